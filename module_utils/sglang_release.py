# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang releases: one immutable virtualenv per installed content, ``<releases_dir>/<key>/``.

The key names what the release contains: the SGLang requirement (``sglang==<version>``, or the git
repository and ref), how its dependencies were installed (``dependencies`` of the role's install marker:
resolved by pip, or the sha256 of the requirement list) and the Python major.minor the venv was made with.
A release is complete when its marker (the role's install marker, written LAST, after every pip run) names
that key; a directory without it is an interrupted build and is never run (the unit names a release only
after the marker is written). Nothing ever pip-installs into a complete release.

Shared by library/sglang_host_probe.py (which release the settings want, and whether it is there),
library/sglang_releases.py (keep the last N) and lab/labctl (the SGLang layer pre-builds the lab release,
importing this file by path: standard library only)."""

from __future__ import annotations

import hashlib
import json
import os
import re

_LABEL_BAD = re.compile(r"[^A-Za-z0-9._+-]+")


def release_identity(wanted, python_version):
    """What the key is computed from (the install marker's ``wanted`` fields that change the content)."""
    if wanted.get("source") == "git":
        sglang = f"git+{wanted.get('git_repo', '')}@{wanted.get('git_ref', '')}"
    else:
        sglang = f"sglang=={wanted.get('version', '')}"
    return {"sglang": sglang, "dependencies": wanted.get("dependencies"), "python": str(python_version)}


def release_key(wanted, python_version):
    """``<version or git-ref>-py<major.minor>-<sha256 of the identity, 12 hex>``: readable and exact."""
    identity = release_identity(wanted, python_version)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    label = (
        ("git-" + str(wanted.get("git_ref", ""))) if wanted.get("source") == "git" else str(wanted["version"])
    )
    label = _LABEL_BAD.sub("_", label).strip("._-")[:40] or "sglang"
    return f"{label}-py{python_version}-{digest[:12]}"


def read_marker(path):
    """(content, sha256) of a release marker; (None, None) when missing, unreadable or not a JSON object."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        content = json.loads(data)
    except (OSError, ValueError):
        return None, None
    if not isinstance(content, dict):
        return None, None
    return content, hashlib.sha256(data).hexdigest()


def is_complete(path, marker_name):
    """The release at ``path`` has its marker, naming its own key (= its directory name)."""
    content, _sha = read_marker(os.path.join(path, marker_name))
    return content is not None and content.get("release") == os.path.basename(path.rstrip("/"))


def inside(path, directory):
    """``path`` is ``directory`` or below it (both normalised, no symlink resolution)."""
    path, directory = os.path.normpath(path), os.path.normpath(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def prune_plan(releases_dir, keep, protect, marker_name, current=None):
    """(remove, kept): the entries of ``releases_dir`` to remove and to keep, as {name, path, reason}.

    Kept: the ``keep`` newest complete releases (by the mtime of their marker: when they were built), every
    release a path of ``protect`` lies in (the running one, the known-good one, the one this run deploys),
    whatever their age, and ``current`` (the release this run builds or runs, complete or not). Removed:
    the other complete releases, and directories without a valid marker (interrupted builds) that are not
    protected. Names starting with a dot (a removal in progress) are removed too."""
    try:
        names = sorted(os.listdir(releases_dir))
    except FileNotFoundError:
        return [], []
    complete, remove, kept = [], [], []
    for name in names:
        path = os.path.join(releases_dir, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        protected = [p for p in protect if p and inside(p, path)]
        if name == current or protected:
            why = "this run's release" if name == current else "holds " + ", ".join(protected)
            kept.append({"name": name, "path": path, "reason": why})
        elif name.startswith("."):
            remove.append({"name": name, "path": path, "reason": "an interrupted removal"})
        elif not is_complete(path, marker_name):
            remove.append({"name": name, "path": path, "reason": "no valid marker (an interrupted build)"})
        else:
            complete.append((os.stat(os.path.join(path, marker_name)).st_mtime, name, path))
    complete.sort(reverse=True)
    room = max(keep - len([k for k in kept if is_complete(k["path"], marker_name)]), 0)
    for index, (_mtime, name, path) in enumerate(complete):
        if index < room:
            kept.append({"name": name, "path": path, "reason": f"one of the {keep} newest"})
        else:
            remove.append({"name": name, "path": path, "reason": f"older than the {keep} newest"})
    return remove, kept
