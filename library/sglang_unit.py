#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_unit
short_description: Install the SGLang unit, environment and config file (validated, atomic) and load them
description:
  - One round trip for what a deploy does to the unit files, in this order, and only what is needed.
  - 1. Compares O(unit_content), O(env_content) and O(config_content) (and owner, group, mode) with the
    files on disk.
  - 2. A changed unit is written to a private temporary directory and checked with
    C(systemd-analyze verify) under the unit's own name BEFORE anything on the host changes (in check
    mode too); a unit systemd refuses fails the module and leaves both files as they were.
  - 3. Each changed file is replaced atomically (write, fsync, rename in its directory); the file it
    replaces is kept as C(<name>.previous) in O(previous_dir).
  - 4. C(systemctl daemon-reload) when the unit changed or systemd holds an older definition
    (C(NeedDaemonReload=yes)); C(systemctl enable) when the unit is not enabled.
  - Returns the unit's systemd state after all of it (C(systemctl show)).
  - The C(--config) YAML file (O(config_path)) holds the secrets SGLang must not get on its command line
    (the API key), mode C(0640), owner root, group O(config_group), so the service reads it and no other
    local user does.
    O(config_content) and O(env_content) are C(no_log) and never shown in a diff.
  - Check mode validates, reports what would change (with the unit diff) and changes nothing.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  name:
    description: Unit name, e.g. C(sglang.service).
    type: str
    required: true
  unit_path:
    description: Path of the unit file.
    type: path
    required: true
  unit_content:
    description: Rendered unit file.
    type: str
    required: true
  env_path:
    description: Path of the environment file (C(EnvironmentFile=) of the unit).
    type: path
    required: true
  env_content:
    description: Rendered environment file (may hold a secret; never logged or diffed).
    type: str
    required: true
  config_path:
    description: Path of the YAML file the unit passes to SGLang with C(--config).
    type: path
  config_content:
    description:
      - Rendered C(--config) file (holds secrets; never logged or diffed); required with O(config_path).
    type: str
  config_group:
    description:
      - Group of O(config_path), the service's group, which must read it; required with O(config_path).
    type: str
  previous_dir:
    description: Directory (created 0700 root) that keeps the version of each file this call replaced.
    type: path
    required: true
  pending_path:
    description:
      - The pending marker (JSON, C(0600) root), written with the one atomic writer BEFORE the first file
        is replaced, only when a file changes, naming the files this call writes (path, sha256 before and
        after), when, by whom (O(pending_by)) and the module's PID. C(sglang_history) removes it once the
        verified restart was recorded (or a rollback finished); a run that stops in between leaves it, and
        the next run (the C(pending) option of C(sglang_host_probe)) and the boot-time
        C(sglang-deploy-heal) unit find it.
    type: path
  pending_by:
    description: Who is deploying (controller, user, run), copied into the marker as C(by).
    type: dict
    default: {}
  expect_changed:
    description:
      - Which files the caller's decision expects to change (C(unit), C(env), C(config), each true or false;
        other keys are ignored), from what it read earlier in the run. A file that differs from its content
        here although the decision expected it unchanged was changed on disk since (by hand?), and the call
        fails naming it and writes nothing. The next run decides again from what is on disk.
      - Omitted, every file that differs is written.
    type: dict
  lock:
    description:
      - The deploy lock this run holds (C(sglang_lock)). Before the pending marker, the files, the
        daemon-reload or the enable, the lock must still be this run's. Its lease is extended to
        O(lock.lease) and it says O(lock.doing) (what comes next, the restart); the same as a C(sglang_lock)
        C(state=renewed) call, without its round trip. A lock that is not this run's any more fails the
        call, naming its holder, and nothing is written.
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
      lease:
        description: Seconds of the new lease.
        type: int
        required: true
      doing:
        description: What the run does next.
        type: str
        required: true
attributes:
  check_mode:
    support: full
  diff_mode:
    support: partial
    details: The unit file only; the environment and config files are never diffed.
"""

EXAMPLES = r"""
- name: Install the unit and the environment file
  sglang_unit:
    name: sglang.service
    unit_path: /etc/systemd/system/sglang.service
    unit_content: "{{ lookup('ansible.builtin.template', 'etc/systemd/system/sglang.service.j2') }}"
    env_path: /etc/sglang/sglang.env
    env_content: "{{ lookup('ansible.builtin.template', 'etc/sglang/sglang.env.j2') }}"
    previous_dir: /var/lib/sglang-deploy/previous
  register: __sglang_write
