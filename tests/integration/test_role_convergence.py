"""The sglang role converges from states that an earlier run left behind, on the shared lab host.

1. Interrupted deploy: a `-e window=4096` run killed after it wrote the unit and reloaded systemd but
   before the verified restart leaves the 4096 unit on disk while the server still runs 2048. Made
   deterministic here: the 4096 unit (byte for byte what the role renders, which the next run's
   template task confirms by changing nothing) is written over ssh and systemd reloaded. Check mode
   then says it would restart because the unit on disk is not the last verified one; the real run
   restarts, verifies 4096 and records it; a re-run is changed=0 on the same invocation. On the way, every
   metric of the running server and node_exporter's textfile name the configuration (issue 38 item 4): the
   textfile follows each change of the window, a re-run leaves it untouched, and the same configuration
   gets the same hash again.
2. Releases: appending a requirement to sglang_dependency_requirements is another release (another key,
   issue 14 item 1), never an install into the running one: check mode names the new release beside the
   running one and changes nothing (the real switch between releases: tests/integration/test_releases.py).

Each test restores the baseline (window 2048, the lab requirement list) before it ends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import ansible.module_utils

REPO = Path(__file__).resolve().parents[2]
# The role's own hash of a configuration (module_utils/sglang_argv.py), imported as Ansible ships it.
if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))
from ansible.module_utils.sglang_argv import config_hash  # noqa: E402

UNIT_PATH = "/etc/systemd/system/sglang.service"
ENV_PATH = "/etc/sglang/sglang.env"
KNOWN_GOOD_UNIT = "/var/lib/sglang-deploy/known-good/sglang.service"
RELEASES = "/opt/sglang/releases"
# The install marker of the baseline's release (SGLang 0.5.23 from the layer): {} is the release directory.
MARKER_GLOB_ONE = "{}/sglang-deploy-install.json"
# The lab requirement list, read the way inventory/lab/group_vars/lab/lab.yml reads it.
LAB_REQUIREMENTS = re.findall(r"(?m)^[^#\s]\S*", (REPO / "lab" / "requirements-sglang-lab.txt").read_text())
# Satisfied by the pinned idna of the lab list: pip has nothing to fetch, the wheelhouse has it.
EXTRA_REQUIREMENT = "idna>=3"
# A restart in these tests waits for a short stability window (the lab default is 3 s).
FAST_VERIFY = {"sglang_stable_seconds": 3, "sglang_health_count": 2}
WINDOW_FLAG = '"--speculative-draft-window-size" "{}"'
# Task names of roles/sglang.
RENDER_UNIT = "Install the systemd unit, the environment file and the --config file"
PREFLIGHT = "Parse and resolve the command line with the host's SGLang"
RESTART = "Restart SGLang and wait until the new invocation is ready and stable"
# roles/sglang/tasks/main.yml includes apply.yml (the lease, the router leave, the write, the verified
# restart) only when the decision writes a file or restarts.
APPLY_INCLUDE = "Write the files and restart SGLang with proof (apply.yml)"
INSTALL_INCLUDE = "Install what the host lacks (install.yml)"
VERIFY = "Prove the running invocation is healthy, owns its port and runs the intended arguments"
RELEASE_LOCK = "Release the deploy lock of the service"
KEEP = "Keep the running-arguments assertion of this invocation"
LOCK_DIR = "/run/sglang-deploy"
KNOWN_GOOD_META = "/var/lib/sglang-deploy/known-good/sglang.json"
# The role's default textfile (sglang_metrics_textfile) and SGLang's port in the lab.
TEXTFILE = "/var/lib/node_exporter/textfile_collector/sglang_deploy.prom"
METRICS = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:30000/metrics').read().decode())\""


def flat(r) -> str:
    """Output with whitespace normalised (the yaml result format folds long lines)."""
    return " ".join((r.stdout + r.stderr).split())


def recap(r) -> str:
    return r.stdout[r.stdout.rindex("PLAY RECAP") :]


def task_status(r, name: str) -> str | None:
    """The first status word ("ok", "changed", "skipping", ...) printed under TASK [sglang : name]."""
    m = re.search(r"TASK \[sglang : " + re.escape(name) + r"\][^\n]*\n(?:[^\n]*\n)*?(\w+): \[", r.stdout)
    return m.group(1) if m else None


def assert_role_converged(r) -> None:
    """A pass on a host with nothing to change: the running-arguments assertion the host probe's call proved
    is kept; the install, the parse, the write and restart and the pass's own proof are skipped as one task
    each (the decision: module_utils/sglang_decide.py); the lock is released in main.yml's always."""
    assert task_status(r, KEEP) == "ok", r.stdout[-6000:]
    for name in (INSTALL_INCLUDE, PREFLIGHT, APPLY_INCLUDE, VERIFY):
        assert task_status(r, name) == "skipping", (name, r.stdout[-6000:])
    assert task_status(r, RELEASE_LOCK) == "ok", r.stdout[-6000:]
    # The play's report follows (playbooks/tasks/deploy_report.yml), with what the probe's call proved.
    report = r"TASK \[Show the verified running arguments and write the full report\][^\n]*\nok: \["
    assert re.search(report, r.stdout), r.stdout[-6000:]


