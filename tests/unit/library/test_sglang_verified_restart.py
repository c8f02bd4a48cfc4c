"""sglang_verified_restart: the REAL main() replaying recorded systemd sequences from lab40.

Each scenario replays a `*.jsonl` of successive `systemctl show` outputs (tests/fixtures/systemd/
SOURCE.md) on a fake CLOCK_MONOTONIC: `systemctl show` returns the latest snapshot recorded at or
before the fake time, `systemctl start|restart --no-block` moves the clock to the recorded request,
and every poll advances the clock by poll_interval (no real sleeping). /proc and /sys/fs/cgroup
point at the proc trees copied from the same host; journalctl returns the recorded JSON.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket

import pytest
from ansible.module_utils import sglang_http, sglang_journal
from ansible.module_utils import sglang_running_args as running_args
from ansible.module_utils import sglang_speculation as speculation_utils
from ansible.module_utils import sglang_verifier as worker
from ansible.module_utils.basic import AnsibleModule
from conftest import FIXTURES, call_main, load_module

FIX = FIXTURES / "systemd"
SECRET = "sk-sentinel-123"
SHOW_COST_US = 10_000  # one `systemctl show` takes ~10 ms on lab40


class Replay:
    def __init__(self, sequence=None, initial=None, journal=None, ready_at_us=None):
        rows = [json.loads(line) for line in (FIX / sequence).read_text().splitlines()] if sequence else []
        self.snaps = [(r["t_us"], r["show"]) for r in rows if "show" in r]
        marks = [r for r in rows if "request_us" in r]
        self.request_us = marks[0]["request_us"] if marks else None
        if initial is not None:
            self.snaps = [(0, (FIX / initial).read_text())]
        self.now = self.snaps[0][0] + 1000 if self.snaps else 1_000_000
        self.journal = (FIX / journal).read_text() if journal else ""
        self.ready_at_us = ready_at_us
        self.commands = []

    # fake clock -------------------------------------------------------------
    def now_us(self):
        return self.now

    def sleep(self, seconds):
        self.now += int(seconds * 1e6)

    # fake run_command ---------------------------------------------------------
    def run_command(self, cmd, environ_update=None, **_kw):
        assert isinstance(cmd, list) and environ_update and environ_update.get("LANG") == "C"
        self.commands.append(cmd[1:])
        tool, verb = cmd[0].rsplit("/", 1)[-1], cmd[1]
        if tool == "systemctl" and verb == "show":
            self.now += SHOW_COST_US
            text = [s for t, s in self.snaps if t <= self.now - SHOW_COST_US] or [self.snaps[0][1]]
            return 0, text[-1], ""
        if tool == "systemctl" and verb in ("restart", "start"):
            assert cmd[2] == "--no-block"
            self.now = max(self.now, self.request_us or self.now)
            return 0, "", ""
        if tool == "systemctl" and verb == "reset-failed":
            return 0, "", ""
        if tool == "journalctl" and verb == "--sync":
            return 0, "", ""
        raise AssertionError(f"unexpected command {cmd}")

    def journal_lines(self, cmd):
        """journalctl's output as sglang_journal reads it (streamed, not through run_command)."""
        self.commands.append(cmd[1:])
        yield from (line.encode() for line in self.journal.splitlines(keepends=True))

    def http_status(self, _url, _headers, _timeout):
        if self.ready_at_us is not None and self.now >= self.ready_at_us:
            self.now += 1_000_000  # SGLang's /health_generate takes >= 1 s
            return 200, ""
        return None, "[Errno 111] Connection refused"


def patch_tools(monkeypatch, replay):
    monkeypatch.setattr(AnsibleModule, "run_command", lambda _self, cmd, **kw: replay.run_command(cmd, **kw))
    monkeypatch.setattr(sglang_journal, "journal_lines", replay.journal_lines)
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda _self, name, **_kw: f"/usr/bin/{name}")


def run(monkeypatch, replay, args, tree=None, threaded=False):
    mod = load_module("sglang_verified_restart")
    monkeypatch.setattr(worker, "clock_us", replay.now_us)
    monkeypatch.setattr(worker, "pause", replay.sleep)
    monkeypatch.setattr(worker, "http_status", replay.http_status)
    monkeypatch.setattr(worker.HealthProbe, "threaded", threaded)
    monkeypatch.setattr(worker, "boottime_offset_us", lambda: 0)
    patch_tools(monkeypatch, replay)
    base = FIX / (tree or "stale-after")
    monkeypatch.setattr(worker, "PROC_ROOT", str(base / "proc"))
    monkeypatch.setattr(worker, "CGROUP_ROOT", str(base / "sys" / "fs" / "cgroup"))
    monkeypatch.setattr(worker, "BOOT_ID_PATH", str(base / "proc" / "sys" / "kernel" / "random" / "boot_id"))
    result, text = call_main(mod, args)
    assert SECRET not in text
    return result


