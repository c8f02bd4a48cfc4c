"""tools/gitops/apply's apply.md: the merged pull request's apply comment (issue 39 item 1), rendered by
gitops.render_apply over the report directories of three runs recorded on a lab fleet
(tests/fixtures/canary/SOURCE.md, reports/) with tools/rollout_status.py's rows."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools" / "gitops"))
sys.path.insert(0, str(REPO / "tools"))

import gitops  # noqa: E402
import rollout_status  # noqa: E402

RUNS = REPO / "tests" / "fixtures" / "canary" / "reports"


def comment(run: str, rc: int) -> str:
    rows, canary = rollout_status.status(RUNS / run)
    # What tools/gitops/apply writes into apply.json before it renders apply.md.
    record = {
        "ref": "main",
        "commit": "5fcea08c0ffee5fcea08c0ffee5fcea08c0ffee0",
        "inventory": "inventory/site/hosts.yml",
        "started": "2026-12-07T14:02:01Z",
        "finished": "2026-12-07T14:04:10Z",
        "ansible_rc": rc,
        "status": "verified" if rc == 0 else "failed",
    }
    return gitops.render_apply(record, rows, canary, rollout_status.RESUME)


def test_a_failed_canary_shows_each_figure_against_the_unchanged_hosts_and_its_limit():
    body = comment("failed", 2)
    assert body.splitlines()[0] == gitops.APPLY_MARKER
    assert "## SGLang deploy FAILED: `5fcea08c0ffe`" in body
    assert "ansible-playbook exited 2" in body
    assert (
        "| lab200 | rolled back (canary verdict Failed) | config 2f298065b282, window 2048 | Failed |" in body
    )
    assert "| lab201 | not reached: still on the old configuration | - | - | - |" in body
    assert "### Canary verdict: Failed" in body
    assert "37 and 44 requests (at least 20 each)" in body
    rows = {line.split(" | ")[0].lstrip("| "): line for line in body.splitlines() if line.startswith("| ")}
    assert (
        rows["error_ratio"]
        == "| error_ratio | 0.2162 | 0 | at most the unchanged hosts' + 0.01 | 0.01 | failed |"
    )
    assert rows["aborted_ratio"].endswith("| 0.01 | passed |")
    assert rows["ttft_seconds"] == (
        "| ttft_seconds | 0.06178 | 0.01955 | at most 1.2x the unchanged hosts' | 0.02346 | failed |"
    )
    assert rows["tokens_per_verify"] == (
        "| tokens_per_verify | 2 | 4 | at least 0.9x the unchanged hosts' | 3.6 | failed |"
    )
    assert "HOLDING" not in body


def test_an_inconclusive_canary_holds_and_says_how_to_resume():
    body = comment("inconclusive", 2)
    assert "## SGLang deploy HOLDING after an Inconclusive canary verdict: `5fcea08c0ffe`" in body
    # A hold is not a failed verification: nothing was rolled back.
    assert "ansible-playbook exited" not in body
    assert "| tokens_per_verify | - | - | at least 0.9x the unchanged hosts' | - | no_data |" in body
    assert body.rstrip().endswith(f"> The rollout is HOLDING: {rollout_status.RESUME}.")


def test_a_run_without_a_canary_verdict_shows_each_hosts_phase_only():
    body = comment("promoted", 0)
    assert "## SGLang deploy applied and verified: `5fcea08c0ffe`" in body
    assert "| lab201 | verified, restarted | config aa0dda6eb31d, window 4096 | - |" in body
    assert "Canary verdict" not in body


@pytest.mark.parametrize("run", ["failed", "inconclusive", "promoted"])
def test_every_table_row_has_the_headers_cells(run):
    tables = [line for line in comment(run, 0).splitlines() if line.startswith("|")]
    assert tables
    widths = {line.count(" | ") for line in tables if not line.startswith("|---")}
    assert widths <= {4, 5}, tables
