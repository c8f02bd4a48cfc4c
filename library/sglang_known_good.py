#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_known_good
short_description: Restore the known-good SGLang unit, environment and config file (checked, validated)
description:
  - What a rollback writes, in one round trip, and only after every check passed.
  - 1. Reads the known-good metadata (O(dir)/O(meta_name), written by M(sglang_history) when it recorded a
    verified deploy) and hashes each known-good copy in O(dir) (named like the file it restores). A copy
    whose sha256 is not the recorded C(<name>_sha256) (tampered, or a set left half-written) is refused,
    naming it, and NOTHING is written.
  - 2. Checks the known-good unit with C(systemd-analyze verify) under the unit's own name, in a private
    temporary directory; a unit systemd refuses is refused and nothing is written.
  - 3. Writes each file that differs to a fsynced temporary file beside its target (owner, group and mode
    set before the content), keeps the file it replaces as C(<name>.previous) in O(previous_dir), then
    renames them over the targets one after the other (environment file, config file, unit last), fsyncs
    the directories and runs C(systemctl daemon-reload) once.
  - Each file is replaced atomically. The SET is not, since the three renames are separate system calls in two
    directories, so a crash between two of them (not while any content is being written, all of it is on
    disk before the first rename) leaves some files restored and some not. The next run sees that (the
    files on disk differ from the known-good ones) and restarts with proof.
  - A known-good set kept before the role had a C(--config) file has no config copy and no
    C(config_sha256), and the config file is then left as it is.
  - Check mode runs the checks and reports what would be restored; it writes nothing.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  name:
    description: Unit name, e.g. C(sglang.service).
    type: str
    required: true
  dir:
    description: Known-good directory (the copies and the metadata).
    type: path
    required: true
  meta_name:
    description: File name of the known-good metadata (JSON) in O(dir).
    type: str
    required: true
  unit_path:
    description: Path of the unit file to restore (C(0644) root:root).
    type: path
    required: true
  env_path:
    description: Path of the environment file to restore (C(0600) root:root).
    type: path
    required: true
  config_path:
    description: Path of the C(--config) file to restore (C(0640) root:O(config_group)).
    type: path
  config_group:
    description: Group of O(config_path); required with O(config_path).
    type: str
  previous_dir:
    description: Directory (created 0700 root) that keeps the version of each file this call replaced.
    type: path
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Restore the known-good configuration (checked and validated first)
  sglang_known_good:
    name: sglang.service
    dir: /var/lib/sglang-deploy/known-good
    meta_name: sglang.json
    unit_path: /etc/systemd/system/sglang.service
    env_path: /etc/sglang/sglang.env
    config_path: /etc/sglang/sglang.yaml
    config_group: sglang
    previous_dir: /var/lib/sglang-deploy/previous
"""

RETURN = r"""
restored:
  description: Names (C(unit), C(env), C(config)) of the files that were (or would be) replaced.
  type: list
  elements: str
  returned: success
sha256:
  description: Name -> sha256 of the restored set (the recorded known-good hashes, checked).
  type: dict
  returned: success
daemon_reloaded:
  description: C(systemctl daemon-reload) ran.
  type: bool
  returned: success
"""

import grp  # noqa: E402
import hashlib  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_files import discard_staged, fsync_dir, replace_file, stage_file
from ansible.module_utils.sglang_known_good import Refused, read_known_good
from ansible.module_utils.sglang_systemd import analyze_verify, daemon_reload

# The order the files are switched in: a unit that names a variable or the config file never starts
# without it (as sglang_unit writes them).
ORDER = ("env", "config", "unit")


def up_to_date(path, content, mode, gid):
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return False, None
        with open(path, "rb") as handle:
            current = handle.read()
    except FileNotFoundError:
        return False, None
    ok = current == content and st.st_uid == 0 and st.st_gid == gid and stat.S_IMODE(st.st_mode) == mode
    return ok, current


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            dir=dict(type="path", required=True),
            meta_name=dict(type="str", required=True),
            unit_path=dict(type="path", required=True),
            env_path=dict(type="path", required=True),
            config_path=dict(type="path"),
            config_group=dict(type="str"),
            previous_dir=dict(type="path", required=True),
        ),
        required_by={"config_path": ("config_group",)},
        supports_check_mode=True,
    )
    p = module.params
    targets = {"unit": (p["unit_path"], 0o644, 0), "env": (p["env_path"], 0o600, 0)}
    if p["config_path"]:
        try:
            gid = grp.getgrnam(p["config_group"]).gr_gid
        except KeyError:
            module.fail_json(
                msg=f"config_group: no group {p['config_group']!r} on the host (nothing written)"
            )
        targets["config"] = (p["config_path"], 0o640, gid)
    try:
        contents = read_known_good(p["dir"], p["meta_name"], targets)
    except Refused as exc:
        module.fail_json(msg=f"rollback of {p['name']} refused: {exc}", restored=[])
    rc, text = analyze_verify(module, p["name"], p["unit_path"], contents["unit"])
    if rc != 0:
        module.fail_json(
            msg=f"rollback of {p['name']} refused: systemd-analyze verify refused the known-good unit "
            f"{os.path.join(p['dir'], os.path.basename(p['unit_path']))} (nothing was written): {text}",
            restored=[],
            rc=rc,
        )
    sha = {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    todo, previous = [], {}
    for name in ORDER:
        if name not in contents:
            continue
        path, mode, gid = targets[name]
        ok, previous[name] = up_to_date(path, contents[name], mode, gid)
        if not ok:
            todo.append(name)
    if module.check_mode:
        module.exit_json(changed=bool(todo), restored=todo, sha256=sha, daemon_reloaded=False)

    staged, done = {}, []
    try:
        # Everything is written and fsynced before the first rename.
        for name in todo:
            path, mode, gid = targets[name]
            if previous[name] is not None:
                os.makedirs(p["previous_dir"], mode=0o700, exist_ok=True)
                keep = os.path.join(p["previous_dir"], os.path.basename(path) + ".previous")
                replace_file(keep, previous[name], 0o600)
            staged[name] = stage_file(path, contents[name], mode, gid)
        for name in todo:
            os.replace(staged.pop(name), targets[name][0])
            done.append(name)
        for directory in sorted({os.path.dirname(targets[name][0]) or "." for name in done}):
            fsync_dir(directory)
    except OSError as exc:
        discard_staged(staged.values())
        module.fail_json(
            msg=f"restoring the known-good {p['name']} failed after replacing {done or 'nothing'}: "
            f"{exc.strerror or exc} ({exc.filename})",
            restored=done,
        )
    failure = daemon_reload(module)
    if failure:
        module.fail_json(msg=failure, restored=done)
    module.exit_json(changed=bool(done), restored=done, sha256=sha, daemon_reloaded=True)


if __name__ == "__main__":
    main()
