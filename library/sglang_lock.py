#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_lock
short_description: One deploy of an SGLang service at a time on a host (a lock that spans tasks)
description:
  - The lock is a JSON holder record, C(<dir>/<name>.lock) (C(0600) root, directory C(0700) root, under
    C(/run), so gone after a reboot). Every decision (free, held, dead, taken over, released) is made
    under C(flock(2)) on the directory and the record is replaced with the one atomic writer, so two
    runs never both hold it. Ansible runs every task as a new process, so nothing is held between
    tasks; the record says who holds it, and the next run decides from it whether that run still lives.
  - "A holder is dead, and its lock is taken over (the takeover is returned and warned), when: the host
    booted since (boot id); the process on this host whose life spans the holder's run is gone (the
    C(sshd) of its multiplexed SSH connection, or the C(ansible-playbook) of a local run such as pull
    mode; checked with its start time, so a reused PID is not mistaken for it); its C(ansible-playbook)
    process on the controller is gone (checked by the action plugin on that controller, passed as
    O(takeover)); or its lease ran out (O(lease) seconds after its last call, on C(CLOCK_BOOTTIME))."
  - A live holder refuses the lock with a message that names it (controller host, user, C(ansible-playbook)
    PID, playbook and play, since when, what it is doing); O(wait) seconds of waiting first when asked.
  - O(state=renewed) (the same token) says what the run does next and extends its lease; a run whose lock
    was taken over fails there instead of going on. O(state=released) removes the record only for its
    own token.
  - The action plugin of the same name adds who runs (O(controller)) and, when a holder started on the
    same controller is dead there, asks again with O(takeover).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  name:
    description: Service the lock is for (one lock per service).
    type: str
    required: true
  state:
    description: C(acquired), C(renewed) (extend the lease, say what the run does now) or C(released).
    type: str
    choices: [acquired, renewed, released]
    default: acquired
  dir:
    description: Lock directory (created C(0700) root).
    type: path
    default: /run/sglang-deploy
  token:
    description: The token O(state=acquired) returned; required for C(renewed) and C(released).
    type: str
  wait:
    description: Seconds to wait for a live holder to release before refusing (C(0) refuses at once).
    type: int
    default: 0
  lease:
    description:
      - Seconds this run may go without another call before its lock counts as abandoned. Bound what
        the run does next (the longest step), or a live run can lose its lock.
    type: int
    default: 3600
  doing:
    description: What the run does while it holds the lock (shown to a refused run).
    type: str
    default: deploying
  controller:
    description:
      - Who runs (C(host), C(user), C(pid) and C(pid_start) of C(ansible-playbook), C(machine_id), C(boot_id),
        C(playbook), C(play)); set by the action plugin.
    type: dict
    default: {}
  anchor_pid:
    description:
      - Process on this host whose life spans the run. Default the nearest C(sshd) ancestor (the connection
        that ControlMaster keeps open for the whole run) or, for a local connection, the outermost
        C(ansible-playbook) ancestor; none found, the lease alone decides.
    type: int
  takeover:
    description: Token of a holder the action plugin proved dead on its controller (taken over if still held).
    type: str
  takeover_reason:
    description: Why the holder of O(takeover) is dead (reported).
    type: str
    default: its controller process is gone
attributes:
  check_mode:
    support: full
    details: Takes, renews and releases nothing; a live holder is reported as a warning.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the deploy lock of the service
  sglang_lock:
    name: sglang
    wait: 0
    doing: installing and configuring
  register: __sglang_lock

- name: Release it
  sglang_lock:
    name: sglang
    state: released
    token: "{{ __sglang_lock.token }}"
"""

RETURN = r"""
token:
  description: The holder token (empty in check mode and on refusal).
  returned: always
  type: str
lock_file:
  description: The lock file.
  returned: always
  type: str
holder:
  description: The holder record (this run's after acquiring; the live holder's on refusal or in check mode).
  returned: when a record exists
  type: dict
took_over:
  description: The dead holder's record and C(reason), when this call took its lock over.
  returned: when a lock was taken over
  type: dict
