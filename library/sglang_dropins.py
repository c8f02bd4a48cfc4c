#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_dropins
short_description: Move drop-ins the sglang role did not render out of the unit's drop-in directories
description:
  - Moves each drop-in of O(paths) (a C(*.conf) file in a C(<unit>.d) directory of O(unit), as the host probe
    reports them) into a new directory C(<removed_dir>/<UTC timestamp>/) under its full original path, with a
    C(MANIFEST.json) (origin, sha256, mode of each), so nothing is lost; then C(systemctl daemon-reload).
  - Refuses (changing nothing) a path that is not a C(*.conf) in O(unit)'s own drop-in directory - a type-wide
    C(service.d) or prefix drop-in applies to other units too and is never removed here.
  - A path that is gone already is skipped; nothing to move means no daemon-reload and C(changed=false).
  - Does not restart the unit; the role restarts it with verification (restart reason
    C(foreign drop-in removed)).
  - Check mode reports what would be moved and changes nothing.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  unit:
    description: The unit, e.g. C(sglang.service).
    type: str
    required: true
  paths:
    description: The drop-ins to move (absolute paths).
    type: list
    elements: path
    required: true
  removed_dir:
    description: Directory (created 0700 root) under which each call makes its own timestamped directory.
    type: path
    required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Move the foreign drop-ins away and reload systemd
  sglang_dropins:
    unit: sglang.service
    paths: [/etc/systemd/system/sglang.service.d/override.conf]
    removed_dir: /var/lib/sglang-deploy/removed-dropins
"""

RETURN = r"""
removed:
  description: Each drop-in moved (or, in check mode, that would be moved) - C(from), C(to), C(sha256).
  returned: always
  type: list
  elements: dict
  sample: [{"from": "/etc/systemd/system/sglang.service.d/override.conf",
            "to": "/var/lib/sglang-deploy/removed-dropins/20261205T101010Z/etc/systemd/system/...",
            "sha256": "5d1c..."}]
dir:
  description: The timestamped directory that holds them (null when nothing was moved).
  returned: always
  type: str
daemon_reloaded:
  description: C(systemctl daemon-reload) ran (or would run).
  returned: always
  type: bool
"""

import contextlib
import datetime
import hashlib
import json
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_files import replace_file
from ansible.module_utils.sglang_systemd import daemon_reload


def own_dropin(unit, path):
    """``path`` is a *.conf directly in a ``<unit>.d`` directory (not a shared type or prefix drop-in)."""
    return (
        os.path.isabs(path)
        and path.endswith(".conf")
        and os.path.basename(os.path.dirname(path)) == unit + ".d"
    )


def new_dir(base):
    os.makedirs(base, mode=0o700, exist_ok=True)
    os.chmod(base, 0o700)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for n in range(100):
        path = os.path.join(base, stamp if n == 0 else f"{stamp}.{n}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise OSError(f"cannot make a new directory under {base}")


def move(src, dest_root):
    """Copy ``src`` (a symlink as a symlink) under ``dest_root`` + its full path, fsync, then unlink it."""
    dest = os.path.join(dest_root, src.lstrip("/"))
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    st = os.lstat(src)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(src)
        os.symlink(target, dest)
        digest = hashlib.sha256(target.encode()).hexdigest()
    else:
        with open(src, "rb") as handle:
            data = handle.read()
        replace_file(dest, data, 0o600)
        digest = hashlib.sha256(data).hexdigest()
    os.unlink(src)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(src))
    return {"from": src, "to": dest, "sha256": digest, "mode": f"{stat.S_IMODE(st.st_mode):04o}"}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", required=True),
            paths=dict(type="list", elements="path", required=True),
            removed_dir=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    refused = [path for path in p["paths"] if not own_dropin(p["unit"], path)]
    if refused:
        module.fail_json(
            msg=f"not a drop-in of {p['unit']} alone (a *.conf in a {p['unit']}.d directory): "
            f"{', '.join(refused)}; type-wide and prefix drop-ins apply to other units too and are never "
            "removed by the role (nothing was changed)",
            removed=[],
            dir=None,
            daemon_reloaded=False,
        )
    present = sorted({path for path in p["paths"] if os.path.lexists(path)})
    result = dict(changed=bool(present), removed=[], dir=None, daemon_reloaded=bool(present))
    if not present:
        module.exit_json(**result)
    if module.check_mode:
        result["removed"] = [{"from": path, "to": None, "sha256": None} for path in present]
        module.exit_json(**result)
    target = new_dir(p["removed_dir"])
    result["dir"] = target
    for path in present:
        result["removed"].append(move(path, target))
        # After each move: an interruption leaves a manifest of what is already away.
        manifest = {"unit": p["unit"], "removed": result["removed"]}
        replace_file(
            os.path.join(target, "MANIFEST.json"),
            (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(),
            0o600,
        )
    failure = daemon_reload(module)
    if failure:
        module.fail_json(msg=f"{failure}; the drop-ins are already in {target}", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