def inv_of(sequence, index=-1):
    rows = [json.loads(line) for line in (FIX / sequence).read_text().splitlines() if '"show"' in line]
    props = dict(line.split("=", 1) for line in rows[index]["show"].splitlines())
    return props


# ---------------------------------------------------------------------------------------- healthy
def test_healthy_restart_accepts_only_the_new_invocation(monkeypatch):
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    before, after = inv_of("healthy-restart.jsonl", 0), inv_of("healthy-restart.jsonl")
    res = run(
        monkeypatch,
        replay,
        {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "stable_seconds": 2, "health_count": 3},
        tree="healthy",
    )
    assert not res.get("failed"), res["msg"]
    assert res["changed"] and res["restarted"] and not res["pending"]
    assert res["previous_invocation_id"] == before["InvocationID"] != res["invocation_id"]
    assert res["invocation_id"] == after["InvocationID"] and res["main_pid"] == 554
    assert res["start_monotonic_us"] == int(after["ExecMainStartTimestampMonotonic"]) > replay.request_us
    assert res["listener"] == {
        "pid": 554,
        "pids": [554],
        "cgroup": "/system.slice/vr-healthy.service",
        "address": "0.0.0.0",
        "in_cgroup": True,
    }
    t = res["timings"]
    assert 0 < t["started"] <= t["port_open"] <= t["ready"] < t["stable"] == t["total"]
    assert t["stable"] - t["ready"] >= 2  # the stability window really elapsed
    assert res["baseline"]["streak"] >= 3
    assert ["restart", "--no-block", "--", "vr-healthy.service"] in replay.commands
    # Verified: no journal read for the phase of a caller no longer waiting (no running_args here, so none).
    assert res["progress"]["phase"] == "" and not [c for c in replay.commands if "-o" in c]


def test_old_invocation_is_never_accepted(monkeypatch):
    """P1: while systemd still shows the previous invocation, the module keeps waiting."""
    replay = Replay("healthy-restart.jsonl")
    replay.snaps = replay.snaps[:1]  # systemd never gets to the new invocation
    replay.ready_at_us = 0  # and the old process answers health 200 the whole time
    res = run(monkeypatch, replay, {"unit": "vr-healthy", "port": 18001, "ready_timeout": 3}, tree="healthy")
    assert res["failed"] and res["invocation_id"] is None
    assert "no new invocation started within ready_timeout=3.0 s" in res["msg"]


def test_budget_returns_pending_and_baseline_resumes(monkeypatch):
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    args = {"unit": "vr-healthy", "port": 18001, "stable_seconds": 2, "health_count": 2}
    first = run(monkeypatch, replay, dict(args, budget=0.5), tree="healthy")
    assert first["pending"] and not first.get("failed")
    assert first["progress"]["step"] in ("port", "ready") and first["progress"]["elapsed"] >= 0.5
    commands = len(replay.commands)
    second = run(monkeypatch, replay, dict(args, restart=False, baseline=first["baseline"]), tree="healthy")
    assert not second.get("failed") and not second["pending"], second["msg"]
    assert second["invocation_id"] == first["invocation_id"] and second["restarted"]
    assert not any(c[0] in ("restart", "start") for c in replay.commands[commands:])


def test_baseline_from_another_boot_is_refused(monkeypatch):
    replay = Replay("healthy-restart.jsonl")
    first = run(monkeypatch, replay, {"unit": "vr-healthy", "port": 18001, "budget": 0}, tree="healthy")
    baseline = dict(first["baseline"], boot_id="00000000-0000-0000-0000-000000000000")
    res = run(
        monkeypatch,
        replay,
        {"unit": "vr-healthy", "port": 18001, "restart": False, "baseline": baseline},
        tree="healthy",
    )
    assert res["failed"] and "rebooted" in res["msg"]


