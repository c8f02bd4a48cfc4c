# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy history's write: one redacted JSON line appended to the history file, the verified files kept as
the known-good set first (only when they are byte for byte the ones the verified restart started), the
pending marker cleared, and node_exporter's textfile rewritten from the record (what runs now). Shared by
library/sglang_history.py and library/sglang_verified_restart.py (which records a verified restart in the call
that verified it). Standard library only."""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import shutil
import time

from ansible.module_utils.sglang_files import fsync_dir, replace_file
from ansible.module_utils.sglang_journal import parse_json_lines
from ansible.module_utils.sglang_redact import redact

# The options of known_good (argument spec), the same in both modules.
KNOWN_GOOD_OPTIONS = dict(
    dir=dict(type="path", required=True),
    files=dict(type="dict", required=True),
    meta_name=dict(type="str", required=True),
    meta=dict(type="dict", default={}),
    api_key=dict(type="str", default="", no_log=True),
    sha256=dict(type="dict", default={}),
    keep_replaced=dict(type="path"),
)

# The options of textfile (argument spec), the same in both modules.
TEXTFILE_OPTIONS = dict(
    path=dict(type="path", required=True),
    service=dict(type="str", required=True),
)

FILE_MODE = 0o640
DIR_MODE = 0o750
# node_exporter runs as its own user: the textfile and its directory are world-readable.
TEXTFILE_MODE = 0o644
TEXTFILE_DIR_MODE = 0o755
# Label of the textfile's metrics -> the record's field it comes from (service: the textfile's own).
TEXTFILE_LABELS = (
    ("service", None),
    ("config_hash", "config_hash"),
    ("invocation", "invocation_id"),
    ("window", "window"),
    ("budget", "budget"),
    ("topk", "topk"),
    ("algorithm", "algorithm"),
    ("sglang_version", "sglang_version"),
    ("result", "result"),
)


def read_records(path, limit):
    """The last ``limit`` records (all with a negative limit), and how many lines were not records."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            records, skipped = parse_json_lines(fh.read())
    except FileNotFoundError:
        return [], 0
    if limit >= 0:
        records = records[-limit:] if limit else []
    return records, skipped


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
        switch_known_good(spec["dir"], files, keep_replaced=spec.get("keep_replaced"))
    return hashes


def switch_known_good(link, files, keep_replaced=None):
    """The whole set, atomically: every file is written (fsynced, 0600) into a new directory
    ``<link>.<ns>/`` (0700) beside ``link`` (a name whose content is None is left out), then ``link``
    becomes a symlink to it by ONE rename(2) of a new symlink over it. A reader (the rollback, the boot-time
    heal) sees the old set or the new one, never a mix. The other services' files of the current generation
    are carried into the new one (one known-good directory serves every service of the host), under a flock
    of the parent directory so that two services switching at once lose neither. ``keep_replaced`` (a path
    beside ``link``): the generation this switch replaces stays, and that path becomes a symlink to it (none
    replaced: the path goes), by the same kind of rename. A generation no symlink of the parent names is
    removed. ``link`` still a real directory (a set kept by an older version of the role) is first renamed
    to ``<link>.legacy-<ns>`` (the one step that is not atomic: a crash right after it leaves no known-good
    set, and the next run restarts with proof as on a fresh host)."""
    link = link.rstrip("/")
    parent, base = os.path.dirname(link) or ".", os.path.basename(link)
    if keep_replaced is not None and os.path.dirname(keep_replaced.rstrip("/")) != parent:
        raise ValueError(f"keep_replaced {keep_replaced} is not beside {link}")
    os.makedirs(parent, mode=0o750, exist_ok=True)
    guard = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        stamp = time.time_ns()
        generation = f"{base}.{stamp}"
        new = os.path.join(parent, generation)
        os.mkdir(new, 0o700)
        os.chmod(new, 0o700)
        kept = dict(files)
        if os.path.isdir(link):
            for name in sorted(os.listdir(link)):
                if name not in kept and os.path.isfile(os.path.join(link, name)):
                    with open(os.path.join(link, name), "rb") as handle:
                        kept[name] = handle.read()
        for name, data in kept.items():
            if data is not None:  # None: the name is not part of the new generation
                replace_file(os.path.join(new, name), data, 0o600)
        fsync_dir(new)
        replaced = os.readlink(link) if os.path.islink(link) else None
        if os.path.isdir(link) and not os.path.islink(link):
            replaced = f"{base}.legacy-{stamp}"
            os.rename(link, os.path.join(parent, replaced))
        point(link, generation)
        if keep_replaced is not None:
            point(keep_replaced.rstrip("/"), replaced)
        fsync_dir(parent)
        named = {
            os.readlink(path)
            for path in (os.path.join(parent, n) for n in os.listdir(parent))
            if os.path.islink(path)
        }
        for name in os.listdir(parent):
            if name.startswith(base + ".") and name not in named:
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    finally:
        os.close(guard)


