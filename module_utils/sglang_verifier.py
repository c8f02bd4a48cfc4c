# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The polling worker of sglang_verified_restart: accept the NEW invocation (P1), watch it die or
become ready on its own port (P4, P6, P14, P15) and stay stable (P5), within a deadline.

All state that must survive a ``budget`` return lives in the baseline dict (``Verifier.b``), so the
action plugin can continue the same verification with the next module call. The unit's state comes
from ``sglang_systemd``, the listener and processes from ``sglang_proc``, journal lines from
``sglang_journal``, health answers from ``sglang_http`` and every text returned passes
``sglang_redact``.

Over 500 lines on purpose: ``Verifier`` is one state machine whose steps (accept, listener, orphans,
death, timeout, report) all read and write the one baseline; cut across files they would pass it around.
"""

from __future__ import annotations

import threading
import time

from ansible.module_utils.sglang_http import base_url
from ansible.module_utils.sglang_http import status as http_status
from ansible.module_utils.sglang_journal import (
    JournalError,
    exit_from_journal,
    format_lines,
    invocation_lines,
    latest_phase,
    read_invocation,
)
from ansible.module_utils.sglang_proc import boottime_offset_us, older_processes, port_listeners, read_boot_id
from ansible.module_utils.sglang_redact import redact_text
from ansible.module_utils.sglang_systemd import (
    CLD_CODES,
    RESTART_PROPERTIES,
    SystemctlError,
    as_int,
    death_of,
    monotonic_us,
    now_monotonic_us,
    restarts_on_failure,
)
from ansible.module_utils.sglang_systemd import show as systemctl_show

BASELINE_VERSION = 1
# A process counts as older than the invocation when it started this much before the main process
# (/proc start times have clock-tick resolution and are taken at fork, just before systemd's stamp).
START_TOLERANCE_US = 50000
HEALTH_PATH = "/health_generate"
# The start job is queued before `systemctl --no-block` returns; only a unit that stays inactive/failed
# with no job this long after the request is a start that never happened.
JOB_GRACE_US = 1000000
SHOW_PROPERTIES = RESTART_PROPERTIES + ("Job",)
PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BASELINE_KEYS = (
    "version",
    "unit",
    "boot_id",
    "request_us",
    "ready_deadline_us",
    "stable_deadline_us",
    "previous_invocation_id",
    "invocation_id",
)


def clock_us():
    """CLOCK_MONOTONIC in microseconds, systemd's clock for ExecMainStartTimestampMonotonic."""
    return now_monotonic_us()


def pause(seconds):
    time.sleep(seconds)


def boot_id():
    return read_boot_id(BOOT_ID_PATH)


def journal_entries(module, unit, invocation_id, main_pid, start_us, count, sync=False):
    """Journal lines of ONE invocation, oldest first (``sglang_journal.invocation_lines``): its own
    output, systemd's messages about it and lines of its main PID logged after it started, this boot.
    Evidence for messages, never a reason to fail: [] when the journal cannot be read."""
    if not invocation_id:
        return []
    since = start_us - START_TOLERANCE_US if start_us else None
    try:
        entries, _notes = read_invocation(
            module,
            invocation_id,
            [main_pid] if main_pid else (),
            since_monotonic_us=since,
            sync=sync,
            last=max(count, 1) * 4,
        )
    except JournalError:
        return []
    return invocation_lines(entries, unit, invocation_id)


class HealthProbe:
    """One ``/health_generate`` request in flight at a time, in a daemon thread.

    ``poll()`` returns the finished (status, error, finished_us) or None, and starts the next
    request. The thread never blocks the caller: a request that takes 20 s does not delay
    noticing that the main process died.
    """

    threaded = True

    def __init__(self, url, api_key, timeout):
        self.url = url
        self.api_key = api_key
        self.timeout = timeout
        self._thread = None
        self._result = None

    def _run(self):
        status, error = http_status(self.url, self.api_key, self.timeout)
        self._result = (status, error, clock_us())

    def poll(self):
        if not self.threaded:
            status, error = http_status(self.url, self.api_key, self.timeout)
            return status, error, clock_us()
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            result, self._result = self._result, None
            return result
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return None

    def in_flight(self):
        return self._thread is not None and self._thread.is_alive()

    def unread(self):
        """A request that has finished since the last ``poll()`` looked: its answer waits to be read."""
        return self._thread is not None and not self._thread.is_alive()

    def wait(self, seconds):
        """Pause between polls: at most ``seconds``, less when the request in flight finishes first
        (its answer is then read at once instead of after a full poll interval)."""
        if self.threaded and self.in_flight():
            self._thread.join(seconds)
        else:
            pause(seconds)


