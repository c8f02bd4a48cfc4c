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
  - Three modes, by I(restart) and I(baseline). B(restart) (I(restart=true), the default) requests the
    restart and verifies the new invocation. B(continue) (I(restart=false) with I(baseline)) goes on
    waiting on the restart that baseline describes. B(probe) (I(restart=false), no I(baseline)) is the
    health probe of a running service. It restarts nothing (C(changed=false)), fails unless the unit is
    C(active) with a main process, and then proves that running invocation exactly as a restarted one
    (listener in the unit's cgroup, no older process in it, C(/health_generate) 200 and the stability
    window); use it to prove a deploy that changed nothing.
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
  running_args:
    description:
      - Once the invocation is verified, assert its running arguments in the same call, as
        C(sglang_running_args) does (module_utils/sglang_running_args.py), with that module's options but
        C(host), C(port), C(api_key), C(unit), C(invocation_id) and C(observed), which are this call's and
        the verified invocation's. Its result is RV(running); a difference fails the call (P3), after the
        proof.
    type: dict
  record:
    description:
      - Once the invocation is verified (and its running arguments, with O(running_args)), record it in the
        same call, as C(sglang_history) does (module_utils/sglang_history.py). O(record.known_good) is kept
        first (only files byte for byte the ones the restart started), then O(record.entry) appended to
        O(record.path), then O(record.clear_pending) removed. The entry gets C(invocation_id), C(main_pid),
        C(timings) (with C(started_to_ready)) and, with O(running_args), C(read_from) of the verified
        invocation; the known-good metadata gets its C(invocation_id). A record that cannot be written fails
        the call (C(recorded=false)), after the proof. Not with O(restart=false) and no O(baseline) (a probe
        records nothing).
    type: dict
    suboptions:
      path:
        description: The history file (JSON lines).
        type: path
        required: true
      entry:
        description: The record, without what the verified invocation adds.
        type: dict
        required: true
      known_good:
        description: The known-good set to keep (the C(known_good) option of C(sglang_history)).
        type: dict
      clear_pending:
        description: The pending marker to remove (the C(clear_pending) option of C(sglang_history)).
        type: path
      known_good_invocation:
        description:
          - The rollback's option (not with O(record.known_good)). The known-good set verified again in this
            invocation stays as it is and its metadata gets this invocation's C(invocation_id), first. That is
            the last verified invocation, which the drift check compares the running one with (P17).
        type: dict
        suboptions:
          dir:
            description: The known-good directory.
            type: path
            required: true
          meta_name:
            description: The name of its metadata file.
            type: str
            required: true
          from_dir:
            description:
              - A revert's kept set (the configuration the rolling play replaced). Its metadata and
                O(record.known_good_invocation.files) become the known-good set, with this invocation (the
                other services' files of the current set carried over).
            type: path
          files:
            description: With O(record.known_good_invocation.from_dir), the names of the copies it takes.
            type: list
            elements: str
            default: []
      textfile:
        description:
          - The node_exporter textfile to rewrite from the record (the C(textfile) option of
            C(sglang_history)); one that cannot be written is a warning, the record stands.
        type: dict
  speculation:
    description:
      - Once the restarted invocation is verified (and its running arguments, with O(running_args)), and
        before O(record) is written, show that speculative decoding takes effect, by one deterministic
        C(/generate) request (temperature 0, a prompt longer than O(speculation.window), a fixed number of new
        tokens) and SGLang's acceptance length from its answer, C(completion_tokens / spec_verify_ct)
        (module_utils/sglang_speculation.py). The result is RV(speculation) and goes into the history record.
      - Under O(speculation.min_accept_length) the call fails naming the figure and records nothing. A probe
        that gets no usable answer is reported in RV(speculation) (C(error)); it fails the call only with
        O(speculation.min_accept_length).
      - Only with a restart (O(restart=true), or a O(baseline) to continue); a probe of a running service
        sends no request.
    type: dict
    suboptions:
      window:
        description: The draft window; the probe's prompt is longer than it.
        type: int
      min_accept_length:
        description: The acceptance length the invocation must reach (unset, record only). Must be > 0.
        type: float
      algorithm:
        description: The speculative algorithm the invocation runs (C(--speculative-algorithm)).
        type: str
      draft_path:
        description:
          - The drafter's directory. With a DFLASH-based O(speculation.algorithm) (DFLASH, DDTREE), when
            O(speculation.window) exceeds the sliding window in its C(config.json)
            (C(text_config.sliding_window), else C(sliding_window), as SGLang reads it), the call warns naming
            the file and the field.
        type: path
      new_tokens:
        description: New tokens the probe asks for.
        type: int
        default: 64
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
  - The listening sockets are read in the module's network namespace (the kernel's sock_diag dump, as C(ss)
    reads it; C(/proc/net/tcp) where it is not offered), which is the server's on a plain host.
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
    redacted; read while the module is still waiting, RV(pending), and on failure; empty once the invocation
    is verified), C(state) (ActiveState/SubState), C(step) (what the module waits for).
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
running:
  description: The result of the running-arguments assertion (as C(sglang_running_args) returns it, redacted).
  returned: with O(running_args), once the invocation is verified
  type: dict