def point(path, target):
    """``path`` becomes a symlink to ``target`` (a name in its directory) by one rename(2); None: ``path``
    goes. A real directory at ``path`` (a set an older version of the role copied there) goes first."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    if target is None:
        if os.path.lexists(path):
            os.unlink(path)
        return
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.rename(tmp, path)


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


def label_value(value):
    """A record's value as a Prometheus label value, escaped as the text exposition format wants it
    (backslash, double quote, newline); no value is the empty string (to Prometheus, no label)."""
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float) and value.is_integer():
        text = str(int(value))
    else:
        text = str(value)
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_textfile(entry, service):
    """node_exporter textfile content for the history record ``entry`` (with its ``time``) of ``service``:
    ``sglang_deploy_info`` (1) and ``sglang_deploy_timestamp_seconds`` (the record's time), both labelled with
    what runs (TEXTFILE_LABELS)."""
    values = {name: service if field is None else entry.get(field) for name, field in TEXTFILE_LABELS}
    labels = ",".join(f'{name}="{label_value(values[name])}"' for name, _ in TEXTFILE_LABELS)
    stamp = datetime.datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    seconds = stamp.replace(tzinfo=datetime.timezone.utc).timestamp()
    return (
        "# HELP sglang_deploy_info The SGLang configuration the last deploy of the service left running"
        " (its history record).\n"
        "# TYPE sglang_deploy_info gauge\n"
        f"sglang_deploy_info{{{labels}}} 1\n"
        "# HELP sglang_deploy_timestamp_seconds When the last deploy of the service was recorded.\n"
        "# TYPE sglang_deploy_timestamp_seconds gauge\n"
        f"sglang_deploy_timestamp_seconds{{{labels}}} {seconds:.3f}\n"
    )


def write_textfile(spec, entry, check_mode=False):
    """Rewrite ``spec['path']`` atomically (a file beside it, then rename: node_exporter reads the old content
    or the new) from ``entry``; ``{'path', 'written'}``, or ``{'path', 'error'}`` when it cannot be written
    (the record stands; the caller warns)."""
    path = spec["path"]
    data = render_textfile(entry, spec["service"]).encode("utf-8")
    if check_mode:
        return {"path": path, "written": False}
    try:
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            os.makedirs(directory, mode=TEXTFILE_DIR_MODE, exist_ok=True)
        replace_file(path, data, TEXTFILE_MODE)
    except OSError as exc:
        return {"path": path, "error": f"cannot write {path}: {exc.strerror or exc}"}
    return {"path": path, "written": True}


class NotRecorded(Exception):
    """Nothing (or, when the pending marker could not be removed, only the record) was written; the message
    says which."""


def set_known_good_invocation(spec, invocation_id, write):
    """The known-good set stays as it is; its metadata's ``invocation_id`` becomes ``invocation_id`` (a new
    generation, the set's other files carried over: switch_known_good). A rollback verified that set again in
    a new invocation, which is the last verified one now: what the drift check (P17) compares the running
    invocation with. With ``from_dir`` (a revert: the set the rolling play kept), that set's metadata and
    its ``files`` (copy names; one it lacks goes from the new generation too) become the known-good set
    instead, the other services' files carried over. Raises NotRecorded."""
    source = spec.get("from_dir") or spec["dir"]
    meta_path = os.path.join(source, spec["meta_name"])
    try:
        with open(meta_path, "rb") as handle:
            meta = json.loads(handle.read())
    except (OSError, ValueError) as exc:
        raise NotRecorded(f"cannot read the known-good metadata {meta_path}: {exc}") from None
    if not isinstance(meta, dict):
        raise NotRecorded(f"the known-good metadata {meta_path} is not a JSON object")
    meta["invocation_id"] = invocation_id
    files = {spec["meta_name"]: (json.dumps(meta, indent=4, sort_keys=True) + "\n").encode()}
    if spec.get("from_dir"):
        for name in spec.get("files") or []:
            try:
                with open(os.path.join(source, name), "rb") as handle:
                    files[name] = handle.read()
            except FileNotFoundError:
                files[name] = None
            except OSError as exc:
                raise NotRecorded(f"cannot read the kept copy {os.path.join(source, name)}: {exc}") from None
    if write:
        try:
            switch_known_good(spec["dir"], files)
        except OSError as exc:
            raise NotRecorded(
                f"cannot update the known-good metadata {meta_path}: {exc.strerror or exc}"
            ) from None


def write(
    path,
    record,
    known_good=None,
    clear_pending=None,
    secrets=(),
    check_mode=False,
    known_good_invocation=None,
    textfile=None,
):
    """Keep ``known_good`` (when given) or set the known-good set's invocation (``known_good_invocation``:
    ``{dir, meta_name, invocation_id, from_dir, files}``), append ``record`` with its time, clear the pending
    marker, then rewrite the ``textfile`` (when given, TEXTFILE_OPTIONS); returns (the entry as written,
    whether a pending marker was cleared, what ``write_textfile`` returned or None). Raises NotRecorded."""
    entry = {"time": now_utc()}
    entry.update({k: v for k, v in record.items() if k != "time"})
    if known_good_invocation is not None:
        set_known_good_invocation(
            known_good_invocation, known_good_invocation["invocation_id"], not check_mode
        )
    if known_good is not None:
        try:
            entry.update(keep_known_good(known_good, write=not check_mode))
        except (NotVerified, ValueError) as exc:
            raise NotRecorded(f"not kept as known-good, not recorded: {exc}") from None
        except OSError as exc:
            raise NotRecorded(
                f"cannot keep the known-good files in {known_good['dir']}: "
                f"{exc.strerror or exc} ({exc.filename})"
            ) from None
    pending = read_pending(clear_pending) if clear_pending else None
    if pending is not None:
        entry["pending"] = pending
    entry = redact(entry, list(secrets))
    line = json.dumps(entry, sort_keys=True, default=str, separators=(",", ":")) + "\n"
    if "\n" in line[:-1]:
        raise NotRecorded("history record serialises to more than one line")
    if not check_mode:
        try:
            append_line(path, line)
        except OSError as exc:
            raise NotRecorded(f"cannot append to history file {path}: {exc.strerror or exc}") from None
        if pending is not None:
            try:
                remove_pending(clear_pending)
            except OSError as exc:
                raise NotRecorded(
                    f"recorded, but cannot remove the pending marker {clear_pending}: {exc.strerror or exc}"
                ) from None
    written = write_textfile(textfile, entry, check_mode) if textfile else None
    return entry, pending is not None, written
