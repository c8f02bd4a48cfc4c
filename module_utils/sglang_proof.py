# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proof of an invocation (module_utils/sglang_verifier.py) and the assertion of its running
arguments (module_utils/sglang_running_args.py) in one call: shared by sglang_verified_restart (after a
restart, and with restart=false) and sglang_host_probe, which proves the invocation that runs now in its own
call when the host is converged (its O(prove), docs/properties.md P11)."""

from __future__ import annotations

from ansible.module_utils import sglang_running_args as running_args
from ansible.module_utils import sglang_systemd
from ansible.module_utils import sglang_verifier as verifier
from ansible.module_utils.sglang_expectations import running_expectations
from ansible.module_utils.sglang_systemd import SystemctlError, as_int, is_loaded, needs_daemon_reload

# sglang_host_probe's prove option: the server, and what only the controller knows of the expectations.
PROVE_OPTIONS = dict(
    host=dict(type="str", required=True),
    port=dict(type="int", required=True),
    api_key=dict(type="str", no_log=True),
    base=dict(type="dict", required=True),
    health_timeout=dict(type="float", default=25),
)
# The running-arguments options a proof passes on, with sglang_running_args' defaults for those not built.
RUNNING_DEFAULTS = {name: spec.get("default") for name, spec in running_args.RUNNING_ARGS_SUBOPTIONS.items()}


class NotProven(Exception):
    """A proof that did not hold: the reason; the call goes on without it."""


class SoftModule:
    """The module, for a proof that must not end the call: its ``fail_json`` raises NotProven."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def fail_json(self, msg="", **_result):
        raise NotProven(msg)


def unit_name(unit):
    """``unit`` with its .service suffix (a bare service name is one)."""
    return unit if "." in unit else unit + ".service"


def unit_problems(unit, props):
    """P7: reasons a restart now would not run the unit file on disk."""
    if not is_loaded(props):
        return [
            f"{unit} is not loaded (LoadState={props.get('LoadState')}): install the unit file "
            "and run systemctl daemon-reload first"
        ]
    if needs_daemon_reload(props):
        files = " ".join(p for p in (props.get("FragmentPath"), props.get("DropInPaths")) if p)
        return [
            f"{unit}: NeedDaemonReload=yes - the unit file(s) {files} changed on disk since systemd loaded "
            "them; a restart would run the OLD definition. Run systemctl daemon-reload first (P7), see "
            "docs/properties.md"
        ]
    return []


def probe_baseline(module, params, props, call_us):
    """Probe mode: the running invocation is what gets verified; a unit that is not running fails."""
    if props.get("ActiveState") != "active" or not as_int(props.get("MainPID")):
        module.fail_json(
            msg=f"{params['unit']} is not running (ActiveState={props.get('ActiveState')}, "
            f"SubState={props.get('SubState')}, Result={props.get('Result')}); "
            "restart=false only verifies a running invocation",
            changed=False,
        )
    return verifier.new_baseline(params, props, False, None, call_us, None)


def assert_running_args(module, params, invocation_id):
    """(the assertion's result, its problems) for ``invocation_id``; this call's address, key and unit."""
    return running_args.check(
        module,
        dict(
            params["running_args"],
            host=params["host"],
            port=params["port"],
            api_key=params["api_key"],
            unit=params["unit"],
            invocation_id=invocation_id,
            observed=None,
        ),
    )


def run_and_assert(module, params, baseline, systemctl, budget_end_us):
    """Poll ``baseline`` until verified, failed (``module.fail_json``) or pending at ``budget_end_us``; with
    ``params['running_args']``, the verified invocation's arguments asserted (a difference fails the call)."""
    # The running arguments are asserted as soon as the invocation is ready, while its stability window
    # elapses (the window then proves the same invocation stayed); a call that continues a baseline whose
    # ready moment an earlier call saw asserts them after the window.
    running, on_ready = {}, None
    if params["running_args"] is not None:

        def on_ready(b):
            running["at_ready"] = assert_running_args(module, params, b["invocation_id"])

    result = verifier.Verifier(module, params, baseline, systemctl, on_ready=on_ready).run(budget_end_us)
    if params["running_args"] is not None and not result["pending"]:
        checked, problems = running.get("at_ready") or assert_running_args(
            module, params, result["invocation_id"]
        )
        result["running"] = checked
        if problems:
            module.fail_json(**dict(result, msg=f"{result['msg']} But its {checked['msg']}"))
    return result


def prove_running(module, unit, prove, argv, release_path):
    """The proof of the invocation of ``unit`` that runs now, as sglang_verified_restart's with restart=false
    and one health answer, with the running-arguments assertion of the command line ``argv`` built from the
    settings (run from ``release_path``), ``prove`` being sglang_host_probe's option: {"proof": result}, or
    {"not_proven": why}; nothing it finds ends the call."""
    params = dict(
        unit=unit,
        host=prove["host"],
        port=prove["port"],
        api_key=prove["api_key"],
        # As verify.yml's proof; the budget below ends the wait at once.
        ready_timeout=30,
        stable_seconds=0,
        health_count=1,
        health_timeout=prove["health_timeout"],
        poll_interval=0.25,
        journal_lines=20,
        running_args=dict(RUNNING_DEFAULTS, **running_expectations(argv, prove["base"], release_path)),
    )
    soft = SoftModule(module)
    try:
        systemctl = module.get_bin_path("systemctl", required=True)
        call_us = verifier.clock_us()
        props = sglang_systemd.show(module, unit, verifier.SHOW_PROPERTIES, systemctl)
        problems = unit_problems(unit, props)
        if problems:
            raise NotProven("; ".join(problems))
        # One health answer: the budget ends at the call (the answer in flight is still waited for).
        result = run_and_assert(
            soft, params, probe_baseline(soft, params, props, call_us), systemctl, call_us
        )
    except (NotProven, SystemctlError) as exc:
        return {"not_proven": str(exc)}
    if result.get("pending"):
        return {"not_proven": f"no health answer 200 from {unit} ({result['msg']})"}
    return {"proof": result}
