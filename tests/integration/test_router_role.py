"""The SGLang router role (roles/sglang_router, issue 17 item 1) on a real lab host, through deploy.yml.

Lab hosts are separate network namespaces with no route between them, so here ONE host is both the GPU
node and the router: the router's worker is the SGLang server on the same host (http://127.0.0.1:30000),
the router listens on 30080, its metrics on 29080. The host (lab$ROUTER_LAB_INDEX, default lab180) is
brought up with the SGLang layer by the module fixture and taken down at the end. Its inventory is two
gitignored files in inventory/lab/ (so inventory/lab/group_vars apply: smg from the wheelhouse's smg/):
router-<index>.yml written by `labctl up` (groups gpu_nodes, lab) and router-<index>-routers.yml, the same
plus group `routers` with that host. The two API keys are random per run and go in as `-e @file` only.

In order, on the fixture's runs:
  1. `playbooks/router.yml --check --diff` on the fresh host says what it would install and start, and
     installs and starts nothing;
  2. `deploy.yml -e window=2048` deploys SGLang, then the router: a new InvocationID, /readiness 200, the
     listener is the unit's main process in the unit's cgroup, GET /workers lists the worker ready;
  3. no key is in any /proc/<pid>/cmdline, the unit or the Ansible output, yet both keys are in force: a
     wrong or missing admin key gets 401 from /workers, a client without the worker key 401 from the router;
  4. the same deploy again is changed=0 with the same InvocationIDs (SGLang and router);
  5. a changed router setting restarts it: a new InvocationID, verified again.
Not here: a router on its own host in front of workers on other hosts, and the rolling deploy through
the router (not built; docs/router.md).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
LABCTL = REPO / "lab" / "labctl"
WHEELHOUSE = Path(os.environ.get("WHEELHOUSE", "/var/cache/sglang-lab/wheelhouse"))
INDEX = int(os.environ.get("ROUTER_LAB_INDEX", "180"))
HOST = f"lab{INDEX}"
BASE_INVENTORY = REPO / "inventory" / "lab" / f"router-{INDEX}.yml"
INVENTORY = REPO / "inventory" / "lab" / f"router-{INDEX}-routers.yml"
WORKER = "http://127.0.0.1:30000"
PORT = 30080
METRICS_PORT = 29080
UNIT = "sglang-router.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ROUTERS_GROUP = f"""\
    routers:
      hosts:
        {HOST}:
          sglang_router_worker_urls: ["{WORKER}"]
          sglang_router_port: {PORT}
          sglang_router_prometheus_port: {METRICS_PORT}
"""
# Runs on the host as `python3 -c PROBE`, its input on stdin (never on a command line): the keys to look
# for in every /proc/<pid>/cmdline, and HTTP requests to the router ([method, path, bearer, JSON body]).
PROBE = r"""
import json, os, sys, urllib.error, urllib.request
given = json.load(sys.stdin)
cmdlines, holders = {}, []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        continue
    cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if any(k.encode() in raw for k in given["keys"]):
        holders.append(pid)