# ------------------------------------------------------------------------------------- deaths
def test_crash_two_seconds_after_start_fails_within_two_seconds_of_death(monkeypatch):
    replay = Replay("crash-start.jsonl", journal="journal-crash-5ac0ae7758c74a1c8677593ef4d48e42.json")
    first = inv_of("crash-start.jsonl", 1)
    exit_us = next(
        int(json.loads(line)["__MONOTONIC_TIMESTAMP"])
        for line in replay.journal.splitlines()
        if json.loads(line).get("MESSAGE_ID") == "98e322203f7a4ed290d09fe03c09fe15"
    )
    res = run(monkeypatch, replay, {"unit": "vr-crash", "port": 18002, "api_key": SECRET})
    assert res["failed"] and res["invocation_id"] == first["InvocationID"]
    assert res["crash_loop"] is True
    assert res["exit"] == {
        "code": "exited",
        "status": "1",
        "result": "exit-code",
        "source": "journal",
        "message": "vr-crash.service: Main process exited, code=exited, status=1/FAILURE",
    }
    assert res["died_monotonic_us"] == exit_us
    # the bound: the verdict came at most 2 s (fake clock) after the recorded death
    assert 0 <= replay.now - exit_us <= 2_000_000
    assert 0 <= res["detected_after_death"] <= 2
    assert "Crash loop: Restart=on-failure, NRestarts=1" in res["msg"]
    assert "StartLimitBurst=3 starts within StartLimitIntervalUSec=30s" in res["msg"]
    assert any("RuntimeError: injected crash" in line for line in res["journal"])
    assert any("api_key=" in line and SECRET not in line for line in res["journal"])


def test_death_is_noticed_while_a_health_request_hangs(monkeypatch):
    """The health request runs in a thread: a /health_generate that never answers cannot delay the verdict."""
    import threading

    replay = Replay("stale-start.jsonl", journal="journal-stale-744980ea39994a67991c4012242da84c.json")
    release = threading.Event()
    mod = load_module("sglang_verified_restart")

    def hanging(_url, _headers, _timeout):
        release.wait(30)
        return None, "timed out"

    monkeypatch.setattr(worker, "clock_us", replay.now_us)
    monkeypatch.setattr(worker, "pause", replay.sleep)
    monkeypatch.setattr(worker, "http_status", hanging)
    monkeypatch.setattr(worker, "boottime_offset_us", lambda: 0)
    patch_tools(monkeypatch, replay)
    # a listener in the unit's cgroup so that the probe starts: the healthy tree, with the stale unit's cgroup
    monkeypatch.setattr(
        worker,
        "port_listeners",
        lambda host, port, cg, _root: [
            {
                "address": "0.0.0.0",
                "family": "tcp",
                "inode": 1,
                "pids": [704],
                "pid": 704,
                "cgroup": cg,
                "in_cgroup": True,
                "foreign": [],
            }
        ],
    )
    try:
        res, _text = call_main(mod, {"unit": "vr-stale", "port": 18004})
    finally:
        release.set()
    assert res["failed"] and "died" in res["msg"] and 0 <= res["detected_after_death"] <= 2


def test_stale_process_outside_the_cgroup_is_named(monkeypatch):
    """P4: a process outside the unit's cgroup holds the port: fail naming pid, cmdline and cgroup."""
    replay = Replay("stale-start.jsonl", journal="journal-stale-744980ea39994a67991c4012242da84c.json")
    res = run(monkeypatch, replay, {"unit": "vr-stale", "port": 18004}, tree="stale")
    assert res["failed"]
    assert (
        "pid 373 ('/usr/bin/python3 /opt/vrtest/server.py', cgroup /system.slice/ssh.service)" in res["msg"]
    )
    assert "OUTSIDE the unit" in res["msg"] and res["listener"]["in_cgroup"] is False
    assert "(P4), see docs/properties.md." in res["msg"]
    assert res["timings"]["ready"] is None


