# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""journalctl -o json parsing and selection of ONE invocation's messages (P2).

``journalctl -u UNIT`` mixes the lines of every run of the unit; it is never used as evidence.
Selection is by ``_SYSTEMD_INVOCATION_ID`` (set by journald for stdout/stderr of a unit) or
``INVOCATION_ID`` (set by some clients), OR by ``_PID`` in the invocation's PID set: lines of a
process that exits quickly can lose their unit tags (systemd #2913), and journald still records
their ``_PID``. PIDs are reused, so a PID match only counts when the entry is not tagged with a
DIFFERENT invocation and, given ``since_monotonic_us``, is not older than the invocation's start.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

INVOCATION_FIELDS = ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID")
# What SGLang logs once it answers (its HTTP server's warmup; the lab server logs the same line). Every line
# the running-arguments check reads - server_args=, the draft runner's, SGLang's warnings about the window -
# comes before it; after it come access and batch-statistics lines, as many as the server has been up and
# busy.
READY_MESSAGE = "The server is fired up and ready to roll!"


class JournalError(Exception):
    """journalctl could not be run or its output could not be read; message names the command."""


def message_text(value):
    """MESSAGE as text: journald sends a JSON string, or an array of byte values when the message
    is not valid UTF-8 (or contains control characters); an array of such arrays when a field
    occurs more than once. Invalid bytes are replaced, never dropped silently."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if value and all(isinstance(b, int) for b in value):
            return bytes(b & 0xFF for b in value).decode("utf-8", errors="replace")
        return "\n".join(message_text(v) for v in value)
    return str(value)


def parse_json_lines(text):
    """Entries of ``journalctl -o json`` output (one JSON object per line).

    Returns ``(entries, bad_lines)``; a line that is not JSON (journalctl prints ``-- No entries --``
    only in short formats, but be tolerant) is counted, not fatal.
    """
    entries, bad = [], 0
    for line in (text or "").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(obj, dict):
            entries.append(obj)
        else:
            bad += 1
    return entries, bad


def _int(value, default=None):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def entry_invocation(entry):
    for field in INVOCATION_FIELDS:
        value = entry.get(field)
        if isinstance(value, str) and value:
            return value.replace("-", "").lower()
    return None


def _norm_id(invocation_id):
    return (invocation_id or "").replace("-", "").lower()


def _sort_key(entry):
    # Monotonic time only orders entries of the same boot; the realtime stamp breaks ties and
    # orders across boots; the cursor string keeps the order stable for equal stamps.
    return (
        entry.get("_BOOT_ID") or "",
        _int(entry.get("__MONOTONIC_TIMESTAMP"), 0),
        _int(entry.get("__REALTIME_TIMESTAMP"), 0),
        entry.get("__CURSOR") or "",
    )


def select_invocation(entries, invocation_id, pids=(), since_monotonic_us=None, boot_id=None):
    """Entries of one invocation, deduplicated by cursor and sorted in time order."""
    want = _norm_id(invocation_id)
    pid_set = {str(p) for p in pids if p not in (None, "", 0, "0")}
    seen, out = set(), []
    for entry in entries:
        tagged = entry_invocation(entry)
        match = bool(want) and tagged == want
        if not match and pid_set and str(entry.get("_PID", "")) in pid_set and tagged in (None, want):
            if boot_id and entry.get("_BOOT_ID") and entry.get("_BOOT_ID") != boot_id:
                match = False
            elif since_monotonic_us is not None:
                mono = _int(entry.get("__MONOTONIC_TIMESTAMP"))
                match = mono is not None and mono >= since_monotonic_us
            else:
                match = True
        if not match:
            continue
        cursor = entry.get("__CURSOR") or id(entry)
        if cursor in seen:
            continue
        seen.add(cursor)
        out.append(entry)
    out.sort(key=_sort_key)
    return out


def messages(entries, last=None):
    """MESSAGE texts of ``entries`` in order; the last ``last`` only when given."""
    texts = [message_text(e.get("MESSAGE")) for e in entries]
    if last is not None and last >= 0:
        texts = texts[-last:] if last else []
    return texts


JOURNAL_ENV = {"LANG": "C", "LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}


def invocation_command(journalctl, invocation_id, pids=(), last=None, this_boot=True):
    """The journalctl argv for one invocation's lines, this boot (every boot the journal keeps with
    ``this_boot=False``: an invocation of an earlier boot): ``INVOCATION_ID=<id> +
    _SYSTEMD_INVOCATION_ID=<id>`` and, per PID, ``+ _PID=<pid>`` (``+`` is journalctl's OR); with ``last``,
    the newest ``last`` only (``-n``)."""
    inv = _norm_id(invocation_id)
    # --all: without it journalctl -o json prints "MESSAGE": null for fields over 4096 bytes,
    # and the 0.5.23 server_args= line is ~19 KB (recorded: tests/fixtures/journal/).
    cmd = [journalctl, "-o", "json", "--all", "--no-pager"] + (["-b"] if this_boot else [])
    if last is not None:
        cmd += ["-n", str(max(int(last), 1))]
    cmd += [f"INVOCATION_ID={inv}", "+", f"_SYSTEMD_INVOCATION_ID={inv}"]
    for pid in pids:
        if pid not in (None, "", 0, "0"):
            cmd += ["+", f"_PID={int(pid)}"]
    return cmd


def read_invocation(
    module, invocation_id, pids=(), since_monotonic_us=None, journalctl=None, sync=True, last=None, until=None
):
    """Run journalctl on the target for one invocation (+ its PIDs); return selected entries.

    The one journal reader of the modules. With ``sync``, ``journalctl --sync`` first (needs root;
    failure is tolerated: the entries may then lag). Then ``journalctl -o json --all --no-pager -b
    INVOCATION_ID=<id> + _SYSTEMD_INVOCATION_ID=<id>``, and with PIDs ``+ _PID=<pid> ...`` (``+`` is
    journalctl's OR): the invocation's own output, systemd's messages about it ("Main process
    exited, code=...") and lines of its PIDs that lost their unit tags, this boot only (a PID of an
    earlier boot is not this process; monotonic stamps of another boot do not compare). ``last``
    bounds the read to the newest ``last`` matching lines (``-n``); ``until`` (a message, e.g.
    READY_MESSAGE) to the oldest lines up to the invocation's main process's first line containing it.
    Either way journalctl's output is read as it comes (stream_entries). ``-u UNIT`` is never used: it
    returns lines of old invocations. Returns ``(entries, notes)``; raises JournalError when journalctl is
    missing or fails.
    """
    if not invocation_id:
        raise JournalError("no InvocationID given: cannot select the current invocation's journal lines")
    journalctl = journalctl or module.get_bin_path("journalctl")
    if not journalctl:
        raise JournalError("journalctl not found on the host: cannot read the invocation's journal lines")
    notes = []
    if sync:
        rc, out, err = module.run_command([journalctl, "--sync"], environ_update=JOURNAL_ENV)
        if rc != 0:
            notes.append(f"journalctl --sync failed (rc={rc}): {(err or out).strip()}; reading anyway")
    inv = _norm_id(invocation_id)
    cmd = invocation_command(journalctl, inv, pids, last)
    entries, bad, stopped = stream_entries(cmd, until, main_process_line(inv, pids, since_monotonic_us))
    if until is not None and not stopped:
        notes.append(f"no {until!r} line in the invocation's journal: read to its end")
    if bad:
        notes.append(f"{bad} line(s) of journalctl -o json output were not JSON and were skipped")
    return select_invocation(entries, inv, pids, since_monotonic_us), notes


def journal_lines(cmd):
    """journalctl's standard output line by line as it comes (bytes); closing the generator stops journalctl.
    Raises JournalError when it cannot be started, or when it ran to its end and failed."""
    try:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, **JOURNAL_ENV)
        )
    except OSError as exc:
        raise JournalError(f"{' '.join(cmd)} could not be run: {exc}") from None
    finished = False
    try:
        yield from proc.stdout
        finished = True
    finally:
        if not finished:
            proc.kill()
        proc.stdout.close()
        err = proc.stderr.read().decode("utf-8", errors="replace")
        proc.stderr.close()
        rc = proc.wait()
    if rc != 0:
        raise JournalError(f"{' '.join(cmd)} failed (rc={rc}): {err.strip()}")


def main_process_line(invocation_id, pids, since_monotonic_us=None):
    """What stream_entries stops on: a line of the invocation logged by one of ``pids`` (its main process). A
    left-over process of an older run (KillMode=process) logs lines tagged with the new invocation too
    (recorded in tests/fixtures/journal/stale-inv-2.json), its own ready line among them."""
    mains = {str(p) for p in pids if p not in (None, "", 0, "0")}

    def accepts(entry):
        return (not mains or str(entry.get("_PID")) in mains) and bool(
            select_invocation([entry], invocation_id, pids, since_monotonic_us)
        )

    return accepts


def stream_entries(cmd, until, selected):
    """The entries of ``journalctl -o json`` run as ``cmd``, read from the oldest as journalctl prints them,
    up to and including the first one that ``selected`` accepts and whose MESSAGE contains ``until`` (all of
    them when ``until`` is None); journalctl is stopped there. A server's journal keeps growing while it
    serves (access lines, batch statistics): what a check needs from its start is read in the same time on
    its first day and its hundredth. Returns ``(entries, bad_lines, stopped)``; ``stopped`` is False when no
    such entry came (all was read)."""
    entries, bad = [], 0
    lines = journal_lines(cmd)
    try:
        for raw in lines:
            found, not_json = parse_json_lines(raw.decode("utf-8", errors="replace"))
            bad += not_json
            entries += found
            if (
                found
                and until is not None
                and until in message_text(found[0].get("MESSAGE"))
                and selected(found[0])
            ):
                return entries, bad, True
    finally:
        lines.close()
    return entries, bad, False


# systemd's "Main process exited, code=..., status=..." message (sd-messages.h SD_MESSAGE_UNIT_PROCESS_EXIT).
UNIT_PROCESS_EXIT = "98e322203f7a4ed290d09fe03c09fe15"


def invocation_lines(entries, unit, invocation_id):
    """Selected entries of one invocation as dicts with t_us/pid/message/systemd/fields, oldest first.

    ``systemd`` marks systemd's own messages about the invocation (PID 1, or tagged only with
    ``INVOCATION_ID``); one of those about another unit (``UNIT``) is dropped.
    """
    want = _norm_id(invocation_id)
    lines = []
    for entry in entries:
        about = entry.get("_PID") == "1" or bool(
            entry.get("INVOCATION_ID") and _norm_id(entry.get("_SYSTEMD_INVOCATION_ID")) != want
        )
        if about and entry.get("UNIT") not in (None, unit):
            continue
        lines.append(
            {
                "t_us": _int(entry.get("__MONOTONIC_TIMESTAMP"), 0),
                "pid": entry.get("_PID"),
                "systemd": about,
                "message": message_text(entry.get("MESSAGE")),
                "fields": entry,
            }
        )
    return lines


def format_lines(lines, count, redact):
    """The last ``count`` lines as ``[seconds] pid N: message`` (``systemd:`` for systemd's), through
    ``redact``."""
    out = []
    for line in lines[-count:] if count else []:
        who = "systemd" if line["systemd"] else f"pid {line['pid']}"
        out.append(redact(f"[{line['t_us'] / 1e6:.6f}] {who}: {line['message']}"))
    return out


def latest_phase(lines, redact, ignore=None):
    """The invocation's latest own log line (systemd's 'Started ...' only when it logged nothing),
    through ``redact``, at most 300 characters; lines containing ``ignore`` do not count."""
    own = [
        e
        for e in lines
        if not e["systemd"] and e["message"].strip() and not (ignore and ignore in e["message"])
    ]
    pick = own or [e for e in lines if e["message"].strip()]
    return redact(pick[-1]["message"].strip())[:300] if pick else ""


def exit_from_journal(lines):
    """EXIT_CODE/EXIT_STATUS of systemd's 'Main process exited' message (of ExecStart=) in ``lines``."""
    results = [e["fields"]["UNIT_RESULT"] for e in lines if e["fields"].get("UNIT_RESULT")]
    result = results[-1] if results else None
    for line in reversed(lines):
        fields = line["fields"]
        exec_start = fields.get("COMMAND", "ExecStart") == "ExecStart"
        if fields.get("MESSAGE_ID") == UNIT_PROCESS_EXIT and exec_start:
            return {
                "code": fields.get("EXIT_CODE"),
                "status": fields.get("EXIT_STATUS"),
                "source": "journal",
                "result": result,
                "t_us": line["t_us"],
                "message": line["message"],
            }
    return None


