"""The sglang role's one decision (module_utils/sglang_decide.py), table-driven over host probe answers
recorded on a lab host (tests/fixtures/decide/, SOURCE.md): every case the lab tests prove end to end, as the
plan the role routes on."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "decide"
_SPEC = importlib.util.spec_from_file_location("sglang_decide", REPO / "module_utils" / "sglang_decide.py")
decide_module = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(decide_module)
decide = decide_module.decide

WANT = {
    "version": "0.5.23",
    "install_source": "wheelhouse",
    "remove_foreign_dropins": False,
    "plan_account": False,
    "service": "sglang",
    "unit": "sglang.service",
    "pending_path": "/var/lib/sglang-deploy/sglang.pending.json",
    "known_good_dir": "/var/lib/sglang-deploy/known-good",
    "marker_name": "sglang-deploy-install.json",
    "removed_dropins_dir": "/var/lib/sglang-deploy/removed-dropins",
}
DEPLOY = {"check": False, "plan": False, "rollout": False}
CHECK = dict(DEPLOY, check=True)
ROLLOUT = dict(DEPLOY, rollout=True)
PLAN = {"check": True, "plan": True, "rollout": False}


def recorded(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def on_disk(probe):
    """What the pass renders when it renders the files the host has."""
    return {name: probe["sha256"][name] for name in ("unit", "env", "config")}


def known_good(probe):
    return {name: probe["sha256"][f"known_good_{name}"] for name in ("unit", "env", "config")}


def other(text):
    return hashlib.sha256(text.encode()).hexdigest()


def with_unit(rendered, text="[Service]\nExecStart=/x --speculative-draft-window-size 4096\n"):
    return dict(rendered, unit=other(text))


def converged_probe():
    return recorded("converged")


def release_switched():
    """The converged host asked for another complete release: its unit runs the old one (the probe's
    ``runs_from`` of the wanted release is false) and the rendered ExecStart names the new one."""
    probe = converged_probe()
    probe["release"]["running"] = False
    return probe


def names(plan):
    return [reason["name"] for reason in plan["restart"]]


# (case, probe, rendered, want changes, mode, the plan's fields that must hold)
CASES = [
    (
        "converged",
        converged_probe,
        on_disk,
        {},
        DEPLOY,
        dict(
            converged=True, restart=[], write=False, restart_now=False, parse=False, prove=False, defer=False
        ),
    ),
    (
        "changed knob",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {},
        DEPLOY,
        # The probe's own call built the command line and had the host's SGLang judge it (``preflight``).
        dict(
            converged=False,
            restart=["unit"],
            write=True,
            restart_now=True,
            parse=False,
            defer=False,
            apply=True,
        ),
    ),
    (
        "weights revision change (the environment file)",
        converged_probe,
        lambda p: dict(on_disk(p), env=other("HF_HUB_REVISION=new\n")),
        {},
        DEPLOY,
        dict(converged=False, restart=["env"], write=True, restart_now=True),
    ),
    (
        "release switch",
        release_switched,
        lambda p: with_unit(on_disk(p), "ExecStart=/opt/sglang/releases/new/bin/python\n"),
        {},
        DEPLOY,
        dict(converged=False, restart=["unit"], write=True, restart_now=True, tidy_releases=False),
    ),
    (
        "rolling deferral: the first play of several hosts changes nothing",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {},
        ROLLOUT,
        dict(
            defer=True,
            write=False,
            restart_now=False,
            prove=False,
            parse=False,
            restart=["unit"],
            apply=False,
        ),
    ),
    (
        "rolling deferral: a converged host is verified in the first play",
        converged_probe,
        on_disk,
        {},
        ROLLOUT,
        dict(defer=False, converged=True),
    ),
    (
        "check mode: the change shown, nothing restarted",
        lambda: recorded("check-knob-changed"),
        lambda p: with_unit(on_disk(p)),
        {},
        CHECK,
        dict(
            converged=False, restart=["unit"], write=True, restart_now=False, prove=True, tidy_releases=False
        ),
    ),
    (
        "plan account: set up in every pass, never converged early",
        converged_probe,
        on_disk,
        {"plan_account": True},
        DEPLOY,
        dict(converged=False, plan_account=True, prepare=True, restart=[], write=False, prove=False),
    ),
    (
        "pending marker: an interrupted run is restarted with proof",
        lambda: recorded("check-pending-marker"),
        known_good,
        {},
        DEPLOY,
        dict(converged=False, restart_now=True, write=True),
    ),
    (
        "GitOps plan: compared by sha256 alone, the --config file not without its secrets",
        converged_probe,
        lambda p: dict(with_unit(on_disk(p)), config=None),
        {},
        PLAN,
        dict(restart=["unit"], restart_now=False, write=True, converged=False, defer=False),
    ),
    (
        "canary: the first batch of a rolling play behind a router bakes",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        dict(DEPLOY, rolling=True, canary={"bake": 600, "baseline": 1, "decided": False}),
        # The rolling play's probe took the lease of the leave, drain and restart: no renewal first.
        dict(canary_bakes=True, restart_now=True, defer=False, leave_routers=True, renew_lock=False),
    ),
    (
        "behind a router, a restart outside the rolling play renews the lock before the leave",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        DEPLOY,
        dict(restart_now=True, leave_routers=True, renew_lock=True),
    ),
    (
        "without a router, a restart leaves none and renews nothing",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": False},
        dict(DEPLOY, rolling=True),
        dict(restart_now=True, leave_routers=False, renew_lock=False),
    ),
    (
        "canary: a later batch (the run's canary judged) does not bake",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        dict(DEPLOY, rolling=True, canary={"bake": 600, "baseline": 1, "decided": True}),
        dict(canary_bakes=False, restart_now=True),
    ),
    (
        "canary: no bake without a router, hosts left to compare with, or bake seconds",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": False},
        dict(DEPLOY, rolling=True, canary={"bake": 600, "baseline": 1, "decided": False}),
        dict(canary_bakes=False),
    ),
    (
        "canary: the last batch has nothing left on the old configuration",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        dict(DEPLOY, rolling=True, canary={"bake": 600, "baseline": 0, "decided": False}),
        dict(canary_bakes=False),
    ),
    (
        "canary: a bake of 0 s is no bake",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        dict(DEPLOY, rolling=True, canary={"bake": 0, "baseline": 1, "decided": False}),
        dict(canary_bakes=False),
    ),
    (
        "canary: the first play never bakes",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True},
        dict(DEPLOY, canary={"bake": 600, "baseline": 1, "decided": False}),
        dict(canary_bakes=False),
    ),
    (
        "fleet revert: a host of the rolling play that restarts keeps the set it replaces",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True, "fleet_revert": True},
        dict(DEPLOY, rolling=True, canary={"bake": 0, "baseline": 1, "decided": True}),
        dict(keep_before_run=True, restart_now=True, canary_bakes=False),
    ),
    (
        "fleet revert off: only a canary that bakes keeps the set it replaces",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True, "fleet_revert": False},
        dict(DEPLOY, rolling=True, canary={"bake": 0, "baseline": 1, "decided": True}),
        dict(keep_before_run=False, restart_now=True),
    ),
    (
        "fleet revert off: the canary that bakes keeps the set its Failed verdict restores",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True, "fleet_revert": False},
        dict(DEPLOY, rolling=True, canary={"bake": 600, "baseline": 1, "decided": False}),
        dict(keep_before_run=True, canary_bakes=True),
    ),
    (
        "fleet revert: a host that does not restart keeps nothing aside",
        converged_probe,
        on_disk,
        {"routers": True, "fleet_revert": True},
        dict(DEPLOY, rolling=True, canary={"bake": 0, "baseline": 1, "decided": True}),
        dict(keep_before_run=False, restart_now=False),
    ),
    (
        "fleet revert: the first play keeps nothing aside (it restarts a single host whole)",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True, "fleet_revert": True},
        DEPLOY,
        dict(keep_before_run=False, restart_now=True),
    ),
    (
        "fleet revert: check mode keeps nothing aside",
        converged_probe,
        lambda p: with_unit(on_disk(p)),
        {"routers": True, "fleet_revert": True},
        dict(CHECK, rolling=True),
        dict(keep_before_run=False, restart_now=False),
    ),
]


@pytest.mark.parametrize(
    ("probe", "rendered", "want", "mode", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_plan_of_each_case(probe, rendered, want, mode, expected):
    answer = probe()
    plan = decide(answer, rendered(answer), dict(WANT, **want), mode)
    got = {key: names(plan) if key == "restart" else plan[key] for key in expected}
    assert got == expected
    assert plan["refusals"] == []


def test_each_restart_reason_names_what_differs_as_compare_container_does():
    probe = converged_probe()
    rendered = with_unit(on_disk(probe))
    (reason,) = decide(probe, rendered, WANT, DEPLOY)["restart"]
    assert reason == {
        "name": "unit",
        "current": probe["sha256"]["unit"],
        "desired": "rendered",
        "text": "the unit changed",
    }


def test_the_pending_marker_is_the_first_reason_naming_the_interrupted_run():
    probe = recorded("check-pending-marker")
    plan = decide(probe, known_good(probe), WANT, DEPLOY)
    first = plan["restart"][0]
    assert first["name"] == "pending"
    assert first["text"].startswith("a previous run stopped between writing and verifying (")
    controller = probe["pending"]["by"]["controller"]
    assert f"ansible-playbook PID {controller['pid']}" in first["text"]
    assert "a pending marker is there" in plan["blockers"]


def test_a_foreign_dropin_is_refused_moved_or_reported():
    probe = recorded("check-foreign-dropin")
    (dropin,) = probe["dropins"]
    rendered = on_disk(probe)
    refused = decide(probe, rendered, WANT, DEPLOY)
    assert len(refused["refusals"]) == 1 and dropin["path"] in refused["refusals"][0]
    assert not refused["write"] and not refused["restart_now"] and not refused["converged"]
    moved = decide(probe, rendered, dict(WANT, remove_foreign_dropins=True), DEPLOY)
    assert moved["refusals"] == [] and moved["dropins"]["move"] == [dropin["path"]]
    assert "dropins" in names(moved) and moved["restart_now"]
    shown = decide(probe, rendered, WANT, CHECK)
    assert shown["refusals"] == [] and dropin["path"] in shown["dropins"]["refusal"]


def test_an_incomplete_release_is_installed_then_its_command_line_built():
    probe = recorded("check-new-dependencies")
    assert probe["argv"] is None
    deploy = decide(probe, None, WANT, DEPLOY)
    assert deploy["install"]["needed"] and deploy["install"]["release"] and deploy["build_argv"]
    assert deploy["prepare"] and not deploy["apply"]
    assert not deploy["converged"] and "the release is not complete" in deploy["blockers"]
    # Installed, the command line built after the probe: no verdict of the probe's, sglang_preflight judges.
    assert "preflight" not in probe
    assert decide(probe, with_unit(on_disk(probe)), WANT, DEPLOY)["parse"]
    judged = converged_probe()
    assert not decide(judged, with_unit(on_disk(judged)), WANT, DEPLOY)["parse"]
    check = decide(probe, None, WANT, CHECK)
    assert not check["inspectable"] and check["install"]["check_only"] and not check["build_argv"]
    assert check["prepare"] and not check["apply"]
    assert not check["prove"] and not check["tidy_releases"]
    rolled = decide(probe, None, WANT, ROLLOUT)
    assert rolled["defer"] and not rolled["install"]["needed"] and not rolled["build_argv"]
    assert not rolled["prepare"]


def test_a_release_holding_another_version_is_refused():
    probe = converged_probe()
    plan = decide(probe, on_disk(probe), dict(WANT, version="0.5.99"), DEPLOY)
    (refusal,) = plan["refusals"]
    assert "holds SGLang 0.5.23, not 0.5.99" in refusal
    assert not plan["write"] and not plan["converged"] and not plan["install"]["needed"]


def test_the_probe_proves_only_a_host_with_nothing_blocking():
    """What sglang_host_probe decides on the host before anything is rendered (``blockers``)."""
    probe = converged_probe()
    assert decide(probe, None, {}, {})["blockers"] == []
    pending = recorded("check-pending-marker")
    assert decide(pending, None, {}, {})["blockers"][0] == "a pending marker is there"
    dropin = recorded("check-foreign-dropin")
    assert "the unit has drop-ins" in decide(dropin, None, {}, {})["blockers"]
    # Policy, not the host: the rolling play's hosts restart, a plan account is set up in every pass.
    assert decide(probe, None, {}, {"rolling": True})["blockers"] == ["the rolling play restarts this host"]
    assert decide(probe, None, {"plan_account": True}, {})["blockers"] == [
        "the plan account is set up in every pass"
    ]
    incomplete = recorded("check-new-dependencies")
    assert decide(incomplete, None, {}, {})["blockers"][:2] == [
        "the command line was not built",
        "the unit does not run from the release",
    ]


def test_systemd_state_alone_restarts():
    probe = converged_probe()
    held = copy.deepcopy(probe)
    held["systemd"]["NeedDaemonReload"] = "yes"
    assert names(decide(held, on_disk(held), WANT, DEPLOY)) == ["daemon_reload"]
    stopped = copy.deepcopy(probe)
    stopped["systemd"]["ActiveState"] = "failed"
    plan = decide(stopped, on_disk(stopped), WANT, DEPLOY)
    assert plan["restart"][-1] == {
        "name": "active_state",
        "current": "failed",
        "desired": "active",
        "text": "the service is failed",
    }


# (case, enabled, failed host, hosts of earlier batches this run changed, check mode, revert, reason contains)
FLEET_REVERT = [
    ("a later batch fails: the earlier hosts are reverted", True, "h3", ["h1", "h2"], False, True, "h1, h2"),
    ("the first batch fails: nothing to revert, the run stops", True, "h1", [], False, False, "first batch"),
    ("sglang_fleet_revert off: the run stops, the others stay", False, "h2", ["h1"], False, False, "off"),
    ("check mode changed nothing: the run stops", True, "h2", ["h1"], True, False, "check mode"),
]


@pytest.mark.parametrize(
    ("enabled", "host", "changed", "check", "revert", "reason"),
    [case[1:] for case in FLEET_REVERT],
    ids=[case[0] for case in FLEET_REVERT],
)
def test_what_a_failure_in_the_rolling_play_does(enabled, host, changed, check, revert, reason):
    plan = decide_module.fleet_revert(enabled, host, changed, check)
    assert (plan["revert"], plan["stop"]) == (revert, not revert)
    assert plan["host"] == host and plan["changed_before"] == changed
    assert reason in plan["reason"] and host in plan["reason"]
