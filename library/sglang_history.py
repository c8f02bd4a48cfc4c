#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_history
short_description: Append to or read the SGLang deploy history (JSON lines)
description:
  - With O(record), appends one JSON line (the record plus C(time), UTC ISO 8601) to O(path),
    redacted first (secret keys and O(secret_values) never reach the file). The write uses
    C(O_APPEND) and C(fsync), so concurrent appends never interleave inside a line and a
    record survives a crash once the module returned. The file is created C(0640) root.
  - Without O(record), returns the last O(limit) records (read-only).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  path:
    description: History file.
    type: path
    default: /var/lib/sglang-deploy/history.jsonl
  record:
    description: Record to append (e.g. invocation, unit hash, window/budget/topk, result).
    type: dict
  limit:
    description: Number of most recent records returned when O(record) is not given.
    type: int
    default: 20
  secret_values:
    description: Literal secret values to scrub from the record before writing.
    type: list
    elements: str
    default: []
  known_good:
    description:
      - With O(record), first keep the files just verified as the known-good ones (what a rollback
        restores); each of O(known_good.files) is copied to O(known_good.dir) (C(0600) root), its sha256
        is added to the record and to the metadata file as C(<name>_sha256), and O(known_good.meta) (plus
        O(known_good.api_key)) is written to O(known_good.dir)/O(known_good.meta_name).
      - The SET is switched atomically - all files are written into a new directory
        C(<known_good.dir>.<ns>/) (0700), then O(known_good.dir) becomes a symlink to it by one C(rename(2))
        and the previous generation is removed; a reader sees the old set or the new one, never a mix. A real
        directory there (kept by an older version of the role) is renamed aside first, the one step that is
        not atomic.
      - All of it in the same call as the record, so a verified deploy costs one round trip.
      - With O(known_good.sha256), the files on disk must be exactly the ones the verified restart started;
        any file whose sha256 differs (written by hand or by another run during the readiness and stability
        window) fails the module naming it, and NOTHING is kept or recorded.
    type: dict
    suboptions:
      dir:
        description: Known-good directory (created C(0700) root).
        type: path
        required: true
      files:
        description: "Name -> path of each verified file, e.g. C({unit: /etc/systemd/system/sglang.service})."
        type: dict
        required: true
      meta_name:
        description: File name of the metadata (JSON) in O(known_good.dir).
        type: str
        required: true
      meta:
        description: What a rollback needs besides the files (listener, expected arguments, invocation).
        type: dict
        default: {}
      api_key:
        description: API key the known-good server answers to, kept in the metadata (never returned).
        type: str
        default: ''
      sha256:
        description:
          - "Name -> sha256 (hex) of each file as the verified restart started it, taken before the
            restart (e.g. C({unit: ..., env: ...}); the names of O(known_good.files)). A name missing here
            is not checked."
        type: dict
        default: {}
  clear_pending:
    description:
      - With O(record), the pending marker C(sglang_unit) wrote before it replaced the files. Once the
        record is on disk the marker is removed (the run is finished, verified, or rolled back, verified
        or not; the record says which) and its content is added to the record as C(pending).
      - A marker that is not there changes nothing.
    type: path
attributes:
  check_mode:
    support: full
    details: With O(record), reports changed and writes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Record the verified deploy
  sglang_history:
    record:
      invocation_id: "{{ __sglang_restart.invocation_id }}"
      unit_sha256: "{{ __sglang_unit.checksum }}"
      window: "{{ sglang_speculative_draft_window_size }}"
      result: verified

- name: Read the last five deploys
  sglang_history:
    limit: 5
  register: __sglang_history
"""

RETURN = r"""
records:
  description: Last O(limit) records, oldest first (only without O(record)).
  returned: when record is not given
  type: list
  elements: dict
  sample:
    - {"time": "2026-12-02T16:40:00Z", "invocation_id": "5f67eaa3...", "window": 2048, "result": "verified"}
record:
  description: The record as written (redacted, with C(time)).
  returned: when record is given
  type: dict
skipped_lines:
  description: Lines of the file that were not valid JSON objects (reported, not fatal).
  returned: when record is not given
  type: int
pending_cleared:
  description: O(clear_pending) was there and is removed now (in check mode, would be).
  returned: when record is given
  type: bool
