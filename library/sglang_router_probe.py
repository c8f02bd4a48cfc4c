#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_router_probe
short_description: Whether the SGLang router (smg) host is already as the sglang_router role would leave it
description:
  - Reads, in one call and changing nothing, everything the sglang_router role would install, write, restart
    and verify on the router host - the packages, the account, the virtualenv and its smg version, each
    file's sha256, owner, group and mode, the files that must be gone, the unit's systemd state - and, when
    all of it is as wanted, proves the running router as the role's own checks do (C(GET /readiness) 200,
    every socket on O(port) held by the unit's cgroup, every URL of O(workers) listed C(ready) by C(GET
    /workers)).
  - C(converged) is true only when nothing differs and the proof holds; otherwise C(reasons) names each
    difference, and the role runs its install, configure and service steps (which change only what
    differs and wait for what is not ready yet).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  service:
    description: The router's systemd unit, e.g. C(sglang-router.service).
    type: str
    required: true
  packages:
    description: Debian packages that must be installed.
    type: list
    elements: str
    default: []
  user:
    description: The account the router runs as (a system account with this O(home) and O(shell)).
    type: str
    required: true
  group:
    description: The account's primary group.
    type: str
    required: true
  home:
    description: The account's home directory (it must exist).
    type: path
    required: true
  shell:
    description: The account's shell.
    type: str
    default: /usr/sbin/nologin
  venv:
    description: The router's virtualenv.
    type: path
    required: true
  version:
    description: The smg version that must be installed in O(venv).
    type: str
    required: true
  files:
    description:
      - What must exist, each a dict with C(path), C(owner), C(group), C(mode) (octal string) and, for a
        file, C(sha256) of its content (without C(sha256), a directory).
    type: list
    elements: dict
    default: []
  absent:
    description: Paths that must not exist.
    type: list
    elements: path
    default: []
  url:
    description: The router's base URL from the router host, e.g. C(http://127.0.0.1:30000).
    type: str
    required: true
  host:
    description: The address the router listens on (C(0.0.0.0) or C(::) for every address).
    type: str
    default: 0.0.0.0
  port:
    description: The router's port; every socket listening there must belong to the unit's cgroup.
    type: int
    required: true
  admin_key:
    description: The router's control-plane admin key, for C(GET /workers).
    type: str
    required: true
  workers:
    description: The worker URLs the router must list C(ready).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each HTTP request may take.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Read the router host in one call
  sglang_router_probe:
    service: sglang-router.service
    packages: [python3-venv, iproute2]
    user: sglang-router
    group: sglang-router
    home: /var/lib/sglang-router
    venv: /opt/sglang-router/venv
    version: "1.13.0"
    files:
      - {path: /etc/sglang-router, owner: root, group: root, mode: "0700"}
      - {path: /etc/sglang-router/admin_key, owner: root, group: root, mode: "0600", sha256: "..."}
    url: http://127.0.0.1:30000
    port: 30000
    admin_key: "{{ sglang_router_admin_key }}"
    workers: [http://10.0.0.1:30000]
  register: router
"""

RETURN = r"""
converged:
  description: Nothing to install, write or restart, and the running router proved.
  returned: always
  type: bool
reasons:
  description: Why not, each difference named (empty when converged).
  returned: always
  type: list
  elements: str
systemd:
  description: The unit's LoadState, ActiveState, SubState, InvocationID, UnitFileState, NeedDaemonReload.
  returned: always
  type: dict
workers_ready:
  description: The URLs of O(workers) the router lists ready (read only when nothing else differs).
  returned: always
  type: list
  elements: str
"""

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_files import sha256_of
from ansible.module_utils.sglang_http import HttpError, get_json, status
from ansible.module_utils.sglang_proc import port_listeners
from ansible.module_utils.sglang_systemd import SystemctlError, is_loaded, needs_daemon_reload, show

SHOW = (
    "LoadState",
    "ActiveState",
    "SubState",
    "InvocationID",
    "UnitFileState",
    "NeedDaemonReload",
    "ControlGroup",
)
VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('smg'))"


def file_differences(want, found):
    """What differs between a wanted path (``files`` item) and ``found`` (its lstat as a dict, with the
    content's sha256 for a file; None: missing)."""
    path = want["path"]
    if found is None:
        return [f"{path} is missing"]
    out = []
    directory = "sha256" not in want
    if found["is_dir"] != directory:
        out.append(f"{path} is not a {'directory' if directory else 'regular file'}")
        return out
    for key in ("owner", "group"):
        if found[key] != want[key]:
            out.append(f"{path}: {key} {found[key]}, not {want[key]}")
    if found["mode"] != int(str(want["mode"]), 8):
        out.append(f"{path}: mode {found['mode']:04o}, not {want['mode']}")
    if not directory and found.get("sha256") != want["sha256"]:
        out.append(f"{path}: content differs")
    return out


def service_differences(props, service):
    """What keeps ``service`` (its ``systemctl show`` properties) from running as the role leaves it."""
    out = []
    if not is_loaded(props):
        out.append(f"{service} is not installed (LoadState={props.get('LoadState', '')})")
        return out
    if needs_daemon_reload(props):
        out.append(f"{service}: systemd has not read its unit file since it changed")
    if props.get("UnitFileState") != "enabled":
        out.append(f"{service} is not enabled (UnitFileState={props.get('UnitFileState', '')})")
    if props.get("ActiveState") != "active":
        out.append(f"{service} is not active (ActiveState={props.get('ActiveState', '')})")
    return out


def workers_differences(answer, workers):
    """(the URLs of ``workers`` listed ready, what is missing) from ``GET /workers`` (status, body)."""
    code, body = answer
    if code != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return [], [f"GET /workers answered {code}, not the worker list"]
    ready = {w.get("url") for w in body["workers"] if isinstance(w, dict) and w.get("status") == "ready"}
    listed = [url for url in workers if url in ready]
    missing = [url for url in workers if url not in ready]
    return listed, ([f"the router does not list {', '.join(missing)} ready"] if missing else [])


def listener_differences(found, port, control_group):
    """Every socket on ``port`` is held by the unit's cgroup (``port_listeners``' rows)."""
    if not found:
        return [f"nothing listens on port {port}"]
    foreign = [pid for row in found if not row["in_cgroup"] for pid in row["pids"] or ["?"]]
    if foreign:
        return [f"port {port} is held outside {control_group} (pid {', '.join(map(str, foreign))})"]
    return []


def path_state(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    found = {
        "is_dir": stat.S_ISDIR(st.st_mode),
        "mode": stat.S_IMODE(st.st_mode),
        "owner": name_of(pwd.getpwuid, st.st_uid),
        "group": name_of(grp.getgrgid, st.st_gid),
    }
    if stat.S_ISREG(st.st_mode):
        found["sha256"] = sha256_of(path)
    elif not found["is_dir"]:
        found["is_dir"] = None  # a link or a special file: neither
    return found


def name_of(lookup, number):
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def install_differences(module, p):
    out = []
    if p["packages"]:
        rc, text, _err = module.run_command(
            ["dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", *p["packages"]],
            environ_update={"LANG": "C", "LC_ALL": "C"},
        )
        installed = {line.split()[0] for line in text.splitlines() if line.split()[1:2] == ["ii"]}
        missing = [name for name in p["packages"] if name not in installed]
        if missing:
            out.append(f"package(s) not installed: {', '.join(missing)}")
    try:
        group = grp.getgrnam(p["group"])
    except KeyError:
        out.append(f"no group {p['group']}")
        group = None
    try:
        user = pwd.getpwnam(p["user"])
    except KeyError:
        out.append(f"no user {p['user']}")
    else:
        if group is not None and user.pw_gid != group.gr_gid:
            out.append(f"user {p['user']}: primary group is not {p['group']}")
        if user.pw_dir != p["home"] or not os.path.isdir(p["home"]):
            out.append(f"user {p['user']}: home {user.pw_dir}, not an existing {p['home']}")
        if user.pw_shell != p["shell"]:
            out.append(f"user {p['user']}: shell {user.pw_shell}, not {p['shell']}")
    python = os.path.join(p["venv"], "bin", "python")
    if not os.path.exists(python):
        return out + [f"no virtualenv at {p['venv']}"]
    rc, text, _err = module.run_command([python, "-c", VERSION_SCRIPT])
    if rc != 0 or text.strip() != p["version"]:
        out.append(f"smg {text.strip() or 'not installed'} in {p['venv']}, not {p['version']}")
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            packages=dict(type="list", elements="str", default=[]),
            user=dict(type="str", required=True),
            group=dict(type="str", required=True),
            home=dict(type="path", required=True),
            shell=dict(type="str", default="/usr/sbin/nologin"),
            venv=dict(type="path", required=True),
            version=dict(type="str", required=True),
            files=dict(type="list", elements="dict", default=[]),
            absent=dict(type="list", elements="path", default=[]),
            url=dict(type="str", required=True),
            host=dict(type="str", default="0.0.0.0"),
            port=dict(type="int", required=True),
            admin_key=dict(type="str", required=True, no_log=True),
            workers=dict(type="list", elements="str", default=[]),
            timeout=dict(type="float", default=10.0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    reasons = install_differences(module, p)
    for want in p["files"]:
        reasons += file_differences(want, path_state(want["path"]))
    reasons += [f"{path} exists" for path in p["absent"] if os.path.lexists(path)]
    try:
        props = show(module, p["service"], SHOW)
    except SystemctlError as exc:
        module.fail_json(msg=str(exc))
    reasons += service_differences(props, p["service"])
    ready = []
    # The proof only of a router with nothing to change: any other runs the role's steps, which wait for it.
    if not reasons:
        url = p["url"].rstrip("/")
        code, why = status(url + "/readiness", timeout=p["timeout"])
        if code != 200:
            reasons.append(f"GET /readiness answered {code or why}, not 200")
        group = props.get("ControlGroup", "")
        reasons += listener_differences(port_listeners(p["host"], p["port"], group), p["port"], group)
        try:
            answer = get_json(url + "/workers", api_key=p["admin_key"], timeout=p["timeout"])
        except HttpError as exc:
            answer = (None, str(exc))
        ready, missing = workers_differences(answer, p["workers"])
        reasons += missing
    module.exit_json(
        changed=False,
        converged=not reasons,
        reasons=reasons,
        systemd={key: props.get(key, "") for key in SHOW if key != "ControlGroup"},
        workers_ready=ready,
    )


if __name__ == "__main__":
    main()
