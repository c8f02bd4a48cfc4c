# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proof of an invocation (module_utils/sglang_verifier.py) and the assertion of its running
arguments (module_utils/sglang_running_args.py) in one call: shared by sglang_verified_restart (after a
restart, and with restart=false) and sglang_host_probe, which proves the invocation that runs now in its own
call when the host is converged (its O(prove), docs/properties.md P11)."""

from __future__ import annotations

from ansible.module_utils import sglang_running_args as running_args
from ansible.module_utils import sglang_verifier as verifier
from ansible.module_utils.sglang_systemd import as_int, is_loaded, needs_daemon_reload


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
