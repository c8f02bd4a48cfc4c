# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and interpreting ``systemctl show`` output.

Everything here is pure parsing except :func:`show`, which runs systemctl through
``AnsibleModule.run_command`` in list form with ``LANG=C``.  Times are kept as
systemd gives them: ``...Monotonic`` properties are microseconds of CLOCK_MONOTONIC
(the same clock as ``time.clock_gettime(time.CLOCK_MONOTONIC)`` on the same kernel).
"""

from __future__ import annotations

import os
import re
import tempfile
import time

# The properties the verified restart reads in every poll.
RESTART_PROPERTIES = (
    "Id",
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "InvocationID",
    "MainPID",
    "NRestarts",
    "ExecMainStartTimestampMonotonic",
    "ExecMainExitTimestampMonotonic",
    "ExecMainPID",
    "ExecMainStatus",
    "ExecMainCode",
    "ControlGroup",
    "NeedDaemonReload",
    "FragmentPath",
    "DropInPaths",
    "StartLimitBurst",
    "StartLimitIntervalUSec",
    "Restart",
    "RestartUSec",
    "Type",
    "KillMode",
)

# ExecMainCode is a CLD_* code from waitid(2), printed as a number by systemctl show.
CLD_CODES = {
    "0": None,
    "1": "exited",
    "2": "killed",
    "3": "dumped",
    "4": "trapped",
    "5": "stopped",
    "6": "continued",
}

_TIMESPAN_UNITS = {
    "us": 1,
    "usec": 1,
    "µs": 1,
    "ms": 1000,
    "msec": 1000,
    "s": 1000000,
    "sec": 1000000,
    "second": 1000000,
    "seconds": 1000000,
    "m": 60000000,
    "min": 60000000,
    "minute": 60000000,
    "minutes": 60000000,
    "h": 3600000000,
    "hr": 3600000000,
    "hour": 3600000000,
    "hours": 3600000000,
    "d": 86400000000,
    "day": 86400000000,
    "days": 86400000000,
    "w": 604800000000,
    "week": 604800000000,
    "weeks": 604800000000,
    "M": 2629800000000,
    "month": 2629800000000,
    "months": 2629800000000,
    "y": 31557600000000,
    "year": 31557600000000,
    "years": 31557600000000,
}
_TIMESPAN_TOKEN = re.compile(r"(\d+(?:\.\d+)?)\s*([a-zA-Zµ]*)")


class SystemctlError(Exception):
    """systemctl failed; ``args`` carries a message naming the command."""


def parse_show(text):
    """Parse ``systemctl show -p A,B UNIT`` output into a dict.

    One ``Key=Value`` per line; the value is everything after the FIRST ``=`` (values such as
    ``ExecStart={ path=/usr/bin/x ; argv[]=... }`` contain more ``=``), and may be empty.
    Lines without ``=`` (there are none in systemd 252 output) are ignored.
    """
    props = {}
    for line in text.splitlines():
        if not line or "=" not in line:
            continue
        key, _, value = line.partition("=")
        props[key] = value
    return props


def show_command(systemctl, unit, props=RESTART_PROPERTIES):
    """``systemctl show`` of ``props`` of ``unit``; run it with LANG=C, LC_ALL=C for ``parse_show``."""
    return [systemctl, "show", "-p", ",".join(props), "--", unit]


def show(module, unit, props=RESTART_PROPERTIES, systemctl=None):
    """Return ``parse_show`` of ``systemctl show -p <props> UNIT``; raise SystemctlError on failure."""
    cmd = show_command(systemctl or module.get_bin_path("systemctl", required=True), unit, props)
    rc, out, err = module.run_command(cmd, environ_update={"LANG": "C", "LC_ALL": "C"})
    if rc != 0:
        raise SystemctlError(f"{' '.join(cmd)} failed (rc={rc}): {(err or out).strip()}")
    return parse_show(out)


def as_int(value, default=0):
    """Integer property (``MainPID``, ``NRestarts``, ``...Monotonic``); ``''``/``[not set]`` -> default."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def monotonic_us(value):
    """A ``...TimestampMonotonic`` property in microseconds, or None when systemd never set it (0)."""
    usec = as_int(value, 0)
    return usec or None


def now_monotonic_us():
    """CLOCK_MONOTONIC in microseconds, comparable with the ``...Monotonic`` properties."""
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000000)