"""

RETURN = r"""
unit_changed:
  description: The unit file was (or in check mode would be) replaced.
  type: bool
  returned: always
env_changed:
  description: The environment file was (or would be) replaced.
  type: bool
  returned: always
config_changed:
  description: The C(--config) file was (or would be) replaced (false without O(config_path)).
  type: bool
  returned: always
daemon_reloaded:
  description: C(systemctl daemon-reload) ran (or would run).
  type: bool
  returned: always
enabled_now:
  description: C(systemctl enable) ran (or would run).
  type: bool
  returned: always
status:
  description: C(systemctl show) properties of the unit after the call (before it, in check mode).
  type: dict
  returned: always
lock_renewed:
  description: The deploy lock was renewed (O(lock) given, not check mode).
  type: bool
  returned: always
pending_marker:
  description: What was written to O(pending_path) (null when no file changed, in check mode or without it).
  type: dict
  returned: always
"""

import datetime
import grp
import hashlib
import json
import os
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_files import replace_file
from ansible.module_utils.sglang_lock import LockError, hold
from ansible.module_utils.sglang_systemd import SystemctlError, analyze_verify, daemon_reload
from ansible.module_utils.sglang_systemd import show as systemctl_show

STATUS_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NeedDaemonReload",
    "InvocationID",
    "MainPID",
    "FragmentPath",
    "DropInPaths",
    "Result",
)
C_ENV = {"LANG": "C", "LC_ALL": "C"}


def read_current(path, mode, gid=0):
    """(content bytes or None, True when owner root, group ``gid`` and ``mode`` already)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, False
    if not stat.S_ISREG(st.st_mode):
        return None, False
    with open(path, "rb") as handle:
        content = handle.read()
    return content, st.st_uid == 0 and st.st_gid == gid and stat.S_IMODE(st.st_mode) == mode


def keep_previous(previous_dir, path, content):
    os.makedirs(previous_dir, mode=0o700, exist_ok=True)
    replace_file(os.path.join(previous_dir, os.path.basename(path) + ".previous"), content, 0o600)


def pending_marker(name, files, current, changed_files, by):
    """The marker of an unverified write: what is replaced by what (sha256 before and after)."""
    return {
        "unit": name,
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "pid": os.getpid(),
        "by": by,
        "files": {
            key: {
                "path": files[key][0],
                "sha256": hashlib.sha256(files[key][1]).hexdigest(),
                "sha256_before": None
                if current[key][0] is None
                else hashlib.sha256(current[key][0]).hexdigest(),
            }
            for key in changed_files
        },
    }


def write_pending(path, marker):
    os.makedirs(os.path.dirname(path) or ".", mode=0o750, exist_ok=True)
    replace_file(path, (json.dumps(marker, indent=2, sort_keys=True) + "\n").encode("utf-8"), 0o600)


def systemctl(module, *args):
    return module.run_command([module.get_bin_path("systemctl", required=True), *args], environ_update=C_ENV)


def show(module, name):
    try:
        return systemctl_show(module, name, STATUS_PROPERTIES)
    except SystemctlError as exc:
        module.fail_json(msg=str(exc))