def test_processes_older_than_the_invocation_fail_p14(monkeypatch):
    replay = Replay("orphan-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_000_000
    res = run(monkeypatch, replay, {"unit": "vr-orphan", "port": 18007}, tree="orphan")
    assert res["failed"] and "(P14), see docs/properties.md." in res["msg"]
    assert sorted(o["pid"] for o in res["orphans"]) == [410, 417]
    assert res["orphans"][0]["cmdline"] == ["/usr/bin/sleep", "1000"]
    assert res["main_pid"] == 609


def test_main_process_stamped_late_by_systemd_is_not_older_than_itself(monkeypatch, tmp_path):
    """P14 compares /proc start times, not /proc with systemd's stamp. The molecule failures scenario
    (case 2's rollback, lab12) failed once: PID 1 stamped ExecMainStartTimestampMonotonic 5057.900248 s
    while /proc gave the main process 5057.85 s (fork, clock ticks), more than the 50 ms tolerance, so
    the new main process was reported as a process older than its own invocation. The recorded healthy
    tree with the main process's start moved to the same 50.2 ms before systemd's stamp."""
    tree = tmp_path / "stamped-late"
    shutil.copytree(FIX / "healthy", tree, symlinks=True)
    stat = tree / "proc" / "554" / "stat"
    fields = stat.read_text().split(" ")
    stamp = int(inv_of("healthy-restart.jsonl")["ExecMainStartTimestampMonotonic"])
    assert fields[21] == "127679" and stamp == 1_276_800_275  # recorded: /proc 10.3 ms before the stamp
    fields[21] = "127675"  # 1276.75 s: 50.275 ms before the stamp, as on lab12
    stat.write_text(" ".join(fields))
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    res = run(monkeypatch, replay, {"unit": "vr-healthy", "port": 18001}, tree=str(tree))
    assert not res.get("failed"), res["msg"]
    assert res["main_pid"] == 554 and "orphans" not in res


def test_never_opens_port_fails_at_ready_timeout(monkeypatch):
    replay = Replay("healthy-restart.jsonl", journal=None)
    res = run(monkeypatch, replay, {"unit": "vr-healthy", "port": 18099, "ready_timeout": 4}, tree="healthy")
    assert (
        res["failed"]
        and "did not answer 200 within ready_timeout=4.0 s (port 18099 never opened" in res["msg"]
    )
    assert res["timings"]["port_open"] is None and res["progress"]["elapsed"] >= 4


def _bound_tree(tmp_path):
    """The healthy proc tree with the server's listener bound to 10.213.1.2 instead of 0.0.0.0."""
    tree = tmp_path / "bound"
    shutil.copytree(FIX / "healthy", tree, symlinks=True)
    tcp = tree / "proc" / "net" / "tcp"
    text = tcp.read_text()
    assert "00000000:4651" in text  # port 18001 on the wildcard
    tcp.write_text(text.replace("00000000:4651", "0201D50A:4651"))  # 10.213.1.2, little-endian
    return tree


@pytest.mark.parametrize(
    ("host", "ok"),
    [("gpu01.lab", True), ("10.213.1.2", True), ("other.lab", False), ("unknown.lab", False)],
)
def test_a_hostname_is_matched_to_the_address_it_resolves_to(monkeypatch, tmp_path, host, ok):
    """Issue 18: SGLang binds the address a hostname in sglang_host resolves to; the listener was
    matched only against the name itself, so a hostname never matched and the run waited the whole
    ready timeout (twice, with the rollback) saying the port never opened."""
    table = {"gpu01.lab": ["10.213.1.2", "fd00::2"], "other.lab": ["10.9.9.9"]}

    def fake_getaddrinfo(name, port, *args, **kwargs):
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0))
            for ip in table[name]
        ]

    monkeypatch.setattr(socket, "getaddrinfo", fake_getaddrinfo)
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    args = {"unit": "vr-healthy", "host": host, "port": 18001, "ready_timeout": 5, "stable_seconds": 1}
    res = run(monkeypatch, replay, args, tree=_bound_tree(tmp_path))
    if ok:
        assert not res.get("failed"), res["msg"]
        assert res["listener"]["address"] == "10.213.1.2" and res["listener"]["pid"] == 554
    else:
        assert res["failed"] and "port 18001 never opened" in res["msg"]


# ------------------------------------------------------------------------------ refusals, check
@pytest.mark.parametrize(
    "fixture,needle",
    [
        ("show-need-daemon-reload.txt", "NeedDaemonReload=yes"),
        ("show-vr-missing.txt", "is not loaded (LoadState=not-found)"),
    ],
)
def test_p7_refuses_before_restarting(monkeypatch, fixture, needle):
    replay = Replay(initial=fixture)
    res = run(monkeypatch, replay, {"unit": "vr-reload", "port": 18005})
    assert res["failed"] and needle in res["msg"] and res["restarted"] is False
    assert [c[0] for c in replay.commands] == ["show"]
    if needle == "NeedDaemonReload=yes":
        assert "daemon-reload first (P7), see docs/properties.md" in res["msg"]


def test_check_mode_reports_a_restart_and_does_nothing(monkeypatch):
    replay = Replay("healthy-restart.jsonl")
    res = run(
        monkeypatch,
        replay,
        {"unit": "vr-healthy", "port": 18001, "_ansible_check_mode": True},
        tree="healthy",
    )
    assert res["changed"] and res["would"] == "restart" and not res["restarted"]
    assert [c[0] for c in replay.commands] == ["show"]


def test_check_mode_warns_instead_of_failing_on_p7(monkeypatch):
    replay = Replay(initial="show-need-daemon-reload.txt")
    warned = []
    monkeypatch.setattr(AnsibleModule, "warn", lambda _self, text: warned.append(text))
    res = run(monkeypatch, replay, {"unit": "vr-reload", "port": 18005, "_ansible_check_mode": True})
    assert not res.get("failed") and res["changed"]
    assert len(warned) == 1 and "NeedDaemonReload=yes" in warned[0]


