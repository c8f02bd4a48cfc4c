"""The watch after a verified deploy (issue 38 item 2) on the shared deployed lab host (tests/integration/
conftest.py, fixture lab_host): a `kill -9` of the server's main process, which systemd restarts, is recorded
in the host's history by the role's watch timer within its interval, with how the killed invocation ended.
The lab inventory turns the watch off (inventory/lab/group_vars/lab/lab.yml); this test turns it on with a
2 s interval through the role's variables, and the baseline restore turns it off again."""

from __future__ import annotations

import datetime
import json
import time

from conftest import BASELINE_WINDOW, RESTORE_VERIFY, SGLANG_PLAYBOOK

INTERVAL = 2
WATCH = dict(RESTORE_VERIFY, sglang_watch_hours=1, sglang_watch_interval=INTERVAL)
# RestartSec (the role's 10 s) + the lab server's start + a tick, with room for a loaded machine.
WAIT_S = 60


def utc(text: str) -> float:
    return (
        datetime.datetime.strptime(text.rstrip("Z")[:19], "%Y-%m-%dT%H:%M:%S")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
    )


def test_a_kill_after_a_verified_deploy_is_recorded_by_the_watch_within_its_interval(lab_host):
    r = lab_host.playbook("-e", f"window={BASELINE_WINDOW}", extra=WATCH, playbook=SGLANG_PLAYBOOK)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    try:
        timer = lab_host.ssh("systemctl is-active sglang-deploy-watch.timer", check=False).stdout.strip()
        assert timer == "active", r.stdout[-4000:]
        before = lab_host.state()
        assert before.active_state == "active", before
        lab_host.ssh(f"kill -9 {before.main_pid}")
        deadline, found = time.monotonic() + WAIT_S, []
        while time.monotonic() < deadline and not found:
            time.sleep(1)
            found = [
                rec
                for rec in lab_host.history()
                if rec.get("watch") is not None and rec.get("ended_invocation_id") == before.invocation_id
            ]
        journal = lab_host.ssh(
            "journalctl -u sglang-deploy-watch.service -n 20 --no-pager", check=False
        ).stdout
        assert len(found) == 1, journal
        (rec,) = found
        after = lab_host.state()
        assert rec["result"] == "crashed_after_verify", rec
        assert rec["invocation_id"] == after.invocation_id != before.invocation_id
        assert rec["ended"]["code"] == "killed" and rec["ended"]["signal"] == "KILL", rec["ended"]
        assert rec["ended"]["restart_counter"] >= 1 and rec["n_restarts"] >= 1
        assert rec["ended"]["last_lines"], rec["ended"]
        assert "Main process exited, code=killed, status=9/KILL" in " ".join(rec["ended"]["systemd"])
        assert "crashed_after_verify" in journal
        # systemd started the new invocation right after its "Stopped" line (the end); a tick came within
        # the interval, give or take the start of a python process on a loaded machine.
        late = utc(rec["time"]) - utc(rec["ended"]["ended"])
        print(f"recorded {late:.1f} s after the restart (interval {INTERVAL} s)")
        assert late <= INTERVAL + 5, (late, rec)
        # Nothing new: the ticks after it write nothing.
        lines = len(lab_host.history())
        time.sleep(3 * INTERVAL)
        assert len(lab_host.history()) == lines
        assert json.dumps(rec).count(before.invocation_id) >= 2
    finally:
        lab_host.restore_baseline()
    assert (
        lab_host.ssh("systemctl is-active sglang-deploy-watch.timer", check=False).stdout.strip() != "active"
    )