class Verifier:
    """The polling state machine. All state that must survive a ``budget`` return is in ``self.b``."""

    def __init__(self, module, params, baseline, systemctl, on_ready=None):
        self.module = module
        self.p = params
        self.b = baseline
        self.systemctl = systemctl
        # Called once, in this call, when the invocation first answers 200 (before its stability window), with
        # the baseline: work that needs a ready server runs while the window elapses, not after it.
        self.on_ready = on_ready
        self.secrets = [s for s in (params.get("api_key"),) if s]
        url = base_url(params["host"], params["port"]) + HEALTH_PATH
        self.probe = HealthProbe(url, params.get("api_key"), params["health_timeout"])
        self.props = {}
        self.listener = None

    # ---------------------------------------------------------------- helpers
    def redact(self, text):
        return redact_text(text, self.secrets)

    def show(self):
        try:
            return systemctl_show(self.module, self.p["unit"], SHOW_PROPERTIES, self.systemctl)
        except SystemctlError as exc:
            self.fail(str(exc))

    def rel(self, t_us):
        request = self.b.get("request_us") or self.b.get("call_us")
        if t_us is None or request is None:
            return None
        return round((t_us - request) / 1e6, 3)

    def timings(self, now_us=None):
        b = self.b
        total_end = b.get("stable_us") or now_us
        return {
            "started": self.rel(b.get("start_us")),
            "port_open": self.rel(b.get("port_open_us")),
            "ready": self.rel(b.get("ready_us")),
            "stable": self.rel(b.get("stable_us")),
            "total": self.rel(total_end),
        }

    def entries(self, sync=False):
        b = self.b
        return journal_entries(
            self.module,
            self.p["unit"],
            b.get("invocation_id"),
            b.get("main_pid"),
            b.get("start_us"),
            self.p["journal_lines"],
            sync=sync,
        )

    def state(self):
        return f"{self.props.get('ActiveState', '?')}/{self.props.get('SubState', '?')}"

    def progress(self, now_us, entries=None):
        if entries is None:
            entries = self.entries()
        start = self.b.get("request_us") or self.b.get("call_us")
        return {
            "elapsed": round((now_us - start) / 1e6, 1),
            "phase": latest_phase(entries, self.redact, ignore=HEALTH_PATH),
            "state": self.state(),
            "step": self.b.get("step"),
        }

    def result(self, now_us, **extra):
        b = self.b
        res = {
            "changed": bool(b.get("restarted")),
            "restarted": bool(b.get("restarted")),
            "previous_invocation_id": b.get("previous_invocation_id") or "",
            "invocation_id": b.get("invocation_id"),
            "main_pid": b.get("main_pid"),
            "n_restarts": b.get("n_restarts"),
            "start_monotonic_us": b.get("start_us"),
            "start_monotonic": round(b["start_us"] / 1e6, 6) if b.get("start_us") else None,
            "timings": self.timings(now_us),
            "listener": self.listener,
            "baseline": dict(b),
            "pending": False,
        }
        res.update(extra)
        if "progress" not in res:
            # The phase (the invocation's latest log line) is for a caller still waiting: the action plugin
            # prints it after a pending slice. A verified invocation's is not read - the running-arguments
            # check of the same call reads its journal already.
            res["progress"] = self.progress(now_us, None if res["pending"] else [])
        return res

    def fail(self, msg, **extra):
        now_us = clock_us()
        entries = extra.pop("entries", None)
        if entries is None:
            entries = self.entries(sync=True) if self.b.get("invocation_id") else []
        res = self.result(
            now_us,
            progress=self.progress(now_us, entries),
            journal=format_lines(entries, self.p["journal_lines"], self.redact),
            **extra,
        )
        self.module.fail_json(msg=self.redact(msg), **res)

    # ---------------------------------------------------------------- failure paths
    def fail_death(self, reason, props):
        b = self.b
        unit = self.p["unit"]
        entries = self.entries(sync=True)
        same = (
            props.get("InvocationID") == b["invocation_id"]
            and as_int(props.get("ExecMainPID")) == b["main_pid"]
        )
        exit_info = None
        if same and props.get("ExecMainCode") not in ("", "0"):
            exit_info = {
                "code": CLD_CODES.get(props["ExecMainCode"], props["ExecMainCode"]),
                "status": props.get("ExecMainStatus"),
                "result": props.get("Result"),
                "source": "systemctl",
            }
        if exit_info is None:
            exit_info = exit_from_journal(entries) or {
                "code": None,
                "status": None,
                "source": "unknown",
            }
            exit_info.setdefault("result", props.get("Result") if same else None)
        lived = None
        exit_us = monotonic_us(props.get("ExecMainExitTimestampMonotonic")) if same else None
        exit_us = exit_us or exit_info.pop("t_us", None)
        exit_info.pop("t_us", None)
        if exit_us and b.get("start_us"):
            lived = round((exit_us - b["start_us"]) / 1e6, 3)
        crash_loop = restarts_on_failure(props) and (
            props.get("SubState") == "auto-restart"
            or props.get("InvocationID") != b["invocation_id"]
            or as_int(props.get("NRestarts")) > (b.get("n_restarts") or 0)
        )
        start_limit = any("Start request repeated too quickly" in e["message"] for e in entries)
        burst = props.get("StartLimitBurst", "?")
        interval = props.get("StartLimitIntervalUSec", "?")
        status = ", ".join(
            f"{k}={v}"
            for k, v in (
                ("code", exit_info.get("code")),
                ("status", exit_info.get("status")),
                ("result", exit_info.get("result")),
            )
            if v
        )
        msg = (
            f"{unit}: invocation {b['invocation_id']} (MainPID {b['main_pid']}) died"
            f"{f' {lived} s after start' if lived is not None else ''}: {reason}"
            f"{f'; exit {status}' if status else ''}."
        )
        if (
            crash_loop
            or start_limit
            or (props.get("ActiveState") == "failed" and as_int(props.get("NRestarts")))
        ):
            crash_loop = True
            msg += (
                f" Crash loop: Restart={props.get('Restart')}, NRestarts={props.get('NRestarts')}; systemd"
                f" stops retrying after StartLimitBurst={burst} starts within"
                f" StartLimitIntervalUSec={interval}"
            )
            msg += (
                " and has marked the unit failed (start limit hit)."
                if start_limit or props.get("ActiveState") == "failed"
                else "."
            )
        foreign = [
            entry
            for entry in port_listeners(self.p["host"], self.p["port"], b["control_group"], PROC_ROOT)
            if entry["foreign"]
        ]
        if foreign:
            msg += " " + self.foreign_text(foreign)
        msg += ' Last journal lines of this invocation are in "journal".'
        # How long after the death this verdict came (the bound the tests and the lab measure).
        detected = round((clock_us() - exit_us) / 1e6, 3) if exit_us else None
        self.fail(
            msg,
            entries=entries,
            exit=exit_info,
            crash_loop=crash_loop,
            died_after=lived,
            died_monotonic_us=exit_us,
            detected_after_death=detected,
        )

    def foreign_text(self, foreign):
        parts = []
        for entry in foreign:
            for proc in entry["foreign"]:
                argv = " ".join(proc["cmdline"] or [])
                parts.append(f"pid {proc['pid']} ({self.redact(argv)!r}, cgroup {proc['cgroup']})")
        return (
            f"Port {self.p['port']} is held by a process OUTSIDE the unit's cgroup "
            f"{self.b.get('control_group')}: " + "; ".join(parts) + "."
        )

    # ---------------------------------------------------------------- one poll
    def accept(self, props, now_us):
        """P1: an invocation counts only when it is new and its main process started after the request."""
        b = self.b
        invocation = props.get("InvocationID", "")
        start_us = monotonic_us(props.get("ExecMainStartTimestampMonotonic"))
        new = invocation and invocation != b.get("previous_invocation_id")
        after = start_us is not None and (b.get("request_us") is None or start_us > b["request_us"])
        if new and after:
            # MainPID is 0 when the process already exited; ExecMainPID still names it.
            b.update(
                invocation_id=invocation,
                main_pid=as_int(props.get("MainPID")) or as_int(props.get("ExecMainPID")),
                n_restarts=as_int(props.get("NRestarts")),
                start_us=start_us,
                control_group=props.get("ControlGroup", ""),
                step="port",
            )
            if b.get("restarted") and b["n_restarts"] > b.get("request_n_restarts", 0):
                # A manual restart resets NRestarts: a higher value means systemd already restarted
                # the first process started for our request.
                b["n_restarts_at_request"] = b.get("request_n_restarts", 0)
                self.fail_death(
                    f"a process started after the restart request already exited and systemd "
                    f"restarted the unit (NRestarts={b['n_restarts']})",
                    props,
                )
            return True
        if new and not after and props.get("ActiveState") == "failed":
            self.fail(
                f"{self.p['unit']} failed before its main process started (Result={props.get('Result')}, "
                f"SubState={props.get('SubState')}): an ExecStartPre= or the start job failed.",
                entries=journal_entries(
                    self.module, self.p["unit"], invocation, None, None, self.p["journal_lines"], sync=True
                ),
            )
        if (
            not props.get("Job")
            and props.get("ActiveState") in ("failed", "inactive")
            and b.get("restarted")
            and now_us - b["request_us"] > JOB_GRACE_US
        ):
            self.fail(
                f"{self.p['unit']}: the {b.get('action', 'restart')} job finished without starting a new "
                f"invocation (ActiveState={props.get('ActiveState')}, Result={props.get('Result')}). "
                f"Check 'journalctl -u {self.p['unit']}' (a start limit or a failed condition)."
            )
        return False

    def check_listener(self, now_us):
        b = self.b
        found = port_listeners(self.p["host"], self.p["port"], b["control_group"], PROC_ROOT)
        foreign = [entry for entry in found if entry["foreign"]]
        if foreign:
            self.listener = {k: foreign[0][k] for k in ("pid", "pids", "cgroup", "address", "in_cgroup")}
            self.fail(
                self.foreign_text(foreign) + " It answers on the port instead of invocation "
                f"{b['invocation_id']} (P4), see docs/properties.md."
            )
        ours = [entry for entry in found if entry["in_cgroup"]]
        if ours:
            self.listener = {k: ours[0][k] for k in ("pid", "pids", "cgroup", "address", "in_cgroup")}
            if not b.get("port_open_us"):
                b["port_open_us"] = now_us
        return bool(ours)

    def check_orphans(self):
        b = self.b
        older = older_processes(
            b["control_group"],
            b["start_us"],
            b.get("main_pid"),
            boottime_offset_us(),
            START_TOLERANCE_US,
            PROC_ROOT,
            CGROUP_ROOT,
        )
        if older:
            desc = "; ".join(
                f"pid {o['pid']} ({self.redact(' '.join(o['cmdline'] or []))!r}, started "
                f"{o['started_monotonic']} s)"
                for o in older
            )
            self.fail(
                f"{self.p['unit']}: processes older than invocation {b['invocation_id']} (main process "
                f"started {b['start_us'] / 1e6:.3f} s) are still in its cgroup {b['control_group']}: {desc}. "
                "They survived the restart (KillMode=process or a double fork?) and may hold GPUs (P14),"
                " see docs/properties.md.",
                orphans=older,
            )

    def step(self, now_us):
        """One poll. Returns True when the verification is complete."""
        b = self.b
        props = self.props = self.show()
        if b.get("invocation_id") is None and not self.accept(props, now_us):
            b["step"] = "invocation"
            return False
        reason = death_of(props, b["invocation_id"], b["main_pid"])
        if reason is None and as_int(props.get("NRestarts")) != b["n_restarts"]:
            reason = f"NRestarts changed from {b['n_restarts']} to {props.get('NRestarts')}"
        if reason:
            self.fail_death(reason, props)
        if not self.check_listener(now_us):
            b["step"] = "port"
            return False
        result = self.probe.poll()
        if result is None:
            b["step"] = b.get("step") if b.get("ready_us") else "ready"
            return False
        status, error, done_us = result
        b["last_health"] = status if status is not None else error
        if status != 200:
            if b.get("ready_us"):
                b.update(
                    streak=0,
                    stable_since_us=None,
                    step="stable",
                    health_failures=b.get("health_failures", 0) + 1,
                )
            return False
        if not b.get("ready_us"):
            b["ready_us"] = done_us
            self.check_orphans()
            if self.on_ready is not None:
                self.on_ready(b)
        b["streak"] = b.get("streak", 0) + 1
        if not b.get("stable_since_us"):
            b["stable_since_us"] = done_us
        b["step"] = "stable"
        if (
            b["streak"] >= self.p["health_count"]
            and done_us - b["stable_since_us"] >= self.p["stable_seconds"] * 1e6
        ):
            self.check_listener(done_us)
            self.check_orphans()
            b["stable_us"] = done_us
            return True
        return False

    def timeout_message(self, now_us, entries):
        b = self.b
        phase = latest_phase(entries, self.redact, ignore=HEALTH_PATH) or "(no journal lines)"
        if b.get("invocation_id") is None:
            return (
                f"{self.p['unit']}: no new invocation started within "
                f"ready_timeout={self.p['ready_timeout']} s "
                f"of the restart request (state {self.state()}, previous InvocationID "
                f"{b.get('previous_invocation_id') or 'none'})."
            )
        if not b.get("ready_us"):
            port = "port open" if b.get("port_open_us") else f"port {self.p['port']} never opened"
            return (
                f"{self.p['unit']}: /health_generate did not answer 200 within ready_timeout="
                f"{self.p['ready_timeout']} s ({port}; last health answer: {b.get('last_health', 'none')}). "
                f"Invocation {b['invocation_id']} (MainPID {b['main_pid']}) was last doing: {phase}"
            )
        return (
            f"{self.p['unit']}: not stable: /health_generate did not answer 200 "
            f"{self.p['health_count']} times "
            f"in a row over stable_seconds={self.p['stable_seconds']} before the deadline "
            f"({b.get('health_failures', 0)} failed answers, last: {b.get('last_health')})."
        )

    def run(self, budget_end_us):
        b = self.b
        last_look = False
        while True:
            now_us = clock_us()
            if self.step(now_us):
                now_us = clock_us()
                return self.result(
                    now_us,
                    msg=(
                        f"{self.p['unit']}: invocation {b['invocation_id']} "
                        f"(MainPID {b['main_pid']}) is ready, "
                        f"listens on port {self.p['port']} from its own cgroup and was stable for "
                        f"{self.p['stable_seconds']} s ({b['streak']} health answers)."
                    ),
                )
            now_us = clock_us()
            deadline = b["ready_deadline_us"] if not b.get("ready_us") else b["stable_deadline_us"]
            if now_us >= deadline:
                entries = self.entries(sync=True)
                self.fail(self.timeout_message(now_us, entries), entries=entries)
            if now_us >= budget_end_us and not self.probe.in_flight():
                # An answer that came in after this poll looked (the request is fast, the host busy) is read
                # in one more poll before the call gives up: the probe's proof waits for one answer only.
                if self.probe.unread() and not last_look:
                    last_look = True
                    continue
                return self.result(
                    now_us, pending=True, msg=f"{self.p['unit']}: still waiting ({b.get('step')})"
                )
            if now_us >= budget_end_us + self.p["health_timeout"] * 1e6:
                return self.result(
                    now_us, pending=True, msg=f"{self.p['unit']}: still waiting ({b.get('step')})"
                )
            self.probe.wait(self.p["poll_interval"])


