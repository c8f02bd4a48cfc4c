"""The watch after a verified deploy (issue 38 item 2): module_utils/sglang_watch.py's decision, table-driven
over what a lab host recorded after a verified deploy (tests/fixtures/restart_drift/: `kill -9` of the main
process, which systemd restarted, and a hand `systemctl restart`), and roles/sglang/files/sglang-deploy-watch
run as its unit runs it, with systemctl and journalctl stand-ins that print those recordings: a tick records
the new invocation once, with the ended one's last lines and the kernel's Xid/OOM lines of the same minutes
(tests/fixtures/watch/), and a tick with nothing new, or under a deploy's lock, writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from ansible.module_utils import sglang_journal as sj
from ansible.module_utils import sglang_systemd
from ansible.module_utils import sglang_watch as sw
from conftest import FIXTURES, REPO

RD = FIXTURES / "restart_drift"
WATCH = REPO / "roles" / "sglang" / "files" / "sglang-deploy-watch"
UNIT = "sglang.service"
NOW = 1796640450.0  # 16 s after the killed invocation's end (its journal's newest line)


def recorded(case):
    """(systemctl show, known-good metadata, the verified invocation's end) as the lab host recorded them."""
    props = sglang_systemd.parse_show((RD / case / "show.txt").read_text())
    kg = json.loads((RD / case / "known-good.json").read_text())
    entries, bad = sj.parse_json_lines((RD / case / "verified-journal.json").read_text())
    assert bad == 0
    return props, kg, sj.invocation_end(entries, UNIT, kg["invocation_id"], own_lines=10)


def verified(kg, at=NOW - 600):
    """The history record of the verified deploy (the role's record: result, unit, invocation_id, time)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(at))
    return {"time": stamp, "unit": UNIT, "result": "verified", "invocation_id": kg["invocation_id"]}


def crash(kg, running, at, crashes=1, n_restarts=1):
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(at))
    return {
        "time": stamp,
        "unit": UNIT,
        "result": sw.CRASHED,
        "watch": {},
        "invocation_id": running,
        "verified_invocation_id": kg["invocation_id"],
        "crashes": crashes,
        "n_restarts": n_restarts,
    }


def found_for(case, **change):
    props, kg, end = recorded(case)
    found = {
        "unit": UNIT,
        "lock_held": False,
        "props": props,
        "known_good": kg,
        "history": [verified(kg)],
        "end": end,
        "files_known_good": True,
        "now": NOW,
    }
    return dict(found, **change)


KILLED_PROPS, KILLED_KG, _ = recorded("killed")
RUNNING = KILLED_PROPS["InvocationID"]
OFF = {"revert": False, "revert_count": 3, "revert_window": 600}
ON = {"revert": True, "revert_count": 3, "revert_window": 600}
# Two crashes of the verified invocation's successors within the revert window: the third makes a loop.
LOOP = [verified(KILLED_KG), crash(KILLED_KG, "a" * 32, NOW - 100), crash(KILLED_KG, "b" * 32, NOW - 50)]

# (id, case, changes to what the watch found, settings, action, result)
CASES = [
    ("killed-restarted-by-systemd", "killed", {}, OFF, "record", sw.CRASHED),
    ("restarted-by-hand", "restarted", {}, OFF, "record", sw.RESTARTED),
    (
        "nothing-happened",
        "killed",
        {"props": dict(KILLED_PROPS, InvocationID=KILLED_KG["invocation_id"], NRestarts="0")},
        OFF,
        "idle",
        None,
    ),
    (
        "already-recorded",
        "killed",
        {"history": [verified(KILLED_KG), crash(KILLED_KG, RUNNING, NOW - 5)]},
        OFF,
        "idle",
        None,
    ),
    ("deploy-holds-the-lock", "killed", {"lock_held": True}, OFF, "idle", None),
    ("no-verified-deploy", "killed", {"known_good": None}, OFF, "idle", None),
    (
        "verified-invocation-failed-for-good",
        "killed",
        {
            "props": dict(KILLED_PROPS, InvocationID=KILLED_KG["invocation_id"], ActiveState="failed"),
        },
        OFF,
        "record",
        sw.CRASHED,
    ),
    (
        "crash-loop-of-files-not-known-good",
        "killed",
        {
            "history": LOOP,
            "files_known_good": False,
        },
        ON,
        "revert",
        sw.CRASHED,
    ),
    (
        "crash-loop-of-the-known-good-files",
        "killed",
        {"history": LOOP},
        ON,
        "record",
        sw.CRASH_LOOP,
    ),
    (
        "crash-loop-without-the-opt-in",
        "killed",
        {
            "history": LOOP,
            "files_known_good": False,
        },
        OFF,
        "record",
        sw.CRASHED,
    ),
    (
        "crashes-outside-the-window",
        "killed",
        {
            "history": [
                verified(KILLED_KG),
                crash(KILLED_KG, "a" * 32, NOW - 900),
                crash(KILLED_KG, "b" * 32, NOW - 700),
            ],
            "files_known_good": False,
        },
        ON,
        "record",
        sw.CRASHED,
    ),
    (
        "several-restarts-in-one-tick-count",
        "killed",
        {"props": dict(KILLED_PROPS, NRestarts="3"), "files_known_good": False},
        ON,
        "revert",
        sw.CRASHED,
    ),
]


@pytest.mark.parametrize(
    "case,change,settings,action,result", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_what_the_watch_found_decides_record_result_and_revert(case, change, settings, action, result):
    found = found_for(case, **change)
    decision = sw.decide(found, settings)
    assert (decision["action"], decision["result"]) == (action, result), decision
    if action == "idle":
        assert sw.look_at(found) is None or found["lock_held"] or not found["known_good"]
    else:
        assert decision["why"]


def test_a_crash_record_names_the_new_invocation_and_the_one_that_ended():
    decision = sw.decide(found_for("killed"), OFF)
    assert decision["invocation_id"] == RUNNING
    assert decision["ended_invocation_id"] == KILLED_KG["invocation_id"]
    assert decision["crashes"] == 1 and decision["crashes_in_window"] == 1


def test_only_xid_and_oom_lines_of_the_minutes_of_the_end_are_kept():
    entries, bad = sj.parse_json_lines((FIXTURES / "watch" / "kernel.json").read_text())
    assert bad == 0
    _props, _kg, end = recorded("killed")
    lines = sw.kernel_lines(entries, sw.parse_utc(end["ended"]))
    assert [line.split(" ", 1)[1].split(":")[0] for line in lines] == [
        "NVRM",
        "python invoked oom-killer",
        "Out of memory",
        "oom_reaper",
    ]
    assert "79, pid=1208, GPU has fallen off the bus" in lines[0]
    assert all(line[:4] == "2026" for line in lines)


# ---- the script, as its unit runs it ---------------------------------------------------------------------


@pytest.fixture
def host(tmp_path):
    """A host after the verified deploy of tests/fixtures/restart_drift/killed/: its known-good metadata and
    history record; systemctl shows SHOW (written per test), journalctl prints the recorded journal (the
    kernel transport: tests/fixtures/watch/kernel.json) and logs each call."""
    state, kg_dir, run = tmp_path / "state", tmp_path / "state" / "known-good", tmp_path / "run"
    for d in (state, kg_dir, run):
        d.mkdir(parents=True)
    kg = json.loads((RD / "killed" / "known-good.json").read_text())
    (kg_dir / "sglang.json").write_text(json.dumps(kg))
    history = state / "history.jsonl"
    history.write_text(json.dumps(verified(kg, at=time.time() - 600)) + "\n")
    show = tmp_path / "show.txt"
    systemctl = tmp_path / "systemctl"
    systemctl.write_text(
        f'#!/bin/sh\n[ "$1" = show ] && cat {show} || echo "$@" >> {tmp_path / "systemctl.log"}\nexit 0\n'
    )
    journalctl = tmp_path / "journalctl"
    journalctl.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path / "journalctl.log"}\n'
        'case "$*" in *--sync*) exit 0;; *_TRANSPORT=kernel*) cat '
        f"{FIXTURES / 'watch' / 'kernel.json'};; *) cat {RD / 'killed' / 'verified-journal.json'};; esac\n"
    )
    for tool in (systemctl, journalctl):
        tool.chmod(0o755)
    argv = [
        sys.executable,
        str(WATCH),
        "--name",
        "sglang",
        "--unit-path",
        str(tmp_path / "sglang.service"),
        "--env-path",
        str(tmp_path / "sglang.env"),
        "--known-good-dir",
        str(kg_dir),
        "--history",
        str(history),
        "--lock",
        str(run / "sglang.lock"),
        "--hours",
        "24",
        "--systemctl",
        str(systemctl),
        "--journalctl",
        str(journalctl),
        "--lib",
        str(REPO / "module_utils"),
    ]
    return {
        "root": tmp_path,
        "argv": argv,
        "history": history,
        "show": show,
        "kg": kg,
        "lock": run / "sglang.lock",
    }


def tick(host):
    r = subprocess.run(host["argv"], capture_output=True, text=True, check=False, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def journal_calls(host):
    log = host["root"] / "journalctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_kill_after_the_verified_deploy_is_recorded_once_with_its_end_and_the_kernels_lines(host):
    host["show"].write_text((RD / "killed" / "show.txt").read_text())
    before = host["history"].read_bytes()
    r = tick(host)
    records = [json.loads(line) for line in host["history"].read_text().splitlines()]
    assert len(records) == 2 and host["history"].read_bytes().startswith(before)
    rec = records[-1]
    assert rec["result"] == "crashed_after_verify" and rec["unit"] == UNIT
    assert rec["invocation_id"] == RUNNING and rec["ended_invocation_id"] == host["kg"]["invocation_id"]
    assert rec["ended"]["code"] == "killed" and rec["ended"]["signal"] == "KILL"
    assert rec["ended"]["restart_counter"] == 1 and rec["n_restarts"] == 1
    assert rec["ended"]["last_lines"], rec["ended"]
    assert any("GPU has fallen off the bus" in line for line in rec["kernel"])
    assert any("Out of memory: Killed process" in line for line in rec["kernel"])
    assert r.stdout.startswith("<4>") and "crashed_after_verify" in r.stdout
    # The next tick finds nothing new: no write, no journal read.
    calls, stamp = len(journal_calls(host)), host["history"].stat().st_mtime_ns
    r = tick(host)
    assert r.stdout == "" and host["history"].stat().st_mtime_ns == stamp
    assert len(journal_calls(host)) == calls


def test_a_tick_with_nothing_new_reads_no_journal_and_writes_nothing(host):
    show = (RD / "killed" / "show.txt").read_text().replace(RUNNING, host["kg"]["invocation_id"])
    host["show"].write_text(show.replace("NRestarts=1", "NRestarts=0"))
    stamp, data = host["history"].stat().st_mtime_ns, host["history"].read_bytes()
    r = tick(host)
    assert r.stdout == "" and journal_calls(host) == []
    assert host["history"].stat().st_mtime_ns == stamp and host["history"].read_bytes() == data


def test_a_deploy_holding_the_lock_is_left_alone(host):
    host["show"].write_text((RD / "killed" / "show.txt").read_text())
    host["lock"].write_text("{}")
    data = host["history"].read_bytes()
    r = tick(host)
    assert r.stdout == "" and host["history"].read_bytes() == data and journal_calls(host) == []


def test_the_watch_ends_sglang_watch_hours_after_the_verified_deploy(host):
    host["show"].write_text((RD / "killed" / "show.txt").read_text())
    host["history"].write_text(json.dumps(verified(host["kg"], at=time.time() - 2 * 3600)) + "\n")
    data = host["history"].read_bytes()
    argv = list(host["argv"])
    argv[argv.index("--hours") + 1] = "1"
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout == "" and host["history"].read_bytes() == data


def test_a_crash_loop_of_edited_files_is_reverted_to_the_known_good_set_and_recorded(host):
    """sglang_watch_revert: the third crash within the window, of a unit edited on the host since the verified
    deploy, restores the known-good set (kept by module_utils/sglang_history.py, as the deploy's record keeps
    it), reloads, restarts, and records reverted_by_watch once the new invocation stayed up."""
    from ansible.module_utils import sglang_history

    root, kg = host["root"], host["kg"]
    unit, env = root / "sglang.service", root / "sglang.env"
    unit.write_text("[Service]\nExecStart=/opt/sglang/bin/sglang serve --window 2048\n")
    env.write_text("HF_HOME=/var/lib/sglang/.cache/huggingface\n")
    kg_dir = root / "state" / "kept"
    spec = {
        "dir": str(kg_dir),
        "files": {"unit": str(unit), "env": str(env)},
        "meta_name": "sglang.json",
        "meta": {"unit": UNIT, "invocation_id": kg["invocation_id"]},
        "api_key": "",
        "sha256": {},
    }
    sglang_history.keep_known_good(spec, write=True)
    good = unit.read_bytes()
    unit.write_text("[Service]\nExecStart=/opt/sglang/bin/sglang serve --window 9999\n")
    now = time.time()
    lines = [verified(kg, at=now - 300), crash(kg, "a" * 32, now - 100), crash(kg, "b" * 32, now - 50)]
    host["history"].write_text("".join(json.dumps(r) + "\n" for r in lines))
    # The last recorded invocation ("b"*32) ended: the killed recording's show, its new invocation running.
    host["show"].write_text((RD / "killed" / "show.txt").read_text())
    argv = list(host["argv"])
    argv[argv.index("--known-good-dir") + 1] = str(kg_dir)
    argv += ["--revert", "--revert-count", "3", "--revert-window", "600", "--stable-seconds", "2"]
    r = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert unit.read_bytes() == good
    rec = json.loads(host["history"].read_text().splitlines()[-1])
    assert rec["result"] == "reverted_by_watch" and rec["crashes_in_window"] == 3, rec
    assert rec["revert"]["restored"] == [str(unit)]
    assert "reverted_by_watch" in r.stdout
    calls = (root / "systemctl.log").read_text().splitlines()
    assert calls == ["daemon-reload", f"reset-failed {UNIT}", f"restart --no-block {UNIT}"]
