"""module_utils/sglang_journal on journalctl -o json output recorded on a systemd 252 lab host."""

from __future__ import annotations

import json
import sys
import time

import pytest
from ansible.module_utils import sglang_journal as sj
from ansible.module_utils import sglang_serverargs as sa
from conftest import FIXTURES

J = FIXTURES / "journal"
INV = {
    1: "d5e6d014036b4b5bb5567b6ccf223302",
    2: "5f67eaa332b14ce095abdbeeeb5c0407",
    3: "8a886876e13c4b869ed14adebc8adc35",
}


def entries(name):
    found, bad = sj.parse_json_lines((J / name).read_text())
    assert bad == 0
    return found


def window_of(messages):
    return sa.parse_server_args(sa.find_server_args_line(messages))["args"]["speculative_draft_window_size"]


def test_unit_output_mixes_runs_but_selection_keeps_one():
    everything = entries("unit-all.json")
    # `journalctl -u` holds all three runs: its LAST server_args line is run 3's, not run 1's.
    assert window_of([sj.message_text(e.get("MESSAGE")) for e in everything]) == 2048
    for n, window in ((1, None), (2, 2048), (3, 2048)):
        msgs = sj.messages(sj.select_invocation(everything, INV[n]))
        assert window_of(msgs) == window
        assert sum("server_args=" in m for m in msgs) == 1
    assert not any("has no effect" in m for m in sj.messages(sj.select_invocation(everything, INV[2])))


def test_order_and_last_n():
    everything = entries("unit-all.json")
    chosen = sj.select_invocation(list(reversed(everything)), INV[2])
    stamps = [int(e["__MONOTONIC_TIMESTAMP"]) for e in chosen]
    assert stamps == sorted(stamps)
    # systemd's own "Stopped" line carries INVOCATION_ID= of run 2 and is its last entry
    assert sj.messages(chosen, last=1) == [
        "Stopped h3a-sglang.service - h3a journal fixture recorder (prints recorded SGLang 0.5.23 output)."
    ]
    assert len(sj.messages(chosen, last=3)) == 3 and sj.messages(chosen, last=0) == []


def test_pid_match_respects_invocation_tag_and_start_time():
    everything = entries("unit-all.json")
    # PID 98 (run 2's MainPID), but asking for an unknown invocation: untagged PID lines only.
    assert sj.select_invocation(everything, "ffffffffffffffffffffffffffffffff", pids=[98]) == []
    untagged = [dict(e, _SYSTEMD_INVOCATION_ID=None) for e in entries("inv-2.json")]
    got = sj.select_invocation(untagged, "ffffffffffffffffffffffffffffffff", pids=[98])
    assert got and all(str(e["_PID"]) == "98" for e in got)
    late = sj.select_invocation(untagged, "ffff", pids=[98], since_monotonic_us=10**13)
    assert late == []


def test_message_as_byte_array_and_null():
    recs = entries("bytes-unit.json")
    texts = [sj.message_text(e.get("MESSAGE")) for e in recs]
    assert "Capturing batches (bs=8): \x1b[32m 50%\r100%" in texts
    assert "\ufffd\ufffd not utf-8" in texts
    # without --all journalctl prints null for the 19 KB server_args line
    without_all = entries("inv-2-without-all.json")
    assert any(e.get("MESSAGE") is None for e in without_all)
    assert sa.find_server_args_line([sj.message_text(e.get("MESSAGE")) for e in without_all]) is None


def test_non_json_lines_are_counted():
    found, bad = sj.parse_json_lines('{"MESSAGE": "a"}\n-- No entries --\n[1]\n\n')
    assert [e["MESSAGE"] for e in found] == ["a"] and bad == 2


