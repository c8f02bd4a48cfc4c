# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watch after a verified deploy (roles/sglang/files/sglang-deploy-watch, on a timer): what it found ->
record or not, which result, revert or not, in ONE pure function (:func:`decide`), and the kernel's GPU
(NVIDIA Xid) and OOM lines of the minutes of an invocation's end (:func:`kernel_lines`). The history is the
watch's only state: an invocation it recorded is not recorded again, and a tick that finds nothing new
writes nothing. Standard library only (installed on the host beside the boot-time heal's module_utils)."""

from __future__ import annotations

import datetime
import re

from ansible.module_utils.sglang_systemd import as_int

# Results of the watch's history records.
CRASHED = "crashed_after_verify"
RESTARTED = "restarted_outside_deploy"
STOPPED = "stopped_outside_deploy"
CRASH_LOOP = "crash_loop"
REVERTED = "reverted_by_watch"
REVERT_FAILED = "revert_failed"
WATCH_RESULTS = (CRASHED, RESTARTED, STOPPED, CRASH_LOOP, REVERTED, REVERT_FAILED)

# The kernel lines an invocation's end is read with: NVIDIA's Xid (the driver's "NVRM: Xid (PCI:...): <n>,
# ..." line, docs.nvidia.com/deploy/xid-errors) and the OOM killer's (mm/oom_kill.c).
KERNEL_RE = re.compile(
    r"NVRM: Xid|invoked oom-killer|Out of memory|oom-kill:|oom_reaper|Memory cgroup out of memory"
)
# Minutes of the kernel's journal around an end that count as "the same minutes".
KERNEL_BEFORE_S = 120
KERNEL_AFTER_S = 60


def norm_id(value):
    return str(value or "").replace("-", "").strip().lower()


def parse_utc(text):
    """Seconds since the epoch of a history/journal time (``2026-12-07T10:47:13[.ffffff]Z``), else None."""
    if not text:
        return None
    text = str(text).rstrip("Z")
    for fmt in ("%Y-%m-%dT%H:%M:%S.%f", "%Y-%m-%dT%H:%M:%S"):
        try:
            stamp = datetime.datetime.strptime(text, fmt)
        except ValueError:
            continue
        return stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
    return None


def unit_records(history, unit):
    """The history records of ``unit`` (older ones without ``unit`` count as the unit's), oldest first."""
    return [r for r in history if isinstance(r, dict) and r.get("unit", unit) == unit]


def last_seen(records):
    """The newest invocation the history names (a deploy's or one the watch recorded), '' when none."""
    for rec in reversed(records):
        inv = norm_id(rec.get("invocation_id"))
        if inv:
            return inv
    return ""


def recorded(records, invocation_id, results):
    return any(
        norm_id(r.get("invocation_id")) == invocation_id and r.get("result") in results for r in records
    )


def is_crash(end):
    """Whether an invocation's end (sglang_journal.invocation_end) was its main process dying, not a job."""
    if not end:
        return False
    if end.get("code") in ("killed", "dumped") or (
        end.get("code") == "exited" and str(end.get("status")) != "0"
    ):
        return True
    return end.get("result") not in (None, "success") or end.get("restart_counter") is not None


def crashes_since(records, since_invocation, n_restarts, now, window_s):
    """(crashes the history records within ``window_s`` seconds of ``now``, crashes new since the watch's last
    record of the same verified deploy): NRestarts counts from the job that started the unit, and one tick can
    see several."""
    total, previous = 0, None
    for rec in records:
        if rec.get("watch") is None or norm_id(rec.get("verified_invocation_id")) != since_invocation:
            continue
        if rec.get("result") == CRASHED:
            stamp = parse_utc(rec.get("time"))
            if stamp is not None and now - stamp <= window_s:
                total += max(as_int(rec.get("crashes"), 1), 1)
        previous = rec
    prev = as_int((previous or {}).get("n_restarts"), 0)
    return total, (n_restarts - prev if n_restarts >= prev and previous is not None else n_restarts)


def decide(found, settings):
    """What the watch does with what it found; pure.

    ``found``: ``lock_held`` (a deploy holds the host lock), ``props`` (``systemctl show`` of the unit),
    ``known_good`` (the known-good metadata: the last verified deploy, its ``invocation_id``), ``history``
    (the records of the history file), ``end`` (sglang_journal.invocation_end of the invocation named by
    :func:`look_at`, or None), ``files_known_good`` (the unit, environment and --config files on disk are
    the known-good ones), ``now`` (seconds since the epoch), ``unit``.
    ``settings``: ``revert`` (bool), ``revert_count``, ``revert_window`` (seconds).

    Returns ``{"action": "idle"|"record"|"revert", "result", "why", "invocation_id", "ended_invocation_id",
    "crashes", "crashes_in_window"}``; ``idle`` writes nothing."""
    unit = found.get("unit") or "sglang.service"
    out = dict(
        action="idle",
        result=None,
        why="",
        invocation_id="",
        ended_invocation_id="",
        crashes=0,
        crashes_in_window=0,
    )
    if found.get("lock_held"):
        return dict(out, why="a deploy holds the host lock: it verifies or rolls back itself")
    kg = found.get("known_good")
    verified = norm_id((kg or {}).get("invocation_id")) if isinstance(kg, dict) else ""
    if not verified:
        return dict(out, why="no verified deploy on this host yet: nothing to watch")
    props = found.get("props") or {}
    running = norm_id(props.get("InvocationID"))
    active = props.get("ActiveState")
    records = unit_records(found.get("history") or [], unit)
    target = look_at(found)
    out.update(invocation_id=running, ended_invocation_id=target or "")
    if target is None:
        return dict(out, why=f"{unit} runs {running[:12] or '(none)'}, already known: nothing new")
    end = found.get("end")
    if active in ("active", "activating", "reloading", "deactivating") and running != target:
        if is_crash(end) or (end is None and as_int(props.get("NRestarts")) > 0):
            result, why = CRASHED, "its main process died and systemd started it again"
        else:
            result, why = RESTARTED, "a restart that no deploy made (by hand, or a reboot)"
    elif is_crash(end):
        result, why = CRASHED, f"its main process died and {unit} is {active}"
    else:
        result, why = STOPPED, f"{unit} is {active}: stopped outside a deploy"
    out.update(action="record", result=result, why=why)
    if result != CRASHED:
        return out
    total, crashes = crashes_since(
        records,
        verified,
        as_int(props.get("NRestarts")),
        found.get("now", 0),
        settings.get("revert_window", 0),
    )
    crashes = max(crashes, 1)
    out.update(crashes=crashes, crashes_in_window=total + crashes)
    if not settings.get("revert") or total + crashes < max(as_int(settings.get("revert_count"), 1), 1):
        return out
    if found.get("files_known_good"):
        return dict(
            out,
            result=CRASH_LOOP,
            why=f"{total + crashes} crashes within {settings.get('revert_window')} s, but the files on disk "
            "are "
            "the known-good ones (the last verified deploy): nothing older is kept to revert to",
        )
    return dict(
        out,
        action="revert",
        why=f"{total + crashes} crashes within {settings.get('revert_window')} s of a configuration that is "
        "not the known-good one: restore the known-good files and verify them",
    )


def look_at(found):
    """The invocation whose end the watch reads (the journal), or None when nothing new happened: the
    running invocation is the last one the history names (a deploy's or the watch's) and is still running, or
    its stop is recorded already. ``found`` as :func:`decide`'s (``end`` not needed)."""
    unit = found.get("unit") or "sglang.service"
    props = found.get("props") or {}
    running = norm_id(props.get("InvocationID"))
    kg = found.get("known_good") if isinstance(found.get("known_good"), dict) else {}
    records = unit_records(found.get("history") or [], unit)
    seen = last_seen(records) or norm_id(kg.get("invocation_id"))
    if running and running != seen:
        return seen or None
    # The invocation the history knows is the running one: nothing new unless it stopped unrecorded.
    if props.get("ActiveState") in ("active", "activating", "reloading") or not running:
        return None
    if recorded(records, running, (CRASHED, STOPPED, CRASH_LOOP, REVERT_FAILED)):
        return None
    return running


def kernel_lines(entries, end_s, limit=20):
    """The kernel's GPU (NVIDIA Xid) and OOM lines (``entries``: journal JSON of the kernel transport) within
    KERNEL_BEFORE_S before and KERNEL_AFTER_S after ``end_s`` (seconds since the epoch), as
    ``"<UTC time> <message>"``, the newest ``limit``."""
    out = []
    for entry in entries:
        msg = entry.get("MESSAGE")
        if isinstance(msg, list):
            msg = bytes(msg).decode("utf-8", errors="replace")
        if not isinstance(msg, str) or not KERNEL_RE.search(msg):
            continue
        stamp = as_int(entry.get("__REALTIME_TIMESTAMP"), 0) / 1e6
        if end_s is not None and not (end_s - KERNEL_BEFORE_S <= stamp <= end_s + KERNEL_AFTER_S):
            continue
        when = datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        out.append(f"{when} {msg.strip()}")
    return out[-limit:]
