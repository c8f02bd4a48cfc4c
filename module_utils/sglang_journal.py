# Copyright: contributors to this repository
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

INVOCATION_FIELDS = ('_SYSTEMD_INVOCATION_ID', 'INVOCATION_ID')


class JournalError(Exception):
    """journalctl could not be run or its output could not be read; message names the command."""


def message_text(value):
    """MESSAGE as text: journald sends a JSON string, or an array of byte values when the message
    is not valid UTF-8 (or contains control characters); an array of such arrays when a field
    occurs more than once. Invalid bytes are replaced, never dropped silently."""
    if value is None:
        return ''
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if value and all(isinstance(b, int) for b in value):
            return bytes(b & 0xFF for b in value).decode('utf-8', errors='replace')
        return '\n'.join(message_text(v) for v in value)
    return str(value)


def parse_json_lines(text):
    """Entries of ``journalctl -o json`` output (one JSON object per line).

    Returns ``(entries, bad_lines)``; a line that is not JSON (journalctl prints ``-- No entries --``
    only in short formats, but be tolerant) is counted, not fatal.
    """
    entries, bad = [], 0
    for line in (text or '').splitlines():
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
            return value.replace('-', '').lower()
    return None


def _norm_id(invocation_id):
    return (invocation_id or '').replace('-', '').lower()


def _sort_key(entry):
    # Monotonic time only orders entries of the same boot; the realtime stamp breaks ties and
    # orders across boots; the cursor string keeps the order stable for equal stamps.
    return (
        entry.get('_BOOT_ID') or '',
        _int(entry.get('__MONOTONIC_TIMESTAMP'), 0),
        _int(entry.get('__REALTIME_TIMESTAMP'), 0),
        entry.get('__CURSOR') or '',
    )


def select_invocation(entries, invocation_id, pids=(), since_monotonic_us=None, boot_id=None):
    """Entries of one invocation, deduplicated by cursor and sorted in time order."""
    want = _norm_id(invocation_id)
    pid_set = {str(p) for p in pids if p not in (None, '', 0, '0')}
    seen, out = set(), []
    for entry in entries:
        tagged = entry_invocation(entry)
        match = bool(want) and tagged == want
        if not match and pid_set and str(entry.get('_PID', '')) in pid_set and tagged in (None, want):
            if boot_id and entry.get('_BOOT_ID') and entry.get('_BOOT_ID') != boot_id:
                match = False
            elif since_monotonic_us is not None:
                mono = _int(entry.get('__MONOTONIC_TIMESTAMP'))
                match = mono is not None and mono >= since_monotonic_us
            else:
                match = True
        if not match:
            continue
        cursor = entry.get('__CURSOR') or id(entry)
        if cursor in seen:
            continue
        seen.add(cursor)
        out.append(entry)
    out.sort(key=_sort_key)
    return out


def messages(entries, last=None):
    """MESSAGE texts of ``entries`` in order; the last ``last`` only when given."""
    texts = [message_text(e.get('MESSAGE')) for e in entries]
    if last is not None and last >= 0:
        texts = texts[-last:] if last else []
    return texts


def invocation_messages(text_or_entries, invocation_id, pids=(), last=None, since_monotonic_us=None):
    """Convenience: parse (if text) + select + messages."""
    if isinstance(text_or_entries, str):
        entries, _bad = parse_json_lines(text_or_entries)
    else:
        entries = list(text_or_entries)
    return messages(select_invocation(entries, invocation_id, pids, since_monotonic_us), last)


def read_invocation(module, invocation_id, pids=(), since_monotonic_us=None, journalctl=None):
    """Run journalctl on the target for one invocation (+ its PIDs); return selected entries.

    ``journalctl --sync`` first (needs root; failure is tolerated: the entries may then lag).
    Then ``journalctl -o json --all --no-pager _SYSTEMD_INVOCATION_ID=<id>``, and with PIDs
    ``_SYSTEMD_INVOCATION_ID=<id> + _PID=<pid> ...`` (``+`` is journalctl's OR). ``-u UNIT`` is
    never used: it returns lines of old invocations. Returns ``(entries, notes)``.
    """
    if not invocation_id:
        raise JournalError('no InvocationID given: cannot select the current invocation\'s journal lines')
    journalctl = journalctl or module.get_bin_path('journalctl', required=True)
    env = {'LANG': 'C', 'LC_ALL': 'C', 'SYSTEMD_PAGER': '', 'SYSTEMD_COLORS': '0'}
    notes = []
    rc, out, err = module.run_command([journalctl, '--sync'], environ_update=env)
    if rc != 0:
        notes.append(f'journalctl --sync failed (rc={rc}): {(err or out).strip()}; reading anyway')
    inv = _norm_id(invocation_id)
    # --all: without it journalctl -o json prints "MESSAGE": null for fields over 4096 bytes,
    # and the 0.5.23 server_args= line is ~19 KB (recorded: tests/fixtures/journal/).
    cmd = [journalctl, '-o', 'json', '--all', '--no-pager', f'_SYSTEMD_INVOCATION_ID={inv}']
    for pid in pids:
        if pid not in (None, '', 0, '0'):
            cmd += ['+', f'_PID={int(pid)}']
    rc, out, err = module.run_command(cmd, environ_update=env)
    if rc != 0:
        raise JournalError(f"{' '.join(cmd)} failed (rc={rc}): {(err or out).strip()}")
    entries, bad = parse_json_lines(out)
    if bad:
        notes.append(f'{bad} line(s) of journalctl -o json output were not JSON and were skipped')
    return select_invocation(entries, inv, pids, since_monotonic_us), notes
