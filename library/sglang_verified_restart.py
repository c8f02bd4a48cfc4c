#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_verified_restart
short_description: Restart a systemd service; prove the NEW invocation is ready, owns its port, is stable
description:
  - Refuses to restart when the unit is not loaded or systemd has not re-read an edited unit file
    (C(NeedDaemonReload=yes)), because the restart would run the old definition (P7).
  - Records C(CLOCK_MONOTONIC) immediately before C(systemctl restart --no-block UNIT) (C(start) when
    the unit is not running; C(reset-failed) first when it is C(failed)).
  - Accepts only an invocation whose C(InvocationID) differs from the one before the request AND whose
    C(ExecMainStartTimestampMonotonic) is later than the request (P1).
  - Fails within about one O(poll_interval) (well under 2 s) of the main process dying, with its exit
    status and the last journal lines of THAT invocation (by C(_SYSTEMD_INVOCATION_ID), systemd's own
    C(INVOCATION_ID) and the main C(_PID)); reports a C(Restart=) crash loop with C(NRestarts) (P15).
  - Ready means C(/health_generate) answered 200 (P6); C(/health) is not enough. Health requests run in
    a background thread, so a slow C(/health_generate) (SGLang's takes at least 1 s) never delays noticing
    a death.
  - The process listening on I(host):I(port) must be in the unit's cgroup; a process outside it is a
    failure naming its pid, cmdline and cgroup. No process in the unit's cgroup may have started before
    the invocation's main process (P4, P14).
  - Stability window - over I(stable_seconds), C(InvocationID), C(MainPID) and C(NRestarts) stay constant and
    C(/health_generate) answers 200 I(health_count) times in a row (P5).
  - Waits at most I(budget) seconds per call and then returns C(pending=true) with I(baseline); call
    again with I(restart=false) and that I(baseline) to continue (the action plugin of the same name does
    this and prints progress).
  - With I(restart=false) and no I(baseline), verifies the invocation that is running now (no restart,
    C(changed=false)); use it to prove a deploy that changed nothing.
  - The property codes (P1 ... P17) in this text and in its messages are defined in C(docs/properties.md).
version_added: "1.0.0"
author:
  - sglang-deploy authors
options:
  unit:
    description: Name of the systemd unit (C(.service) is implied).
    type: str
    required: true
  host:
    description: Address the server listens on, used for health requests and to pick the listening socket.
    type: str
    default: 127.0.0.1
  port:
    description: TCP port of the server's HTTP API.
    type: int
    required: true
  api_key:
    description:
      - Sent as C(Authorization Bearer) on health requests. SGLang does not require it on C(/health*),
        but a fronting proxy may. Never printed; also redacted from journal excerpts.
    type: str
  ready_timeout:
    description: Seconds from the restart request until C(/health_generate) must answer 200.
    type: float
    default: 1800
  stable_seconds:
    description: Length of the stability window after the first 200, in seconds.
    type: float
    default: 5
  health_count:
    description: Consecutive C(/health_generate) 200 answers required in the stability window.
    type: int
    default: 3
  health_timeout:
    description:
      - Timeout of one C(/health_generate) request. SGLang answers 503 itself after
        C(SGLANG_HEALTH_CHECK_TIMEOUT) (20 s) when it cannot generate.
    type: float
    default: 25
  poll_interval:
    description: Seconds between two reads of the unit's state.
    type: float
    default: 0.25
  restart:
    description:
      - C(true) issues the restart. C(false) continues waiting on the restart described by I(baseline),
        or, without I(baseline), verifies the running invocation without restarting.
    type: bool
    default: true
  reset_start_limit:
    description:
      - With O(restart), run C(systemctl reset-failed UNIT) before the restart even when the unit is
        not C(failed); a deliberate restart then does not count against C(StartLimitBurst), whose
        budget is meant for crashes (without it the 4th deploy within C(StartLimitIntervalSec) is refused).
    type: bool
    default: false
  baseline:
    description: The C(baseline) returned by a previous call that ended with C(pending=true).
    type: dict
  budget:
    description:
      - Seconds this call may wait before it returns C(pending=true). Default is the whole deadline.
    type: float
  journal_lines:
    description: How many journal lines of the invocation to return on failure.
    type: int
    default: 20
attributes:
  check_mode:
    support: full
    details:
      - With I(restart=true), checks the unit (P7 problems become warnings) and reports C(changed=true)
        without restarting. With I(restart=false) the verification runs normally (it only reads).
  diff_mode:
    support: none
notes:
  - C(ExecMainStartTimestampMonotonic) and the module's C(CLOCK_MONOTONIC) come from the same kernel
    clock; containers (systemd-nspawn) share it with the host.
  - C(/proc/net/tcp) is read in the module's network namespace, which is the server's on a plain host.
"""

EXAMPLES = r"""
- name: Restart SGLang and prove the new invocation serves
  sglang_verified_restart:
    unit: sglang.service
    port: 30000
    api_key: "{{ sglang_api_key }}"
    ready_timeout: 1800
  no_log: false
  register: __sglang_restart

- name: Verify the running invocation without restarting
  sglang_verified_restart:
    unit: sglang.service
    port: 30000
    restart: false
"""

RETURN = r"""
invocation_id:
  description: InvocationID of the verified invocation.
  returned: when an invocation was accepted
  type: str
  sample: 816cf17c830242c5baee929b8784d3da
previous_invocation_id:
  description: InvocationID before the restart request ('' when the unit was not running).
  returned: always
  type: str
  sample: e41c2429b4a947f4a8f3e5cfcc1a7b8d
main_pid:
  description: MainPID of the verified invocation.
  returned: when an invocation was accepted
  type: int
  sample: 93
n_restarts:
  description: NRestarts of the unit during the verified invocation.
  returned: when an invocation was accepted
  type: int
  sample: 0
start_monotonic_us:
  description: ExecMainStartTimestampMonotonic of the invocation (CLOCK_MONOTONIC, microseconds).
  returned: when an invocation was accepted
  type: int
  sample: 1005476461
start_monotonic:
  description: The same in seconds.
  returned: when an invocation was accepted
  type: float
  sample: 1005.476461
restarted:
  description: Whether this call (or the first call of this baseline) issued the restart.
  returned: always
  type: bool
  sample: true
timings:
  description:
    - Seconds from the restart request to each event (null until it happened). C(started) is systemd's
      exec of the main process, C(port_open) the first poll that saw the listener in the cgroup,
      C(ready) the first C(/health_generate) 200, C(stable) the end of the stability window.
  returned: always
  type: dict
  sample: {started: 0.025, port_open: 1.21, ready: 2.3, stable: 7.4, total: 7.4}
listener:
  description: The process listening on the port.
  returned: when the port was open
  type: dict
  sample: {pid: 93, pids: [93], cgroup: /system.slice/sglang.service, address: 0.0.0.0, in_cgroup: true}
pending:
  description: True when I(budget) ran out before the verification finished; call again with C(baseline).
  returned: always
  type: bool
  sample: false
progress:
  description: C(elapsed) seconds since the request, C(phase) (latest journal message of the invocation,
    redacted), C(state) (ActiveState/SubState), C(step) (what the module waits for).
  returned: always
  type: dict
  sample: {elapsed: 61.2, phase: "Load weight end. mem usage=12.3 GB", state: active/running, step: ready}
baseline:
  description: Pass back as I(baseline) with I(restart=false) to continue.
  returned: always
  type: dict
exit:
  description: On a death, C(code), C(status) and C(result) of the dead main process.
  returned: on failure after a death
  type: dict
  sample: {code: exited, status: '1', result: exit-code, source: systemctl}
crash_loop:
  description: On a death, whether systemd restarts the unit by itself (C(Restart=)), i.e. a crash loop.
  returned: on failure after a death
  type: bool
journal:
  description: Last I(journal_lines) journal lines of the invocation (redacted).
  returned: on failure
  type: list
  elements: str
"""

import re
import threading
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_journal import message_text, parse_json_lines, select_invocation
from ansible.module_utils.sglang_proc import (
    boottime_offset_us,
    cgroup_of,
    cgroup_procs,
    cmdline,
    in_cgroup,
    listeners,
    pids_of_inode,
    start_time_us,
)
from ansible.module_utils.sglang_redact import redact_text
from ansible.module_utils.sglang_systemd import (
    CLD_CODES,
    RESTART_PROPERTIES,
    SystemctlError,
    as_int,
    death_of,
    is_loaded,
    monotonic_us,
    needs_daemon_reload,
    now_monotonic_us,
    restarts_on_failure,
)
from ansible.module_utils.sglang_systemd import show as systemctl_show

BASELINE_VERSION = 1
# A process counts as older than the invocation when it started this much before the main process
# (/proc start times have clock-tick resolution and are taken at fork, just before systemd's stamp).
START_TOLERANCE_US = 50000
UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"
HEALTH_PATH = "/health_generate"
# The start job is queued before `systemctl --no-block` returns; only a unit that stays inactive/failed
# with no job this long after the request is a start that never happened.
JOB_GRACE_US = 1000000
PROC_ROOT = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_SECRET_PATTERNS = (
    re.compile(
        r"""(?i)((?:admin[_-])?api[_-]?key|token|secret|password)(['"]?\s*[:=]\s*['"]?)([^'",\s)}]+)"""
    ),
    re.compile(r"""(?i)(--(?:admin-)?api-key)(\s+|=)(\S+)"""),
    re.compile(r"""(?i)(Authorization:?\s*Bearer)(\s+)(\S+)"""),
)


def _now_us():
    return now_monotonic_us()


def _sleep(seconds):
    time.sleep(seconds)


def redact(text, secrets=()):
    """Remove secret values (the literal ones we know, and anything that looks like key=value)."""
    text = redact_text(text, secrets)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "********")
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + m.group(2) + "********", text)
    return text


def http_status(url, headers, timeout):
    """GET ``url``; returns (status or None, error text). Proxies from the environment are ignored."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(url, headers=headers)
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return None, str(reason)