# --------------------------------------------------------------------- the one journal reader
class _Journalctl:
    """A module whose journalctl answers with the recorded crash of vr-crash.service: ``--sync`` through
    run_command, the read itself streamed (sglang_journal.journal_lines, replaced by this one)."""

    def __init__(self, monkeypatch, sync_rc=0, rc=0):
        self.calls, self.sync_rc, self.rc = [], sync_rc, rc
        self.text = (FIXTURES / "systemd" / "journal-crash-e264219f.json").read_text()
        monkeypatch.setattr(sj, "journal_lines", self.journal_lines)

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, cmd, environ_update=None):
        assert environ_update["LANG"] == "C" and environ_update["SYSTEMD_PAGER"] == ""
        assert cmd[1:] == ["--sync"], f"only the sync goes through run_command, not {cmd}"
        self.calls.append(cmd)
        return self.sync_rc, "", "Failed to connect to journald" if self.sync_rc else ""

    def journal_lines(self, cmd):
        self.calls.append(cmd)
        if self.rc:
            raise sj.JournalError(f"{' '.join(cmd)} failed (rc={self.rc}): No journal files were found.")
        yield from (line.encode() for line in self.text.splitlines(keepends=True))


CRASH = "e264219f0da04f3da81b88c5e071680f"


def test_read_invocation_asks_for_this_boot_the_invocation_and_its_pid(monkeypatch):
    module = _Journalctl(monkeypatch)
    entries, notes = sj.read_invocation(module, CRASH, pids=[309], sync=False, last=80)
    assert module.calls == [
        [
            "/usr/bin/journalctl",
            "-o",
            "json",
            "--all",
            "--no-pager",
            "-b",
            "-n",
            "80",
            f"INVOCATION_ID={CRASH}",
            "+",
            f"_SYSTEMD_INVOCATION_ID={CRASH}",
            "+",
            "_PID=309",
        ]
    ]
    assert notes == [] and len(entries) == 9
    assert "-u" not in module.calls[0]


def test_read_invocation_tolerates_a_failed_sync_and_raises_on_a_failed_read(monkeypatch):
    module = _Journalctl(monkeypatch, sync_rc=1)
    _entries, notes = sj.read_invocation(module, CRASH)
    assert module.calls[0] == ["/usr/bin/journalctl", "--sync"] and "reading anyway" in notes[0]
    try:
        sj.read_invocation(_Journalctl(monkeypatch, rc=1), CRASH)
    except sj.JournalError as exc:
        assert "rc=1" in str(exc) and "No journal files" in str(exc)
    else:
        raise AssertionError("a failed journalctl read must raise JournalError")


# A stand-in for journalctl on a server that keeps serving: prints the recorded invocation
# (tests/fixtures/journal/stale-inv-2.json: SGLang 0.5.23's startup lines, its ready line, then a left-over
# process's line), then an access line every millisecond, 20000 of them - a server up for days.
ACCESS = '{"MESSAGE": "INFO: 10.0.0.1 - GET /health HTTP/1.1 200 OK", "_PID": "165"}'
_FOREVER = [
    sys.executable,
    "-c",
    "import sys, time\n"
    "sys.stdout.write(open(sys.argv[1]).read()); sys.stdout.flush()\n"
    "for _ in range(20000):\n"
    f"    print({ACCESS!r}, flush=True)\n"
    "    time.sleep(0.001)\n",
    str(FIXTURES / "journal" / "stale-inv-2.json"),
]
STALE = "7639c897365042fe9cf56a91777d626c"


def _main_pids_ready(entry):
    return entry.get("_PID") == "165" and sj.entry_invocation(entry) == STALE


def test_stream_stops_at_the_main_process_ready_line_of_an_endless_journal():
    started = time.monotonic()
    entries, bad, stopped = sj.stream_entries(_FOREVER, sj.READY_MESSAGE, _main_pids_ready)
    assert stopped and bad == 0 and time.monotonic() - started < 20
    assert len(entries) == 9 and sj.READY_MESSAGE in sj.message_text(entries[-1]["MESSAGE"])
    # The left-over process's server_args line, logged after the ready line, was never read.
    assert all(e["_PID"] == "165" for e in entries)


