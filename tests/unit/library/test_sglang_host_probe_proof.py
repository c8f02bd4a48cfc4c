"""The host probe's proof of a converged host in its own call (library/sglang_host_probe.py O(prove)) and
the one definition of what the running server must show (module_utils/sglang_expectations.py), which the
role's filter (roles/sglang/filter_plugins/sglang_running.py) and the probe share."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
from ansible.module_utils import sglang_proof, sglang_systemd
from ansible.module_utils.sglang_expectations import release_launcher, running_expectations
from ansible.module_utils.sglang_running_args import RUNNING_ARGS_SUBOPTIONS
from ansible.module_utils.sglang_systemd import parse_show
from conftest import FIXTURES, REPO, call_main, load_module
from test_sglang_host_probe import CAPS_0523, DFLASH, build_good_host, fake_host, release_beside_venv, want

SHOW_RUNNING = parse_show((FIXTURES / "plan_probe" / "show.txt").read_text())
BASE = {
    "secret_keys": ["api_key"],
    "nccl_environment": {"NCCL_P2P_DISABLE": "1"},
    "launcher": ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"],
    "venv": "/opt/sglang/venv",
    "version": "0.5.23",
}


def built_argv(settings=DFLASH):
    """sglang_argv's result for ``settings`` with the recorded SGLang 0.5.23 parser dump."""
    from ansible.module_utils.sglang_argv_run import BUILD_OPTIONS, command_line

    params = {name: spec.get("default") for name, spec in BUILD_OPTIONS.items()}
    params.update(settings=settings, config_path="/etc/sglang/sglang.yaml")
    return command_line(SimpleNamespace(no_log_values=set()), params, capabilities=CAPS_0523)


def test_the_expectations_of_a_built_command_line():
    argv = dict(built_argv(), env={"SGLANG_X": "2", "NCCL_P2P_DISABLE": "0"})
    argv["managed"] = dict(argv["managed"], api_key="SECRET")
    got = running_expectations(argv, BASE, "/opt/sglang/releases/r1")
    assert "api_key" not in got["expected"]
    assert got["expected"]["speculative_draft_window_size"] == 2048
    assert {k: v for k, v in got["expected"].items()} == {
        k: v for k, v in argv["managed"].items() if k != "api_key"
    }
    # The built command line's environment wins over the NCCL decision (as combine() did).
    assert got["expected_env"] == {"NCCL_P2P_DISABLE": "0", "SGLANG_X": "2"}
    assert got["expected_argv"][:3] == ["/opt/sglang/releases/r1/bin/python", "-m", "sglang.launch_server"]
    assert got["expected_argv"][3:] == argv["argv"]
    assert got["expected_release"] == {"path": "/opt/sglang/releases/r1", "version": "0.5.23"}
    assert (got["runner_lines"], got["flag_dests"]) == (argv["runner_lines"], argv["flag_dests"])
    assert got["require_window"] is argv["require_window"] and got["full_server_info"] is True
    # Only options sglang_running_args knows.
    assert set(got) <= set(RUNNING_ARGS_SUBOPTIONS)
    # A git install runs the version its command line reports.
    assert (
        running_expectations(argv, dict(BASE, version=None), "/r")["expected_release"]["version"]
        == (argv["version"])
    )


def test_only_launcher_elements_under_the_venv_move_into_the_release():
    launcher = ["/usr/bin/numactl", "--interleave=all", "/opt/sglang/venv/bin/python", "/opt/sglang/venvx/y"]
    assert release_launcher(launcher, "/opt/sglang/venv", "/rel") == [
        "/usr/bin/numactl",
        "--interleave=all",
        "/rel/bin/python",
        "/opt/sglang/venvx/y",
    ]