record:
  description: The history record as written (redacted, with C(time)).
  returned: with O(record), once the invocation is verified and recorded
  type: dict
recorded:
  description: Whether O(record) was written.
  returned: with O(record), once the invocation is verified
  type: bool
speculation:
  description:
    - The speculation probe's figures, C(accept_length) (C(completion_tokens / spec_verify_ct), 1.0 when
      nothing was verified), C(completion_tokens), C(spec_verify_ct), C(new_tokens) and C(stand_in) (true
      when the lab's stand-in server made them); or C(error), the reason the probe got no usable answer.
      C(window_warning) when the draft window exceeds the drafter's trained sliding window.
  returned: with O(speculation), once the restarted invocation is verified
  type: dict
  sample: {accept_length: 4.0, completion_tokens: 64, spec_verify_ct: 16, new_tokens: 64, stand_in: false}
pending_cleared:
  description: O(record.clear_pending) was there and is removed now.
  returned: with O(record), once the invocation is verified and recorded
  type: bool
textfile:
  description: With O(record.textfile), its C(path) and C(written), or C(error).
  returned: with O(record.textfile), once the invocation is verified and recorded
  type: dict
"""

from ansible.module_utils import sglang_verifier as verifier
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_history import KNOWN_GOOD_OPTIONS, TEXTFILE_OPTIONS, NotRecorded
from ansible.module_utils.sglang_history import write as write_history
from ansible.module_utils.sglang_options import DFLASH_BASED
from ansible.module_utils.sglang_proof import probe_baseline, run_and_assert, unit_name, unit_problems
from ansible.module_utils.sglang_running_args import RUNNING_ARGS_SUBOPTIONS
from ansible.module_utils.sglang_speculation import ProbeError, below_minimum, measure, window_warning
from ansible.module_utils.sglang_systemd import SystemctlError
from ansible.module_utils.sglang_systemd import show as systemctl_show

ARGUMENT_SPEC = dict(
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
    running_args=dict(type="dict", options=RUNNING_ARGS_SUBOPTIONS),
    record=dict(
        type="dict",
        options=dict(
            path=dict(type="path", required=True),
            entry=dict(type="dict", required=True),
            known_good=dict(type="dict", options=KNOWN_GOOD_OPTIONS),
            clear_pending=dict(type="path"),
            known_good_invocation=dict(
                type="dict",
                options=dict(
                    dir=dict(type="path", required=True),
                    meta_name=dict(type="str", required=True),
                    from_dir=dict(type="path"),
                    files=dict(type="list", elements="str", default=[]),
                ),
            ),
            textfile=dict(type="dict", options=TEXTFILE_OPTIONS),
        ),
        mutually_exclusive=[("known_good", "known_good_invocation")],
    ),
    speculation=dict(
        type="dict",
        options=dict(
            algorithm=dict(type="str"),
            window=dict(type="int"),
            min_accept_length=dict(type="float"),
            draft_path=dict(type="path"),
            new_tokens=dict(type="int", default=64),
        ),
    ),
)
RUNNING = ("active", "activating", "reloading", "deactivating")
C_ENV = {"LANG": "C", "LC_ALL": "C"}


def checked_params(module):
    """The parameters, with the unit's suffix; a bad value fails naming the setting."""
    params = dict(module.params)
    params["unit"] = unit_name(params["unit"])
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
    for name in ("record", "speculation"):
        if params[name] is not None and not (params["restart"] or params["baseline"]):
            module.fail_json(
                msg=f"{name} is only used with a restart (restart=true, or a baseline to continue)"
            )
    spec = params["speculation"]
    if spec is not None:
        if spec["min_accept_length"] is not None and spec["min_accept_length"] <= 0:
            module.fail_json(
                msg=f"speculation.min_accept_length must be > 0 (got {spec['min_accept_length']})"
            )
        if spec["new_tokens"] <= 0:
            module.fail_json(msg=f"speculation.new_tokens must be > 0 (got {spec['new_tokens']})")
    return params


def probe_speculation(module, params, result):
    """The speculation probe of the verified invocation, into ``result['speculation']`` (with the drafter's
    sliding-window warning, also a module warning); under the minimum (or no usable answer with a minimum) the
    call fails, nothing recorded."""
    spec, warning = params["speculation"], None
    if spec["draft_path"] and str(spec["algorithm"] or "").upper() in DFLASH_BASED:
        warning = window_warning(spec["draft_path"], spec["window"])
        if warning:
            module.warn(warning)
    minimum = spec["min_accept_length"]
    try:
        figures = measure(
            params["host"], params["port"], params["api_key"], spec["window"], spec["new_tokens"]
        )
    except ProbeError as exc:
        figures = {"error": str(exc)}
    if warning:
        figures["window_warning"] = warning
    result["speculation"] = figures
    if "error" in figures:
        if minimum:
            module.fail_json(
                **dict(
                    result,
                    recorded=False,
                    msg=f"{result['msg']} But the speculation probe got no acceptance length "
                    f"(sglang_min_accept_length {minimum}): {figures['error']}",
                )
            )
        module.warn(f"the speculation probe got no acceptance length: {figures['error']}")
        return
    failure = below_minimum(figures, minimum)
    if failure:
        module.fail_json(**dict(result, recorded=False, msg=f"{result['msg']} But its {failure}"))


def record_verified(module, spec, result):
    """Append the record of the verified invocation (``result``), its known-good set kept first; a record that
    cannot be written fails the call, naming why."""
    timings = dict(result.get("timings") or {})
    ready, started = timings.get("ready"), timings.get("started")
    numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in (ready, started))
    timings["started_to_ready"] = round(ready - started, 3) if numbers else None
    entry = dict(
        spec["entry"], invocation_id=result["invocation_id"], main_pid=result["main_pid"], timings=timings
    )
    if "running" in result:
        entry["read_from"] = result["running"].get("read_from") or {}
    if "speculation" in result:
        entry["speculation"] = result["speculation"]
    known_good = spec["known_good"]
    if known_good is not None:
        known_good = dict(known_good, meta=dict(known_good["meta"], invocation_id=result["invocation_id"]))
    adopt = spec.get("known_good_invocation")
    if adopt is not None:
        adopt = dict(adopt, invocation_id=result["invocation_id"])
    try:
        entry, cleared, textfile = write_history(
            spec["path"],
            entry,
            known_good=known_good,
            clear_pending=spec["clear_pending"],
            known_good_invocation=adopt,
            textfile=spec["textfile"],
        )
    except NotRecorded as exc:
        module.fail_json(**dict(result, recorded=False, msg=f"{result['msg']} But {exc}"))
    result.update(record=entry, recorded=True, pending_cleared=cleared)
    if textfile is not None:
        result["textfile"] = textfile
        if "error" in textfile:
            module.warn(f"recorded, but the node_exporter textfile is not: {textfile['error']}")