def test_failed_unit_is_reset_then_started(monkeypatch):
    replay = Replay("crash-start.jsonl", journal="journal-crash-5ac0ae7758c74a1c8677593ef4d48e42.json")
    replay.snaps.insert(0, (0, (FIX / "show-vr-crash.txt").read_text()))
    replay.now = 1000
    run(monkeypatch, replay, {"unit": "vr-crash", "port": 18002})
    verbs = [c[0] for c in replay.commands if c[0] != "show"]
    assert verbs[:2] == ["reset-failed", "start"]


@pytest.mark.parametrize("reset", [True, False])
def test_deliberate_restart_resets_the_start_limit_only_when_asked(monkeypatch, reset):
    """An active unit: reset_start_limit runs reset-failed before the restart (a deploy must not
    use up the crash-loop budget); without it only a failed unit is reset."""
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    args = {"unit": "vr-healthy", "port": 18001, "stable_seconds": 0, "health_count": 1}
    res = run(monkeypatch, replay, dict(args, reset_start_limit=reset), tree="healthy")
    assert not res.get("failed"), res["msg"]
    verbs = [c[0] for c in replay.commands if c[0] not in ("show", "--no-pager")]
    assert verbs[: 2 if reset else 1] == (["reset-failed", "restart"] if reset else ["restart"])
    assert ("reset-failed" in verbs) is reset


def test_verify_running_without_restart(monkeypatch):
    replay = Replay(initial="healthy/show.txt")
    replay.ready_at_us = 0
    res = run(
        monkeypatch,
        replay,
        {"unit": "vr-healthy", "port": 18001, "restart": False, "stable_seconds": 1, "health_count": 2},
        tree="healthy",
    )
    assert not res.get("failed"), res["msg"]
    assert not res["changed"] and res["main_pid"] == 554
    assert not any(c[0] in ("restart", "start") for c in replay.commands)


def test_one_answer_that_came_in_before_the_budget_check_is_read(monkeypatch):
    """The host probe's proof (budget 0, one answer): a health request that finishes between the poll that
    started it and the budget's check (a fast answer on a busy host) is read, not given up as pending."""
    replay = Replay(initial="healthy/show.txt")
    replay.ready_at_us = 0
    original = worker.HealthProbe.poll

    def poll_then_answer(probe):
        answer = original(probe)
        if answer is None:
            probe._thread.join()  # the answer arrives before run() looks at the request again
        return answer

    monkeypatch.setattr(worker.HealthProbe, "poll", poll_then_answer)
    args = {"unit": "vr-healthy", "port": 18001, "restart": False, "health_count": 1, "budget": 0}
    res = run(monkeypatch, replay, dict(args, stable_seconds=0), tree="healthy", threaded=True)
    assert not res.get("failed") and not res["pending"], res["msg"]
    assert res["main_pid"] == 554 and "1 health answers" in res["msg"]


def test_verify_running_refuses_a_dead_unit(monkeypatch):
    replay = Replay(initial="show-vr-crash.txt")
    res = run(monkeypatch, replay, {"unit": "vr-crash", "port": 18002, "restart": False})
    assert res["failed"] and "is not running (ActiveState=failed" in res["msg"]


@pytest.mark.parametrize(
    "problems", [[], ["speculative_draft_window_size: expected 4096, /server_info reports 2048"]]
)
def test_running_args_are_asserted_in_the_same_call_once_verified(monkeypatch, problems):
    """With running_args, the verified invocation's arguments are asserted by the running-arguments check
    (module_utils/sglang_running_args.py, tested on its own in test_sglang_running_args.py) with this call's
    address, key and unit and the invocation just verified, as soon as it is ready (during its stability
    window); a difference fails the call after the proof."""
    calls = []

    def check(_module, p):
        calls.append(dict(p, at_us=replay.now_us()))
        msg = (
            "running SGLang arguments do not match the intended ones:\n"
            if problems
            else "3 managed key(s) agree"
        )
        return {"msg": msg + "\n".join(problems), "diff": problems}, problems

    # The module binds the check when it is imported (run() imports it afresh).
    monkeypatch.setattr(running_args, "check", check)
    replay = Replay(initial="healthy/show.txt")
    replay.ready_at_us = 0
    args = {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "restart": False, "stable_seconds": 1}
    expected = {"speculative_draft_window_size": 4096}
    res = run(monkeypatch, replay, dict(args, running_args={"expected": expected}), tree="healthy")
    assert len(calls) == 1
    p = calls[0]
    assert (p["host"], p["port"], p["api_key"], p["unit"]) == (
        "127.0.0.1",
        18001,
        SECRET,
        "vr-healthy.service",
    )
    assert p["invocation_id"] == res["invocation_id"] and p["observed"] is None
    # Asserted at ready, while the stability window elapsed (not after it).
    assert res["baseline"]["ready_us"] <= p["at_us"] < res["baseline"]["stable_us"]
    assert p["expected"] == {"speculative_draft_window_size": 4096} and p["expected_env"] == {}
    assert res["running"]["diff"] == problems
    if problems:
        assert res["failed"] and res["msg"].startswith(
            f"vr-healthy.service: invocation {res['invocation_id']}"
        )
        assert "and was stable for 1" in res["msg"]
        assert res["msg"].endswith(
            ". But its running SGLang arguments do not match the intended ones:\n" + problems[0]
        )
    else:
        assert not res.get("failed") and res["running"]["msg"] == "3 managed key(s) agree", res["msg"]


