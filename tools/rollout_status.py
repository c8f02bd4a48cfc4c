#!/usr/bin/env python3
"""The status of one rollout, per host: phase, configuration, verdict, when (issue 39 item 4).

    tools/rollout_status.py [out/deploy/<run>]      # default: the newest run under out/deploy/

Reads the run's report directory on the controller: each host's report (<host>.json, written after its deploy
was verified) and canary.json (the canary's verdict, its figures and thresholds, or the operator's
`-e canary=promote|abort`). A held run says how to resume. Standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The canary's own words for how a held rollout resumes (module_utils is standard library only).
sys.path.insert(0, str(REPO / "module_utils"))
from sglang_canary import RESUME  # noqa: E402


def phase(host, report, canary):
    """What happened to ``host`` in this run."""
    verdict = (canary or {}).get("verdict")
    # The revert play rewrote the report (playbooks/sglang.yml, sglang_fleet_revert).
    if (report or {}).get("result") == "reverted_by_run":
        return "reverted (a later batch failed): back on the configuration from before the run"
    if host in (canary or {}).get("canary_hosts", []):
        return {
            "Failed": "rolled back (canary verdict Failed)",
            "Inconclusive": "HOLDING (canary verdict Inconclusive)",
            "Successful": "canary, verified",
            "Promoted": "canary promoted by the operator",
            "Aborted": "rolled back (canary aborted by the operator)",
        }.get(verdict, "canary")
    if report is None:
        return "not reached: still on the old configuration"
    return "verified, restarted" if report.get("restarted") else "verified, nothing to change"


def status(run_dir):
    """Rows {host, phase, config, verdict, when} of one run's report directory, and its canary record."""
    run_dir = Path(run_dir)
    canary_path = run_dir / "canary.json"
    canary = json.loads(canary_path.read_text()) if canary_path.exists() else None
    reports = {
        path.stem: json.loads(path.read_text())
        for path in sorted(run_dir.glob("*.json"))
        if path != canary_path
    }
    hosts = sorted(
        set(reports)
        | set((canary or {}).get("canary_hosts", []))
        | set((canary or {}).get("baseline_hosts", []))
    )
    rows = []
    for host in hosts:
        report = reports.get(host)
        in_canary = host in (canary or {}).get("canary_hosts", [])
        config = "-"
        if report is not None:
            window = (report.get("intended") or {}).get("speculative_draft_window_size")
            config = f"config {report.get('config_hash')}" + (
                f", window {window}" if window is not None else ""
            )
        rows.append(
            {
                "host": host,
                "phase": phase(host, report, canary),
                "config": config,
                "verdict": (canary or {}).get("verdict") or "-" if in_canary else "-",
                "when": (canary or {}).get("when")
                if in_canary and canary.get("when")
                else (report or {}).get("written", "-"),
            }
        )
    return rows, canary


def render(rows, canary):
    widths = {
        key: max([len(key)] + [len(str(row[key])) for row in rows])
        for key in ("host", "phase", "config", "verdict", "when")
    }
    lines = ["  ".join(key.ljust(width) for key, width in widths.items())]
    lines += ["  ".join(str(row[key]).ljust(width) for key, width in widths.items()) for row in rows]
    if canary and canary.get("reason"):
        lines.append(f"canary: {canary.get('verdict')} - {canary['reason']}")
    if canary and canary.get("verdict") == "Inconclusive":
        lines.append(f"the rollout is HOLDING: {RESUME}")
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        run_dir = Path(argv[1])
    else:
        runs = sorted((REPO / "out" / "deploy").glob("*/"))
        if not runs:
            sys.exit("no run under out/deploy/: name a report directory")
        run_dir = runs[-1]
    if not run_dir.is_dir():
        sys.exit(f"{run_dir}: not a report directory")
    rows, canary = status(run_dir)
    print(f"rollout {run_dir.name}")
    print(render(rows, canary))


if __name__ == "__main__":
    main(sys.argv)
