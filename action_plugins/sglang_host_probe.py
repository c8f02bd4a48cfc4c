# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of sglang_host_probe: with ``lock``, take the deploy lock in the probe's own call.

The module takes the lock before it reads anything (library/sglang_host_probe.py, O(lock)); what only the
controller can see - who runs, and whether a holder that started on this controller is dead - is
sglang_lock's action plugin's (controller_identity, dead_here, taking), loaded from its file beside this
one. Without ``lock`` the module runs as it is.
"""

from __future__ import annotations

import importlib.util
import os

from ansible.plugins.action import ActionBase

MODULE = "sglang_host_probe"


def _lock_plugin():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sglang_lock.py")
    spec = importlib.util.spec_from_file_location("sglang_deploy_lock_action", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)

        def execute(module_args):
            return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)

        if args.get("lock"):
            lock = _lock_plugin()
            me = lock.controller_identity(task_vars)
            res = lock.taking(lambda lock_args: execute(dict(args, lock=lock_args)), args["lock"], me)
        else:
            res = execute(args)
        result.update(res)
        return result