def requirements_sha256(requirements: list[str]) -> str:
    """What roles/sglang records: sha256 of the list as Ansible's to_json writes it."""
    return hashlib.sha256(json.dumps(requirements).encode()).hexdigest()


def window_of(lab_host, pid: int) -> str:
    argv = lab_host.cmdline(pid)
    assert argv.count("--speculative-draft-window-size") == 1, argv
    return argv[argv.index("--speculative-draft-window-size") + 1]


def configuration(lab_host) -> tuple[str, str, str]:
    """(the hash of the running configuration as the known-good set records it, the textfile, its mtime)."""
    meta = json.loads(lab_host.read_bytes(KNOWN_GOOD_META))
    mtime = lab_host.ssh(f"stat -c %y {TEXTFILE}").stdout.strip()
    return meta["config_hash"], lab_host.read_bytes(TEXTFILE).decode(), mtime


def assert_named(lab_host, state, window: int) -> str:
    """Every SGLang metric of the running server carries the configuration's hash, and the textfile says what
    runs: that hash, this invocation, the window, verified. Returns the hash."""
    named, text, _ = configuration(lab_host)
    assert re.fullmatch(r"[0-9a-f]{12}", named), named
    argv = lab_host.cmdline(state.main_pid)
    assert "--enable-metrics" in argv, argv
    assert json.loads(argv[argv.index("--extra-metric-labels") + 1]) == {"config_hash": named}, argv
    # SGLang's HTTP request metrics (http_request_metrics.py) carry endpoint, method and status only.
    lines = lab_host.ssh(METRICS).stdout.splitlines()
    samples = [line for line in lines if line.startswith("sglang:") and not line.startswith("sglang:http_")]
    assert samples and all(f'config_hash="{named}"' in line for line in samples), samples
    info = next(line for line in text.splitlines() if line.startswith("sglang_deploy_info{"))
    assert info == (
        f'sglang_deploy_info{{service="sglang",config_hash="{named}",invocation="{state.invocation_id}",'
        f'window="{window}",budget="",topk="",algorithm="DFLASH",sglang_version="0.5.23",'
        'result="verified"} 1'
    ), text
    assert re.search(r"(?m)^sglang_deploy_timestamp_seconds\{[^}]*\} \d+\.\d{3}$", text), text
    return named


def ok(r) -> None:
    assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]


def run(lab_host, label: str, *args: str, extra: dict) -> subprocess.CompletedProcess:
    """lab_host.playbook, with its wall time printed (the suite's time budget is tight)."""
    start = time.monotonic()
    r = lab_host.playbook(*args, extra=extra)
    print(f"{label}: rc {r.returncode} in {time.monotonic() - start:.1f} s")
    return r


