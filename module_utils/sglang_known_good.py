# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The known-good set of the last VERIFIED deploy, read only when every copy has the sha256 recorded for it:
shared by the rollback (library/sglang_known_good.py) and the boot-time heal script
(roles/sglang/files/sglang-deploy-heal, which the role installs this file beside). Standard library only,
no other import: the heal script loads it by path at boot, without Ansible."""

from __future__ import annotations

import hashlib
import json
import os


class Refused(Exception):
    """The known-good set cannot be trusted; the message names every copy and why."""


def marker_matches(data, recorded):
    """The release marker ``data`` (bytes) is the one whose sha256 was ``recorded``. A release the role
    built (not found complete) used to be recorded with the hash of its text and a backslash-n where the file
    has its final newline (a Jinja '\\n' in a YAML folded scalar stays two characters): that record names
    exactly one file as well, this one, so the rollback of a host deployed then is not refused."""
    recorded = str(recorded).lower()
    if hashlib.sha256(data).hexdigest() == recorded:
        return True
    return data.endswith(b"\n") and hashlib.sha256(data[:-1] + b"\\n").hexdigest() == recorded


def release_problems(meta, meta_path):
    """The SGLang release the known-good unit runs (``release`` of the metadata: its directory and marker with
    the marker's sha256) must still be there, unchanged: a unit naming a removed or rebuilt release is not
    restored. A set kept before releases existed has no ``release`` and is not checked."""
    release = meta.get("release")
    if release is None:
        return []
    if not isinstance(release, dict) or not release.get("path") or not release.get("marker_sha256"):
        return [f"release: {release!r} in {meta_path} names no release directory and marker sha256"]
    marker = release.get("marker") or ""
    try:
        with open(marker, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        return [f"the release {release['path']} ({marker}: {exc.strerror or exc})"]
    actual = hashlib.sha256(data).hexdigest()
    if os.path.dirname(os.path.normpath(marker)) != os.path.normpath(release["path"]):
        return [f"the release {release['path']} (its marker {marker} is not in it)"]
    if not marker_matches(data, release["marker_sha256"]):
        return [
            f"the release {release['path']} ({marker}: sha256 {actual[:12]}, "
            f"recorded {str(release['marker_sha256'])[:12]})"
        ]
    return []


def read_known_good(directory, meta_name, targets):
    """{name: content} of the known-good copies of ``targets`` ({name: (path, mode, gid)}: the copy is
    ``directory``/basename(path)), each checked against the ``<name>_sha256`` of the metadata ``meta_name``.
    A config copy with no hash recorded and no file is skipped (a set kept before the --config file)."""
    meta_path = os.path.join(directory, meta_name)
    try:
        with open(meta_path, "rb") as handle:
            meta = json.loads(handle.read())
    except (OSError, ValueError) as exc:
        raise Refused(f"cannot read the known-good metadata {meta_path}: {exc}") from exc
    if not isinstance(meta, dict):
        raise Refused(f"the known-good metadata {meta_path} is not a JSON object")
    contents, bad = {}, []
    for name, (path, _mode, _gid) in targets.items():
        copy = os.path.join(directory, os.path.basename(path))
        recorded = meta.get(f"{name}_sha256")
        if name == "config" and recorded is None and not os.path.exists(copy):
            continue  # a set kept before the role had a --config file
        if not recorded:
            bad.append(f"{copy} (no {name}_sha256 recorded in {meta_path})")
            continue
        try:
            with open(copy, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            bad.append(f"{copy} ({exc.strerror or exc})")
            continue
        actual = hashlib.sha256(data).hexdigest()
        if actual != str(recorded).lower():
            bad.append(f"{copy} (sha256 {actual[:12]}, recorded {str(recorded)[:12]})")
            continue
        contents[name] = data
    bad += release_problems(meta, meta_path)
    if bad:
        raise Refused(
            "the known-good copies are not the ones that were verified: "
            + "; ".join(bad)
            + ". Refused: nothing was written"
        )
    return contents
