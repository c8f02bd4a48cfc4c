# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy lock (library/sglang_lock.py): its record, read, written, taken, renewed and released under
flock(2) on its directory. Shared by sglang_lock; by sglang_host_probe, which takes the lock in the call that
probes the host (O(lock)); by every module that writes under it (sglang_unit, sglang_release_marker, the
sglang_pip action through sglang_lock), which checks this run's token and renews its lease first
(:func:`hold`); and by sglang_verified_restart, which releases it in the call that proves a host with nothing
to change. Each saves a round trip (a Python process on the host) per deploy.

A holder is dead only where that is certain: the host booted since, its own ansible-playbook on this host
is gone (a local run), its ansible-playbook on the controller is gone (proven there, by
action_plugins/sglang_lock.py) or its lease ran out. The sshd a holder took the lock under proves nothing:
without ControlMaster every task has its own, gone when the task ends while the run goes on."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import stat
import time
import uuid

from ansible.module_utils.sglang_files import replace_file

BOOT_ID = "/proc/sys/kernel/random/boot_id"
NAME_RE = re.compile(r"^[A-Za-z0-9_.@:-]+$")
POLL_SECONDS = 0.5

# The options of taking the lock: sglang_lock's own, and sglang_host_probe's O(lock) suboptions.
TAKE_OPTIONS = dict(
    name=dict(type="str", required=True),
    dir=dict(type="path", default="/run/sglang-deploy"),
    wait=dict(type="int", default=0),
    lease=dict(type="int", default=3600),
    doing=dict(type="str", default="deploying"),
    controller=dict(type="dict", default={}),
    anchor_pid=dict(type="int"),
    takeover=dict(type="str", no_log=False),
    takeover_reason=dict(type="str", default="its controller process is gone"),
)


# The ``lock`` option of a module that writes under the lock: checked, its lease renewed, before any write.
LOCK_OPTION = dict(
    type="dict",
    options=dict(
        dir=dict(type="path", required=True),
        name=dict(type="str", required=True),
        token=dict(type="str", required=True, no_log=False),
    ),
)


class LockError(Exception):
    pass


def now_iso(offset=0.0):
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def boottime():
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def boot_id():
    try:
        with open(BOOT_ID) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def describe(record):
    """One sentence naming the holder, for a refused run and the takeover report."""
    if not isinstance(record, dict):
        return "an unreadable lock record"
    ctl = record.get("controller") or {}
    who = (
        f"ansible-playbook PID {ctl.get('pid', '?')} on controller {ctl.get('host', '?')} "
        f"(user {ctl.get('user', '?')}), playbook {ctl.get('playbook') or '?'}"
    )
    if ctl.get("play"):
        who += f", play {ctl['play']}"
    anchor = record.get("anchor")
    here = f"; on this host {anchor['comm']} PID {anchor['pid']}" if anchor else ""
    return (
        f"{who}{here}; holding it since {record.get('acquired', '?')}, now {record.get('doing', '?')} "
        f"(since {record.get('updated', '?')}, lease until {record.get('lease_until', '?')})"
    )


def read_record(path):
    """The record (dict), None when there is no lock file, {} when it cannot be parsed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return {}
        raise
    with os.fdopen(fd, "rb") as handle:
        data = handle.read()
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


class Mutex:
    """flock(2) on the lock directory around one decision."""

    def __init__(self, directory):
        self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def new_record(params, anchor, token, acquired=None):
    lease = params["lease"]
    now = now_iso()
    return {
        "version": 1,
        "token": token,
        "service": params["name"],
        "acquired": acquired or now,
        "updated": now,
        "doing": params["doing"],
        "controller": params["controller"],
        "anchor": anchor,
        "module_pid": os.getpid(),
        "boot_id": boot_id(),
        "lease_seconds": lease,
        "lease_until_boottime": boottime() + lease,
        "lease_until": now_iso(lease),
    }


def write_record(path, record):
    replace_file(path, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode(), 0o600)


def renew(directory, name, token, doing, lease, controller=None):
    """Extend this run's lease and say what it does now (``doing`` or ``lease`` None: the record's own);
    LockError (naming the holder) when the lock is not this run's any more (taken over, released, gone).
    Returns the new record."""
    path = os.path.join(directory, name + ".lock")
    with Mutex(directory):
        record = read_record(path)
        if record is None or record.get("token") != token:
            holder = describe(record) if record is not None else "nobody (the lock file is gone)"
            raise LockError(
                f"this run no longer holds the deploy lock of {name} ({path}): it is held by {holder}. "
                f"Stopping before: {doing or 'its next step'}"
            )
        if lease is None:
            lease = record.get("lease_seconds")
            lease = lease if isinstance(lease, int) and lease >= 1 else TAKE_OPTIONS["lease"]["default"]
        params = {
            "name": name,
            "doing": doing or record.get("doing") or TAKE_OPTIONS["doing"]["default"],
            "lease": lease,
            "controller": record.get("controller") or controller or {},
        }
        mine = new_record(params, record.get("anchor"), token, acquired=record.get("acquired"))
        write_record(path, mine)
    return mine


def hold(lock, doing=None, lease=None):
    """What a module that writes under the deploy lock calls before its first write: ``lock`` ({dir, name,
    token}, its O(lock) option) must still be this run's; its lease is renewed (``lease`` seconds, else the
    record's own) and, given ``doing``, what the run does now. LockError naming the holder otherwise; an
    OSError (a lock directory gone) is the caller's to report. Returns the new record."""
    return renew(lock["dir"], lock["name"], lock["token"], doing, lease)


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
    """The process on this host the holder runs under, shown to a refused run; its end proves the holder
    dead only when it is the run's own ansible-playbook (a local connection): an sshd may be one task's."""
    if pid is None:
        return None
    info = proc_stat(pid)
    if info is None:
        raise LockError(f"anchor_pid {pid}: no such process on this host")
    return {"pid": int(pid), "comm": info[0], "start": info[2], "ansible_playbook": is_ansible_playbook(pid)}