def report_check_mode(module, unit, props, action, problems):
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
            "state": f"{props.get('ActiveState')}/{props.get('SubState')}",
            "step": "check_mode",
        },
        baseline={},
    )


def request_restart(module, systemctl, params, props, action, call_us):
    """Reset a failed unit (or the start limit, when asked), then ``systemctl ACTION --no-block``;
    the baseline of that request."""
    unit = params["unit"]
    if props.get("ActiveState") == "failed" or params["reset_start_limit"]:
        rc, out, err = module.run_command([systemctl, "reset-failed", "--", unit], environ_update=C_ENV)
        if rc != 0:
            module.fail_json(msg=f"systemctl reset-failed {unit} failed (rc={rc}): {(err or out).strip()}")
    request_us = verifier.clock_us()
    rc, out, err = module.run_command([systemctl, action, "--no-block", "--", unit], environ_update=C_ENV)
    if rc != 0:
        module.fail_json(
            msg=f"systemctl {action} --no-block {unit} failed (rc={rc}): {(err or out).strip()}",
            changed=True,
            restarted=False,
        )
    return verifier.new_baseline(params, props, True, request_us, call_us, action)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = checked_params(module)
    unit = params["unit"]

    # read: the unit as systemd has it now
    systemctl = module.get_bin_path("systemctl", required=True)
    call_us = verifier.clock_us()
    try:
        props = systemctl_show(module, unit, verifier.SHOW_PROPERTIES, systemctl)
    except SystemctlError as exc:
        module.fail_json(msg=str(exc))
    problems = unit_problems(unit, props)

    # decide and act: restart (or only say so in check mode), continue a baseline, or probe
    if params["restart"]:
        action = "restart" if props.get("ActiveState") in RUNNING else "start"
        if module.check_mode:
            report_check_mode(module, unit, props, action, problems)
        if problems:
            module.fail_json(msg="; ".join(problems), restarted=False, changed=False)
        baseline = request_restart(module, systemctl, params, props, action, call_us)
    elif params["baseline"]:
        baseline = dict(params["baseline"])
        problem = verifier.baseline_problem(unit, baseline)
        if problem:
            module.fail_json(msg=problem)
    else:
        if problems:
            module.fail_json(msg="; ".join(problems), restarted=False, changed=False)
        baseline = probe_baseline(module, params, props, call_us)

    # report: poll until verified, failed, or this call's budget is spent (pending)
    budget_end_us = baseline["stable_deadline_us"]
    if params["budget"] is not None:
        budget_end_us = min(budget_end_us, call_us + int(params["budget"] * 1e6))
    result = run_and_assert(module, params, baseline, systemctl, budget_end_us)
    if params["speculation"] is not None and not result["pending"] and not module.check_mode:
        probe_speculation(module, params, result)
    if params["record"] is not None and not result["pending"]:
        record_verified(module, params["record"], result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