def test_the_roles_filter_is_this_very_function():
    path = REPO / "roles" / "sglang" / "filter_plugins" / "sglang_running.py"
    spec = importlib.util.spec_from_file_location("sglang_running_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    filters = module.FilterModule().filters()
    for name, function in (
        ("sglang_running_expectations", running_expectations),
        ("sglang_release_launcher", release_launcher),
    ):
        code = filters[name].__code__
        assert code.co_filename == str(REPO / "module_utils" / "sglang_expectations.py")
        assert code.co_code == function.__code__.co_code


def converged(tmp_path, monkeypatch, host):
    """A converged host (want() plus the --config file, known-good copies, a complete tidy release that the
    unit runs from): the probe's arguments with argv and prove, and the lock's directory."""
    from ansible.module_utils import sglang_argv_run

    monkeypatch.setattr(
        sglang_argv_run, "discover", lambda *a, **k: (CAPS_0523, True, str(tmp_path / "caps" / "x.json"), {})
    )
    build_good_host(tmp_path)
    release, key, version, wanted, spec = release_beside_venv(tmp_path)
    (release / "sglang-deploy-install.json").write_text(json.dumps(dict(wanted, release=key, python=version)))
    link = tmp_path / "current"
    os.symlink(release, link)
    kg = tmp_path / "state" / "known-good"
    (tmp_path / "etc" / "sglang.yaml").write_text("api-key: x\n")
    (tmp_path / "etc" / "sglang.yaml").chmod(0o640)
    for name in ("sglang.env", "sglang.yaml"):
        (kg / name).write_bytes((tmp_path / "etc" / name).read_bytes())
    args = {k: v for k, v in want(tmp_path).items() if k not in ("venv", "marker")}
    args["sha256"] = dict(
        args["sha256"],
        known_good_env=str(kg / "sglang.env"),
        config=str(tmp_path / "etc" / "sglang.yaml"),
        known_good_config=str(kg / "sglang.yaml"),
    )
    args["modes"] = dict(
        args["modes"], config={"path": str(tmp_path / "etc" / "sglang.yaml"), "mode": "0640"}
    )
    args.update(
        release=dict(spec, keep=3, link=str(link)),
        argv={
            "settings": DFLASH,
            "cache_dir": str(tmp_path / "caps"),
            "config_path": "/etc/sglang/sglang.yaml",
        },
        lock={"name": "sglang", "dir": str(tmp_path / "run" / "sglang-deploy"), "anchor_pid": os.getpid()},
        prove={"host": "127.0.0.1", "port": 30000, "api_key": "SECRET", "base": BASE},
    )
    (tmp_path / "run").mkdir()
    return args, release


@pytest.fixture
def host(monkeypatch):
    """The recorded host of test_sglang_host_probe.py (dpkg-query, systemctl show)."""
    return fake_host(monkeypatch)


@pytest.fixture
def proof_calls(monkeypatch):
    """The proof's own systemctl show answers the recorded running unit; run_and_assert is recorded and
    answers ``state['answer']`` (a callable of the soft module)."""
    state = {"calls": [], "answer": lambda module, params: {"pending": False, "msg": "ok", "running": {}}}
    original_show = sglang_systemd.show

    def show(module, unit, props=sglang_systemd.RESTART_PROPERTIES, systemctl=None):
        if "Job" in props:  # the verifier's properties: the proof's own call
            return dict(SHOW_RUNNING)
        return original_show(module, unit, props, systemctl)

    def run_and_assert(module, params, baseline, systemctl, budget_end_us):
        state["calls"].append(
            dict(params=copy.deepcopy(params), baseline=baseline, budget_end_us=budget_end_us)
        )
        return state["answer"](module, params)

    monkeypatch.setattr(sglang_systemd, "show", show)
    monkeypatch.setattr(sglang_proof, "run_and_assert", run_and_assert)
    return state


def run_probe(monkeypatch, args, runs_from=True):
    """The probe's main(); the unit's MainPID (not a process of this machine) runs from the release or not."""
    module = load_module("sglang_host_probe")
    monkeypatch.setattr(module, "runs_from", lambda pid, path: runs_from)
    result, _ = call_main(module, args)
    return result


def lock_file(tmp_path):
    return tmp_path / "run" / "sglang-deploy" / "sglang.lock"


def test_a_converged_host_is_proven_in_the_probes_call_and_keeps_its_lock(
    host, proof_calls, tmp_path, monkeypatch
):
    args, release = converged(tmp_path, monkeypatch, host)
    result = run_probe(monkeypatch, args)
    assert not result.get("failed"), result
    assert result["not_proven"] == "" and result["proof"] == {"pending": False, "msg": "ok", "running": {}}
    # The role releases the lock once, at the end of its pass (tasks/main.yml, always).
    assert "released_lock" not in result
    assert json.loads(lock_file(tmp_path).read_text())["token"] == result["lock"]["token"]
    (call,) = proof_calls["calls"]
    params = call["params"]
    expected = running_expectations(result["argv"], BASE, str(release))
    defaults = {name: spec.get("default") for name, spec in RUNNING_ARGS_SUBOPTIONS.items()}
    assert params["running_args"] == dict(defaults, **expected)
    assert (params["unit"], params["host"], params["port"], params["api_key"]) == (
        "sglang.service",
        "127.0.0.1",
        30000,
        "SECRET",
    )
    assert (params["stable_seconds"], params["health_count"]) == (0, 1)
    # One health answer: the budget ends when the call starts.
    assert call["budget_end_us"] == call["baseline"]["call_us"]
    assert call["baseline"]["restarted"] is False  # the invocation that runs, no restart


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda a, t: (t / "etc" / "sglang.env").write_text("X=1\n"), "not the known-good one"),
        (lambda a, t: (t / "etc" / "sglang.yaml").chmod(0o644), "a file's mode is not as wanted"),
        (
            lambda a, t: (t / "bin" / "sglang-history").write_text("x"),
            "directories or files are not as wanted",
        ),
        (lambda a, t: a.update(pending=str(t / "etc" / "sglang.env")), "a pending marker is there"),
        (lambda a, t: a["release"].update(link=str(t / "elsewhere")), "the releases are not tidy"),
    ],
)
def test_a_host_that_is_not_converged_is_not_proven_and_keeps_its_lock(
    host, proof_calls, tmp_path, monkeypatch, change, reason
):
    args, _ = converged(tmp_path, monkeypatch, host)
    change(args, tmp_path)
    result = run_probe(monkeypatch, args)
    assert not result.get("failed"), result
    assert reason in result["not_proven"], result["not_proven"]
    assert result["proof"] is None and proof_calls["calls"] == []
    assert json.loads(lock_file(tmp_path).read_text())["token"] == result["lock"]["token"]