answers = []
for method, path, bearer, body in given["requests"]:
    request = urllib.request.Request(f"http://127.0.0.1:{given['port']}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if bearer is not None:
        request.add_header("Authorization", "Bearer " + bearer)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            answers.append([r.status, r.read().decode()])
    except urllib.error.HTTPError as e:
        answers.append([e.code, e.read().decode()])
print(json.dumps({"cmdlines": cmdlines, "holders": holders, "answers": answers}))
"""


def ansible_env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        PATH=f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
    )


class Lab:
    def __init__(self, keys: dict[str, str]):
        self.keys = keys
        self.hv = yaml.safe_load(BASE_INVENTORY.read_text())["all"]["children"]["gpu_nodes"]["hosts"][HOST]
        self.runs: list[str] = []  # every ansible-playbook output, for the "no key printed" check

    def ssh(self, command: str, stdin: str | None = None, timeout: int = 300) -> str:
        argv = [
            "ssh",
            "-i",
            self.hv["ansible_ssh_private_key_file"],
            *shlex.split(self.hv.get("ansible_ssh_common_args", "")),
            "-o",
            "BatchMode=yes",
            f"root@{self.hv['ansible_host']}",
            command,
        ]
        r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"ssh {HOST} {command[:80]!r} -> rc {r.returncode}: {r.stderr.strip()}"
        return r.stdout

    def play(self, *args: str, playbook: str = "deploy.yml", extra: dict | None = None):
        """ansible-playbook on this host; the keys (and ``extra``) as ``-e @file``, never on an argv."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="router-extra-") as handle:
            json.dump({**self.keys, **(extra or {})}, handle)
            handle.flush()
            argv = [str(ANSIBLE_PLAYBOOK), "-i", str(INVENTORY), "--limit", f"{HOST},localhost", playbook]
            argv += ["-e", "@" + handle.name, *args]
            r = subprocess.run(argv, cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=900)
        self.runs.append(r.stdout + r.stderr)
        return r

    def unit(self, name: str = UNIT) -> dict[str, str]:
        out = self.ssh(f"systemctl show -p InvocationID -p ActiveState -p MainPID -p ControlGroup {name}")
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def probe(self, *requests: list) -> dict:
        given = {"keys": list(self.keys.values()), "port": PORT, "requests": [list(r) for r in requests]}
        return json.loads(self.ssh(f"python3 -c {shlex.quote(PROBE)}", stdin=json.dumps(given)))


def changed(r, host: str = HOST) -> int:
    m = re.search(rf"^{host}\s*: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", r.stdout, re.M)
    assert m, (r.stdout + r.stderr)[-6000:]
    return int(m.group(1))


def ok(r) -> None:
    assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not ANSIBLE_PLAYBOOK.exists():
        pytest.skip("lab hosts need root, systemd-nspawn and the controller toolchain (make venv)")
    if not any((WHEELHOUSE / "smg").glob("smg-1.13.0-*.whl")) or not any(WHEELHOUSE.glob("sglang-*.whl")):
        pytest.fail(f"no smg 1.13.0 in {WHEELHOUSE}/smg or no sglang wheel in it: run `make wheelhouse`")
    # A host an interrupted run left behind is stopped first (only the host of this inventory).
    subprocess.run([str(LABCTL), "down", "--inventory", str(BASE_INVENTORY)], check=False, cwd=REPO)
    try:
        subprocess.run(
            [
                str(LABCTL),
                "up",
                "--sglang-layer",
                "--hosts",
                "1",
                "--first-index",
                str(INDEX),
                "--inventory",
                str(BASE_INVENTORY),
            ],
            check=True,
            cwd=REPO,
        )
        base = BASE_INVENTORY.read_text()
        assert base.rstrip().endswith(f"{HOST}:") and "\n    lab:\n" in base, base
        INVENTORY.write_text(base.rstrip("\n") + "\n" + ROUTERS_GROUP)
        keys = {
            "sglang_router_admin_key": "admin-" + secrets.token_hex(16),
            "sglang_router_worker_api_key": "worker-" + secrets.token_hex(16),
        }
        lab = Lab(keys)
        fresh = lab.unit()
        check = lab.play("--check", "--diff", playbook="playbooks/router.yml")
        after_check = lab.unit()
        after_check_files = lab.ssh("ls -d /opt/sglang-router /etc/sglang-router 2>/dev/null || true")
        deploy = lab.play("-e", "window=2048")
        yield {
            "lab": lab,
            "fresh": fresh,
            "check": check,
            "after_check": after_check,
            "after_check_files": after_check_files,
            "deploy": deploy,
            "deployed": lab.unit(),
            "sglang": lab.unit("sglang.service"),
        }
    finally:
        subprocess.run([str(LABCTL), "down", "--inventory", str(BASE_INVENTORY)], check=False, cwd=REPO)
        INVENTORY.unlink(missing_ok=True)


def test_check_mode_on_a_fresh_host_installs_and_starts_nothing(lab):
    ok(lab["check"])
    out = " ".join(lab["check"].stdout.split())
    assert "Would install smg==1.13.0 into /opt/sglang-router/venv from wheelhouse (installed: none)" in out
    assert "Would (re)start sglang-router.service and verify it" in out
    assert lab["fresh"]["ActiveState"] == lab["after_check"]["ActiveState"] == "inactive"
    assert lab["after_check"]["InvocationID"] == ""
    assert lab["after_check_files"].strip() == ""


def test_deploy_runs_sglang_then_the_router_and_verifies_it(lab):
    r = lab["deploy"]
    ok(r)
    plays = re.findall(r"^PLAY \[(.*?)\]", r.stdout, re.M)
    assert plays[-2:] == [
        "Deploy SGLang and verify the running server",
        "Deploy the SGLang router and verify it",
    ]
    unit = lab["deployed"]
    assert unit["ActiveState"] == "active"
    assert unit["InvocationID"] not in ("", lab["fresh"]["InvocationID"])
    out = " ".join(r.stdout.split())
    assert f"sglang-router: ActiveState=active, InvocationID={unit['InvocationID']}" in out
    assert f"workers ready: [''{WORKER}'']" in out  # the YAML result format doubles the quotes
    assert re.search(r"TASK \[sglang_router : Install smg from the wheelhouse\] \**\nchanged:", r.stdout)


def test_router_is_ready_and_lists_its_worker_ready(lab):
    host = lab["lab"]
    admin = host.keys["sglang_router_admin_key"]
    answers = host.probe(["GET", "/readiness", None, None], ["GET", "/workers", admin, None])["answers"]
    ready, workers = answers
    assert ready[0] == 200
    assert json.loads(ready[1]) == {"status": "ready", "healthy_workers": 1, "total_workers": 1}
    assert workers[0] == 200
    listed = json.loads(workers[1])["workers"]
    assert [(w["url"], w["status"], w["is_healthy"]) for w in listed] == [(WORKER, "ready", True)]
    assert listed[0]["labels"]["served_model_name"] == "lab-target"


def test_the_listener_is_the_units_main_process_in_its_cgroup(lab):
    unit = lab["lab"].unit()
    listeners = lab["lab"].ssh(f"ss -Hltnp 'sport = :{PORT}'")
    pids = set(re.findall(r"pid=(\d+)", listeners))
    assert pids == {unit["MainPID"]}, listeners
    assert unit["ControlGroup"] == f"/system.slice/{UNIT}"
    # systemd's hierarchy: "0::<path>" (cgroup v2) and/or "N:name=systemd:<path>" (hybrid, as in the lab).
    lines = lab["lab"].ssh(f"cat /proc/{unit['MainPID']}/cgroup").split()
    systemd = [line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] in ("", "name=systemd")]
    assert systemd and set(systemd) == {unit["ControlGroup"]}, lines
    metrics = lab["lab"].ssh(f"ss -Hltnp 'sport = :{METRICS_PORT}'")
    assert set(re.findall(r"pid=(\d+)", metrics)) == {unit["MainPID"]}, metrics


