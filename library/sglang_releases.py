#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_releases
short_description: Keep the last N SGLang releases; never the running one or the known-good one
description:
  - SGLang releases are immutable virtualenvs C(<dir>/<key>/) (module_utils/sglang_release.py). This module
    removes the old ones, keeping the O(keep) newest complete releases (by when their marker was written) and,
    whatever their age, every release that one of these lies in - the release this run deploys (O(current)),
    the known-good one (C(release.path) of the known-good metadata O(known_good_meta)), the one the running
    process of O(unit) was started from (C(/proc/<MainPID>/cmdline)) and any path of O(protect).
  - A directory without a valid marker (an interrupted build) that nothing protects is removed too.
  - Each removal renames the directory to C(.removing-<name>) first (one rename, so it stops being a release
    at once), then deletes it.
  - With O(link), that path becomes a symlink to the release O(current) (a new symlink renamed over the old
    one). It is for tools that want "the installed SGLang" (the weights fetch, a benchmark); the unit never
    uses it. A real directory or file at O(link) (a virtualenv of an older role) is left as it is, and
    reported.
  - Check mode reports what would be removed.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  dir:
    description: The releases directory.
    type: path
    required: true
  keep:
    description: How many complete releases to keep (protected ones count among them).
    type: int
    default: 3
  marker_name:
    description: File name of the release marker inside each release.
    type: str
    required: true
  current:
    description: Name (key) of the release this run deploys; kept even while incomplete.
    type: str
  unit:
    description: The SGLang unit; the release its MainPID runs from is kept.
    type: str
  known_good_meta:
    description: Known-good metadata (JSON); the release its C(release.path) names is kept.
    type: path
  protect:
    description: More paths whose release is kept.
    type: list
    elements: path
    default: []
  link:
    description: A path to make a symlink to the release O(current) (requires O(current)).
    type: path
  lock:
    description:
      - The deploy lock this run holds (C(sglang_lock)'s C(dir), C(name) and C(token)). Outside check mode
        it must still be this run's before anything is removed or linked (its lease is renewed). The release
        another run builds has no marker yet and would be removed as an interrupted build.
    type: dict
    suboptions:
      dir:
        description: The lock directory.
        type: path
        required: true
      name:
        description: The service the lock is for.
        type: str
        required: true
      token:
        description: The token C(sglang_lock) returned.
        type: str
        required: true
"""

EXAMPLES = r"""
- name: Keep the last three releases
  sglang_releases:
    dir: /opt/sglang/releases
    keep: 3
    marker_name: sglang-deploy-install.json
    current: 0.5.23-py3.11-0123456789ab
    unit: sglang.service
    known_good_meta: /var/lib/sglang-deploy/known-good/sglang.json
"""

RETURN = r"""
removed:
  description: Each release removed (or, in check mode, that would be), with why.
  type: list
  elements: dict
  returned: always
kept:
  description: Each release kept, with why.
  type: list
  elements: dict
  returned: always
protected:
  description: The paths that protected a release (running process, known-good, O(protect)).
  type: list
  elements: str
  returned: always
link:
  description: What O(link) is now (C(symlink to ...)), or why it was left as it is.
  type: str
  returned: with O(link)
"""

import json
import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_lock import LOCK_OPTION, LockError, hold
from ansible.module_utils.sglang_release import prune_plan


def running_argv0(unit):
    """argv[0] of the unit's MainPID (the release's python or script), or None when it is not running."""
    try:
        out = subprocess.run(
            ["systemctl", "show", "-p", "MainPID", "--value", unit],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
        pid = int(out or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            first = handle.read().split(b"\0", 1)[0]
    except OSError:
        return None
    return first.decode("utf-8", "replace") or None


def known_good_release(meta_path):
    try:
        with open(meta_path, encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError):
        return None
    release = meta.get("release") if isinstance(meta, dict) else None
    return release.get("path") if isinstance(release, dict) else None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", required=True),
            keep=dict(type="int", default=3),
            marker_name=dict(type="str", required=True),
            current=dict(type="str"),
            unit=dict(type="str"),
            known_good_meta=dict(type="path"),
            protect=dict(type="list", elements="path", default=[]),
            link=dict(type="path"),
            lock=LOCK_OPTION,
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["keep"] < 1:
        module.fail_json(msg=f"keep must be at least 1, got {p['keep']}")
    protect = list(p["protect"])
    if p["unit"]:
        protect.append(running_argv0(p["unit"]))
    if p["known_good_meta"]:
        protect.append(known_good_release(p["known_good_meta"]))
    protect = [path for path in protect if path]
    remove, kept = prune_plan(p["dir"], p["keep"], protect, p["marker_name"], p["current"])
    if p["lock"] and not module.check_mode:
        try:
            hold(p["lock"], doing=f"tidying the releases in {p['dir']}")
        except (LockError, OSError) as exc:
            module.fail_json(msg=f"{exc} (nothing was removed)", removed=[])
    if not module.check_mode:
        for item in remove:
            doomed = item["path"]
            if not item["name"].startswith("."):
                doomed = os.path.join(p["dir"], ".removing-" + item["name"])
                try:
                    os.rename(item["path"], doomed)
                except OSError as exc:
                    module.fail_json(msg=f"cannot remove the release {item['path']}: {exc}", removed=[])
            shutil.rmtree(doomed, ignore_errors=True)
    changed = bool(remove)
    result = {}
    if p["link"]:
        if not p["current"]:
            module.fail_json(msg="link requires current (the release it points at)")
        target = os.path.join(p["dir"], p["current"])
        link = p["link"].rstrip("/")
        if os.path.islink(link) and os.readlink(link) == target:
            result["link"] = f"symlink to {target}"
        elif os.path.lexists(link) and not os.path.islink(link):
            result["link"] = (
                f"{link} is not a symlink (a virtualenv an older version of the role installed into?): left "
                "as it is; remove it once no tool uses it, the role then links it to the running release"
            )
        else:
            changed = True
            result["link"] = f"symlink to {target}"
            if not module.check_mode:
                tmp = f"{link}.sglang-deploy-{os.getpid()}"
                os.makedirs(os.path.dirname(link) or "/", exist_ok=True)
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(target, tmp)
                os.rename(tmp, link)
    module.exit_json(changed=changed, removed=remove, kept=kept, protected=protect, **result)


if __name__ == "__main__":
    main()