def test_interrupted_deploy_is_restarted_verified_and_then_left_alone(lab_host):
    before = lab_host.state()
    assert before.active_state == "active"
    assert window_of(lab_host, before.main_pid) == "2048"
    baseline_unit = lab_host.read_bytes(UNIT_PATH).decode()
    assert baseline_unit.count(WINDOW_FLAG.format(2048)) == 1, baseline_unit
    assert lab_host.read_bytes(KNOWN_GOOD_UNIT).decode() == baseline_unit
    named_2048 = assert_named(lab_host, before, 2048)
    # What the role renders for 4096: the window and the hash of the managed arguments with it.
    managed = json.loads(lab_host.read_bytes(KNOWN_GOOD_META))["expected"]
    named_4096 = config_hash(dict(managed, speculative_draft_window_size=4096), {}, (), "config_hash")
    assert named_4096 != named_2048 and baseline_unit.count(named_2048) == 1
    interrupted = (
        baseline_unit.replace(WINDOW_FLAG.format(2048), WINDOW_FLAG.format(4096))
        .replace(named_2048, named_4096)
        .encode()
    )
    try:
        # The interrupted run: the new unit in place (same owner and mode), systemd reloaded, no restart.
        payload = base64.b64encode(interrupted).decode()
        lab_host.ssh(
            f"echo {payload} | base64 -d > {UNIT_PATH}.it-new && chmod 0644 {UNIT_PATH}.it-new"
            f" && mv {UNIT_PATH}.it-new {UNIT_PATH} && systemctl daemon-reload"
        )
        assert lab_host.ssh("systemctl show -p NeedDaemonReload sglang.service").stdout.strip() == (
            "NeedDaemonReload=no"
        )
        stale = lab_host.state()
        assert (stale.invocation_id, stale.active_state) == (before.invocation_id, "active")
        assert window_of(lab_host, stale.main_pid) == "2048"

        # Check mode: the template matches the file on disk (nothing to install: sglang_unit is
        # skipped), yet the restart is announced; the host's SGLang judged the command line in the probe's
        # own call, so the separate parse (for a host with no release to build it from) is skipped.
        r = run(lab_host, "check mode", "-e", "window=4096", "--check", "--diff", extra=FAST_VERIFY)
        ok(r)
        # Nothing is written in check mode: the files on disk are current, so sglang_unit is skipped.
        assert task_status(r, RENDER_UNIT) == "skipping", r.stdout[-6000:]
        assert task_status(r, PREFLIGHT) == "skipping", r.stdout[-6000:]
        assert (
            "Would restart sglang.service and verify it: the unit on disk is not the one last verified"
            f" ({KNOWN_GOOD_UNIT})" in flat(r)
        ), r.stdout[-6000:]
        assert lab_host.state() == stale

        # The next real run: same settings, the unit is not rewritten, the restart still happens.
        r = run(lab_host, "deploy after the interruption", "-e", "window=4096", extra=FAST_VERIFY)
        ok(r)
        assert task_status(r, RENDER_UNIT) == "skipping", r.stdout[-6000:]
        assert task_status(r, RESTART) == "changed"
        after = lab_host.state()
        assert after.active_state == "active"
        assert after.invocation_id != stale.invocation_id
        assert after.unit_sha256 == hashlib.sha256(interrupted).hexdigest()
        assert window_of(lab_host, after.main_pid) == "4096"
        record = lab_host.history()[-1]
        assert record["result"] == "verified", record
        assert record["invocation_id"] == after.invocation_id
        assert record["window"] == 4096
        assert record["unit_sha256"] == after.unit_sha256
        assert f"the unit on disk is not the one last verified ({KNOWN_GOOD_UNIT})" in record["reasons"]
        assert lab_host.read_bytes(KNOWN_GOOD_UNIT) == interrupted
        assert assert_named(lab_host, after, 4096) == named_4096 == record["config_hash"]
        textfile = configuration(lab_host)

        # Converged: the same run again changes nothing and restarts nothing; current and verified, so neither
        # the write and restart nor the preflight runs.
        r = run(lab_host, "re-run", "-e", "window=4096", extra=FAST_VERIFY)
        ok(r)
        assert "changed=0" in recap(r), recap(r)
        assert_role_converged(r)
        assert task_status(r, RESTART) is None, r.stdout[-6000:]
        assert lab_host.state() == after
        # Nothing changed, nothing written: the textfile is the same file, not rewritten.
        assert configuration(lab_host) == textfile
    finally:
        ok(run(lab_host, "baseline again", "-e", "window=2048", extra=FAST_VERIFY))
    restored = lab_host.state()
    assert window_of(lab_host, restored.main_pid) == "2048"
    # The same configuration has the same name again.
    assert assert_named(lab_host, restored, 2048) == named_2048


def test_env_file_with_a_wrong_mode_is_rewritten_and_the_server_restarted(lab_host):
    """The no-change fast path must not hide a hand-made mode change: the probe checks owner and
    mode, so sglang_unit runs, restores 0600 and the server is restarted onto the rewritten file."""
    before = lab_host.state()
    lab_host.ssh(f"chmod 0644 {ENV_PATH}")
    try:
        r = run(lab_host, "env file 0644", "-e", "window=2048", extra=FAST_VERIFY)
        ok(r)
        assert task_status(r, RENDER_UNIT) == "changed", r.stdout[-6000:]
        assert lab_host.ssh(f"stat -c %a {ENV_PATH}").stdout.strip() == "600"
        assert task_status(r, RESTART) == "changed", r.stdout[-6000:]
        assert "the environment file changed" in lab_host.history()[-1]["reasons"]
        after = lab_host.state()
        assert after.invocation_id != before.invocation_id and after.env_sha256 == before.env_sha256
    finally:
        lab_host.ssh(f"chmod 0600 {ENV_PATH}")