def _record_spec(tmp_path, unit_text="[Service]\nExecStart=/bin/true\n", sha=None):
    unit = tmp_path / "vr-healthy.service"
    unit.write_text(unit_text)
    pending = tmp_path / "pending.json"
    pending.write_text('{"since": "the write"}')
    digest = sha or hashlib.sha256(unit_text.encode()).hexdigest()
    return {
        "path": str(tmp_path / "history.jsonl"),
        "entry": {"result": "verified", "window": 4096},
        "clear_pending": str(pending),
        "known_good": {
            "dir": str(tmp_path / "known-good"),
            "files": {"unit": str(unit)},
            "meta_name": "meta.json",
            "meta": {"unit": "vr-healthy"},
            "api_key": SECRET,
            "sha256": {"unit": digest},
        },
    }


def test_a_verified_restart_is_recorded_in_the_same_call(monkeypatch, tmp_path):
    """With record, the verified invocation is kept as known-good and appended to the history by the call that
    verified it (module_utils/sglang_history.py): its invocation, main PID and timings, the pending marker
    cleared."""
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    spec = _record_spec(tmp_path)
    args = {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "stable_seconds": 1, "record": spec}
    res = run(monkeypatch, replay, args, tree="healthy")
    assert not res.get("failed"), res["msg"]
    assert res["recorded"] and res["pending_cleared"]
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry == res["record"]
    assert (entry["result"], entry["window"]) == ("verified", 4096)
    assert (entry["invocation_id"], entry["main_pid"]) == (res["invocation_id"], 554)
    t = entry["timings"]
    assert t["started_to_ready"] == round(t["ready"] - t["started"], 3) > 0
    assert entry["pending"] == {"since": "the write"} and not (tmp_path / "pending.json").exists()
    meta = json.loads((tmp_path / "known-good" / "meta.json").read_text())
    assert meta["invocation_id"] == res["invocation_id"] and meta["unit"] == "vr-healthy"
    assert (tmp_path / "known-good" / "vr-healthy.service").read_text() == "[Service]\nExecStart=/bin/true\n"


def test_a_file_changed_since_the_restart_fails_the_call_and_records_nothing(monkeypatch, tmp_path):
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    spec = _record_spec(tmp_path, sha="0" * 64)
    args = {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "stable_seconds": 1, "record": spec}
    res = run(monkeypatch, replay, args, tree="healthy")
    assert res["failed"] and res["recorded"] is False
    assert "and was stable for 1" in res["msg"]
    assert ". But not kept as known-good, not recorded: changed since the verified restart" in res["msg"]
    assert not (tmp_path / "history.jsonl").exists() and not (tmp_path / "known-good").exists()
    assert (tmp_path / "pending.json").exists()


def test_a_probe_records_nothing(monkeypatch, tmp_path):
    replay = Replay(initial="healthy/show.txt")
    args = {"unit": "vr-healthy", "port": 18001, "restart": False, "record": _record_spec(tmp_path)}
    res = run(monkeypatch, replay, args, tree="healthy")
    assert res["failed"] and res["msg"].startswith("record is only used with a restart")
    assert replay.commands == [] and not (tmp_path / "history.jsonl").exists()