def test_a_unit_that_does_not_run_from_the_release_is_not_proven(host, proof_calls, tmp_path, monkeypatch):
    args, _ = converged(tmp_path, monkeypatch, host)
    result = run_probe(monkeypatch, args, runs_from=False)
    assert result["not_proven"] == "the unit does not run from the release" and lock_file(tmp_path).exists()


@pytest.mark.parametrize(
    ("answer", "needle"),
    [
        # What the verifier or the assertion fail with (module.fail_json) ends only the proof.
        (
            lambda module, params: module.fail_json(msg="running SGLang arguments do not match"),
            "do not match",
        ),
        (lambda module, params: {"pending": True, "msg": "still waiting (ready)"}, "no health answer 200"),
    ],
)
def test_a_proof_that_does_not_hold_keeps_the_lock_and_the_run_goes_on(
    host, proof_calls, tmp_path, monkeypatch, answer, needle
):
    args, _ = converged(tmp_path, monkeypatch, host)
    proof_calls["answer"] = answer
    result = run_probe(monkeypatch, args)
    assert not result.get("failed"), result
    assert needle in result["not_proven"] and result["proof"] is None
    assert json.loads(lock_file(tmp_path).read_text())["token"] == result["lock"]["token"]


def test_check_mode_proves_nothing(host, proof_calls, tmp_path, monkeypatch):
    args, _ = converged(tmp_path, monkeypatch, host)
    result = run_probe(monkeypatch, dict(args, _ansible_check_mode=True))
    assert result["proof"] is None and "check mode" in result["not_proven"] and proof_calls["calls"] == []