waited:
  description: Seconds waited for the lock.
  returned: state=acquired
  type: float
released:
  description: Whether the record was removed (false when it is another run's or gone).
  returned: state=released
  type: bool
message:
  description: What happened, in one sentence (also a warning for a takeover, a lock that is another run's,
    and a deploy in progress seen by check mode).
  returned: when there is something to say
  type: str
"""

import contextlib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import stat  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_lock import (  # noqa: E402
    LockError,
    Mutex,
    boot_id,
    boottime,
    describe,
    new_record,
    read_record,
    renew,
    write_record,
)

NAME_RE = re.compile(r"^[A-Za-z0-9_.@:-]+$")
POLL_SECONDS = 0.5


def proc_stat(pid):
    """(comm, ppid, starttime in clock ticks since boot) of a live process, or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as handle:
            data = handle.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    comm = data[data.find("(") + 1 : data.rfind(")")]
    fields = data[data.rfind(")") + 2 :].split()
    # fields[0] is field 3 (state) of proc(5): ppid is field 4, starttime field 22.
    if fields and fields[0] in ("Z", "X"):
        return None
    return comm, int(fields[1]), int(fields[19])


def proc_argv(pid):
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as handle:
            return [part.decode("utf-8", "replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def is_ansible_playbook(pid):
    return any(os.path.basename(arg) in ("ansible-playbook", "ansible-pull") for arg in proc_argv(pid)[:2])


def discover_anchor():
    """The nearest sshd ancestor, else the outermost ansible-playbook ancestor, else None."""
    pid, outermost, seen = os.getppid(), None, set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        info = proc_stat(pid)
        if info is None:
            break
        comm, ppid, _ = info
        if comm.startswith("sshd"):
            return pid
        if is_ansible_playbook(pid):
            outermost = pid
        pid = ppid
    return outermost


def anchor_record(pid):
    if pid is None:
        return None
    info = proc_stat(pid)
    if info is None:
        raise LockError(f"anchor_pid {pid}: no such process on this host")
    return {"pid": int(pid), "comm": info[0], "start": info[2]}


def why_dead(record, current_boot, now_boot):
    """Why the holder of ``record`` cannot be running any more, or None while it may be."""
    if not isinstance(record, dict) or not record.get("token"):
        return "its lock record is unreadable"
    if record.get("boot_id") != current_boot:
        return f"the host booted since it took the lock (boot id {str(record.get('boot_id'))[:8]}...)"
    anchor = record.get("anchor")
    if anchor:
        info = proc_stat(anchor["pid"])
        if info is None or info[2] != anchor["start"]:
            return f"its process on this host ({anchor['comm']} PID {anchor['pid']}) is gone"
    until = record.get("lease_until_boottime")
    if not isinstance(until, (int, float)) or now_boot > until:
        return (
            f"its lease ran out at {record.get('lease_until', '?')} (no call for "
            f"{record.get('lease_seconds', '?')} s)"
        )
    return None


def same_run(record, controller):
    keys = ("machine_id", "boot_id", "pid", "pid_start")
    ctl = (record.get("controller") or {}) if isinstance(record, dict) else {}
    return all(controller.get(k) for k in keys) and all(ctl.get(k) == controller.get(k) for k in keys)


def ensure_dir(path):
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise LockError(f"{path} is not a directory (a symlink is never followed)")
    if st.st_uid != os.geteuid():
        raise LockError(f"{path} belongs to uid {st.st_uid}, not to uid {os.geteuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def acquire(module, path, directory):
    params = module.params
    anchor_pid = params["anchor_pid"] if params["anchor_pid"] is not None else discover_anchor()
    anchor = anchor_record(anchor_pid)
    started = time.monotonic()
    deadline = started + max(params["wait"], 0)
    while True:
        with Mutex(directory):
            record = read_record(path)
            took_over = None
            if record is not None:
                reason = why_dead(record, boot_id(), boottime())
                if reason is None and params["takeover"] and record.get("token") == params["takeover"]:
                    reason = params["takeover_reason"]
                if reason is None and same_run(record, params["controller"]):
                    reason = "it is this same run (an earlier acquire whose release did not run)"
                if reason is None:
                    if time.monotonic() >= deadline:
                        return None, record, time.monotonic() - started
                else:
                    took_over = dict(record, reason=reason)
            if record is None or took_over is not None:
                token = uuid.uuid4().hex
                mine = new_record(params, anchor, token)
                write_record(path, mine)
                return mine, took_over, time.monotonic() - started
        time.sleep(min(POLL_SECONDS, max(deadline - time.monotonic(), 0.05)))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="acquired", choices=["acquired", "renewed", "released"]),
            dir=dict(type="path", default="/run/sglang-deploy"),
            token=dict(type="str", no_log=False),
            wait=dict(type="int", default=0),
            lease=dict(type="int", default=3600),
            doing=dict(type="str", default="deploying"),
            controller=dict(type="dict", default={}),
            anchor_pid=dict(type="int"),
            takeover=dict(type="str", no_log=False),
            takeover_reason=dict(type="str", default="its controller process is gone"),
        ),
        required_if=[("state", "renewed", ["token"]), ("state", "released", ["token"])],
        supports_check_mode=True,
    )
    params = module.params
    if not NAME_RE.match(params["name"]):
        module.fail_json(msg=f"name {params['name']!r}: only letters, digits and _.@:- are allowed")
    if params["lease"] < 1 or params["wait"] < 0:
        module.fail_json(msg=f"lease must be >= 1 and wait >= 0 (got {params['lease']}, {params['wait']})")
    directory = params["dir"]
    path = os.path.join(directory, params["name"] + ".lock")
    state = params["state"]
    result = dict(changed=False, lock_file=path, token="")

    if module.check_mode:
        # Nothing is taken or written; a deploy in progress makes this run's report out of date.
        record = read_record(path) if os.path.isdir(directory) else None
        if record is not None and state == "acquired":
            reason = why_dead(record, boot_id(), boottime())
            if reason is None:
                result["message"] = (
                    f"{params['name']} is being deployed now by {describe(record)}: what this check mode run "
                    f"shows may be out of date when that deploy ends"
                )
                module.warn(result["message"])
            result["holder"] = record
        module.exit_json(**result)

    try:
        ensure_dir(directory)
        if state == "acquired":
            mine, other, waited = acquire(module, path, directory)
            result["waited"] = round(waited, 3)
            if mine is None:
                waited_text = f" after waiting {waited:.0f} s (sglang_lock_wait)" if params["wait"] else ""
                module.fail_json(
                    msg=f"another deploy of {params['name']} holds {path}{waited_text}: {describe(other)}. "
                    f"Run again when it has finished, or set sglang_lock_wait (seconds) to wait for it.",
                    holder=other,
                    **result,
                )
            result.update(token=mine["token"], holder=mine)
            result["message"] = f"took the deploy lock of {params['name']} ({path})"
            if other is not None:
                result["took_over"] = other
                result["message"] = (
                    f"took over the deploy lock of {params['name']} ({path}) from a dead run: "
                    f"{other['reason']}. It was held by {describe(other)}"
                )
                module.warn(result["message"])
        elif state == "renewed":
            try:
                mine = renew(
                    directory,
                    params["name"],
                    params["token"],
                    params["doing"],
                    params["lease"],
                    params["controller"],
                )
            except LockError as exc:
                module.fail_json(msg=str(exc), holder=read_record(path), **result)
            result.update(token=params["token"], holder=mine)
        else:
            with Mutex(directory):
                record = read_record(path)
                mine = record is not None and record.get("token") == params["token"]
                if mine:
                    os.unlink(path)
                elif record is not None:
                    result["message"] = (
                        f"the deploy lock of {params['name']} is not this run's any more (left as it is): "
                        f"held by {describe(record)}"
                    )
                    module.warn(result["message"])
                    result["holder"] = record
            result["released"] = mine
    except (OSError, LockError) as exc:
        text = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
        module.fail_json(msg=f"deploy lock of {params['name']} in {directory}: {text}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