def parse_timespan_us(value):
    """Parse a systemd time span as ``systemctl show`` prints it (``10s``, ``1min 30s``, ``100ms``).

    Returns microseconds, None for ``infinity``, and raises ValueError for anything else.
    A bare number is microseconds (what ``--value`` of a ``...USec`` property prints with ``-P``
    on some versions).
    """
    value = (value or "").strip()
    if value in ("infinity", ""):
        return None
    if value.isdigit():
        return int(value)
    total = 0.0
    pos = 0
    for match in _TIMESPAN_TOKEN.finditer(value):
        if value[pos : match.start()].strip():
            raise ValueError(f"not a systemd time span: {value!r}")
        number, unit = match.groups()
        if unit not in _TIMESPAN_UNITS:
            raise ValueError(f"unknown unit {unit!r} in systemd time span {value!r}")
        total += float(number) * _TIMESPAN_UNITS[unit]
        pos = match.end()
    if value[pos:].strip() or pos == 0:
        raise ValueError(f"not a systemd time span: {value!r}")
    return int(round(total))


def is_loaded(props):
    return props.get("LoadState") == "loaded"


def needs_daemon_reload(props):
    return props.get("NeedDaemonReload") == "yes"


def exit_description(props):
    """``code=exited, status=1`` from ExecMainCode/ExecMainStatus plus ``result=...``; '' if none."""
    code = CLD_CODES.get(props.get("ExecMainCode", ""), props.get("ExecMainCode") or None)
    status = props.get("ExecMainStatus", "")
    parts = []
    if code:
        parts.append(f"code={code}")
        if status != "":
            parts.append(f"{'signal' if code in ('killed', 'dumped') else 'status'}={status}")
    result = props.get("Result")
    if result and result != "success":
        parts.append(f"result={result}")
    return ", ".join(parts)


def restarts_on_failure(props):
    """True when ``Restart=`` makes systemd start the unit again after its main process fails."""
    return props.get("Restart", "no") not in ("no", "", "on-success")


def death_of(props, invocation_id, main_pid):
    """Why the invocation ``invocation_id`` whose main process is ``main_pid`` is no longer running.

    Returns None while it runs; otherwise a short reason.  Covers: the unit failed, a
    ``Restart=`` wait (``activating``/``auto-restart``), the unit stopped, systemd started another
    invocation, and the main PID vanished or changed.
    """
    active = props.get("ActiveState")
    sub = props.get("SubState")
    current = props.get("InvocationID", "")
    pid = as_int(props.get("MainPID"))
    if current and current != invocation_id:
        return f"systemd started another invocation {current}"
    if active == "failed":
        return "the unit failed"
    if sub == "auto-restart":
        restart = props.get("Restart", "")
        return f"the main process exited and systemd is waiting to restart it (Restart={restart})"
    if active in ("inactive", "deactivating"):
        return f"the unit is {active} ({sub})"
    if pid == 0:
        return f"the unit has no main process (MainPID=0, {active}/{sub})"
    if main_pid and pid != main_pid:
        return f"the main PID changed from {main_pid} to {pid}"
    return None


def daemon_reload(module):
    """``systemctl daemon-reload``: None when it succeeded, else the sentence that says why not."""
    rc, out, err = module.run_command(
        [module.get_bin_path("systemctl", required=True), "daemon-reload"],
        environ_update={"LANG": "C", "LC_ALL": "C"},
    )
    return None if rc == 0 else f"systemctl daemon-reload failed (rc={rc}): {(err or out).strip()}"


def analyze_verify(module, name, unit_path, content):
    """``systemd-analyze verify`` of ``content`` (bytes) under the unit's own ``name``, in a private
    temporary directory (the host is not touched): (rc, what it said with the temporary path replaced by
    ``unit_path``, blank lines dropped)."""
    tmpdir = tempfile.mkdtemp(prefix="sglang-unit.")
    tmp = os.path.join(tmpdir, name)
    try:
        with open(tmp, "wb") as handle:
            handle.write(content)
        analyze = module.get_bin_path("systemd-analyze", required=True)
        rc, out, err = module.run_command(
            [analyze, "verify", "--recursive-errors=no", f"{tmp}:{name}"],
            environ_update={"LANG": "C", "LC_ALL": "C"},
        )
    finally:
        os.unlink(tmp)
        os.rmdir(tmpdir)
    # systemd-analyze names the unit by the copy it makes in its own temporary directory.
    text = (err + out).replace(tmp, unit_path)
    text = re.sub(r"\S*/systemd-analyze-[^/\s]+/" + re.escape(name), unit_path, text)
    return rc, "\n".join(line for line in text.splitlines() if line.strip())
