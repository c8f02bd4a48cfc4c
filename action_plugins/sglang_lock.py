# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of sglang_lock: say who runs, and prove a holder of this controller dead.

The module on the host decides from what it can see there (boot id, the holder's connection process,
its lease). What only the controller can see is whether the holder's ``ansible-playbook`` still runs:
a run killed with SIGKILL or Ctrl-C leaves its SSH ControlMaster (``ControlPersist``), so its sshd on
the host lives on for minutes. This plugin passes ``controller`` (host, user, the ``ansible-playbook``
PID and its start time, machine id, boot id, playbook, play) to the module; when the module refuses
because of a holder that started on THIS controller (same machine id and boot) whose process is gone,
it asks once more with ``takeover`` = that holder's token, and the module takes the lock over (if
that holder still holds it) and reports it.
"""

from __future__ import annotations

import getpass
import os
import socket
import sys

from ansible import context
from ansible.plugins.action import ActionBase

MODULE = "sglang_lock"


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """starttime (field 22 of /proc/PID/stat, clock ticks since boot) of a live process."""
    data = _read(f"/proc/{int(pid)}/stat")
    if not data:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _playbook_pid() -> int:
    """The ansible-playbook process: the parent of this worker process (forked from it)."""
    parent = os.getppid()
    argv = _read(f"/proc/{parent}/cmdline").split("\0")
    return parent if any("ansible" in os.path.basename(arg) for arg in argv[:2]) else os.getpid()


def controller_identity(task_vars: dict) -> dict:
    pid = _playbook_pid()
    # ansible-playbook's own parse of its command line (inherited by this forked worker).
    playbooks = list(context.CLIARGS.get("args") or ()) if context.CLIARGS else []
    if not playbooks:
        playbooks = [os.path.basename(sys.argv[0])] if sys.argv and sys.argv[0] else []
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.geteuid())
    return {
        "host": socket.gethostname(),
        "user": user,
        "pid": pid,
        "pid_start": _start_ticks(pid),
        "machine_id": _read("/etc/machine-id"),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "playbook": " ".join(playbooks),
        "play": task_vars.get("ansible_play_name", ""),
    }


def dead_here(holder: dict, me: dict) -> str | None:
    """Why ``holder``'s ansible-playbook is dead, when it ran on this controller; else None."""
    ctl = (holder or {}).get("controller") or {}
    if not (ctl.get("machine_id") and ctl.get("machine_id") == me["machine_id"]):
        return None
    if ctl.get("boot_id") != me["boot_id"]:
        return f"its controller {ctl.get('host', '?')} (this one) booted since it took the lock"
    pid, start = ctl.get("pid"), ctl.get("pid_start")
    if not isinstance(pid, int) or start is None:
        return None
    if _start_ticks(pid) != start:
        return f"its ansible-playbook process (PID {pid}) on controller {ctl.get('host', '?')} is gone"
    return None


def taking(execute, lock_args: dict, me: dict) -> dict:
    """Take the lock through ``execute(lock arguments) -> module result`` (sglang_lock, or sglang_host_probe
    with O(lock)): at once first (a wait is spent only on a holder that may still be alive), then once more
    with ``takeover`` when the holder's ansible-playbook ran on this controller and is gone, or with the
    wait asked for."""
    args = dict(lock_args)
    args.setdefault("controller", me)
    res = execute(dict(args, wait=0))
    holder = res.get("holder") if isinstance(res.get("holder"), dict) else {}
    if res.get("failed") and holder.get("token"):
        reason = dead_here(holder, me)
        if reason:
            res = execute(dict(args, takeover=holder["token"], takeover_reason=reason))
        elif int(args.get("wait") or 0) > 0:
            res = execute(args)
    return res


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)

        def execute(module_args):
            return self._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)

        me = controller_identity(task_vars)
        args.setdefault("controller", me)
        res = taking(execute, args, me) if args.get("state", "acquired") == "acquired" else execute(args)
        result.update(res)
        return result
