"""Drop-ins the sglang role did not render, and flags it did not render, on the shared lab host (lab_host).

1. A drop-in with User=root (loaded: daemon-reload): the deploy fails naming it and its lines before it
   changes anything (unit hash, InvocationID, history unchanged); the drift inspection
   (playbooks/drift.yml, tools/gitops/gitops.py drift_findings) reports it as drift.
2. The same with sglang_remove_foreign_dropins=true: moved to /var/lib/sglang-deploy/removed-dropins/<ts>/,
   restarted (new InvocationID) and verified; the process does not run as root; the history says why.
3. A flag the role did not render in the RUNNING process (a drop-in's ExecStart, restarted by hand, the
   drop-in then removed: the unit is clean, only the process differs): the deploy fails naming the flag.
4. A link the service account planted in its home (~/.cache -> a root-owned directory): the deploy fails
   before it changes anything and root never chowns the link's target (P23).
Each test leaves the host as it found it (finally: drop-ins removed, baseline restored).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# As tests/integration/conftest.py's restore: the lab inventory's short stability window (no crash is
# injected here); only the play that deploys SGLang.
FAST_VERIFY = {"sglang_stable_seconds": 3, "sglang_health_count": 2}
SGLANG_PLAYBOOK = "playbooks/sglang.yml"
UNIT_PATH = "/etc/systemd/system/sglang.service"

DROPIN_DIR = "/etc/systemd/system/sglang.service.d"
DROPIN = f"{DROPIN_DIR}/override.conf"
REMOVED = "/var/lib/sglang-deploy/removed-dropins"
USER_ROOT = "[Service]\n# left by a manual test\nUser=root\n"


def write_dropin(lab_host, text, path=DROPIN):
    lab_host.ssh(
        f"mkdir -p {DROPIN_DIR} && printf %s {shlex.quote(text)} > {path} && systemctl daemon-reload"
    )


def cleanup(lab_host):
    lab_host.ssh(f"rm -rf {DROPIN_DIR} {REMOVED} && systemctl daemon-reload")


def deploy(lab_host, **extra):
    return lab_host.playbook("-e", "window=2048", extra=dict(FAST_VERIFY, **extra), playbook=SGLANG_PLAYBOOK)


def flat(r) -> str:
    """Output with whitespace normalised (the yaml result format folds long lines)."""
    return " ".join((r.stdout + r.stderr).split())


PLAN_USER = "sglang-plan"


def with_plan_account(lab_host):
    """Drift connects as the plan account (docs/gitops.md): set it up on the shared host with the lab's own
    key (a deploy with sglang_plan_authorized_keys; nothing restarts). Removed by remove_plan_account."""
    key = Path(lab_host.vars["ansible_ssh_private_key_file"] + ".pub").read_text().strip()
    r = deploy(lab_host, sglang_plan_authorized_keys=[key])
    assert r.returncode == 0, r.stdout[-4000:]


def remove_plan_account(lab_host):
    lab_host.ssh(
        "systemctl disable --now sglang-plan-probe.socket 2>/dev/null;"
        " rm -f /etc/systemd/system/sglang-plan-probe.socket '/etc/systemd/system/sglang-plan-probe@.service'"
        " /etc/sglang/sglang.plan-probe.json /usr/local/lib/sglang-deploy/plan-probe"
        " /usr/local/lib/sglang-deploy/sglang_redact.py /usr/local/lib/sglang-deploy/sglang_journal.py;"
        f" systemctl daemon-reload; userdel -r {PLAN_USER} 2>/dev/null; groupdel {PLAN_USER} 2>/dev/null;"
        " true"
    )


def drift_findings(lab_host, tmp_path):
    """playbooks/drift.yml as tools/gitops/drift runs it: as the plan account, without become."""
    plan = {"ansible_user": PLAN_USER, "ansible_become": False}
    r = lab_host.playbook(
        "--check", "-e", f"gitops_report_dir={tmp_path}", extra=plan, playbook="playbooks/drift.yml"
    )
    assert r.returncode == 0, r.stdout[-4000:]
    # gitops.py imports its sibling modules (names.py) as the tools run it: from its own directory.
    if str(REPO / "tools" / "gitops") not in sys.path:
        sys.path.insert(0, str(REPO / "tools" / "gitops"))
    spec = importlib.util.spec_from_file_location("gitops", REPO / "tools" / "gitops" / "gitops.py")
    gitops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gitops)
    report = json.loads((tmp_path / f"{lab_host.name}.json").read_text())
    return report, gitops.drift_findings(report)


def test_a_foreign_dropin_fails_the_deploy_untouched_and_is_drift(lab_host, tmp_path):
    with_plan_account(lab_host)
    before = lab_host.state()
    try:
        write_dropin(lab_host, USER_ROOT)
        r = deploy(lab_host)
        after = lab_host.state()
        assert r.returncode != 0, r.stdout[-4000:]
        text = flat(r)
        assert "Take the deploy lock and probe the host" in text and "did not render" in text
        assert f"{DROPIN}: [Service] | User=root" in text and "(nothing was changed)" in text
        assert after == before, (before, after)
        assert lab_host.ssh(f"test -e {DROPIN}").returncode == 0
        report, findings = drift_findings(lab_host, tmp_path)
        assert [d["path"] for d in report["foreign_dropins"]] == [DROPIN]
        assert f"drop-in {DROPIN} (loaded) is not rendered by git: [Service] | User=root" in findings
        assert lab_host.state() == before
    finally:
        cleanup(lab_host)
        remove_plan_account(lab_host)
        lab_host.restore_baseline()


def test_remove_foreign_dropins_moves_them_away_and_restarts_verified(lab_host):
    before = lab_host.state()
    try:
        write_dropin(lab_host, USER_ROOT)
        r = deploy(lab_host, sglang_remove_foreign_dropins=True)
        assert r.returncode == 0, r.stdout[-6000:]
        after = lab_host.state()
        assert after.invocation_id != before.invocation_id and after.active_state == "active"
        assert after.unit_sha256 == before.unit_sha256
        assert lab_host.ssh(f"test -e {DROPIN_DIR}", check=False).returncode != 0
        assert lab_host.ssh("systemctl show -P DropInPaths sglang.service").stdout.strip() == ""
        kept = lab_host.ssh(f"ls {REMOVED}").stdout.split()
        assert len(kept) == 1
        assert lab_host.read_bytes(f"{REMOVED}/{kept[0]}{DROPIN}").decode() == USER_ROOT
        manifest = json.loads(lab_host.read_bytes(f"{REMOVED}/{kept[0]}/MANIFEST.json"))
        assert [m["from"] for m in manifest["removed"]] == [DROPIN]
        user = lab_host.ssh(f"ps -o user= -p {after.main_pid}").stdout.strip()
        assert user == "sglang"
        record = lab_host.history()[-1]
        assert record["result"] == "verified" and record["invocation_id"] == after.invocation_id
        assert f"foreign drop-in removed ({DROPIN})" in record["reasons"]
    finally:
        cleanup(lab_host)
        lab_host.restore_baseline()


def test_a_flag_the_role_did_not_render_in_the_running_process_fails_naming_it(lab_host):
    """The unit is clean and verified, but the process was started from a drop-in's ExecStart with an extra
    flag (the drop-in removed afterwards): only the whole-argv comparison of the assertion sees it."""
    unit = lab_host.read_bytes(UNIT_PATH).decode()
    execstart = re.search(r"^ExecStart=(?:.*\\\n)*.*$", unit, re.MULTILINE).group(0)
    try:
        write_dropin(lab_host, f'[Service]\nExecStart=\n{execstart} "--enable-cache-report"\n')
        lab_host.ssh("systemctl restart sglang.service")
        lab_host.ssh(f"rm -rf {DROPIN_DIR} && systemctl daemon-reload")
        running = lab_host.state()
        assert "--enable-cache-report" in lab_host.cmdline(running.main_pid)
        r = deploy(lab_host)
        assert r.returncode != 0, r.stdout[-4000:]
        assert "--enable-cache-report: a flag the role did not render is in /proc/" in flat(r)
        assert lab_host.state().invocation_id == running.invocation_id
    finally:
        cleanup(lab_host)
        lab_host.ssh("systemctl restart sglang.service")
        lab_host.restore_baseline()


def test_a_link_the_service_account_planted_is_never_followed_by_root(lab_host):
    """Issue 37 item 2 (P23): the service account owns its home; a link it plants there (~/.cache pointing
    at a root-owned directory) fails the deploy before anything changes, and the target keeps its owner and
    mode (the role never chowns through it)."""
    cache, target = "/var/lib/sglang/.cache", "/etc/sglang-planted-target"
    before = lab_host.state()
    lab_host.ssh(
        f"mkdir -m 0755 {target} && mv {cache} {cache}.real && ln -s {target} {cache}"
        f" && chown -h sglang:sglang {cache}"
    )
    try:
        r = deploy(lab_host)
        assert r.returncode != 0, r.stdout[-4000:]
        text = flat(r)
        assert "symbolic link" in text and f"{cache}" in text and "nothing was changed" in text, text[-3000:]
        assert lab_host.ssh(f"stat -c '%U:%G %a' {target}").stdout.split() == ["root:root", "755"]
        assert lab_host.state() == before
    finally:
        lab_host.ssh(f"rm -f {cache} && mv {cache}.real {cache} && rmdir {target}", check=False)
    lab_host.restore_baseline()