def test_a_verified_rollback_makes_its_invocation_the_last_verified_one(monkeypatch, tmp_path):
    """The rollback's record (record.known_good_invocation): the known-good set it restored stays byte for
    byte, and its metadata names the rollback's invocation, the one the drift check (P17) compares with."""
    spec = _record_spec(tmp_path)
    first = Replay("healthy-restart.jsonl")
    first.ready_at_us = first.request_us + 1_500_000
    args = {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "stable_seconds": 1, "record": spec}
    kept = run(monkeypatch, first, args, tree="healthy")
    assert not kept.get("failed"), kept["msg"]
    kg = tmp_path / "known-good"
    before = {p.name: p.read_bytes() for p in kg.iterdir()}
    meta = json.loads(before["meta.json"])
    meta["invocation_id"] = "0" * 32
    (kg / "meta.json").write_text(json.dumps(meta))
    rollback = {
        "path": spec["path"],
        "entry": {"result": "rolled_back"},
        "known_good_invocation": {"dir": str(kg), "meta_name": "meta.json"},
    }
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    args = dict(args, record=rollback)
    res = run(monkeypatch, replay, args, tree="healthy")
    assert not res.get("failed"), res["msg"]
    after = json.loads((kg / "meta.json").read_text())
    assert after == dict(meta, invocation_id=res["invocation_id"]) and after["api_key"] == SECRET
    assert (kg / "vr-healthy.service").read_bytes() == before["vr-healthy.service"]
    assert json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])["result"] == "rolled_back"


def test_a_verified_revert_makes_the_kept_set_the_known_good_one(monkeypatch, tmp_path):
    """A revert's record (known_good_invocation.from_dir: the set the rolling play kept, before-run): once the
    restored set is verified, its metadata (with the revert's invocation) and its copies become the known-good
    set in one switch; a copy it lacks is not carried over from the set it replaces, another service's files
    are."""
    spec = _record_spec(tmp_path)
    spec["known_good"]["keep_replaced"] = str(tmp_path / "before-run")
    args = {"unit": "vr-healthy", "port": 18001, "api_key": SECRET, "stable_seconds": 1}
    for window in (2048, 4096):  # the second keeping switch keeps the first set
        (tmp_path / "vr-healthy.service").write_text(f"[Service]\nExecStart=/bin/true {window}\n")
        spec["known_good"]["meta"] = {"unit": "vr-healthy", "window": window}
        spec["known_good"]["sha256"] = {}
        replay = Replay("healthy-restart.jsonl")
        replay.ready_at_us = replay.request_us + 1_500_000
        res = run(monkeypatch, replay, dict(args, record=spec), tree="healthy")
        assert not res.get("failed"), res["msg"]
    kg, before = tmp_path / "known-good", tmp_path / "before-run"
    assert json.loads((before / "meta.json").read_text())["window"] == 2048
    (kg / "vr-healthy.yaml").write_text("config: of this run\n")  # a copy the kept set lacks
    (kg / "other.json").write_text("{}\n")  # another service's
    revert = {
        "path": spec["path"],
        "entry": {"result": "reverted_by_run"},
        "known_good_invocation": {
            "dir": str(kg),
            "meta_name": "meta.json",
            "from_dir": str(before),
            "files": ["vr-healthy.service", "vr-healthy.yaml"],
        },
    }
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    res = run(monkeypatch, replay, dict(args, record=revert), tree="healthy")
    assert not res.get("failed"), res["msg"]
    meta = json.loads((kg / "meta.json").read_text())
    assert meta["window"] == 2048 and meta["invocation_id"] == res["invocation_id"]
    assert (kg / "vr-healthy.service").read_text().endswith(" 2048\n")
    assert sorted(p.name for p in kg.iterdir()) == ["meta.json", "other.json", "vr-healthy.service"]


# ------------------------------------------------------------------------ speculation takes effect (P25)
SPEC_FIX = FIXTURES / "speculation"


class Generate:
    """The /generate answer recorded from the lab server (tests/fixtures/speculation/), or a refused
    connection; notes the fake time of each request."""

    def __init__(self, replay, answer="generate-dflash-2048.json", verify_ct=None):
        self.replay, self.calls = replay, []
        self.body = json.loads((SPEC_FIX / answer).read_text()) if answer else None
        if verify_ct is not None:
            self.body["meta_info"]["spec_verify_ct"] = verify_ct

    def __call__(self, url, payload, api_key=None, timeout=60.0):
        self.calls.append((self.replay.now, url, api_key, payload))
        if self.body is None:
            raise sglang_http.HttpError(f"POST {url} failed: [Errno 111] Connection refused")
        return 200, self.body


def run_speculation(monkeypatch, tmp_path, speculation, generate_kw=None, **extra):
    replay = Replay("healthy-restart.jsonl")
    replay.ready_at_us = replay.request_us + 1_500_000
    generate = Generate(replay, **(generate_kw or {}))
    monkeypatch.setattr(speculation_utils, "post_json", generate)
    args = {
        "unit": "vr-healthy",
        "port": 18001,
        "api_key": SECRET,
        "stable_seconds": 1,
        "speculation": speculation,
    }
    args.update(extra)
    return run(monkeypatch, replay, args, tree="healthy"), replay, generate


