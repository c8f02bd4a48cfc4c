# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Atomic, durable file replacement for the files a deploy writes (unit, environment file, the kept
previous and known-good copies), and the digest of a file: shared by sglang_unit, sglang_history,
sglang_known_good, sglang_host_probe and the host scripts (roles/sglang/files/sglang-deploy-heal and
sglang-deploy-watch, which the role installs this file beside)."""

from __future__ import annotations

import hashlib
import os
import tempfile


def file_digest(path, algorithm):
    """Hex digest of the file at ``path``, read in 1 MiB blocks; OSError when it cannot be read."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path):
    """The file's sha256, or None when it cannot be read (missing, unreadable)."""
    try:
        return file_digest(path, "sha256")
    except OSError:
        return None


def fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stage_file(path, data, mode, gid=0):
    """Write ``data`` (bytes) to a fsynced temporary file beside ``path`` (same directory, so the rename is
    atomic) with ``mode``, owner root and group ``gid`` (when running as root); return its path. The content
    is never readable beyond ``mode`` (the file is created 0600 and chowned before it is written)."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            if os.geteuid() == 0:
                os.fchown(handle.fileno(), 0, gid)
            os.fchmod(handle.fileno(), mode)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def discard_staged(tmps):
    for tmp in tmps:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def replace_file(path, data, mode, gid=0):
    """Replace ``path`` with ``data`` (bytes): a staged file (:func:`stage_file`) is renamed over it, then
    the directory is fsynced. Either the old or the new content is there at any moment, never a partial
    file."""
    tmp = stage_file(path, data, mode, gid)
    try:
        os.replace(tmp, path)
    except BaseException:
        discard_staged([tmp])
        raise
    fsync_dir(os.path.dirname(path) or ".")
