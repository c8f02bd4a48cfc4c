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
  - "A holder is dead, and its lock is taken over (the takeover is returned and warned), only where that is
    certain: the host booted since (boot id); the C(ansible-playbook) of a local run on this host (pull
    mode) is gone (checked with its start time, so a reused PID is not mistaken for it); its
    C(ansible-playbook) process on the controller is gone (checked by the action plugin on that controller,
    passed as O(takeover)); or its lease ran out (O(lease) seconds after its last call, on
    C(CLOCK_BOOTTIME)). The C(sshd) it took the lock under proves nothing: without ControlMaster every task
    has its own, which ends with the task while the run goes on."
  - Every module that writes under the lock (C(sglang_unit), C(sglang_release_marker), C(sglang_pip)) checks
    the token and renews the lease first, so a run that works keeps its lock and one whose lock was taken
    over writes nothing.
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
        the run does next (the longest step that renews nothing), or a live run can lose its lock.
      - Default C(3600) when acquiring; when renewing, the lease the record has.
    type: int
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
      - Process on this host the run works under, shown to a refused run. Default the nearest C(sshd)
        ancestor or, for a local connection, the outermost C(ansible-playbook) ancestor. Only the end of an
        C(ansible-playbook) proves the run dead; an C(sshd) can be one task's.
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

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_lock import (  # noqa: E402
    TAKE_OPTIONS,
    LockError,
    checked_path,
    ensure_dir,
    failure,
    read_record,
    release,
    renew,
    take,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            TAKE_OPTIONS,
            # Renewing keeps the record's lease unless one is given.
            lease=dict(type="int"),
            state=dict(type="str", default="acquired", choices=["acquired", "renewed", "released"]),
            token=dict(type="str", no_log=False),
        ),
        required_if=[("state", "renewed", ["token"]), ("state", "released", ["token"])],
        supports_check_mode=True,
    )
    params = module.params
    directory, state = params["dir"], params["state"]
    if state == "acquired" and params["lease"] is None:
        params["lease"] = TAKE_OPTIONS["lease"]["default"]
    try:
        path = checked_path(dict(params, lease=1 if params["lease"] is None else params["lease"]))
    except LockError as exc:
        module.fail_json(msg=str(exc))
    result = dict(changed=False, lock_file=path, token="")

    if module.check_mode and state != "acquired":  # renews and releases nothing
        module.exit_json(**result)

    try:
        if state == "acquired":
            taken, refused = take(params, module.check_mode, module.warn)
            result.update(taken)
            if refused:
                module.fail_json(msg=refused, **result)
        elif state == "renewed":
            ensure_dir(directory)
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
            ensure_dir(directory)
            released, other, message = release(directory, params["name"], params["token"])
            result["released"] = released
            if message:
                result.update(message=message, holder=other)
                module.warn(message)
    except (OSError, LockError) as exc:
        module.fail_json(msg=failure(params, exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