def test_the_speculation_probe_runs_after_the_proof_and_is_recorded(monkeypatch, tmp_path):
    """The restarted invocation proven (ready, stable), one deterministic /generate to it; its acceptance
    length (completion_tokens / spec_verify_ct) is returned and written into the history record."""
    spec = _record_spec(tmp_path)
    res, replay, generate = run_speculation(monkeypatch, tmp_path, {"window": 2048}, record=spec)
    assert not res.get("failed"), res["msg"]
    figures = {
        "accept_length": 4.0,
        "completion_tokens": 64,
        "spec_verify_ct": 16,
        "new_tokens": 64,
        "stand_in": True,
    }
    assert res["speculation"] == figures
    [(at_us, url, key, payload)] = generate.calls
    assert url == "http://127.0.0.1:18001/generate" and key == SECRET
    assert payload == speculation_utils.probe_request(2048, 64)
    # After the stability window (timings are rounded to the millisecond).
    assert at_us >= res["baseline"]["request_us"] + (res["timings"]["stable"] - 0.001) * 1e6
    entry = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[-1])
    assert entry["speculation"] == figures and res["recorded"]
    assert (
        json.loads((tmp_path / "known-good" / "meta.json").read_text())["invocation_id"]
        == res["invocation_id"]
    )


def test_an_acceptance_under_the_minimum_fails_the_call_and_records_nothing(monkeypatch, tmp_path):
    spec = _record_spec(tmp_path)
    res, _replay, _generate = run_speculation(
        monkeypatch, tmp_path, {"window": 2048, "min_accept_length": 2.5}, {"verify_ct": 43}, record=spec
    )
    assert res["failed"] and res["recorded"] is False
    assert "and was stable for 1" in res["msg"]
    assert res["msg"].endswith(
        "But its speculative decoding acceptance length 1.488 (completion_tokens 64 / spec_verify_ct 43) is "
        "under sglang_min_accept_length 2.5"
    )
    assert res["speculation"]["accept_length"] == 1.488
    assert not (tmp_path / "history.jsonl").exists() and not (tmp_path / "known-good").exists()
    assert (tmp_path / "pending.json").exists()


@pytest.mark.parametrize("minimum", [None, 2.5])
def test_a_probe_without_an_answer_is_reported_and_fails_only_with_a_minimum(monkeypatch, tmp_path, minimum):
    spec = _record_spec(tmp_path)
    res, _replay, _generate = run_speculation(
        monkeypatch, tmp_path, {"window": 2048, "min_accept_length": minimum}, {"answer": None}, record=spec
    )
    error = "POST http://127.0.0.1:18001/generate failed: [Errno 111] Connection refused"
    assert res["speculation"] == {"error": error}
    if minimum is None:
        assert not res.get("failed") and res["recorded"], res["msg"]
        assert json.loads((tmp_path / "history.jsonl").read_text())["speculation"] == {"error": error}
    else:
        assert res["failed"] and res["recorded"] is False
        assert "no acceptance length (sglang_min_accept_length 2.5)" in res["msg"]
        assert not (tmp_path / "history.jsonl").exists() and not (tmp_path / "known-good").exists()


def test_a_window_over_the_drafters_sliding_window_warns_naming_file_and_field(monkeypatch, tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_bytes((SPEC_FIX / "draft-config.json").read_bytes())
    spec = {"algorithm": "DFLASH", "window": 4096, "draft_path": str(draft)}
    res, _replay, _generate = run_speculation(monkeypatch, tmp_path, spec)
    assert not res.get("failed"), res["msg"]
    assert res["speculation"]["window_warning"] == (
        "the draft window 4096 exceeds the sliding window the drafter was trained with: "
        f"{draft / 'config.json'} sliding_window = 2048"
    )
    # Within the trained window, or not a DFLASH-based algorithm: no warning.
    for other in (dict(spec, window=2048), dict(spec, algorithm="EAGLE3")):
        res, _replay, _generate = run_speculation(monkeypatch, tmp_path, other)
        assert not res.get("failed") and "window_warning" not in res["speculation"], res["msg"]


def test_a_probe_of_a_running_service_sends_no_speculation_request(monkeypatch, tmp_path):
    replay = Replay(initial="healthy/show.txt")
    generate = Generate(replay)
    monkeypatch.setattr(speculation_utils, "post_json", generate)
    args = {"unit": "vr-healthy", "port": 18001, "restart": False, "speculation": {"window": 2048}}
    res = run(monkeypatch, replay, args, tree="healthy")
    assert res["failed"] and res["msg"].startswith("speculation is only used with a restart")
    assert generate.calls == [] and replay.commands == []