def validate_unit(module, name, unit_path, content):
    """Fail (host untouched) when systemd-analyze refuses the new unit (checked in a private tmp dir)."""
    rc, text = analyze_verify(module, name, unit_path, content)
    if rc != 0:
        module.fail_json(
            msg=f"systemd-analyze verify refused the new {name} (nothing was changed on the host): {text}",
            unit_changed=False,
            env_changed=False,
            config_changed=False,
            rc=rc,
        )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            unit_path=dict(type="path", required=True),
            unit_content=dict(type="str", required=True),
            env_path=dict(type="path", required=True),
            env_content=dict(type="str", required=True, no_log=True),
            config_path=dict(type="path"),
            config_content=dict(type="str", no_log=True),
            config_group=dict(type="str"),
            previous_dir=dict(type="path", required=True),
            pending_path=dict(type="path"),
            pending_by=dict(type="dict", default={}),
            expect_changed=dict(type="dict"),
            lock=dict(
                type="dict",
                options=dict(
                    dir=dict(type="path", required=True),
                    name=dict(type="str", required=True),
                    token=dict(type="str", required=True, no_log=False),
                    lease=dict(type="int", required=True),
                    doing=dict(type="str", required=True),
                ),
            ),
        ),
        required_by={"config_path": ("config_content", "config_group")},
        supports_check_mode=True,
    )
    p = module.params
    name = p["name"]
    files = {
        "unit": (p["unit_path"], p["unit_content"].encode("utf-8"), 0o644, 0),
        "env": (p["env_path"], p["env_content"].encode("utf-8"), 0o600, 0),
    }
    if p["config_path"]:
        try:
            gid = grp.getgrnam(p["config_group"]).gr_gid
        except KeyError:
            module.fail_json(
                msg=f"config_group: no group {p['config_group']!r} on the host (nothing was changed)",
                unit_changed=False,
                env_changed=False,
                config_changed=False,
            )
        files["config"] = (p["config_path"], p["config_content"].encode("utf-8"), 0o640, gid)
    current = {key: read_current(path, mode, gid) for key, (path, _, mode, gid) in files.items()}
    changed_files = [
        key
        for key, (path, content, mode, gid) in files.items()
        if current[key][0] != content or not current[key][1]
    ]
    before = show(module, name)
    need_reload = "unit" in changed_files or before.get("NeedDaemonReload") == "yes"
    need_enable = before.get("UnitFileState") != "enabled"

    result = dict(
        changed=bool(changed_files or need_reload or need_enable),
        unit_changed="unit" in changed_files,
        env_changed="env" in changed_files,
        config_changed="config" in changed_files,
        daemon_reloaded=need_reload,
        enabled_now=need_enable,
        lock_renewed=False,
    )
    if module._diff and "unit" in changed_files:
        old = current["unit"][0]
        result["diff"] = dict(
            before_header=p["unit_path"],
            after_header=p["unit_path"],
            before="" if old is None else old.decode("utf-8", "replace"),
            after=p["unit_content"],
        )
    unit_path, unit_content, _, _ = files["unit"]
    if "unit" in changed_files:
        validate_unit(module, name, unit_path, unit_content)
    result["pending_marker"] = None
    if module.check_mode:
        module.exit_json(status=before, **result)

    # A file the decision saw current but that differs now was changed after the run read it: nothing
    # is written on a view that is out of date.
    expected = p["expect_changed"]
    unexpected = [key for key in changed_files if expected is not None and not expected.get(key)]
    if unexpected:
        module.fail_json(
            msg=f"{', '.join(files[key][0] for key in unexpected)} of {name} changed on disk after this run "
            "read it (by hand?); nothing was written. The next run decides again from what is on disk.",
            unit_changed=False,
            env_changed=False,
            config_changed=False,
            lock_renewed=False,
        )

    # A run whose lock was taken over writes nothing: checked (and renewed for the restart) first.
    if p["lock"]:
        lock = p["lock"]
        try:
            hold(lock, doing=lock["doing"], lease=lock["lease"])
        except (LockError, OSError) as exc:
            module.fail_json(
                msg=f"{exc} (nothing was changed)",
                unit_changed=False,
                env_changed=False,
                config_changed=False,
                lock_renewed=False,
            )
        result["lock_renewed"] = True

    # Before the first byte changes: a run that stops between here and the verified restart leaves it.
    if changed_files and p["pending_path"]:
        marker = pending_marker(name, files, current, changed_files, p["pending_by"])
        try:
            write_pending(p["pending_path"], marker)
        except OSError as exc:
            module.fail_json(
                msg=f"cannot write the pending marker {p['pending_path']} (nothing was changed): "
                f"{exc.strerror or exc}",
                **result,
            )
        result["pending_marker"] = marker

    # The environment and the config file first: a unit that names a new variable or the config
    # file never starts without it.
    for key in ("env", "config", "unit"):
        if key not in changed_files:
            continue
        path, content, mode, gid = files[key]
        if current[key][0] is not None:
            keep_previous(p["previous_dir"], path, current[key][0])
        replace_file(path, content, mode, gid)
    if need_reload:
        failure = daemon_reload(module)
        if failure:
            module.fail_json(msg=failure, **result)
    if need_enable:
        rc, out, err = systemctl(module, "enable", "--", name)
        if rc != 0:
            module.fail_json(
                msg=f"systemctl enable {name} failed (rc={rc}): {(err or out).strip()}", **result
            )
    module.exit_json(status=show(module, name) if result["changed"] else before, **result)


if __name__ == "__main__":
    main()