class HealthProbe:
    """One ``/health_generate`` request in flight at a time, in a daemon thread.

    ``poll()`` returns the finished (status, error, finished_us) or None, and starts the next
    request. The thread never blocks the caller: a request that takes 20 s does not delay
    noticing that the main process died.
    """

    threaded = True

    def __init__(self, url, headers, timeout):
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self._thread = None
        self._result = None

    def _run(self):
        status, error = http_status(self.url, self.headers, self.timeout)
        self._result = (status, error, _now_us())

    def poll(self):
        if not self.threaded:
            status, error = http_status(self.url, self.headers, self.timeout)
            return status, error, _now_us()
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

    def wait(self, seconds):
        """Pause between polls: at most ``seconds``, less when the request in flight finishes first
        (its answer is then read at once instead of after a full poll interval)."""
        if self.threaded and self.in_flight():
            self._thread.join(seconds)
        else:
            _sleep(seconds)


def journal_entries(module, unit, invocation_id, main_pid, start_us, count, sync=False):
    """Journal lines of ONE invocation, oldest first, as dicts with t_us/pid/message/systemd.

    Matches the invocation's own output (``_SYSTEMD_INVOCATION_ID``), systemd's messages about it
    (``INVOCATION_ID``: "Main process exited, code=...") and, because lines of a process that exits
    fast can lose their unit tags, lines of its main PID logged after it started (``_PID``, this
    boot). Selection is ``sglang_journal.select_invocation``.
    """
    journalctl = module.get_bin_path("journalctl")
    if not journalctl or not invocation_id:
        return []
    env = {"LANG": "C", "LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
    if sync:
        module.run_command([journalctl, "--sync"], environ_update=env)
    cmd = [journalctl, "--no-pager", "-o", "json", "--all", "-b", "-n", str(max(count, 1) * 4)]
    cmd += [f"_SYSTEMD_INVOCATION_ID={invocation_id}", "+", f"INVOCATION_ID={invocation_id}"]
    if main_pid:
        cmd += ["+", f"_PID={main_pid}"]
    rc, out, _err = module.run_command(cmd, environ_update=env)
    if rc != 0:
        return []
    raw, _bad = parse_json_lines(out)
    since = start_us - START_TOLERANCE_US if start_us else None
    selected = select_invocation(raw, invocation_id, [main_pid] if main_pid else (), since_monotonic_us=since)
    entries = []
    for entry in selected:
        about = entry.get("_PID") == "1" or (
            entry.get("INVOCATION_ID") and entry.get("_SYSTEMD_INVOCATION_ID") != invocation_id
        )
        if about and entry.get("UNIT") not in (None, unit):
            continue
        entries.append(
            {
                "t_us": as_int(entry.get("__MONOTONIC_TIMESTAMP")),
                "pid": entry.get("_PID"),
                "systemd": bool(about),
                "message": message_text(entry.get("MESSAGE")),
                "fields": entry,
            }
        )
    return entries


def format_entries(entries, count, secrets):
    lines = []
    for entry in entries[-count:]:
        who = "systemd" if entry["systemd"] else f"pid {entry['pid']}"
        lines.append(redact(f"[{entry['t_us'] / 1e6:.6f}] {who}: {entry['message']}", secrets))
    return lines


def latest_phase(entries, secrets):
    """The invocation's latest own log line (systemd's 'Started ...' only when it logged nothing)."""
    # Access-log lines of our own health probes say nothing about what the server is doing.
    own = [
        e for e in entries if not e["systemd"] and e["message"].strip() and HEALTH_PATH not in e["message"]
    ]
    pick = own or [e for e in entries if e["message"].strip()]
    return redact(pick[-1]["message"].strip(), secrets)[:300] if pick else ""


def exit_from_journal(entries, main_pid):
    """EXIT_CODE/EXIT_STATUS of systemd's 'Main process exited' message for this invocation."""
    result = next(
        (e["fields"]["UNIT_RESULT"] for e in reversed(entries) if e["fields"].get("UNIT_RESULT")), None
    )
    for entry in reversed(entries):
        fields = entry["fields"]
        if (
            fields.get("MESSAGE_ID") == UNIT_PROCESS_EXIT
            and fields.get("COMMAND", "ExecStart") == "ExecStart"
        ):
            return {
                "code": fields.get("EXIT_CODE"),
                "status": fields.get("EXIT_STATUS"),
                "source": "journal",
                "result": result,
                "t_us": entry["t_us"],
                "message": entry["message"],
            }
    return None


def read_boot_id():
    try:
        with open(BOOT_ID_PATH) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def describe_pid(pid):
    return {"pid": pid, "cmdline": cmdline(pid, PROC_ROOT), "cgroup": cgroup_of(pid, PROC_ROOT)}


def port_listeners(host, port, control_group):
    """Listeners on the port, each with its holder pids and whether they are all in the cgroup."""
    found = []
    for sock in listeners(port, host, PROC_ROOT):
        holders = pids_of_inode(sock["inode"], PROC_ROOT)
        groups = {pid: cgroup_of(pid, PROC_ROOT) for pid in holders}
        found.append(
            {
                "address": sock["local_address"],
                "family": sock["family"],
                "inode": sock["inode"],
                "pids": holders,
                "pid": holders[0] if holders else None,
                "cgroup": groups[holders[0]] if holders else None,
                "in_cgroup": bool(holders) and all(in_cgroup(g, control_group) for g in groups.values()),
                "foreign": [
                    describe_pid(pid) for pid, g in groups.items() if not in_cgroup(g, control_group)
                ],
            }
        )
    return found


def older_processes(control_group, start_us):
    """P14: processes in the unit's cgroup that started before its main process (monotonic us)."""
    procs = cgroup_procs(control_group, CGROUP_ROOT)
    if procs is None:
        return None
    offset = boottime_offset_us()
    older = []
    for pid in procs:
        started = start_time_us(pid, PROC_ROOT)
        if started is None:
            continue
        started -= offset
        if started < start_us - START_TOLERANCE_US:
            info = describe_pid(pid)
            info["started_monotonic"] = round(started / 1e6, 3)
            older.append(info)
    return older


class Verifier:
    """The polling state machine. All state that must survive a ``budget`` return is in ``self.b``."""

    def __init__(self, module, params, baseline, systemctl):
        self.module = module
        self.p = params
        self.b = baseline
        self.systemctl = systemctl
        self.secrets = [s for s in (params.get("api_key"),) if s]
        scheme_host = f"[{params['host']}]" if ":" in params["host"] else params["host"]
        headers = {"Authorization": f"Bearer {params['api_key']}"} if params.get("api_key") else {}
        self.probe = HealthProbe(
            f"http://{scheme_host}:{params['port']}{HEALTH_PATH}", headers, params["health_timeout"]
        )
        self.props = {}
        self.listener = None

    # ---------------------------------------------------------------- helpers
    def show(self):
        try:
            return systemctl_show(self.module, self.p["unit"], RESTART_PROPERTIES + ("Job",), self.systemctl)
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
            "phase": latest_phase(entries, self.secrets),
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
            res["progress"] = self.progress(now_us)
        return res

    def fail(self, msg, **extra):
        now_us = _now_us()
        entries = extra.pop("entries", None)
        if entries is None:
            entries = self.entries(sync=True) if self.b.get("invocation_id") else []
        res = self.result(
            now_us,
            progress=self.progress(now_us, entries),
            journal=format_entries(entries, self.p["journal_lines"], self.secrets),
            **extra,
        )
        self.module.fail_json(msg=redact(msg, self.secrets), **res)

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
            exit_info = exit_from_journal(entries, b["main_pid"]) or {
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
            for entry in port_listeners(self.p["host"], self.p["port"], b["control_group"])
            if entry["foreign"]
        ]
        if foreign:
            msg += " " + self.foreign_text(foreign)
        msg += ' Last journal lines of this invocation are in "journal".'
        # How long after the death this verdict came (the bound the tests and the lab measure).
        detected = round((_now_us() - exit_us) / 1e6, 3) if exit_us else None
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
                parts.append(f"pid {proc['pid']} ({redact(argv, self.secrets)!r}, cgroup {proc['cgroup']})")
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
        found = port_listeners(self.p["host"], self.p["port"], b["control_group"])
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
        older = older_processes(b["control_group"], b["start_us"])
        if older:
            desc = "; ".join(
                f"pid {o['pid']} ({redact(' '.join(o['cmdline'] or []), self.secrets)!r}, started "
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
        phase = latest_phase(entries, self.secrets) or "(no journal lines)"
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
        while True:
            now_us = _now_us()
            if self.step(now_us):
                now_us = _now_us()
                return self.result(
                    now_us,
                    msg=(
                        f"{self.p['unit']}: invocation {b['invocation_id']} "
                        f"(MainPID {b['main_pid']}) is ready, "
                        f"listens on port {self.p['port']} from its own cgroup and was stable for "
                        f"{self.p['stable_seconds']} s ({b['streak']} health answers)."
                    ),
                )
            now_us = _now_us()
            deadline = b["ready_deadline_us"] if not b.get("ready_us") else b["stable_deadline_us"]
            if now_us >= deadline:
                entries = self.entries(sync=True)
                self.fail(self.timeout_message(now_us, entries), entries=entries)
            if now_us >= budget_end_us and not self.probe.in_flight():
                return self.result(
                    now_us, pending=True, msg=f"{self.p['unit']}: still waiting ({b.get('step')})"
                )
            if now_us >= budget_end_us + self.p["health_timeout"] * 1e6:
                return self.result(
                    now_us, pending=True, msg=f"{self.p['unit']}: still waiting ({b.get('step')})"
                )
            self.probe.wait(self.p["poll_interval"])


def new_baseline(params, props, restarted, request_us, call_us, action):
    ready_deadline = (request_us or call_us) + int(params["ready_timeout"] * 1e6)
    stable_allowance = params["stable_seconds"] + params["health_count"] * params["health_timeout"]
    return {
        "version": BASELINE_VERSION,
        "unit": params["unit"],
        "boot_id": read_boot_id(),
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


def check_baseline(module, params, baseline):
    missing = [
        k
        for k in (
            "version",
            "unit",
            "boot_id",
            "request_us",
            "ready_deadline_us",
            "stable_deadline_us",
            "previous_invocation_id",
            "invocation_id",
        )
        if k not in baseline
    ]
    if missing:
        module.fail_json(
            msg=f"baseline is not a result of sglang_verified_restart (missing {', '.join(missing)})"
        )
    if baseline["version"] != BASELINE_VERSION:
        module.fail_json(msg=f"baseline version {baseline['version']} is not {BASELINE_VERSION}")
    if baseline["unit"] != params["unit"]:
        module.fail_json(msg=f"baseline is for unit {baseline['unit']}, not unit={params['unit']}")
    if baseline["boot_id"] != read_boot_id():
        module.fail_json(
            msg="the host rebooted since the baseline was taken (boot_id changed); "
            "the restart it describes is gone"
        )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            api_key=dict(type="str", no_log=True),
            ready_timeout=dict(type="float", default=1800),
            stable_seconds=dict(type="float", default=5),
            health_count=dict(type="int", default=3),
            health_timeout=dict(type="float", default=25),
            poll_interval=dict(type="float", default=0.25),
            restart=dict(type="bool", default=True),
            reset_start_limit=dict(type="bool", default=False),
            baseline=dict(type="dict"),
            budget=dict(type="float"),
            journal_lines=dict(type="int", default=20),
        ),
        supports_check_mode=True,
    )
    params = dict(module.params)
    if "." not in params["unit"]:
        params["unit"] += ".service"
    for name in ("ready_timeout", "poll_interval", "health_timeout"):
        if params[name] <= 0:
            module.fail_json(msg=f"{name} must be > 0 (got {params[name]})")
    for name in ("stable_seconds", "health_count", "journal_lines"):
        if params[name] < 0:
            module.fail_json(msg=f"{name} must be >= 0 (got {params[name]})")
    if params["budget"] is not None and params["budget"] < 0:
        module.fail_json(msg=f"budget must be >= 0 (got {params['budget']})")
    if params["restart"] and params["baseline"]:
        module.fail_json(msg="baseline is only used with restart=false (it continues an earlier restart)")

    systemctl = module.get_bin_path("systemctl", required=True)
    unit = params["unit"]
    call_us = _now_us()
    try:
        props = systemctl_show(module, unit, RESTART_PROPERTIES + ("Job",), systemctl)
    except SystemctlError as exc:
        module.fail_json(msg=str(exc))

    problems = []
    if not is_loaded(props):
        problems.append(
            f"{unit} is not loaded (LoadState={props.get('LoadState')}): install the unit file "
            "and run systemctl daemon-reload first"
        )
    elif needs_daemon_reload(props):
        files = " ".join(p for p in (props.get("FragmentPath"), props.get("DropInPaths")) if p)
        problems.append(
            f"{unit}: NeedDaemonReload=yes - the unit file(s) {files} changed on disk since systemd loaded "
            "them; a restart would run the OLD definition. Run systemctl daemon-reload first (P7), see "
            "docs/properties.md"
        )
    if params["restart"]:
        active = props.get("ActiveState")
        action = "restart" if active in ("active", "activating", "reloading", "deactivating") else "start"
        if module.check_mode:
            for problem in problems:
                module.warn(problem)
            module.exit_json(
                changed=True,
                pending=False,
                restarted=False,
                would=action,
                previous_invocation_id=props.get("InvocationID", ""),
                msg=f"{unit} would be {action}ed and verified (check mode)",
                timings={},
                progress={
                    "elapsed": 0,
                    "phase": "",
                    "state": f"{active}/{props.get('SubState')}",
                    "step": "check_mode",
                },
                baseline={},
            )
        if problems:
            module.fail_json(msg="; ".join(problems), restarted=False, changed=False)
        env = {"LANG": "C", "LC_ALL": "C"}
        if active == "failed" or params["reset_start_limit"]:
            rc, out, err = module.run_command([systemctl, "reset-failed", "--", unit], environ_update=env)
            if rc != 0:
                module.fail_json(
                    msg=f"systemctl reset-failed {unit} failed (rc={rc}): {(err or out).strip()}"
                )
        request_us = _now_us()
        rc, out, err = module.run_command([systemctl, action, "--no-block", "--", unit], environ_update=env)
        if rc != 0:
            module.fail_json(
                msg=f"systemctl {action} --no-block {unit} failed (rc={rc}): {(err or out).strip()}",
                changed=True,
                restarted=False,
            )
        baseline = new_baseline(params, props, True, request_us, call_us, action)
    elif params["baseline"]:
        baseline = dict(params["baseline"])
        check_baseline(module, params, baseline)
    else:
        if problems:
            module.fail_json(msg="; ".join(problems), restarted=False, changed=False)
        if props.get("ActiveState") != "active" or not as_int(props.get("MainPID")):
            module.fail_json(
                msg=f"{unit} is not running (ActiveState={props.get('ActiveState')}, "
                f"SubState={props.get('SubState')}, Result={props.get('Result')}); "
                "restart=false only verifies a running invocation",
                changed=False,
            )
        baseline = new_baseline(params, props, False, None, call_us, None)
        baseline["previous_invocation_id"] = None

    budget = params["budget"]
    budget_end_us = (
        min(baseline["stable_deadline_us"], call_us + int(budget * 1e6))
        if budget is not None
        else baseline["stable_deadline_us"]
    )
    verifier = Verifier(module, params, baseline, systemctl)
    module.exit_json(**verifier.run(budget_end_us))


if __name__ == "__main__":
    main()