def new_baseline(params, props, restarted, request_us, call_us, action):
    """The state of a new verification: of the restart requested at ``request_us`` (``restarted``), or
    of the invocation running at ``call_us``. Deadlines count from the request (else the call)."""
    ready_deadline = (request_us or call_us) + int(params["ready_timeout"] * 1e6)
    stable_allowance = params["stable_seconds"] + params["health_count"] * params["health_timeout"]
    return {
        "version": BASELINE_VERSION,
        "unit": params["unit"],
        "boot_id": boot_id(),
        "restarted": restarted,
        "action": action,
        "request_us": request_us,
        "call_us": call_us,
        "previous_invocation_id": props.get("InvocationID", "") if restarted else None,
        "request_n_restarts": 0,
        "ready_deadline_us": ready_deadline,
        "stable_deadline_us": ready_deadline + int(stable_allowance * 1e6),
        "invocation_id": None,
        "step": "invocation",
    }


def baseline_problem(unit, baseline):
    """Why ``baseline`` cannot continue a verification of ``unit`` now (None: it can)."""
    missing = [k for k in BASELINE_KEYS if k not in baseline]
    if missing:
        return f"baseline is not a result of sglang_verified_restart (missing {', '.join(missing)})"
    if baseline["version"] != BASELINE_VERSION:
        return f"baseline version {baseline['version']} is not {BASELINE_VERSION}"
    if baseline["unit"] != unit:
        return f"baseline is for unit {baseline['unit']}, not unit={unit}"
    if baseline["boot_id"] != boot_id():
        return (
            "the host rebooted since the baseline was taken (boot_id changed); "
            "the restart it describes is gone"
        )
    return None