# systemd's messages about a unit's end (sd-messages.h): SD_MESSAGE_UNIT_RESULT ("Failed with result ..."),
# SD_MESSAGE_UNIT_SUCCESS ("Deactivated successfully."), SD_MESSAGE_UNIT_RESTART_SCHEDULED ("Scheduled restart
# job, restart counter is at N."), SD_MESSAGE_UNIT_STOPPED ("Stopped ...", with the JOB_TYPE that stopped it).
UNIT_RESULT = "d9b373ed55a64feb8242e02dbe79a49c"
UNIT_SUCCESS = "7ad2d189f7e94e70a38c781354912448"
UNIT_RESTART_SCHEDULED = "5eb03494b6584870a536b337290809b3"
UNIT_STOPPED = "9d1aaa27d60140bd96365438aad20286"
# The signal names systemd prints after a killed process's number ("status=9/KILL").
_SIGNALS = {
    "1": "HUP",
    "2": "INT",
    "3": "QUIT",
    "4": "ILL",
    "6": "ABRT",
    "7": "BUS",
    "8": "FPE",
    "9": "KILL",
    "11": "SEGV",
    "13": "PIPE",
    "14": "ALRM",
    "15": "TERM",
}


def _utc(realtime_us):
    """``__REALTIME_TIMESTAMP`` (microseconds since the epoch) as ``YYYY-MM-DDTHH:MM:SSZ``, or None."""
    usec = _int(realtime_us)
    if usec is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(usec // 1000000))


def invocation_end(entries, unit, invocation_id, own_lines=3):
    """How the invocation ``invocation_id`` of ``unit`` ended, from the newest lines of its journal
    (``journalctl -n``; systemd's own messages about it carry its ``INVOCATION_ID``): a dict with ``ended``
    (the time of systemd's last line about it, UTC), ``code`` and ``status`` of its main process's exit
    (``killed``/``9``; none when it exited cleanly: systemd logs a clean exit at debug level only),
    ``signal`` (the signal's name when it was killed), ``result`` (``signal``, ``exit-code``, ...;
    ``success`` after "Deactivated successfully"), ``restart_counter`` (systemd's automatic restart that
    followed: "Scheduled restart job, restart counter is at N"), ``job`` (the type of the job that stopped
    it: ``restart`` or ``stop``; an automatic restart is a ``restart`` job too, with ``restart_counter``),
    ``systemd`` (systemd's messages about its end, in order) and ``last_lines`` (the last ``own_lines`` of
    its own output). None when the journal holds no line of it (rotated, or an earlier boot's volatile
    journal)."""
    lines = invocation_lines(select_invocation(entries, invocation_id), unit, invocation_id)
    if not lines:
        return None
    out = {
        "invocation_id": _norm_id(invocation_id),
        "ended": None,
        "code": None,
        "status": None,
        "signal": None,
        "result": None,
        "restart_counter": None,
        "job": None,
        "systemd": [],
        "last_lines": [e["message"] for e in lines if not e["systemd"]][-own_lines:] if own_lines else [],
    }
    exited = exit_from_journal(lines)
    if exited:
        out.update(code=exited["code"], status=exited["status"], result=exited["result"])
        if exited["code"] in ("killed", "dumped"):
            out["signal"] = _SIGNALS.get(str(exited["status"]), str(exited["status"]))
    for line in lines:
        if not line["systemd"]:
            continue
        fields = line["fields"]
        mid = fields.get("MESSAGE_ID")
        if mid not in (UNIT_PROCESS_EXIT, UNIT_RESULT, UNIT_SUCCESS, UNIT_RESTART_SCHEDULED, UNIT_STOPPED):
            continue
        out["systemd"].append(line["message"])
        out["ended"] = _utc(fields.get("__REALTIME_TIMESTAMP")) or out["ended"]
        if mid == UNIT_RESULT and fields.get("UNIT_RESULT"):
            out["result"] = fields["UNIT_RESULT"]
        elif mid == UNIT_SUCCESS and not out["result"]:
            out["result"] = "success"
        elif mid == UNIT_RESTART_SCHEDULED:
            out["restart_counter"] = _int(fields.get("N_RESTARTS"))
        elif mid == UNIT_STOPPED and fields.get("JOB_TYPE"):
            out["job"] = fields["JOB_TYPE"]
    return out
