"""module_utils/sglang_systemd on recorded `systemctl show` outputs (tests/fixtures/systemd/SOURCE.md)."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import sglang_systemd as sd
from conftest import FIXTURES

FIX = FIXTURES / "systemd"


def snapshots(name):
    return [json.loads(line) for line in (FIX / name).read_text().splitlines()]


def test_parse_show_keeps_values_with_equals_and_empty_values():
    props = sd.parse_show((FIX / "show-execstart-vr-orphan.txt").read_text())
    assert props["Environment"] == "VR_PORT=18007"
    assert props["ExecStart"].startswith("{ path=/bin/sh ; argv[]=/bin/sh -c /usr/bin/sleep 1000 & exec")
    assert props["ExecStart"].endswith("status=0/0 }")
    assert props["DropInPaths"] == ""
    assert props["Id"] == "vr-orphan.service"


def test_parse_show_healthy_running():
    props = sd.parse_show((FIX / "healthy" / "show.txt").read_text())
    assert set(sd.RESTART_PROPERTIES) <= set(props)
    assert props["ActiveState"] == "active" and props["SubState"] == "running"
    assert sd.as_int(props["MainPID"]) == 554
    assert sd.monotonic_us(props["ExecMainExitTimestampMonotonic"]) is None
    assert sd.is_loaded(props) and not sd.needs_daemon_reload(props)
    assert sd.death_of(props, props["InvocationID"], 554) is None
    assert sd.death_of(props, props["InvocationID"], 553) == "the main PID changed from 553 to 554"


def test_need_daemon_reload_and_not_found():
    edited = sd.parse_show((FIX / "show-need-daemon-reload.txt").read_text())
    assert sd.needs_daemon_reload(edited) and sd.is_loaded(edited)
    missing = sd.parse_show((FIX / "show-vr-missing.txt").read_text())
    assert missing["LoadState"] == "not-found" and not sd.is_loaded(missing)


def test_failed_after_start_limit():
    props = sd.parse_show((FIX / "show-vr-crash.txt").read_text())
    assert props["ActiveState"] == "failed" and props["Result"] == "exit-code"
    assert sd.as_int(props["NRestarts"]) == 3
    assert sd.exit_description(props) == "code=exited, status=1, result=exit-code"
    assert sd.restarts_on_failure(props)
    assert sd.death_of(props, props["InvocationID"], 0) == "the unit failed"
    assert sd.parse_timespan_us(props["StartLimitIntervalUSec"]) == 30_000_000


def test_inactive_has_no_main_process():
    props = sd.parse_show((FIX / "show-vr-hang.txt").read_text())
    assert props["ActiveState"] == "inactive"
    assert sd.death_of(props, props["InvocationID"], 123).startswith("the unit is inactive")


def test_crash_loop_sequence_shows_auto_restart_and_invocation_changes():
    rows = [r for r in snapshots("crash-start.jsonl") if "show" in r]
    states = [sd.parse_show(r["show"]) for r in rows]
    invocations = [p["InvocationID"] for p in states if p["InvocationID"]]
    first = invocations[0]
    # systemd replaced the invocation (Restart=on-failure) and, in one sample, was waiting to restart.
    assert len(set(invocations)) == 3
    reasons = {sd.death_of(p, first, sd.as_int(states[1]["MainPID"])) for p in states[1:]}
    assert any(r and r.startswith("systemd started another invocation") for r in reasons)
    waiting = [p for p in states if p["SubState"] == "auto-restart"]
    assert waiting and all(p["ExecMainCode"] == "1" and p["ExecMainStatus"] == "1" for p in waiting)
    assert states[-1]["ActiveState"] == "failed"


@pytest.mark.parametrize(
    "text,usec",
    [
        ("10s", 10_000_000),
        ("1min 30s", 90_000_000),
        ("100ms", 100_000),
        ("1h 2min 3.5s", 3_723_500_000),
        ("infinity", None),
        ("0", 0),
        ("250000", 250_000),
    ],
)
def test_parse_timespan(text, usec):
    assert sd.parse_timespan_us(text) == usec


@pytest.mark.parametrize("text", ["10 parsecs", "s10", "abc"])
def test_parse_timespan_rejects(text):
    with pytest.raises(ValueError):
        sd.parse_timespan_us(text)


def test_show_runs_systemctl_in_list_form_with_lang_c():
    calls = []

    class Mod:
        def run_command(self, cmd, environ_update=None):
            calls.append((cmd, environ_update))
            return 0, (FIX / "healthy" / "show.txt").read_text(), ""

    props = sd.show(Mod(), "vr-healthy.service", ("Id", "MainPID"), systemctl="/usr/bin/systemctl")
    assert props["Id"] == "vr-healthy.service"
    assert calls == [
        (
            ["/usr/bin/systemctl", "show", "-p", "Id,MainPID", "--", "vr-healthy.service"],
            {"LANG": "C", "LC_ALL": "C"},
        )
    ]


def test_show_failure_names_the_command():
    class Mod:
        def run_command(self, cmd, environ_update=None):
            return 1, "", "Failed to connect to bus: No such file or directory"

    with pytest.raises(sd.SystemctlError, match=r"systemctl show -p Id -- x.service failed \(rc=1\): Failed"):
        sd.show(Mod(), "x.service", ("Id",), systemctl="/usr/bin/systemctl")


class _Module:
    """What daemon_reload uses of AnsibleModule: get_bin_path and run_command (the answer given)."""

    def __init__(self, rc, out="", err=""):
        self.answer, self.calls = (rc, out, err), []

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, environ_update=None):
        self.calls.append((argv, environ_update))
        return self.answer


def test_daemon_reload_is_one_call_and_says_why_it_failed():
    ok = _Module(0)
    assert sd.daemon_reload(ok) is None
    assert ok.calls == [(["/usr/bin/systemctl", "daemon-reload"], {"LANG": "C", "LC_ALL": "C"})]
    failed = _Module(1, err="Failed to reload daemon: Access denied\n")
    assert (
        sd.daemon_reload(failed)
        == "systemctl daemon-reload failed (rc=1): Failed to reload daemon: Access denied"
    )
