#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Over 1,000 lines with its documentation (DOCUMENTATION, EXAMPLES and RETURN are ~470 of them): one
# reader per finding; the proof a converged host gets in the same call is module_utils/sglang_proof.py's.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_host_probe
short_description: Read in one round trip what the sglang role would have to change on a host
description:
  - One call that reads, and never changes, everything the sglang role decides on before it touches
    the host, so that a run that changes nothing stays fast; the tasks that fix a difference are the
    ordinary idempotent modules and run only for what the probe flags.
  - The Debian packages O(packages) that are not installed (C(dpkg-query), status C(ii) counts as
    installed).
  - Whether the virtualenv O(venv) has an executable C(bin/python), and the SGLang version(s) installed
    in it, read from the C(sglang-*.dist-info/METADATA) files (no import, no torch).
  - The install marker O(marker) (JSON), the role's directories O(dirs) and O(user_dirs) (type, owner,
    group, mode), the service account O(user) and its group, the files O(files) (content sha1, owner,
    group, mode), the sha256 of each file of O(sha256), whether each file of O(modes) has its owner,
    group and mode, and the unit's state (C(systemctl show)).
  - The unit's drop-ins (RV(dropins)) - the C(DropInPaths) systemd has loaded and every C(*.conf) on disk in
    the unit's drop-in directories of O(dropin_dirs) (also those a C(daemon-reload) has not loaded yet), each
    with its first lines, secrets redacted (module_utils/sglang_redact). The sglang role renders none, so each
    one is a finding (the decision refuses them, module_utils/sglang_decide.py).
  - Needs no root. What it cannot read (a file, a directory, a marker it has no permission for) is
    reported as not good (a missing sha256, a bad directory or file, no marker), never as an error, so
    a check-mode plan run as another account shows a difference instead of failing.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  venv:
    description: SGLang's virtualenv; required without O(release) (which sets it to the release's path).
    type: path
  marker:
    description:
      - JSON file the role writes into the virtualenv after an install (what was installed); required without
        O(release) (which sets it to the release's marker).
    type: path
  release:
    description:
      - The SGLang release the settings want (module_utils/sglang_release.py). The probe runs
        O(release.python)
        for its major.minor, computes the release key from O(release.wanted) and that version, and then
        probes C(<dir>/<key>) as O(venv) and its O(release.marker_name) as O(marker).
    type: dict
    suboptions:
      dir:
        description: The releases directory.
        type: path
        required: true
      wanted:
        description: The role's install marker content (source, version, git repo/ref, dependencies).
        type: dict
        required: true
      python:
        description: The system Python the release venvs are made with.
        type: path
        required: true
      marker_name:
        description: File name of the marker inside a release.
        type: str
        required: true
      keep:
        description:
          - With O(release.link), the releases to keep (library/sglang_releases.py C(keep)); C(tidy) in the
            answer says whether that module would change nothing.
        type: int
      link:
        description: The symlink library/sglang_releases.py points at the running release (C(sglang_venv)).
        type: path
  packages:
    description: Debian packages the role needs on the host.
    type: list
    elements: str
    default: []
  dirs:
    description: Directories the role owns, each with its owner, group and mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Directory.
        type: path
        required: true
      owner:
        description: Owner (user name).
        type: str
        required: true
      group:
        description: Group name.
        type: str
        required: true
      mode:
        description: Mode as an octal string, e.g. C("0750") (a YAML number is refused).
        type: raw
        required: true
  user_dirs:
    description:
      - Directories of the service account, owned by O(user.name):O(user.group) with mode O(user_dir_mode).
    type: list
    elements: path
    default: []
  user_dir_mode:
    description: Mode of each of O(user_dirs) as an octal string (a YAML number is refused).
    type: raw
    default: "0750"
  user:
    description: The service account the role wants.
    type: dict
    required: true
    suboptions:
      name:
        description: User name.
        type: str
        required: true
      group:
        description: Its primary group (which must exist).
        type: str
        required: true
      home:
        description: Its home directory.
        type: path
        required: true
      shell:
        description: Its login shell.
        type: str
        required: true
  files:
    description: Files the role installs, each with the sha1 of its content, its owner, group and mode.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: File (a symlink is not good).
        type: path
        required: true
      sha1:
        description: sha1 (hex) of the content the role installs.
        type: str
        required: true
      mode:
        description: Mode as an octal string (a YAML number is refused).
        type: raw
        required: true
      owner:
        description: Owner (user name).
        type: str
        default: root
      group:
        description: Group name.
        type: str
        default: root
  unit:
    description: The systemd unit, e.g. C(sglang.service).
    type: str
    required: true
  sha256:
    description:
      - Name -> path of each file whose content sha256 is returned (C(null) when missing or unreadable).
    type: dict
    default: {}
  modes:
    description:
      - Name -> C({path, mode, group, owner}) of each file whose owner, group and mode are checked (a
        symlink or a missing file is not good). C(mode) is an octal string; C(owner) and C(group) default
        to C(root).
    type: dict
    default: {}
  dropin_dirs:
    description:
      - The unit directories searched for drop-ins of O(unit) (C(<dir>/<unit>.d/*.conf), the type-wide
        C(<dir>/service.d/*.conf) and the prefix forms C(<dir>/<prefix>-.service.d/*.conf) of a dashed
        name, systemd.unit(5)). Default systemd's system unit search path.
    type: list
    elements: path
    default: [/etc/systemd/system.control, /run/systemd/system.control, /run/systemd/transient,
              /run/systemd/generator.early, /etc/systemd/system, /etc/systemd/system.attached,
              /run/systemd/system, /run/systemd/system.attached, /run/systemd/generator,
              /usr/local/lib/systemd/system, /usr/lib/systemd/system, /lib/systemd/system,
              /run/systemd/generator.late]
  dropin_lines:
    description: How many lines of each drop-in RV(dropins) shows (comments and blank lines skipped).
    type: int
    default: 6
  pending:
    description:
      - The pending marker C(sglang_unit) writes before it replaces the unit files and C(sglang_history)
        removes once the deploy is verified or rolled back; RV(pending) reports it.
    type: path
  lock:
    description:
      - Take the deploy lock (library/sglang_lock.py, C(state=acquired)) FIRST, in this same call, so that
        everything the probe reads is read holding it - one round trip less per deploy than a separate
        C(sglang_lock) task. The suboptions are C(sglang_lock)'s; the action plugin of the same name as
        this module adds O(lock.controller) and, when a holder started on the same controller is dead there,
        asks again with O(lock.takeover), as C(sglang_lock)'s does.
      - Refused (a live holder), the call fails naming it (RV(holder)) and probes nothing. Taken, RV(lock) is
        what C(sglang_lock) returns (C(token), C(holder), C(took_over), C(message), C(waited), C(lock_file));
        a probe that fails after that still returns RV(lock), so the run can release it. Check mode takes
        nothing and warns when a deploy is in progress.
    type: dict
    suboptions:
      name:
        description: Service the lock is for.
        type: str
        required: true
      dir:
        description: Lock directory (created C(0700) root).
        type: path
        default: /run/sglang-deploy
      wait:
        description: Seconds to wait for a live holder to release before refusing.
        type: int
        default: 0
      lease:
        description: Seconds this run may go without another call before its lock counts as abandoned.
        type: int
        default: 3600
      doing:
        description: What the run does while it holds the lock (shown to a refused run).
        type: str
        default: deploying
      controller:
        description: Who runs; set by the action plugin.
        type: dict
        default: {}
      anchor_pid:
        description: Process on this host whose life spans the run (default as C(sglang_lock)'s).
        type: int
      takeover:
        description: Token of a holder the action plugin proved dead on its controller.
        type: str
      takeover_reason:
        description: Why the holder of O(lock.takeover) is dead (reported).
        type: str
        default: its controller process is gone
  argv:
    description:
      - Build the SGLang command line in this same call, as C(sglang_argv) does with O(argv) being its options
        (not C(python) nor C(capabilities)); the flags are asked of the release's own Python
        (C(<release>/bin/python), cached per installation). Only when O(release) is given and that release is
        complete; else RV(argv) is null and the caller runs C(sglang_argv) after the install. One round trip
        less per deploy of an installed release.
    type: dict
    suboptions:
      settings:
        description: As C(sglang_argv)'s.
        type: dict
        default: {}
      extra_args:
        description: As C(sglang_argv)'s.
        type: list
        elements: dict
        default: []
      cache_dir:
        description: As C(sglang_argv)'s.
        type: path
        default: /var/lib/sglang-deploy/capabilities
      cache_files:
        description: As C(sglang_argv)'s.
        type: dict
      timeout:
        description: As C(sglang_argv)'s.
        type: int
        default: 300
      secret_env:
        description: As C(sglang_argv)'s.
        type: dict
        default: {}
      profile:
        description: As C(sglang_argv)'s.
        type: str
        default: upstream
      profiles:
        description: As C(sglang_argv)'s.
        type: dict
        default: {}
      environment:
        description: As C(sglang_argv)'s.
        type: list
        elements: str
        default: []
      config_path:
        description: As C(sglang_argv)'s.
        type: path
      config_hash_label:
        description: As C(sglang_argv)'s.
        type: str
  preflight:
    description:
      - With O(argv), when the command line was built - let the release's SGLang judge it in this same call,
        as C(sglang_preflight) does (the argv, its C(--config) keys and the environment the command line adds
        are the built ones), so a command line SGLang refuses fails the probe before anything is written, and
        an accepted one costs a cache lookup the next time. SGLang's warnings are shown when a command line is
        judged the first time (not from the cache). Not while O(preflight.run_as) is not on the host yet.
    type: dict
    suboptions:
      device:
        description: As C(sglang_preflight)'s.
        type: str
      run_as:
        description: As C(sglang_preflight)'s.
        type: str
      env:
        description: As C(sglang_preflight)'s, without what the command line adds (RV(argv.env)).
        type: dict
        default: {}
      cache_dir:
        description: As C(sglang_preflight)'s.
        type: path
        default: /var/lib/sglang-deploy/preflight
      timeout:
        description: As C(sglang_preflight)'s.
        type: int
        default: 300
  decide:
    description:
      - What the settings want and the run's mode, for the role's decision (module_utils/sglang_decide.py
        C(decide)), made here with what this call read (RV(plan)); its refusals fail the call, naming what
        the role must not touch, with the lock returned to be released.
    type: dict
    suboptions:
      want:
        description: As C(decide)'s O(want) (version, install source, paths the messages name, ...).
        type: dict
        default: {}
      mode:
        description: As C(decide)'s O(mode) (check, plan, rollout).
        type: dict
        default: {}
  prove:
    description:
      - With O(lock) and O(argv), outside check mode - prove the invocation that runs now in this same call,
        as C(sglang_verified_restart) with C(restart=false) does (one C(/health_generate) answer, the listener
        in the unit's cgroup, no older process, and the running-arguments assertion of the command line built
        from O(argv)), when the decision finds nothing blocking (C(decide)'s C(blockers)) - nothing for the
        role to install or set up, no pending marker, no drop-in, the releases tidy, the unit loaded, enabled,
        active, running from the release, and its unit, environment and --config files on disk the
        known-good ones (O(sha256), O(modes)).
      - Not proven, RV(proof) is null (RV(not_proven) says why), and the run goes on as without this option.
      - The lock stays held either way; the role releases it once, at the end of its pass.
    type: dict
    suboptions:
      host:
        description: Address of the server (as C(sglang_verified_restart)'s).
        type: str
        required: true
      port:
        description: Port of the server.
        type: int
        required: true
      api_key:
        description: The server's API key.
        type: str
      base:
        description:
          - What only the controller knows of the running-arguments assertion
            (module_utils/sglang_expectations.py C(running_expectations)).
        type: dict
        required: true
      health_timeout:
        description: Seconds the health answer may take.
        type: float
        default: 25
attributes:
  check_mode:
    support: full
    details: The module never changes anything; it runs the same in check mode (O(lock) takes nothing).
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Probe the packages, account, directories, virtualenv, SGLang version and unit state
  sglang_host_probe:
    venv: /opt/sglang/venv
    marker: /opt/sglang/venv/sglang-deploy-install.json
    packages: [python3-venv, rsync]
    dirs:
      - {path: /etc/sglang, owner: root, group: root, mode: "0755"}
    user_dirs: [/var/lib/sglang, /var/lib/sglang/.cache]
    user_dir_mode: "0750"
    user: {name: sglang, group: sglang, home: /var/lib/sglang, shell: /usr/sbin/nologin}
    files:
      - {path: /usr/local/bin/sglang-history, sha1: 6f1ed002ab5595859014ebf0951522d9e2b4d4b8, mode: "0755"}
    unit: sglang.service
    sha256:
      unit: /etc/systemd/system/sglang.service
      env: /etc/sglang/sglang.env
    modes:
      unit: {path: /etc/systemd/system/sglang.service, mode: "0644"}
      config: {path: /etc/sglang/sglang.yaml, mode: "0640", group: sglang}
  register: __sglang_probe
"""

RETURN = r"""
proof:
  description:
    - With O(prove), the proof of the running invocation (what C(sglang_verified_restart) returns, C(running)
      the assertion), when the host was converged and the proof held; else null.
  returned: with O(prove)
  type: dict
plan:
  description: With O(decide) - the decision on what this call read, with nothing rendered yet (C(decide)).
  returned: with O(decide)
  type: dict
not_proven:
  description: With O(prove) - why RV(proof) is null (the first reason found); empty when proven.
  returned: with O(prove)
  type: str
argv:
  description:
    - With O(argv) and a complete release, what C(sglang_argv) returns for it (C(argv), C(managed), C(env),
      C(config_keys), C(flag_dests), C(version), ...); else null.
  returned: with O(argv)
  type: dict
preflight:
  description:
    - With O(preflight) and a built command line, SGLang's verdict on it (as C(sglang_preflight) returns it
      - C(version), C(resolved), C(cached)).
  returned: with O(preflight), when RV(argv) is not null
  type: dict
lock:
  description: With O(lock) - what taking the deploy lock returned (as C(sglang_lock) C(state=acquired)).
  returned: with O(lock)
  type: dict
holder:
  description: The live holder's record, when O(lock) was refused.
  returned: when the lock was refused
  type: dict
venv:
  description: O(venv)/bin/python exists and is executable.
  returned: always
  type: bool
versions:
  description:
    - Version of each SGLang dist-info in the virtualenv's site-packages (sorted by path; empty when none).
  returned: always
  type: list
  elements: str
  sample: ["0.5.23"]
marker:
  description: The install marker's JSON content; null when it is missing, unreadable or not JSON.
  returned: always
  type: raw
release:
  description:
    - With O(release) - C(key), C(path), C(python_version), C(exists), C(complete) (its marker names the key,
      so it was built to the end), C(marker_sha256), C(entries) (the names in the releases directory) and
      C(running) (the unit's MainPID was started from it); with O(release.link), C(tidy) (true when the
      symlink points at this release and keeping O(release.keep) releases would remove nothing - no other
      complete release beyond them, no interrupted build or removal - so library/sglang_releases.py has
      nothing to do); else null.
  returned: always
  type: dict
  sample: {"key": "0.5.23-py3.11-6f1c0b7e2a91", "path": "/opt/sglang/releases/0.5.23-py3.11-6f1c0b7e2a91",
           "python_version": "3.11", "exists": true, "complete": true, "marker_sha256": "4b1f...",
           "entries": ["0.5.23-py3.11-6f1c0b7e2a91"]}
missing_packages:
  description: The packages of O(packages) that are not installed, in the order given.
  returned: always
  type: list
  elements: str
bad_dirs:
  description:
    - The paths of O(dirs) and O(user_dirs) that are missing, not a directory, unreadable or have another
      owner, group or mode.
  returned: always
  type: list
  elements: str
linked_dirs:
  description:
    - The paths of O(user_dirs) reached through a symbolic link at or below O(user.home) (the service account
      owns its home and could plant one pointing anywhere); the role refuses to touch them as root.
  returned: always
  type: list
  elements: str
group_ok:
  description: The group O(user.group) exists.
  returned: always
  type: bool
user_ok:
  description:
    - The group exists and the account O(user.name) exists with that primary group, O(user.home) and
      O(user.shell).
  returned: always
  type: bool
bad_files:
  description:
    - The paths of O(files) that are missing, not a regular file, unreadable or differ in content, owner,
      group or mode.
  returned: always
  type: list
  elements: str
sha256:
  description: Name -> sha256 (hex) of each file of O(sha256); null when missing or unreadable.
  returned: always
  type: dict
  sample: {"unit": "9f2c...", "env": null}
modes_ok:
  description: Name -> whether each file of O(modes) is a regular file with its owner, group and mode.
  returned: always
  type: dict
  sample: {"unit": true, "env": false}
systemd:
  description:
    - C(systemctl show) properties of O(unit) (LoadState, ActiveState, SubState, UnitFileState,
      NeedDaemonReload, InvocationID, MainPID, DropInPaths); C(LoadState=not-found) when there is no such
      unit; empty when systemctl failed (with a warning).
  returned: always
  type: dict
  sample: {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled", "MainPID": "1234"}
pending:
  description:
    - The content of O(pending) when a run stopped between writing the files and verifying them (which
      files, their sha256 before and after, when, by whom); a dict with the key C(unreadable) when it is
      not a JSON object (and C(not_a_file) true when the path is no regular file, a directory say); null
      when there is none (or without O(pending)).
  returned: always
  type: dict
dropins:
  description:
    - Every drop-in of O(unit), sorted by path - C(path); C(loaded) (in systemd's C(DropInPaths)) and
      C(on_disk) (found in O(dropin_dirs); a loaded one that is gone is C(on_disk=false)); C(shared) (a
      type-wide or prefix drop-in, which other units read too); C(lines) (its first O(dropin_lines)
      non-comment lines, secrets redacted; null when unreadable); C(sha256) (null when unreadable).
  returned: always
  type: list
  elements: dict
  sample: [{"path": "/etc/systemd/system/sglang.service.d/override.conf", "loaded": true, "on_disk": true,
            "shared": false, "lines": ["[Service]", "User=root"], "sha256": "5d1c..."}]
"""

import glob
import grp
import hashlib
import json
import os
import pwd
import re
import stat
import subprocess
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_argv_run import BUILD_OPTIONS, command_line, discovered
from ansible.module_utils.sglang_decide import decide
from ansible.module_utils.sglang_files import file_digest, sha256_of
from ansible.module_utils.sglang_lock import (
    TAKE_OPTIONS,
    LockError,
    failure,
    on_every_end,
    take,
)
from ansible.module_utils.sglang_preflight import OPTIONS as PREFLIGHT_OPTIONS
from ansible.module_utils.sglang_preflight import preflight
from ansible.module_utils.sglang_proof import PROVE_OPTIONS, prove_running, unit_name
from ansible.module_utils.sglang_redact import redact_text
from ansible.module_utils.sglang_release import inside, prune_plan, release_key
from ansible.module_utils.sglang_release import read_marker as read_release_marker
from ansible.module_utils.sglang_systemd import SystemctlError
from ansible.module_utils.sglang_systemd import show as systemctl_show

# The files a proof in the probe's call wants on disk as the known-good ones (O(sha256) names).
PROBE_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NeedDaemonReload",
    "InvocationID",
    "MainPID",
    "DropInPaths",
)
DPKG_FORMAT = "${Package} ${db:Status-Abbrev}\n"
C_ENV = {"LANG": "C", "LC_ALL": "C"}
MODE_RE = re.compile(r"^0?[0-7]{3,4}$")
# systemd's system unit search path (systemd.unit(5), "Unit File Load Path"), /lib for non-merged /usr.
DROPIN_DIRS = (
    "/etc/systemd/system.control",
    "/run/systemd/system.control",
    "/run/systemd/transient",
    "/run/systemd/generator.early",
    "/etc/systemd/system",
    "/etc/systemd/system.attached",
    "/run/systemd/system",
    "/run/systemd/system.attached",
    "/run/systemd/generator",
    "/usr/local/lib/systemd/system",
    "/usr/lib/systemd/system",
    "/lib/systemd/system",
    "/run/systemd/generator.late",
)


class BadMode(ValueError):
    pass


def parse_mode(text, where):
    if not isinstance(text, str) or not MODE_RE.match(text):
        raise BadMode(f'{where}: mode must be an octal string such as "0750", got {text!r}')
    return int(text, 8)


def installed_versions(venv):
    """Version: of each sglang dist-info METADATA in the venv (the header ends at the first empty line)."""
    versions = []
    site = os.path.join(glob.escape(venv), "lib", "python3*", "site-packages")
    pattern = os.path.join(site, "sglang-*.dist-info", "METADATA")
    for meta in sorted(glob.glob(pattern)):
        try:
            with open(meta, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        versions.append(line.split(":", 1)[1].strip())
                        break
                    if not line.strip():
                        break
        except OSError:
            continue
    return versions


def read_marker(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


class ReleaseError(Exception):
    pass


def python_version(python):
    """major.minor of the Python the release venvs are made with (part of the release key): this module's own
    when it is that same interpreter (the usual case: both are the host's python3), else asked."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return "{}.{}".format(*sys.version_info[:2])
    try:
        proc = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except OSError as exc:
        raise ReleaseError(f"cannot run {python} (the Python SGLang releases are made with): {exc}") from exc
    version = proc.stdout.strip()
    if proc.returncode != 0 or not re.fullmatch(r"\d+\.\d+", version):
        raise ReleaseError(
            f"{python} -c 'import sys; print(sys.version_info)' failed (rc {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[:300]}"
        )
    return version


def runs_from(main_pid, path):
    """The unit's MainPID was started from ``path`` (its argv[0], the release's python, lies in it)."""
    try:
        pid = int(main_pid or 0)
        if pid <= 0:
            return False
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv0 = handle.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except (OSError, ValueError):
        return False
    return bool(argv0) and inside(argv0, path)


def release_state(spec):
    """The release the settings want: key, path, whether it is complete, its marker's sha256, and the
    entries of the releases directory (library/sglang_releases.py prunes them)."""
    version = python_version(spec["python"])
    key = release_key(spec["wanted"], version)
    path = os.path.join(spec["dir"], key)
    marker, marker_sha256 = read_release_marker(os.path.join(path, spec["marker_name"]))
    try:
        entries = sorted(os.listdir(spec["dir"]))
    except OSError:
        entries = []
    state = {
        "key": key,
        "path": path,
        "python_version": version,
        "exists": os.path.isdir(path),
        "complete": marker is not None and marker.get("release") == key,
        "marker_sha256": marker_sha256,
        "entries": entries,
    }
    if spec.get("link"):
        # Nothing protected: protecting the running or known-good release only removes less. What this
        # account cannot read (the plan account) is not tidy: sglang_releases then decides as root.
        try:
            remove, _kept = prune_plan(
                spec["dir"], max(spec.get("keep") or 1, 1), [], spec["marker_name"], key
            )
            link = spec["link"].rstrip("/")
            state["tidy"] = not remove and os.path.islink(link) and os.readlink(link) == path
        except OSError:
            state["tidy"] = False
    return state


def read_pending(path):
    """The pending marker a deploy left (sglang_unit writes it, sglang_history removes it): its content,
    ``{"unreadable": reason}`` when it is not a JSON object (with ``"not_a_file": True`` when the path is not
    a regular file: nothing can replace or remove it), None when there is none."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return {"unreadable": "not a regular file", "not_a_file": True}
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"unreadable": exc.strerror or str(exc)}
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"unreadable": exc.strerror or str(exc)}
    try:
        marker = json.loads(text)
    except ValueError as exc:
        return {"unreadable": f"not JSON: {exc}"}
    return marker if isinstance(marker, dict) else {"unreadable": "not a JSON object"}


def parse_dpkg_status(text):
    """Names whose ``${db:Status-Abbrev}`` is ``ii`` (installed) in ``dpkg-query -W -f=DPKG_FORMAT``."""
    installed = set()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "ii":
            installed.add(fields[0])
    return installed


def missing_packages(module, packages):
    if not packages:
        return []
    cmd = [module.get_bin_path("dpkg-query", required=True), "-W", f"-f={DPKG_FORMAT}", *packages]
    rc, out, err = module.run_command(cmd, environ_update=C_ENV)
    # rc 1: some name is not known to dpkg at all (it is then missing); the others are still listed.
    if rc not in (0, 1):
        module.warn(f"dpkg-query failed (rc={rc}): {err.strip()}; unlisted packages count as missing")
    installed = parse_dpkg_status(out)
    return [name for name in packages if name not in installed]


def owned(st, owner, group, mode):
    """``st`` has owner ``owner``, group ``group`` (names) and permission bits ``mode`` (int)."""
    try:
        return (
            pwd.getpwuid(st.st_uid).pw_name == owner
            and grp.getgrgid(st.st_gid).gr_name == group
            and stat.S_IMODE(st.st_mode) == mode
        )
    except KeyError:
        return False


def dir_good(path, owner, group, mode):
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and owned(st, owner, group, mode)


def planted_links(paths, home):
    """The paths of ``paths`` reached through a symbolic link at or below ``home``: the service account owns
    its home and can plant one there; root must never follow it (chown /etc/... through a cache link)."""
    found = []
    for path in paths:
        rel = os.path.relpath(path, home)
        parts = [] if rel == "." else rel.split(os.sep)
        at = home
        for part in ["", *parts]:
            at = os.path.join(at, part) if part else at
            try:
                if stat.S_ISLNK(os.lstat(at).st_mode):
                    found.append(path)
                    break
            except OSError:
                break
    return found


def file_good(item):
    try:
        st = os.lstat(item["path"])
        if not stat.S_ISREG(st.st_mode):
            return False
        return file_digest(item["path"], "sha1") == item["sha1"].lower() and owned(
            st, item["owner"], item["group"], item["mode"]
        )
    except OSError:
        return False


def account(user):
    """(group_ok, user_ok) of the service account."""
    try:
        grp.getgrnam(user["group"])
    except KeyError:
        return False, False
    try:
        pw = pwd.getpwnam(user["name"])
        primary = grp.getgrgid(pw.pw_gid).gr_name
    except KeyError:
        return True, False
    return True, pw.pw_dir == user["home"] and pw.pw_shell == user["shell"] and primary == user["group"]


def account_exists(name):
    """No account asked for, or that account is on the host."""
    try:
        return not name or bool(pwd.getpwnam(name))
    except KeyError:
        return False


def mode_ok(item):
    try:
        st = os.lstat(item["path"])
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and owned(st, item["owner"], item["group"], item["mode"])


def checked_modes(modes):
    """The O(modes) entries with owner/group defaults and int modes; BadMode on a malformed one."""
    out = {}
    for name, item in modes.items():
        if not isinstance(item, dict) or not isinstance(item.get("path"), str) or "mode" not in item:
            raise BadMode(f"modes.{name}: must be a mapping with path and mode, got {item!r}")
        out[name] = {
            "path": item["path"],
            "mode": parse_mode(item["mode"], f"modes.{name}"),
            "owner": str(item.get("owner") or "root"),
            "group": str(item.get("group") or "root"),
        }
    return out


def dropin_dir_names(unit):
    """(name, shared) of each drop-in directory name systemd reads for ``unit`` (systemd.unit(5)):
    ``foo-bar-baz.service.d``, then ``foo-bar-.service.d``, ``foo-.service.d`` and ``service.d`` (shared)."""
    stem, dot, suffix = unit.rpartition(".")
    if not dot:
        return [(unit + ".d", False)]
    names = [(unit + ".d", False)]
    parts = stem.split("-")
    for cut in range(len(parts) - 1, 0, -1):
        names.append(("-".join(parts[:cut]) + "-." + suffix + ".d", True))
    names.append((suffix + ".d", True))
    return names


def dropin_summary(path, limit):
    """(first ``limit`` non-comment lines with secrets redacted, sha256), (None, None) when unreadable."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError:
        return None, None
    lines = []
    for line in data.decode("utf-8", errors="replace").splitlines():
        text = line.strip()
        if not text or text.startswith(("#", ";")):
            continue
        if len(lines) == limit:
            lines.append("...")
            break
        lines.append(redact_text(text))
    return lines, hashlib.sha256(data).hexdigest()


def dropins(unit, dirs, loaded_text, limit):
    """Every drop-in of ``unit``: systemd's DropInPaths (space-separated) and the *.conf on disk."""
    found, seen = {}, set()
    names = dropin_dir_names(unit)
    for directory in dirs:
        # /lib is /usr/lib on a merged-/usr system: each directory once.
        real = os.path.realpath(directory)
        if real in seen:
            continue
        seen.add(real)
        for name, shared in names:
            for path in sorted(glob.glob(os.path.join(glob.escape(directory), glob.escape(name), "*.conf"))):
                found.setdefault(path, {"path": path, "loaded": False, "on_disk": True, "shared": shared})
    shared_names = {name for name, shared in names if shared}
    for path in (loaded_text or "").split():
        entry = found.setdefault(
            path,
            {
                "path": path,
                "loaded": True,
                "on_disk": os.path.lexists(path),
                "shared": os.path.basename(os.path.dirname(path)) in shared_names,
            },
        )
        entry["loaded"] = True
    out = []
    for path in sorted(found):
        entry = found[path]
        entry["lines"], entry["sha256"] = dropin_summary(path, limit)
        out.append(entry)
    return out


def judged(module, options, python, argv, meta):
    """SGLang's verdict on the command line this call built (module_utils/sglang_preflight.py); a refusal
    fails the probe. Its warnings are shown the first time this installation judges that command line."""
    params = dict(
        options,
        python=python,
        argv=argv["argv"],
        config_keys=list((argv.get("config_keys") or {}).values()),
        env=dict(options["env"] or {}, **(argv.get("env") or {})),
    )
    data, cached, rule_warnings = preflight(module, params, meta)
    if not cached:
        for line in data["warnings"] + rule_warnings:
            module.warn(f"SGLang {data['version']}: {line}")
    return dict(version=data["version"], resolved=data["resolved"], cached=cached)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path"),
            marker=dict(type="path"),
            release=dict(
                type="dict",
                options=dict(
                    dir=dict(type="path", required=True),
                    wanted=dict(type="dict", required=True),
                    python=dict(type="path", required=True),
                    marker_name=dict(type="str", required=True),
                    keep=dict(type="int"),
                    link=dict(type="path"),
                ),
            ),
            packages=dict(type="list", elements="str", default=[]),
            dirs=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    path=dict(type="path", required=True),
                    owner=dict(type="str", required=True),
                    group=dict(type="str", required=True),
                    mode=dict(type="raw", required=True),
                ),
            ),
            user_dirs=dict(type="list", elements="path", default=[]),
            user_dir_mode=dict(type="raw", default="0750"),
            user=dict(
                type="dict",
                required=True,
                options=dict(
                    name=dict(type="str", required=True),
                    group=dict(type="str", required=True),
                    home=dict(type="path", required=True),
                    shell=dict(type="str", required=True),
                ),
            ),
            files=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    path=dict(type="path", required=True),
                    sha1=dict(type="str", required=True),
                    mode=dict(type="raw", required=True),
                    owner=dict(type="str", default="root"),
                    group=dict(type="str", default="root"),
                ),
            ),
            unit=dict(type="str", required=True),
            sha256=dict(type="dict", default={}),
            modes=dict(type="dict", default={}),
            dropin_dirs=dict(type="list", elements="path", default=list(DROPIN_DIRS)),
            dropin_lines=dict(type="int", default=6),
            pending=dict(type="path"),
            lock=dict(type="dict", options=TAKE_OPTIONS),
            argv=dict(type="dict", options=BUILD_OPTIONS),
            preflight=dict(type="dict", options=PREFLIGHT_OPTIONS),
            decide=dict(
                type="dict",
                options=dict(want=dict(type="dict", default={}), mode=dict(type="dict", default={})),
            ),
            prove=dict(type="dict", options=PROVE_OPTIONS),
        ),
        supports_check_mode=True,
    )
    p = module.params
    user = p["user"]
    try:
        dirs = [dict(item, mode=parse_mode(item["mode"], f"dirs {item['path']}")) for item in p["dirs"]]
        user_dir_mode = parse_mode(p["user_dir_mode"], "user_dir_mode")
        files = [dict(item, mode=parse_mode(item["mode"], f"files {item['path']}")) for item in p["files"]]
        modes = checked_modes(p["modes"])
    except BadMode as exc:
        module.fail_json(msg=str(exc))
    # The lock first: everything below is read holding it. Any later failure returns it (to be released).
    if p["lock"]:
        lock = p["lock"]
        try:
            taken, refused = take(lock, module.check_mode, module.warn)
        except (OSError, LockError) as exc:
            module.fail_json(msg=failure(lock, exc))
        if refused:
            module.fail_json(msg=refused, holder=taken.get("holder"), lock=taken)
        on_every_end(module, lambda result, lock=taken: dict(result, lock=lock))
    dirs += [
        {"path": path, "owner": user["name"], "group": user["group"], "mode": user_dir_mode}
        for path in p["user_dirs"]
    ]

    release = None
    if p["release"]:
        try:
            release = release_state(p["release"])
        except ReleaseError as exc:
            module.fail_json(msg=str(exc))
        p["venv"], p["marker"] = release["path"], os.path.join(release["path"], p["release"]["marker_name"])
    elif not p["venv"] or not p["marker"]:
        module.fail_json(msg="venv and marker are required without release")

    group_ok, user_ok = account(user)
    try:
        systemd = systemctl_show(module, p["unit"], PROBE_PROPERTIES)
    except SystemctlError as exc:
        module.warn(f"{exc}; the unit state is unknown")
        systemd = {}
    if release is not None:
        release["running"] = runs_from(systemd.get("MainPID"), release["path"])
    built = {}
    if p["argv"] is not None:
        complete = release is not None and release["complete"]
        python = os.path.join(p["venv"], "bin", "python")
        built["argv"] = None
        if complete and os.access(python, os.X_OK):
            capabilities, found, meta = discovered(module, p["argv"], python)
            built["argv"] = dict(command_line(module, p["argv"], capabilities=capabilities), **found)
            # Not before install.yml made the account it parses as: the parse after the install judges then.
            if p["preflight"] is not None and account_exists(p["preflight"]["run_as"]):
                built["preflight"] = judged(module, p["preflight"], python, built["argv"], meta)
    answer = dict(
        changed=False,
        venv=os.access(os.path.join(p["venv"], "bin", "python"), os.X_OK),
        versions=installed_versions(p["venv"]),
        marker=read_marker(p["marker"]),
        release=release,
        missing_packages=missing_packages(module, p["packages"]),
        bad_dirs=[
            item["path"]
            for item in dirs
            if not dir_good(item["path"], item["owner"], item["group"], item["mode"])
        ],
        linked_dirs=planted_links(p["user_dirs"], user["home"]),
        group_ok=group_ok,
        user_ok=user_ok,
        bad_files=[item["path"] for item in files if not file_good(item)],
        sha256={name: sha256_of(str(path)) for name, path in p["sha256"].items()},
        modes_ok={name: mode_ok(item) for name, item in modes.items()},
        systemd=systemd,
        dropins=dropins(p["unit"], p["dropin_dirs"], systemd.get("DropInPaths"), p["dropin_lines"]),
        pending=read_pending(p["pending"]) if p["pending"] else None,
        **built,
    )

    plan = decide(answer, None, (p["decide"] or {}).get("want"), (p["decide"] or {}).get("mode"))
    if p["decide"] is not None:
        answer["plan"] = plan
        if plan["refusals"]:
            module.fail_json(msg=" ".join(plan["refusals"]), plan=plan)
    if p["prove"] is not None:
        answer.update(proof=None, not_proven="")
        if p["lock"] is None or module.check_mode:
            answer["not_proven"] = "no deploy lock taken (check mode, or no lock option)"
        elif plan["blockers"]:
            answer["not_proven"] = plan["blockers"][0]
        else:
            unit, release_path = unit_name(p["unit"]), answer["release"]["path"]
            answer.update(prove_running(module, unit, p["prove"], answer["argv"], release_path))
    module.exit_json(**answer)


if __name__ == "__main__":
    main()
