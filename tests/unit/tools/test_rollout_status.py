"""tools/rollout_status.py: the status of one rollout per host (issue 39 item 4), over the report directories
of three runs recorded on a lab fleet (tests/fixtures/canary/SOURCE.md, reports/)."""

from __future__ import annotations

import contextlib
import importlib.util
import io

import pytest
from conftest import FIXTURES, REPO

spec = importlib.util.spec_from_file_location("rollout_status", REPO / "tools" / "rollout_status.py")
rollout_status = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rollout_status)
RUNS = FIXTURES / "canary" / "reports"


@pytest.mark.parametrize(
    "run, want",
    [
        (
            "failed",
            {
                "lab200": (
                    "rolled back (canary verdict Failed)",
                    "config 2f298065b282, window 2048",
                    "Failed",
                ),
                "lab201": ("not reached: still on the old configuration", "-", "-"),
            },
        ),
        (
            "inconclusive",
            {
                "lab200": (
                    "HOLDING (canary verdict Inconclusive)",
                    "config aa0dda6eb31d, window 4096",
                    "Inconclusive",
                ),
                "lab201": ("not reached: still on the old configuration", "-", "-"),
            },
        ),
        (
            "promoted",
            {
                "lab200": ("verified, nothing to change", "config aa0dda6eb31d, window 4096", "-"),
                "lab201": ("verified, restarted", "config aa0dda6eb31d, window 4096", "-"),
            },
        ),
    ],
)
def test_each_host_shows_phase_configuration_verdict_and_when(run, want):
    rows, _canary = rollout_status.status(RUNS / run)
    got = {row["host"]: (row["phase"], row["config"], row["verdict"]) for row in rows}
    assert got == want
    assert all(row["when"].startswith("2026-12-07T") for row in rows if row["config"] != "-")


def test_a_host_the_fleet_revert_took_back_says_so_canary_or_not():
    reverted = {"result": "reverted_by_run", "restarted": True}
    canary = {"verdict": "Successful", "canary_hosts": ["lab200"]}
    for host in ("lab200", "lab201"):
        assert rollout_status.phase(host, reverted, canary).startswith("reverted (a later batch failed)")
    assert rollout_status.phase("lab201", {"result": "deployed", "restarted": True}, canary) == (
        "verified, restarted"
    )


def test_a_held_run_says_how_to_resume_and_a_failed_one_why():
    held = rollout_status.render(*rollout_status.status(RUNS / "inconclusive"))
    assert "the rollout is HOLDING: resume with -e canary=promote" in held and "-e canary=abort" in held
    failed = rollout_status.render(*rollout_status.status(RUNS / "failed"))
    assert "canary: Failed - error_ratio 0.2162" in failed and "HOLDING" not in failed


def test_the_command_prints_the_run_it_read(capsys):
    rollout_status.main(["rollout_status.py", str(RUNS / "promoted")])
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "rollout promoted" and "lab201  verified, restarted" in out


def test_a_directory_that_is_not_there_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="not a report directory"), contextlib.redirect_stdout(io.StringIO()):
        rollout_status.main(["rollout_status.py", str(tmp_path / "nope")])
