#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_release_marker
short_description: Mark an SGLang release complete (its install marker, written last) and return its sha256
description:
  - Writes the install marker C(<path>/<name>) of the release directory O(path) (C(0644) root, replaced
    atomically), the last step of a build. A release is complete when its marker names its key, its directory
    name (C(module_utils/sglang_release.py)); nothing installs into it afterwards.
  - Returns RV(sha256), the sha256 of the marker as it is on disk after the write. The known-good record keeps
    it, so that a rollback to this release finds the marker it recorded.
  - Refuses, writing nothing, a marker that would not make the release complete (not a JSON object, or naming
    another release than O(path)'s directory) and a O(path) that is not a directory (a symlink is not
    followed).
  - With O(lock), the deploy lock must still be this run's before anything is written (its lease is renewed).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  path:
    description: The release directory, C(<sglang_releases_dir>/<key>).
    type: path
    required: true
  name:
    description: The marker's file name in it.
    type: str
    required: true
  content:
    description: The marker's text, written as given (a JSON object whose C(release) is the directory name).
    type: str
    required: true
  lock:
    description: The deploy lock this run holds (C(sglang_lock)'s C(dir), C(name) and C(token)).
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
attributes:
  check_mode:
    support: full
    details: Writes nothing; RV(sha256) is that of the marker it would write.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Mark the release complete
  sglang_release_marker:
    path: /opt/sglang/releases/0.5.23-py3.11-0123456789ab
    name: sglang-deploy-install.json
    content: "{{ marker_text }}\n"
    lock: {dir: /run/sglang-deploy, name: sglang, token: "{{ lock_token }}"}
  register: release_marker
"""

RETURN = r"""
marker:
  description: The marker file.
  returned: always
  type: str
  sample: /opt/sglang/releases/0.5.23-py3.11-0123456789ab/sglang-deploy-install.json
sha256:
  description: The sha256 of the marker as the file on disk hashes after the write (in check mode, of what it
    would write).
  returned: success
  type: str
  sample: 4993690e2d8c0c6e0f4b9a7d2e61f6b5a1a1f0d3c9b8e7a6d5c4b3a29180f7e6
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_files import replace_file  # noqa: E402
from ansible.module_utils.sglang_lock import LOCK_OPTION, LockError, hold  # noqa: E402


def problem(path, content):
    """Why ``content`` written into ``path`` would not make that release complete, or None."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory (a symlink is never followed)"
    try:
        marker = json.loads(content)
    except ValueError:
        marker = None
    if not isinstance(marker, dict):
        return "the marker is not a JSON object"
    key = os.path.basename(os.path.normpath(path))
    if marker.get("release") != key:
        return f"the marker names the release {marker.get('release')!r}, not {key!r} (its directory)"
    return None


def sha256_of(path):
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            name=dict(type="str", required=True),
            content=dict(type="str", required=True),
            lock=LOCK_OPTION,
        ),
        supports_check_mode=True,
    )
    p = module.params
    marker = os.path.join(p["path"], p["name"])
    result = dict(changed=False, marker=marker)
    if "/" in p["name"] or p["name"] in ("", ".", ".."):
        module.fail_json(msg=f"name {p['name']!r} must be a file name (nothing was written)", **result)
    why = problem(p["path"], p["content"])
    if why:
        module.fail_json(msg=f"refusing to mark {p['path']} complete: {why} (nothing was written)", **result)
    data = p["content"].encode("utf-8")
    try:
        with open(marker, "rb") as handle:
            current = handle.read()
        st = os.lstat(marker)
        current_ok = (
            stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o644
        )
    except OSError:
        current, current_ok = None, False
    result["changed"] = current != data or not current_ok
    if module.check_mode:
        module.exit_json(sha256=hashlib.sha256(data).hexdigest(), **result)
    if p["lock"]:
        try:
            hold(
                p["lock"],
                doing=f"marking the release {os.path.basename(os.path.normpath(p['path']))} complete",
            )
        except (LockError, OSError) as exc:
            module.fail_json(msg=f"{exc} (nothing was written)", **dict(result, changed=False))
    try:
        if result["changed"]:
            replace_file(marker, data, 0o644)
        # What the known-good record keeps: the file as it is now, not the text that was meant.
        result["sha256"] = sha256_of(marker)
    except OSError as exc:
        module.fail_json(msg=f"cannot write the release marker {marker}: {exc.strerror or exc}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
