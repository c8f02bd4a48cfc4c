"""tools/gitops/drift's findings (P17) on what a lab host's plan probe answered
(tests/fixtures/restart_drift/): a running invocation that is not the last verified deploy's is drift, naming
both invocations, when the running one started and how the verified one ended; the report is assembled from
the probe's answer as playbooks/plan.yml assembles it."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import FIXTURES, REPO

sys.path.insert(0, str(REPO / "tools" / "gitops"))

import gitops  # noqa: E402

RD = FIXTURES / "restart_drift"
SENTINEL = "SENTINEL-SECRET-9f3c"


def report(case: str) -> dict:
    """The host's report with the fields playbooks/plan.yml takes from the probe's answer, files in sync."""
    svc = json.loads((RD / case / "answer.json").read_text())["services"]["sglang"]
    show, kg = svc["systemd"], svc["known_good"]
    return {
        "host": "lab220",
        "status": "ok",
        "invocation_id": show["InvocationID"],
        "active_state": show["ActiveState"],
        "need_daemon_reload": show["NeedDaemonReload"] == "yes",
        "invocation_started": show["ExecMainStartTimestamp"],
        "n_restarts": show["NRestarts"],
        "main_exit": {
            "code": show["ExecMainCode"],
            "status": show["ExecMainStatus"],
            "result": show["Result"],
        },
        "verified_end": svc.get("verified_end"),
        "unit": {
            "path": "/etc/systemd/system/sglang.service",
            "changed": False,
            "sha256": svc["sha256"]["unit"],
        },
        "env": {
            "path": "/etc/sglang/sglang.env",
            "changed": False,
            "sha256": svc["sha256"]["env"],
            "diff": [],
        },
        "known_good": {
            "unit_sha256": svc["sha256"]["unit"],
            "env_sha256": svc["sha256"]["env"],
            "invocation_id": kg["invocation_id"],
            "sglang_version": kg["sglang_version"],
        },
        "intended": {},
        "running": {},
    }


@pytest.mark.parametrize(
    "case, how",
    [
        (
            "killed",
            "it ended 2026-12-07T10:47:13Z: its main process was killed by signal 9/KILL, result 'signal', "
            "systemd restarted the unit by itself (Restart=, restart counter 1); NRestarts=1 now",
        ),
        (
            "restarted",
            "it ended 2026-12-07T10:48:29Z: exited cleanly, stopped by a `systemctl restart` job "
            "(by hand or a tool, not Restart=); NRestarts=0 now",
        ),
    ],
)
def test_a_restart_outside_a_deploy_is_drift_naming_both_invocations(case, how):
    r = report(case)
    running, verified = r["invocation_id"], r["known_good"]["invocation_id"]
    findings = gitops.drift_findings(r)
    assert len(findings) == 1, findings
    assert findings[0].startswith(
        f"running invocation {running} (started {r['invocation_started']}) is not the last verified deploy's "
        f"{verified}: {how}"
    )
    summ = gitops.summary("drift", {"head": "0" * 40, "inventory": "x"}, {"lab220": r}, 0)
    assert summ["status"] == "drift" and summ["changed_hosts"] == ["lab220"]
    assert summ["hosts"]["lab220"]["invocation"]["last_verified"] == verified
    assert summ["hosts"]["lab220"]["invocation"]["verified_end"]["invocation_id"] == verified
    md = gitops.render("drift", dict(head="0" * 40, inventory="x", finished="now"), {"lab220": r}, [])
    assert (
        f"Last lines of the verified invocation `{verified}`" in md
        and r["verified_end"]["last_lines"][-1] in md
    )
    assert SENTINEL not in md + json.dumps(summ)


def test_the_verified_invocation_running_is_no_drift_and_an_unknown_end_is_said():
    r = report("killed")
    assert gitops.drift_findings(dict(r, invocation_id=r["known_good"]["invocation_id"])) == []
    # A host whose known-good record has no invocation (kept by an older role): nothing to compare.
    assert gitops.drift_findings(dict(r, known_good=dict(r["known_good"], invocation_id=None))) == []
    (finding,) = gitops.drift_findings(dict(r, verified_end=None))
    assert "how it ended is not in the journal" in finding


def test_a_failed_service_says_how_its_main_process_ended():
    r = report("killed")
    failed = dict(
        r,
        active_state="failed",
        invocation_id=r["known_good"]["invocation_id"],
        main_exit={"code": "2", "status": "9", "result": "signal"},
    )
    assert gitops.drift_findings(failed) == [
        "the service is failed (main process killed, status 9, result 'signal')"
    ]