def test_stream_reads_to_the_end_without_the_line_and_raises_on_a_failed_run(tmp_path):
    printer = [sys.executable, "-c", "import sys; sys.stdout.write(open(sys.argv[1]).read())", _FOREVER[-1]]
    entries, bad, stopped = sj.stream_entries(printer, "no such line", _main_pids_ready)
    assert not stopped and len(entries) == 10 and bad == 0
    failing = [
        sys.executable,
        "-c",
        "import sys; print('No journal files were found.', file=sys.stderr); sys.exit(1)",
    ]
    with pytest.raises(sj.JournalError, match="rc=1.*No journal files"):
        sj.stream_entries(failing, sj.READY_MESSAGE, _main_pids_ready)
    with pytest.raises(sj.JournalError, match="could not be run"):
        sj.stream_entries([str(tmp_path / "missing-journalctl")], sj.READY_MESSAGE, _main_pids_ready)


def test_invocation_lines_exit_and_excerpt_of_a_recorded_crash():
    raw, _bad = sj.parse_json_lines((FIXTURES / "systemd" / "journal-crash-e264219f.json").read_text())
    lines = sj.invocation_lines(sj.select_invocation(raw, CRASH, [309]), "vr-crash.service", CRASH)
    assert [line["systemd"] for line in lines] == [True, False, False, False, False, True, True, True, True]
    # systemd's lines about another unit are dropped
    assert sj.invocation_lines(raw, "other.service", CRASH)[0]["pid"] == "309"
    exit_info = sj.exit_from_journal(lines)
    assert (exit_info["code"], exit_info["status"], exit_info["result"]) == ("exited", "1", "exit-code")
    assert sj.latest_phase(lines, str) == "RuntimeError: injected crash"
    assert sj.latest_phase(lines, str, ignore="injected") == "Traceback (most recent call last):"
    shown = sj.format_lines(lines, 2, str.upper)
    assert len(shown) == 2
    assert shown[-1].endswith("SYSTEMD: STOPPED VR-CRASH.SERVICE - VERIFIED-RESTART TEST VR-CRASH.")
    assert sj.format_lines(lines, 0, str) == []


RD = FIXTURES / "restart_drift"


@pytest.mark.parametrize(
    "case, want",
    [
        (
            "killed",
            dict(code="killed", status="9", signal="KILL", result="signal", restart_counter=1, job="restart"),
        ),
        (
            "restarted",
            dict(code=None, status=None, signal=None, result="success", restart_counter=None, job="restart"),
        ),
    ],
)
def test_how_the_verified_invocation_ended_by_kill_9_or_by_hand(case, want):
    """The newest lines of the last verified invocation (tests/fixtures/restart_drift/, recorded after a
    kill -9 that systemd's Restart= answered, and after a hand `systemctl restart`): its exit, result,
    systemd's restart counter and the job that stopped it, from systemd's own lines tagged with its
    INVOCATION_ID."""
    invocation = json.loads((RD / case / "known-good.json").read_text())["invocation_id"]
    found, bad = sj.parse_json_lines((RD / case / "verified-journal.json").read_text())
    assert bad == 0 and len(found) == 40
    end = sj.invocation_end(found, "sglang.service", invocation)
    assert {k: end[k] for k in want} == want
    assert end["invocation_id"] == invocation and end["ended"].startswith("2026-12-07T10:4")
    assert end["systemd"][-1].startswith("Stopped sglang.service") and len(end["last_lines"]) == 3
    assert sj.invocation_end(found, "sglang.service", "0" * 32) is None


def test_an_invocation_of_an_earlier_boot_is_asked_of_every_boot():
    cmd = sj.invocation_command("journalctl", "AB-cd", last=40, this_boot=False)
    assert cmd == [
        "journalctl", "-o", "json", "--all", "--no-pager", "-n", "40",
        "INVOCATION_ID=abcd", "+", "_SYSTEMD_INVOCATION_ID=abcd",
    ]  # fmt: skip
    assert "-b" in sj.invocation_command("journalctl", "abcd")