def test_no_key_is_in_any_cmdline_the_unit_or_the_output(lab):
    host = lab["lab"]
    seen = host.probe()
    main_pid = host.unit()["MainPID"]
    # The scan saw the router itself (smg names its process), and no process holds a key.
    assert seen["cmdlines"][main_pid].startswith("smg::router"), seen["cmdlines"]
    assert seen["holders"] == []
    unit_text = host.ssh(f"cat {UNIT_PATH}")
    assert "ExecStart=" in unit_text and "--worker-urls " + WORKER in unit_text
    files = host.ssh("stat -c '%U %a %n' /etc/sglang-router /etc/sglang-router/*").split("\n")
    assert files[:3] == [
        "root 700 /etc/sglang-router",
        "root 600 /etc/sglang-router/admin_key",
        "root 600 /etc/sglang-router/worker_api_key",
    ]
    for key in host.keys.values():
        assert key not in unit_text
        assert all(key not in out for out in host.runs)


def test_a_wrong_admin_key_gets_401_and_the_worker_key_is_in_force(lab):
    host = lab["lab"]
    admin, worker = host.keys["sglang_router_admin_key"], host.keys["sglang_router_worker_api_key"]
    chat = {"model": "lab-target", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    wrong, missing, right, anonymous, client = host.probe(
        ["GET", "/workers", "not-" + admin, None],
        ["GET", "/workers", None, None],
        ["GET", "/workers", admin, None],
        ["POST", "/v1/chat/completions", None, chat],
        ["POST", "/v1/chat/completions", worker, chat],
    )["answers"]
    assert wrong == [401, "Invalid authentication token"]
    assert missing == [401, "Missing or invalid Authorization header"]
    assert right[0] == 200
    # smg's --api-key (the workers' key, from its credential) also guards the router's own API.
    assert anonymous[0] == 401 and json.loads(anonymous[1])["error"]["code"] == "invalid_api_key"
    assert client[0] == 200 and json.loads(client[1])["object"] == "chat.completion", client


def test_the_same_deploy_again_is_changed_0(lab):
    host = lab["lab"]
    r = host.play("-e", "window=2048")
    ok(r)
    assert changed(r) == 0
    assert host.unit()["InvocationID"] == lab["deployed"]["InvocationID"]
    assert host.unit("sglang.service")["InvocationID"] == lab["sglang"]["InvocationID"]


def test_a_changed_router_setting_restarts_it_and_verifies_again(lab):
    host = lab["lab"]
    before = host.unit()
    r = host.play(playbook="playbooks/router.yml", extra={"sglang_router_health_check_interval_secs": 3})
    ok(r)
    assert changed(r) >= 1
    after = host.unit()
    assert after["ActiveState"] == "active" and after["InvocationID"] not in ("", before["InvocationID"])
    assert "--health-check-interval-secs 3 " in host.ssh(f"grep ^ExecStart= {UNIT_PATH}")
    reported = f"sglang-router: ActiveState=active, InvocationID={after['InvocationID']}"
    assert reported in " ".join(r.stdout.split())
    ready = host.probe(["GET", "/readiness", None, None])["answers"][0]
    assert ready[0] == 200
    assert host.unit("sglang.service")["InvocationID"] == lab["sglang"]["InvocationID"]