def why_dead(record, current_boot, now_boot):
    """Why the holder of ``record`` cannot be running any more, or None while it may be."""
    if not isinstance(record, dict) or not record.get("token"):
        return "its lock record is unreadable"
    if record.get("boot_id") != current_boot:
        return f"the host booted since it took the lock (boot id {str(record.get('boot_id'))[:8]}...)"
    anchor = record.get("anchor")
    if anchor and anchor.get("ansible_playbook"):
        info = proc_stat(anchor["pid"])
        if info is None or info[2] != anchor["start"]:
            return f"its ansible-playbook process on this host (PID {anchor['pid']}) is gone"
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


def acquire(params, path, directory):
    """(this run's record or None when refused, the live holder or the dead one taken over, seconds
    waited)."""
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


def checked_path(params):
    """The lock file of ``params`` (name, dir, lease, wait checked); LockError naming the bad one."""
    if not NAME_RE.match(params["name"]):
        raise LockError(f"name {params['name']!r}: only letters, digits and _.@:- are allowed")
    if params["lease"] < 1 or params["wait"] < 0:
        raise LockError(f"lease must be >= 1 and wait >= 0 (got {params['lease']}, {params['wait']})")
    return os.path.join(params["dir"], params["name"] + ".lock")


def failure(params, exc):
    """The message of an OSError or LockError (a bad lock directory) met taking, renewing or releasing."""
    text = f"{exc.strerror} ({exc.filename})" if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"deploy lock of {params['name']} in {params['dir']}: {text}"


def take(params, check_mode, warn):
    """Take the lock (sglang_lock state=acquired). Returns (result, refusal message or None); ``warn(text)``
    is called for a takeover and, in check mode (which takes and writes nothing), for a deploy in progress.
    OSError and LockError (a bad directory) are the caller's to report."""
    path = checked_path(params)
    directory = params["dir"]
    result = dict(lock_file=path, token="")
    if check_mode:
        # Nothing is taken or written; a deploy in progress makes this run's report out of date.
        record = read_record(path) if os.path.isdir(directory) else None
        if record is not None:
            if why_dead(record, boot_id(), boottime()) is None:
                result["message"] = (
                    f"{params['name']} is being deployed now by {describe(record)}: what this check mode run "
                    f"shows may be out of date when that deploy ends"
                )
                warn(result["message"])
            result["holder"] = record
        return result, None
    ensure_dir(directory)
    mine, other, waited = acquire(params, path, directory)
    result["waited"] = round(waited, 3)
    if mine is None:
        waited_text = f" after waiting {waited:.0f} s (sglang_lock_wait)" if params["wait"] else ""
        result["holder"] = other
        return result, (
            f"another deploy of {params['name']} holds {path}{waited_text}: {describe(other)}. "
            f"Run again when it has finished, or set sglang_lock_wait (seconds) to wait for it."
        )
    result.update(token=mine["token"], holder=mine)
    result["message"] = f"took the deploy lock of {params['name']} ({path})"
    if other is not None:
        result["took_over"] = other
        result["message"] = (
            f"took over the deploy lock of {params['name']} ({path}) from a dead run: "
            f"{other['reason']}. It was held by {describe(other)}"
        )
        warn(result["message"])
    return result, None


def on_every_end(module, amend):
    """Pass the result of whatever ends this module's call - exit_json or fail_json, from the module or from a
    helper it calls - through ``amend(result) -> result``: the lock a probe took goes back with any failure
    (to be released), and a proof releases the lock however it ends."""
    exit_json, fail_json = module.exit_json, module.fail_json
    module.exit_json = lambda **result: exit_json(**amend(result))
    module.fail_json = lambda msg, **result: fail_json(**amend(dict(result, msg=msg)))


def release(directory, name, token):
    """Remove the lock file when it is this run's (``token``). Returns (released, the other holder's record
    or None, a message when it is not this run's any more: left as it is)."""
    path = os.path.join(directory, name + ".lock")
    with Mutex(directory):
        record = read_record(path)
        mine = record is not None and record.get("token") == token
        if mine:
            os.unlink(path)
            return True, None, None
    if record is None:
        return False, None, None
    return (
        False,
        record,
        (f"the deploy lock of {name} is not this run's any more (left as it is): held by {describe(record)}"),
    )