def test_a_converged_host_is_proven_in_the_probes_call_and_a_later_write_keeps_the_lock(lab_host):
    """The host probe proves an unchanged host in its own call: a no-change pass makes no other proof call
    (verify.yml's is skipped). A change the running arguments do not show (a variable of sglang_environment)
    is proven too, then found by the decision once the files are rendered: the pass still holds the lock it
    took in the probe's call and restarts verified onto the new environment file; the lock goes at the end."""
    before = lab_host.state()
    r = run(lab_host, "no change", "-e", "window=2048", extra=FAST_VERIFY)
    ok(r)
    assert "changed=0" in recap(r), recap(r)
    assert_role_converged(r)
    assert lab_host.ssh(f"ls -A {LOCK_DIR}").stdout.strip() == ""
    assert lab_host.state().invocation_id == before.invocation_id

    extra = dict(FAST_VERIFY, sglang_environment={"SGLANG_LAB_RETAKE": "1"})
    try:
        r = run(lab_host, "environment variable added", "-e", "window=2048", extra=extra)
        ok(r)
        assert task_status(r, RESTART) == "changed", r.stdout[-6000:]
        after = lab_host.state()
        assert after.invocation_id != before.invocation_id
        assert b"SGLANG_LAB_RETAKE=1" in lab_host.read_bytes(f"/proc/{after.main_pid}/environ")
        assert "the environment file changed" in lab_host.history()[-1]["reasons"]
        assert lab_host.history()[-1]["result"] == "verified"
        assert lab_host.ssh(f"ls -A {LOCK_DIR}").stdout.strip() == ""
    finally:
        ok(run(lab_host, "baseline again", "-e", "window=2048", extra=FAST_VERIFY))
    assert lab_host.ssh(f"ls -A {LOCK_DIR}").stdout.strip() == ""


def marker(lab_host) -> dict:
    return json.loads(
        lab_host.read_bytes(MARKER_GLOB_ONE.format(lab_host.ssh(f"ls -d {RELEASES}/0.5.23-*").stdout.strip()))
    )


def test_changed_dependency_requirements_are_a_new_release_and_touch_nothing_running(lab_host):
    """Issue 14 item 1: a changed dependency list is another release (another key), built beside the running
    one, never pip-installed into it. Check mode says so and changes nothing; the real switch to another
    release (version AND dependency set) is tests/integration/test_releases.py."""
    before = lab_host.state()
    releases = lab_host.ssh(f"ls {RELEASES}").stdout.split()
    baseline = marker(lab_host)
    assert baseline["dependencies"] == {
        "resolved_by_pip": False,
        "requirements_sha256": requirements_sha256(LAB_REQUIREMENTS),
    }, baseline
    assert releases == [baseline["release"]], releases
    extended = LAB_REQUIREMENTS + [EXTRA_REQUIREMENT]
    r = run(
        lab_host,
        "extended list, check mode",
        "-e",
        "window=2048",
        "--check",
        extra=dict(FAST_VERIFY, sglang_dependency_requirements=extended),
    )
    ok(r)
    text = flat(r)
    m = re.search(
        r"as the new release /opt/sglang/releases/(0\.5\.23-py3\.\d+-[0-9a-f]{12}) "
        r"\(releases there now: ([^)]*)\)",
        text,
    )
    assert m, text[-6000:]
    assert m.group(1) != baseline["release"] and m.group(2) == baseline["release"], m.groups()
    assert "the running one is not touched" in text
    assert lab_host.state() == before and lab_host.ssh(f"ls {RELEASES}").stdout.split() == releases
    assert marker(lab_host) == baseline


def test_lab_requirements_are_what_the_test_assumes():
    """The extra requirement is satisfied by a pin of the lab list (installed; its wheel is there)."""
    name = EXTRA_REQUIREMENT.split(">=")[0]
    pins = [req for req in LAB_REQUIREMENTS if req.split("==")[0].lower() == name]
    assert len(pins) == 1 and int(pins[0].split("==")[1].split(".")[0]) >= 3, pins
