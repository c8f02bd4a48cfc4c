# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang role's one decision: from what the host probe found, what this pass renders, what the settings
want and the run's mode, what the pass does on the host.

``decide(probe, rendered, want, mode)`` is pure (standard library only, no ansible import): the role calls it
through its filter (roles/sglang/filter_plugins/sglang_decide.py, one ``set_fact``), and sglang_host_probe
calls it on the host with ``rendered=None`` to know whether it may prove the running invocation in its own
call (``blockers``). Every ``when:`` of the role reads a field of the plan it returns.

probe     the answer of library/sglang_host_probe.py (the plan: with the plan probe's sha256 and systemd).
rendered  {unit, env, config}: the sha256 of the files this pass renders (config None: not compared), or None
          when nothing is rendered (check mode before the first install, the probe's own call).
want      version, install_source, remove_foreign_dropins, plan_account, routers (bool), fleet_revert
          (sglang_fleet_revert), and the paths the messages name: unit, pending_path, known_good_dir,
          marker_name, removed_dropins_dir.
mode      check, plan, rollout (the first play of playbooks/sglang.yml over several hosts: a host with
          anything to change waits for the rolling play), rolling (its second play: the hosts there restart),
          canary ({bake: seconds, baseline: hosts left on the old configuration, decided: this run's canary
          was judged or the operator decided it}).

The plan: ``refusals`` (each message whole), ``install`` (what install.yml brings to the wanted state),
``inspectable``, ``build_argv``, ``prepare`` (install.yml has work), ``canary_bakes`` (this host is the first
batch of a rollout behind a router that bakes and is judged: playbooks/sglang.yml, tasks/canary.yml),
``keep_before_run`` (the rolling play's verified restart keeps the known-good set it replaces: what a Failed
canary or the fleet revert restores, tasks/revert.yml),
``files`` (which file changes; ``current``: nothing to write; ``verified``: the files are the last verified
ones), ``write``, ``apply`` (apply.yml has work), ``parse``, ``restart`` (each reason {name, current, desired,
text}, as kolla-ansible's compare_container returns its differences), ``restart_now``, ``defer``,
``leave_routers`` (the restart leaves the routers first and rejoins them after), ``renew_lock`` (the lease the
leave and drain need is renewed first: the rolling play's probe took it already), ``tidy_releases``, ``prove``
(verify.yml makes its own proof call), ``converged`` and ``blockers`` (why the
host is not converged, first first).
"""

from __future__ import annotations

FILES = ("unit", "env", "config")
FILE_WORDS = {"unit": "the unit", "env": "the environment file", "config": "the --config file"}


def _pending_summary(pending, path):
    if pending.get("unreadable"):
        return f"{path}: unreadable marker ({pending['unreadable']})"
    ctl = ((pending.get("by") or {}).get("controller")) or {}
    files = ", ".join(str((item or {}).get("path")) for item in (pending.get("files") or {}).values())
    return (
        f"{path}: started {pending.get('started', '?')} by ansible-playbook PID {ctl.get('pid', '?')} "
        f"on controller {ctl.get('host', '?')} (user {ctl.get('user', '?')}, "
        f"playbook {ctl.get('playbook', '?')}), writing {files}"
    )


def _reason(name, current, desired, text):
    return {"name": name, "current": current, "desired": desired, "text": text}


def refusals(probe, want, install_release):
    """What the host's state refuses before anything is touched, each message whole."""
    out = []
    release, pending = probe.get("release") or {}, probe.get("pending") or {}
    systemd = probe.get("systemd") or {}
    if pending.get("not_a_file"):
        out.append(
            f"{want.get('pending_path')} is not a regular file (a directory?): the deploy writes its pending "
            "marker there and removes it once verified, so it cannot run. Nothing was changed; remove that "
            "path by hand."
        )
    if install_release and release.get("exists") and release.get("running"):
        out.append(
            f"The SGLang release {release.get('path')} has no valid marker ({want.get('marker_name')}) but "
            f"{want.get('unit')} runs from it (MainPID {systemd.get('MainPID', '?')}): the role never "
            "rebuilds a running release. Restore its marker, or deploy another release first."
        )
    linked = probe.get("linked_dirs") or []
    if linked:
        out.append(
            f"{', '.join(linked)}: reached through a symbolic link inside the service account's home "
            "(planted by that account?). The role never follows one as root; nothing was changed. Remove the "
            "link and run again."
        )
    versions = probe.get("versions") or []
    if (
        release.get("complete")
        and want.get("install_source") != "git"
        and want.get("version")
        and versions != [want["version"]]
    ):
        out.append(
            f"The SGLang release {release.get('path')} is marked complete but holds SGLang "
            f"{', '.join(versions) or 'none'}, not {want['version']} (changed by hand?). The role never "
            "installs into a release: remove that directory and run again to rebuild it."
        )
    return out


def dropin_refusal(dropins, want):
    """The message that fails a run on drop-ins the role did not render, or "" when they are to be moved."""
    if not dropins or (want.get("remove_foreign_dropins") and not any(d.get("shared") for d in dropins)):
        return ""
    found = "; ".join(
        f"{d['path']}{'' if d.get('loaded') else ' (on disk, not loaded yet)'}"
        f"{' (shared with other units: remove it by hand)' if d.get('shared') else ''}: "
        f"{' | '.join(d['lines']) if d.get('lines') is not None else '(unreadable)'}"
        for d in dropins
    )
    how = (
        "Shared drop-ins are never removed by the role."
        if want.get("remove_foreign_dropins")
        else "Remove them, or set sglang_remove_foreign_dropins: true to have the role move them to "
        f"{want.get('removed_dropins_dir')}/<timestamp>/ and restart with verification."
    )
    return (
        f"{want.get('unit')} has {len(dropins)} drop-in(s) the sglang role did not render "
        f"(nothing was changed): {found}. {how}"
    )


def install_steps(probe):
    """What install.yml brings to the wanted state: each entry names what the probe found wrong."""
    release = probe.get("release") or {}
    steps = {
        "packages": list(probe.get("missing_packages") or []),
        "group": not probe.get("group_ok", True),
        "user": not probe.get("user_ok", True),
        "dirs": list(probe.get("bad_dirs") or []),
        "files": list(probe.get("bad_files") or []),
        "release": not release.get("complete", False),
    }
    steps["release"] = steps["release"] or not probe.get("venv", False)
    steps["needed"] = any(bool(value) for value in steps.values())
    # A release directory without its marker is a build that stopped: it is built again from scratch.
    steps["remove_interrupted"] = steps["release"] and bool(release.get("exists"))
    return steps


def file_changes(probe, rendered, plan_mode):
    """Which file this pass replaces: its content differs or (a deploy only) its owner or mode does."""
    sha, modes_ok = probe.get("sha256") or {}, probe.get("modes_ok") or {}
    changes = {}
    for name in FILES:
        want = rendered.get(name)
        if want is None:
            changes[name] = False
            continue
        changes[name] = sha.get(name) != want or (not plan_mode and not modes_ok.get(name, False))
    return changes


def restart_reasons(probe, changes, want, dropins_moved):
    """Why SGLang restarts, in the order a reader asks: an interrupted run, a changed file, unverified files,
    foreign drop-ins moved away, systemd's state."""
    sha, systemd = probe.get("sha256") or {}, probe.get("systemd") or {}
    reasons = []
    pending = probe.get("pending")
    if pending is not None:
        summary = _pending_summary(pending, want.get("pending_path"))
        reasons.append(
            _reason(
                "pending",
                summary,
                None,
                f"a previous run stopped between writing and verifying ({summary})",
            )
        )
    for name in FILES:
        if changes[name]:
            reasons.append(_reason(name, sha.get(name), "rendered", f"{FILE_WORDS[name]} changed"))
    unchanged = not any(changes.values())
    known_good = want.get("known_good_dir")
    if unchanged and (sha.get("known_good_unit") is None or sha.get("known_good_env") is None):
        reasons.append(
            _reason(
                "never_verified",
                None,
                "a verified deploy",
                f"no deploy was ever verified (no known-good unit and environment file in {known_good})",
            )
        )
    suffix = {"unit": ".service", "env": ".env", "config": ".yaml"}
    for name in FILES:
        good = sha.get(f"known_good_{name}")
        if not changes[name] and good is not None and sha.get(name) != good:
            copy = f"{known_good}/{want.get('service', 'sglang')}{suffix[name]}"
            reasons.append(
                _reason(
                    f"{name}_not_known_good",
                    sha.get(name),
                    good,
                    f"{FILE_WORDS[name]} on disk is not the one last verified ({copy})",
                )
            )
    if dropins_moved:
        paths = [d["path"] for d in dropins_moved]
        reasons.append(_reason("dropins", paths, [], f"foreign drop-in removed ({', '.join(paths)})"))
    if systemd.get("NeedDaemonReload", "no") == "yes":
        reasons.append(_reason("daemon_reload", "yes", "no", "systemd held an older unit definition"))
    state = systemd.get("ActiveState", "unknown")
    if state != "active":
        reasons.append(_reason("active_state", state, "active", f"the service is {state}"))
    return reasons


def _files_state(probe, rendered):
    sha, modes_ok, systemd = (
        probe.get("sha256") or {},
        probe.get("modes_ok") or {},
        probe.get("systemd") or {},
    )
    current = (
        rendered is not None
        and all(sha.get(name) == rendered.get(name) for name in FILES)
        and all(modes_ok.get(name, False) for name in FILES)
        and (systemd.get("LoadState"), systemd.get("UnitFileState"), systemd.get("NeedDaemonReload", "no"))
        == ("loaded", "enabled", "no")
    )
    known_good = all(
        sha.get(name) is not None and sha.get(name) == sha.get(f"known_good_{name}") for name in FILES
    )
    return current, current and known_good, known_good


def blockers(probe, install, refused, current_known_good):
    """Why a host is not converged as far as its probe can tell, first first; [] when it is."""
    release, systemd = probe.get("release") or {}, probe.get("systemd") or {}
    found = (
        ("a refusal", bool(refused)),
        ("the command line was not built", not isinstance(probe.get("argv"), dict)),
        ("the unit does not run from the release", not release.get("running")),
        ("the releases are not tidy", not release.get("tidy")),
        ("the release is not complete", install["release"]),
        ("packages are missing", bool(install["packages"])),
        ("the service account is not as wanted", install["group"] or install["user"]),
        ("directories or files are not as wanted", bool(install["dirs"] or install["files"])),
        ("a pending marker is there", probe.get("pending") is not None),
        ("the unit has drop-ins", bool(probe.get("dropins"))),
        (
            "a file's mode is not as wanted",
            not all((probe.get("modes_ok") or {}).get(n, False) for n in FILES),
        ),
        ("the unit, environment or --config file is not the known-good one", not current_known_good),
        (
            "the unit is not loaded, enabled and active",
            (systemd.get("LoadState"), systemd.get("UnitFileState"), systemd.get("ActiveState"))
            != ("loaded", "enabled", "active"),
        ),
        ("systemd holds an older unit definition", systemd.get("NeedDaemonReload", "no") == "yes"),
    )
    return [reason for reason, applies in found if applies]


def decide(probe, rendered, want, mode):
    """The plan of this pass on the host (see the module's docstring)."""
    want, mode = want or {}, mode or {}
    check, plan_mode = bool(mode.get("check")), bool(mode.get("plan"))
    install = install_steps(probe)
    dropins = list(probe.get("dropins") or [])
    refused = refusals(probe, want, install["release"])
    dropin_msg = dropin_refusal(dropins, want)
    # Check mode and the plan report the drop-ins a deploy would fail on; a deploy fails before any change.
    if dropin_msg and not (check or plan_mode):
        refused = [*refused, dropin_msg]
    moved = dropins if dropins and not dropin_msg and want.get("remove_foreign_dropins") else []
    inspectable = not (check and install["release"])
    current, verified, known_good = _files_state(probe, rendered)
    changes = file_changes(probe, rendered or {}, plan_mode)
    reasons = restart_reasons(probe, changes, want, moved) if rendered is not None else []
    # The first play over several hosts changes nothing on a host with anything to change (P21).
    defer = (
        bool(mode.get("rollout"))
        and not check
        and not plan_mode
        and (install["needed"] or bool(reasons) or (rendered is not None and not current))
    )
    acts = not defer and not refused
    found = blockers(probe, install, refused, known_good)
    # Not proven in the probe's call: the rolling play's hosts are there to restart, and a plan account is
    # set up by install.yml in every pass.
    if mode.get("rolling"):
        found.insert(0, "the rolling play restarts this host")
    if want.get("plan_account"):
        found.insert(0, "the plan account is set up in every pass")
    canary = mode.get("canary") or {}
    if rendered is not None:
        if not current:
            found.append("the files this pass renders are not the ones on disk")
        if reasons:
            found.append("SGLang must restart")
    proof = probe.get("proof")
    tidy = bool((probe.get("release") or {}).get("tidy")) and not install["release"]
    converged = (
        not check
        and not plan_mode
        and acts
        and rendered is not None
        and isinstance(proof, dict)
        and verified
        and not reasons
        and tidy
        and not install["needed"]
        and not want.get("plan_account")
    )
    restart = acts and not check and bool(reasons) and inspectable
    needed, check_only = acts and install["needed"], check and install["release"]
    plan_account = acts and bool(want.get("plan_account"))
    build_argv = acts and inspectable and not isinstance(probe.get("argv"), dict)
    write = acts and inspectable and rendered is not None and not current
    canary_bakes = (
        bool(mode.get("rolling"))
        and bool(want.get("routers"))
        and int(canary.get("bake") or 0) > 0
        and int(canary.get("baseline") or 0) > 0
        and not canary.get("decided")
    )
    keep_before_run = restart and (
        canary_bakes or (bool(mode.get("rolling")) and bool(want.get("fleet_revert")))
    )
    return {
        "refusals": refused,
        "dropins": {"found": dropins, "refusal": dropin_msg, "move": [d["path"] for d in moved]},
        "install": dict(install, needed=needed, check_only=check_only),
        "plan_account": plan_account,
        "inspectable": inspectable,
        "build_argv": build_argv,
        # install.yml has something to do: install, the plan account, check mode's note, the command line.
        "prepare": needed or check_only or plan_account or build_argv,
        "canary_bakes": canary_bakes,
        # The set this run replaces, kept for its revert (a canary's rollback, the fleet revert).
        "keep_before_run": keep_before_run,
        "files": dict(changes, current=current, verified=verified),
        "write": write,
        # apply.yml has something to do: a write, a restart, or check mode's account of them.
        "apply": write or restart or (check and bool(reasons) and acts),
        # sglang_preflight's own call, when the probe did not judge the command line (it had none to build).
        # A host the first play leaves to the rolling play is judged there too: a command line its SGLang
        # refuses fails the run before any host rolls (the host caches an accepted parse).
        "parse": not refused
        and inspectable
        and rendered is not None
        and not verified
        and not isinstance(probe.get("preflight"), dict),
        "restart": reasons,
        "restart_now": restart,
        "leave_routers": restart and bool(want.get("routers")),
        "renew_lock": restart and bool(want.get("routers")) and not mode.get("rolling"),
        "defer": defer,
        "tidy_releases": acts and inspectable and not check and not tidy,
        "prove": acts and inspectable and not restart and (check or not isinstance(proof, dict)),
        "converged": converged,
        "blockers": found,
    }


def fleet_revert(enabled, host, changed_before, check=False):
    """What a host's failure in the rolling play of playbooks/sglang.yml does to the rollout, once the role
    rolled that host back itself. ``changed_before``: the hosts of EARLIER batches this run changed (their new
    configuration restarted and verified), in rollout order. With sglang_fleet_revert (``enabled``) and such
    hosts, no later batch starts and they are reverted to the configuration they ran before this run, in
    reverse order (``revert``); otherwise the run stops here, as a failed canary stops it (``stop``)."""
    changed_before = list(changed_before or [])
    revert = bool(enabled) and bool(changed_before) and not check
    if revert:
        reason = (
            f"{host} failed after this run changed {', '.join(changed_before)}: no later batch starts, and "
            "the hosts this run changed are reverted one at a time, last changed first (sglang_fleet_revert)"
        )
    elif check:
        reason = f"{host} failed in check mode, which changes nothing: the run stops"
    elif not changed_before:
        reason = f"{host} failed in the first batch that changed a host: nothing to revert, the run stops"
    else:
        reason = (
            f"{host} failed; sglang_fleet_revert is off: {', '.join(changed_before)} keep the new "
            "configuration and the run stops"
        )
    return {
        "revert": revert,
        "stop": not revert,
        "host": host,
        "changed_before": changed_before,
        "reason": reason,
    }
