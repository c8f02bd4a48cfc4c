"""The plan account's read path (issue 16 item 2), on what a lab host recorded (tests/fixtures/plan_probe/):

- roles/sglang/files/sglang-plan-probe (root, per socket connection) run on a tmp tree holding the host's
  real unit, environment and --config file (the key SENTINEL-SECRET-9f3c) and known-good record, with
  systemctl and journalctl stand-ins printing what the host printed and /server_info answered from the
  host's recorded body: the hashes are the files', and the sentinel appears nowhere in its answer;
- library/sglang_plan_probe.py (the plan account's client) against a socket serving the probe's recorded
  answer, and its errors;
- library/sglang_running_args.py with ``observed`` (the recorded answer's ``running``): the same comparison
  as on the host, a window 2048 running against 4096 from git.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import socket
import sys
import threading
import urllib.error
import urllib.request
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, REPO, FakeResponse

P = FIXTURES / "plan_probe"
PROBE = REPO / "roles" / "sglang" / "files" / "sglang-plan-probe"
SENTINEL = "SENTINEL-SECRET-9f3c"


def load_probe():
    loader = SourceFileLoader("sglang_plan_probe_script", str(PROBE))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The recorded host's files under tmp_path, its systemctl/journalctl output, its /server_info."""
    etc, kg = tmp_path / "etc", tmp_path / "known-good"
    etc.mkdir()
    kg.mkdir()
    files = {
        "unit": tmp_path / "sglang.service",
        "env": etc / "sglang.env",
        "config": etc / "sglang.yaml",
        "known_good_unit": kg / "sglang.service",
        "known_good_env": kg / "sglang.env",
        "known_good_config": kg / "sglang.yaml",
    }
    for name, path in files.items():
        path.write_bytes((P / Path(str(path)).name).read_bytes() if "known_good" not in name else b"")
    for name in ("unit", "env", "config"):
        files[f"known_good_{name}"].write_bytes(files[name].read_bytes())
    (kg / "sglang.json").write_bytes((P / "known-good.json").read_bytes())
    cfg = json.loads((P / "plan-probe.json").read_text())
    cfg.update(files={k: str(v) for k, v in files.items()}, known_good_meta=str(kg / "sglang.json"))
    cfg["pending"] = str(tmp_path / "sglang.pending.json")
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    # The capabilities cache: a real SGLang 0.5.23 parser dump (tests/fixtures/capabilities/), as the cache
    # file sglang_argv writes.
    caps = tmp_path / "capabilities"
    caps.mkdir()
    (caps / "0.5.23-22c90d3314e35efe-86e55bed.json").write_bytes(
        (FIXTURES / "capabilities" / "sglang-0.5.23.json").read_bytes()
    )
    cfg["capabilities_cache"] = str(caps)
    (conf_dir / "sglang.plan-probe.json").write_text(json.dumps(cfg))
    # The server's port: a real listener of this test process, whose cgroup stands for the unit's.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    cfg["port"] = listener.getsockname()[1]
    (conf_dir / "sglang.plan-probe.json").write_text(json.dumps(cfg))
    own_cgroup = [ln for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln.startswith("0::")]
    show = tmp_path / "show.txt"
    show.write_text((P / "show.txt").read_text() + f"ControlGroup={own_cgroup[0][3:]}\n")
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "systemctl").write_text(f"#!/bin/sh\ncat {show}\n")
    (bins / "journalctl").write_text(f'#!/bin/sh\n[ "$1" = --sync ] && exit 0\ncat {P / "journal.json"}\n')
    for b in bins.iterdir():
        b.chmod(0o755)
    seen = []

    def urlopen(req, timeout=None):
        auth = req.get_header("Authorization")
        seen.append(auth)
        if auth != f"Bearer {SENTINEL}":
            raise urllib.error.HTTPError(req.full_url, 401, "x", {}, io.BytesIO(b'{"error": "Unauthorized"}'))
        return FakeResponse(200, (P / "server_info.json").read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    main_pid = int(dict(ln.split("=", 1) for ln in (P / "show.txt").read_text().splitlines())["MainPID"])
    real_open = open

    def fake_open(path, *a, **kw):
        if isinstance(path, str) and path.startswith(f"/proc/{main_pid}/"):
            return real_open(P / (path.rsplit("/", 1)[1] + ".bin"), *a, **kw)
        return real_open(path, *a, **kw)

    probe = load_probe()
    monkeypatch.setattr("builtins.open", fake_open)
    # Its config must be root's, and nobody else may write it: the test runs as whoever runs it.
    monkeypatch.setattr(probe, "OWNER_UID", os.getuid())
    argv = [
        "--config-dir",
        str(conf_dir),
        "--lib",
        str(REPO / "module_utils"),
        "--systemctl",
        str(bins / "systemctl"),
        "--journalctl",
        str(bins / "journalctl"),
    ]
    yield {
        "probe": probe,
        "argv": argv,
        "files": files,
        "seen": seen,
        "conf_dir": conf_dir,
        "show": show,
        "port": cfg["port"],
    }
    listener.close()


def answer(host, capsys) -> tuple[str, dict]:
    assert host["probe"].main(host["argv"]) == 0
    text = capsys.readouterr().out
    return text, json.loads(text)


def test_probe_hashes_on_the_host_and_prints_no_secret(host, capsys):
    text, doc = answer(host, capsys)
    assert SENTINEL not in text
    svc = doc["services"]["sglang"]
    for name in ("unit", "env", "config"):
        want = hashlib.sha256(host["files"][name].read_bytes()).hexdigest()
        assert svc["sha256"][name] == want == svc["sha256"][f"known_good_{name}"]
    assert svc["env"] == {
        "HF_HOME": {"value": '"/var/lib/sglang/.cache/huggingface"'},
        "SGLANG_CACHE_DIR": {"value": '"/var/lib/sglang/.cache/sglang"'},
    }
    assert (
        "api_key" not in svc["known_good"]
        and svc["known_good"]["expected"]["speculative_draft_window_size"] == 2048
    )
    info = svc["running"]["server_info"]
    # Asked with the --config file's key, then without one: 401 proves the key is required.
    assert host["seen"] == [f"Bearer {SENTINEL}", None]
    assert info["status"] == 200 and info["status_without_key"] == 401
    assert info["body"]["api_key"] == "<redacted>" and info["body"]["speculative_draft_window_size"] == 2048
    lines = [e["MESSAGE"] for e in svc["running"]["journal"] if "server_args=" in str(e.get("MESSAGE"))]
    assert len(lines) == 1 and "'api_key': '<redacted>'" in lines[0]
    assert svc["running"]["cmdline"][:2] == (P / "cmdline.bin").read_bytes().decode().split("\0")[:2]
    assert svc["pending"] is None and svc["errors"] == []


def test_the_capabilities_cache_is_handed_over_unredacted(host, capsys):
    # The plan account cannot read it (root-only state directory); redaction would rewrite flag texts.
    _, doc = answer(host, capsys)
    caches = doc["services"]["sglang"]["capabilities_cache"]
    want = json.loads((FIXTURES / "capabilities" / "sglang-0.5.23.json").read_text())
    assert caches == {"0.5.23-22c90d3314e35efe-86e55bed.json": want}
    assert "--api-key" in caches["0.5.23-22c90d3314e35efe-86e55bed.json"]["options"]["api_key"]["flags"]


def test_a_secret_named_environment_entry_is_given_as_its_hash_only(host, capsys):
    env = host["files"]["env"]
    env.write_text(env.read_text() + f'HF_TOKEN="{SENTINEL}-hf"\n')
    text, doc = answer(host, capsys)
    assert SENTINEL not in text
    assert doc["services"]["sglang"]["env"]["HF_TOKEN"] == {
        "sha256": hashlib.sha256(f'"{SENTINEL}-hf"'.encode()).hexdigest()
    }


def test_a_config_others_may_write_is_ignored(host, capsys):
    (host["conf_dir"] / "sglang.plan-probe.json").chmod(0o666)
    _, doc = answer(host, capsys)
    assert doc["services"] == {}
    assert "only root may write; ignored" in doc["errors"][0]


def test_the_key_goes_only_to_a_listener_in_the_units_cgroup(host, capsys):
    """Issue 37 item 4 (P4 for the probe): the port is held by a process outside the unit's cgroup (the plan
    account can bind it first while SGLang loads its model): /server_info is not asked, with or without the
    key, and the answer names the holder."""
    show = host["show"]
    props = [ln for ln in show.read_text().splitlines() if not ln.startswith("ControlGroup=")]
    show.write_text("\n".join(props + ["ControlGroup=/system.slice/sglang.service"]) + "\n")
    text, doc = answer(host, capsys)
    assert host["seen"] == [] and SENTINEL not in text
    info = doc["services"]["sglang"]["running"]["server_info"]
    assert info["attempts"] == [] and "status" not in info
    assert f"port {host['port']}" in info["error"] and f"pid {os.getpid()}" in info["error"]
    assert "not sglang.service's" in info["error"] and "the API key was not sent" in info["error"]


def test_the_key_is_withheld_while_nothing_listens(host, capsys):
    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        free = probe_port.getsockname()[1]
    cfg_path = host["conf_dir"] / "sglang.plan-probe.json"
    cfg_path.write_text(json.dumps(dict(json.loads(cfg_path.read_text()), port=free)))
    _, doc = answer(host, capsys)
    info = doc["services"]["sglang"]["running"]["server_info"]
    assert host["seen"] == [] and f"nothing listens on port {free}" in info["error"]


def test_without_the_listener_reader_the_key_is_withheld(host, capsys, tmp_path):
    """An older role installed no sglang_proc.py beside the probe: it fails closed."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("sglang_redact.py", "sglang_journal.py"):
        (lib / name).write_bytes((REPO / "module_utils" / name).read_bytes())
    argv = list(host["argv"])
    argv[argv.index("--lib") + 1] = str(lib)
    assert host["probe"].main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    info = doc["services"]["sglang"]["running"]["server_info"]
    assert host["seen"] == [] and "sglang_proc.py" in info["error"]


PLAN_ACCOUNT_TASKS = REPO / "roles" / "sglang" / "tasks" / "plan-account.yml"


def test_the_plan_account_cannot_replace_its_root_owned_ssh_directory():
    """Issue 37 item 4: an account that owns its home can rename the root-owned .ssh and put an
    authorized_keys of its own (without ``restrict``) in its place. The home is root's, not writable by the
    account, after the account is created; what the account writes has directories of its own in it."""
    tasks = yaml.safe_load(PLAN_ACCOUNT_TASKS.read_text())
    names = [t.get("name", "") for t in tasks]
    created = names.index("Create the plan account")
    home = [
        (i, t["ansible.builtin.file"])
        for i, t in enumerate(tasks)
        if (t.get("ansible.builtin.file") or {}).get("path") == "{{ __sglang_plan_home }}"
    ]
    assert home, "no task makes the plan account's home root's"
    index, spec = home[0]
    assert index > created and spec.get("owner") == "root" and spec.get("state") == "directory"
    assert not int(str(spec.get("mode", "0777")), 8) & 0o022, spec
    assert spec.get("follow") is False, "root must not follow a link the account planted"
    ssh = next(
        t["ansible.builtin.file"]
        for t in tasks
        if (t.get("ansible.builtin.file") or {}).get("path") == "{{ __sglang_plan_home }}/.ssh"
    )
    assert ssh["owner"] == "root"
    # Ansible's remote tmp and the parser's caches (tasks/plan.yml: .cache/preflight) stay writable.
    own = [
        t["ansible.builtin.file"]
        for t in tasks
        if str((t.get("ansible.builtin.file") or {}).get("owner")) == "{{ sglang_plan_user }}"
    ]
    paths = {str(x.get("path")) for x in own} | {
        f"{{{{ __sglang_plan_home }}}}/{item}"
        for t in tasks
        if str((t.get("ansible.builtin.file") or {}).get("owner")) == "{{ sglang_plan_user }}"
        for item in t.get("loop") or []
    }
    assert {"{{ __sglang_plan_home }}/.ansible", "{{ __sglang_plan_home }}/.cache"} <= paths, paths


def test_the_probe_is_installed_with_its_listener_reader():
    """The probe fails closed without sglang_proc.py (test above): the role installs it beside the probe."""
    tasks = yaml.safe_load(PLAN_ACCOUNT_TASKS.read_text())
    install = next(t for t in tasks if str(t.get("name", "")).startswith("Install the plan probe"))
    dests = {item["dest"] for item in install["loop"]}
    assert "{{ __sglang_heal_lib }}/sglang_proc.py" in dests, dests


def test_the_recorded_answer_holds_no_secret():
    # What the lab host's probe printed for the plan account (the host's key was the sentinel).
    text = (P / "answer-2048.json").read_text()
    assert SENTINEL not in text
    assert json.loads(text)["services"]["sglang"]["running"]["server_info"]["status_without_key"] == 401


# ---- the plan account's client ------------------------------------------------------------------


@pytest.fixture
def serve(tmp_path):
    """A unix socket that answers each connection with ``payload`` (the probe's recorded answer)."""
    path = tmp_path / "probe.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(2)
    payload = {"data": (P / "answer-2048.json").read_bytes()}

    def loop():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(payload["data"])

    threading.Thread(target=loop, daemon=True).start()
    yield path, payload
    server.close()


def test_client_returns_the_services_document(serve, run_module):
    path, _ = serve
    result, failed = run_module("sglang_plan_probe", {"service": "sglang", "socket": str(path)})
    assert not failed and result["changed"] is False
    assert result["services"] == ["sglang"]
    assert (
        result["observed"]["sha256"]["config"]
        == json.loads((P / "answer-2048.json").read_text())["services"]["sglang"]["sha256"]["config"]
    )


def test_client_names_what_to_do_without_a_probe_or_for_an_unknown_service(serve, run_module, tmp_path):
    path, _ = serve
    result, failed = run_module("sglang_plan_probe", {"service": "other", "socket": str(path)})
    assert failed and "knows no service 'other' (it reports sglang" in result["msg"]
    result, failed = run_module("sglang_plan_probe", {"service": "sglang", "socket": str(tmp_path / "none")})
    assert failed and "no plan probe on this host" in result["msg"]
    assert "sglang_plan_authorized_keys" in result["msg"]


# ---- the running arguments from the probe's observations ----------------------------------------

EXPECTED = {
    "model_path": "/srv/models/lab-target",
    "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "/srv/models/lab-dflash-draft",
    "speculative_draft_window_size": "2048",
    "port": "30000",
}


def running_args(run_module, window):
    observed = json.loads((P / "answer-2048.json").read_text())["services"]["sglang"]["running"]
    return run_module(
        "sglang_running_args",
        {
            "port": 30000,
            "unit": "sglang.service",
            "expected": dict(EXPECTED, speculative_draft_window_size=str(window)),
            "observed": observed,
            "_ansible_check_mode": True,
        },
    )


def test_the_journal_is_read_to_the_main_process_ready_line_only(host, capsys):
    """The recorded journal goes on with access lines after SGLang's ready line (as it does for as long as the
    server serves): the probe stops at that line instead of taking the newest lines."""
    _text, doc = answer(host, capsys)
    got = doc["services"]["sglang"]["running"]["journal"]
    recorded = (P / "journal.json").read_text().splitlines()
    assert len(recorded) == 49 and len(got) == 28
    assert "The server is fired up and ready to roll!" in got[-1]["MESSAGE"] and got[-1]["_PID"] == "2802"


def test_observed_running_arguments_agree_with_git(run_module, monkeypatch):
    # Nothing is read on the controller: no systemctl, no journalctl, no HTTP, no /proc.
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("HTTP from the plan"))
    result, failed = running_args(run_module, 2048)
    assert not failed, result["msg"]
    assert set(result["reported"]) == {"server_info", "journal", "cmdline"}
    assert result["evidence"]["key_required"].endswith("401 without a key (plan probe)")


def test_observed_running_window_differs_from_git(run_module):
    result, failed = running_args(run_module, 4096)
    assert failed
    assert result["reported"]["server_info"]["speculative_draft_window_size"] == 2048
    assert any("speculative_draft_window_size" in d and "4096" in d for d in result["diff"]), result["diff"]


def test_probe_script_is_python3_standard_library_only():
    tree = PROBE.read_text()
    assert tree.startswith("#!/usr/bin/python3\n")
    stdlib = set(sys.stdlib_module_names)
    imports = [ln.split()[1].split(".")[0] for ln in tree.splitlines() if ln.startswith(("import ", "from "))]
    assert imports and all(name in stdlib for name in imports), imports


RD = FIXTURES / "restart_drift"


@pytest.mark.parametrize("case", ["killed", "restarted"])
def test_a_running_invocation_not_the_verified_one_comes_with_how_that_one_ended(host, capsys, case):
    """P17: the host as recorded after a kill -9 (systemd restarted the unit) and after a hand `systemctl
    restart` (tests/fixtures/restart_drift/): the probe reads the last verified invocation's newest lines of
    every boot (no -b) and answers how it ended, with no secret in it; when the verified invocation is the
    running one it reads nothing more."""
    kg_meta = Path(host["files"]["known_good_unit"]).parent / "sglang.json"
    kg_meta.write_bytes((RD / case / "known-good.json").read_bytes())
    host["show"].write_text((RD / case / "show.txt").read_text())
    verified = json.loads((RD / case / "known-good.json").read_text())["invocation_id"]
    journalctl = Path(host["argv"][host["argv"].index("--journalctl") + 1])
    calls = journalctl.with_name("journalctl.calls")
    journalctl.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n[ "$1" = --sync ] && exit 0\n'
        f'case "$*" in *INVOCATION_ID={verified}*) cat {RD / case / "verified-journal.json"};; '
        f"*) cat {P / 'journal.json'};; esac\n"
    )
    text, doc = answer(host, capsys)
    assert SENTINEL not in text
    svc = doc["services"]["sglang"]
    recorded = json.loads((RD / case / "answer.json").read_text())["services"]["sglang"]
    assert svc["verified_end"] == recorded["verified_end"] and svc["errors"] == []
    asked = [c for c in calls.read_text().splitlines() if verified in c]
    assert asked == [
        f"-o json --all --no-pager -n 40 INVOCATION_ID={verified} + _SYSTEMD_INVOCATION_ID={verified}"
    ]
    for name in ("ExecMainStartTimestamp", "NRestarts", "ExecMainCode", "ExecMainStatus", "Result"):
        assert name in host["probe"].SHOW_PROPERTIES and svc["systemd"][name] == recorded["systemd"][name]
    # The verified invocation running: nothing more is read.
    kg = json.loads(kg_meta.read_text())
    kg_meta.write_text(json.dumps(dict(kg, invocation_id=svc["systemd"]["InvocationID"])))
    calls.write_text("")
    _text, doc = answer(host, capsys)
    assert "verified_end" not in doc["services"]["sglang"]
    assert not [c for c in calls.read_text().splitlines() if "-n 40" in c]