"""

import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_files import fsync_dir, replace_file
from ansible.module_utils.sglang_journal import parse_json_lines  # JSON lines, one object a line
from ansible.module_utils.sglang_redact import redact  # noqa: E402

FILE_MODE = 0o640
DIR_MODE = 0o750


def now_utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def append_line(path, line):
    """One write(2) of the whole line on an O_APPEND descriptor, then fsync (file and, when the
    file was just created, its directory)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=DIR_MODE, exist_ok=True)
    created = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        if created:
            os.fchmod(fd, FILE_MODE)
            if os.geteuid() == 0:
                os.fchown(fd, 0, 0)
        data = line.encode("utf-8")
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(f"short write to {path}: {written} of {len(data)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class NotVerified(Exception):
    """A file on disk is not the one the verified restart started."""


def keep_known_good(spec, write):
    """Copy the verified files and the metadata into the known-good directory; {name_sha256: hex}.
    Raises NotVerified (nothing written) when a file differs from its O(known_good.sha256)."""
    contents, hashes, differ = {}, {}, []
    expected = spec.get("sha256") or {}
    unknown = sorted(set(expected) - set(spec["files"]))
    if unknown:
        raise NotVerified(f"known_good.sha256 names no file of known_good.files: {', '.join(unknown)}")
    for name, path in sorted(spec["files"].items()):
        with open(path, "rb") as handle:
            contents[path] = handle.read()
        got = hashes[f"{name}_sha256"] = hashlib.sha256(contents[path]).hexdigest()
        want = expected.get(name)
        if want is not None and str(want).lower() != got:
            differ.append(f"{path} (sha256 {got[:12]}, the restart ran {str(want)[:12]})")
    if differ:
        raise NotVerified(
            "changed since the verified restart started it: "
            + "; ".join(differ)
            + ". Written by hand or by another run during the readiness/stability window? It was not "
            "verified: NOTHING was recorded as known-good"
        )
    if write:
        files = {os.path.basename(path): data for path, data in contents.items()}
        # sha256_checked: the files whose hash was the one the verified restart ran (all, in the role).
        meta = dict(spec["meta"], api_key=spec["api_key"], sha256_checked=sorted(expected), **hashes)
        files[spec["meta_name"]] = (json.dumps(meta, indent=4, sort_keys=True) + "\n").encode()
        switch_known_good(spec["dir"], files)
    return hashes


def switch_known_good(link, files):
    """The whole set, atomically: every file is written (fsynced, 0600) into a new directory
    ``<link>.<ns>/`` (0700) beside ``link``, then ``link`` becomes a symlink to it by ONE rename(2) of a new
    symlink over it, and the generation it replaced is removed. A reader (the rollback, the boot-time heal)
    sees the old set or the new one, never a mix. ``link`` still a real directory (a set kept by an older
    version of the role) is first renamed to ``<link>.legacy-<ns>`` (the one step that is not atomic: a crash
    right after it leaves no known-good set, and the next run restarts with proof as on a fresh host)."""
    link = link.rstrip("/")
    parent, base = os.path.dirname(link) or ".", os.path.basename(link)
    os.makedirs(parent, mode=0o750, exist_ok=True)
    stamp = time.time_ns()
    generation = f"{base}.{stamp}"
    new = os.path.join(parent, generation)
    os.mkdir(new, 0o700)
    os.chmod(new, 0o700)
    for name, data in files.items():
        replace_file(os.path.join(new, name), data, 0o600)
    fsync_dir(new)
    if os.path.isdir(link) and not os.path.islink(link):
        os.rename(link, os.path.join(parent, f"{base}.legacy-{stamp}"))
    tmp = os.path.join(parent, f".{base}.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(generation, tmp)
    os.rename(tmp, link)
    fsync_dir(parent)
    for name in os.listdir(parent):
        if name.startswith(base + ".") and name != generation:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def read_pending(path):
    """The pending marker's content (``{"unreadable": reason}`` when it is not JSON), None when absent."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    try:
        marker = json.loads(text)
    except ValueError as exc:
        return {"unreadable": f"not JSON: {exc}"}
    return (
        marker if isinstance(marker, dict) else {"unreadable": f"not a JSON object: {type(marker).__name__}"}
    )


def remove_pending(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path) or ".")


def read_records(path, limit):
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            records, skipped = parse_json_lines(fh.read())
    except FileNotFoundError:
        return [], 0
    if limit >= 0:
        records = records[-limit:] if limit else []
    return records, skipped


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/var/lib/sglang-deploy/history.jsonl"),
            record=dict(type="dict"),
            limit=dict(type="int", default=20),
            secret_values=dict(type="list", elements="str", default=[], no_log=True),
            known_good=dict(
                type="dict",
                options=dict(
                    dir=dict(type="path", required=True),
                    files=dict(type="dict", required=True),
                    meta_name=dict(type="str", required=True),
                    meta=dict(type="dict", default={}),
                    api_key=dict(type="str", default="", no_log=True),
                    sha256=dict(type="dict", default={}),
                ),
            ),
            clear_pending=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    path, record = module.params["path"], module.params["record"]
    secrets = module.params["secret_values"]
    if record is None:
        if module.params["limit"] < 0:
            module.fail_json(msg=f"limit must be >= 0, got {module.params['limit']}")
        try:
            records, skipped = read_records(path, module.params["limit"])
        except OSError as exc:
            module.fail_json(msg=f"cannot read history file {path}: {exc.strerror}")
        module.exit_json(changed=False, records=redact(records, secrets), skipped_lines=skipped, path=path)

    entry = {"time": now_utc()}
    entry.update({k: v for k, v in record.items() if k != "time"})
    known_good = module.params["known_good"]
    if known_good is not None:
        try:
            entry.update(keep_known_good(known_good, write=not module.check_mode))
        except NotVerified as exc:
            module.fail_json(msg=f"not kept as known-good, not recorded: {exc}", recorded=False)
        except OSError as exc:
            module.fail_json(
                msg=f"cannot keep the known-good files in {known_good['dir']}: "
                f"{exc.strerror or exc} ({exc.filename})"
            )
    pending_path = module.params["clear_pending"]
    pending = read_pending(pending_path) if pending_path else None
    if pending is not None:
        entry["pending"] = pending
    entry = redact(entry, secrets)
    line = json.dumps(entry, sort_keys=True, default=str, separators=(",", ":")) + "\n"
    if "\n" in line[:-1]:
        module.fail_json(msg="history record serialises to more than one line")
    if not module.check_mode:
        try:
            append_line(path, line)
        except OSError as exc:
            module.fail_json(msg=f"cannot append to history file {path}: {exc.strerror or exc}")
        if pending is not None:
            try:
                remove_pending(pending_path)
            except OSError as exc:
                module.fail_json(
                    msg=f"recorded, but cannot remove the pending marker {pending_path}: "
                    f"{exc.strerror or exc}"
                )
    module.exit_json(changed=True, record=entry, path=path, pending_cleared=pending is not None)


if __name__ == "__main__":
    main()
