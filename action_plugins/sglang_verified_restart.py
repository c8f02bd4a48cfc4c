# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of sglang_verified_restart: run the module in ~20 s slices and print progress.

A model load takes minutes; one module call that blocks for 30 minutes prints nothing. This
plugin runs the module with ``budget`` = SLICE seconds (first call ``restart`` as given, then
``restart=false`` with the returned ``baseline``) until it is no longer pending, and prints
``sglang on HOST: waiting 60s/1800s, phase: <latest log line>`` after every slice (so at least
every 30 s). The final module result is returned unchanged.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

SLICE_SECONDS = 20.0
PROGRESS_EVERY = 30.0


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("budget") is not None:
            # The caller asked for one bounded call: do exactly that.
            return self._call(args, task_vars, result)
        host = task_vars.get("inventory_hostname", "?")
        ready_timeout = float(args.get("ready_timeout", 1800))
        args["budget"] = SLICE_SECONDS
        started = time.monotonic()
        last_shown = 0.0
        slices = 0
        while True:
            slices += 1
            res = self._execute_module(
                module_name="sglang_verified_restart", module_args=args, task_vars=task_vars
            )
            if res.get("failed") or not res.get("pending"):
                break
            progress = res.get("progress") or {}
            now = time.monotonic()
            if now - last_shown >= min(PROGRESS_EVERY, SLICE_SECONDS) - 1:
                display.display(
                    f"sglang on {host}: waiting {progress.get('elapsed', round(now - started))}s/"
                    f"{ready_timeout:g}s, step: {progress.get('step')}, state: {progress.get('state')}, "
                    f"phase: {progress.get('phase') or '(no log line yet)'}"
                )
                last_shown = now
            baseline = res.get("baseline")
            if not baseline:
                raise AnsibleActionFail("sglang_verified_restart returned pending=true without a baseline")
            args = dict(args, restart=False, baseline=baseline)
        res["slices"] = slices
        result.update(res)
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _call(self, args, task_vars, result):
        result.update(
            self._execute_module(module_name="sglang_verified_restart", module_args=args, task_vars=task_vars)
        )
        return result
