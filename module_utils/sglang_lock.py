# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy lock's record (library/sglang_lock.py): read, written and renewed under flock(2) on its
directory. Shared by sglang_lock and by sglang_unit, which renews the lock for the restart in the call that
writes the files (one round trip less per restart)."""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import time

from ansible.module_utils.sglang_files import replace_file

BOOT_ID = "/proc/sys/kernel/random/boot_id"


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
    """Extend this run's lease and say what it does now; LockError (naming the holder) when the lock is not
    this run's any more (taken over, released, gone). Returns the new record."""
    path = os.path.join(directory, name + ".lock")
    with Mutex(directory):
        record = read_record(path)
        if record is None or record.get("token") != token:
            holder = describe(record) if record is not None else "nobody (the lock file is gone)"
            raise LockError(
                f"this run no longer holds the deploy lock of {name} ({path}): it is held by {holder}. "
                f"Stopping before: {doing}"
            )
        params = {
            "name": name,
            "doing": doing,
            "lease": lease,
            "controller": record.get("controller") or controller or {},
        }
        mine = new_record(params, record.get("anchor"), token, acquired=record.get("acquired"))
        write_record(path, mine)
    return mine
