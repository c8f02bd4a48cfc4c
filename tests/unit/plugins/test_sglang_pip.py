"""action_plugins/sglang_pip.py: pip's progress while it runs, and changed as pip reports it (issues 18, 19).

The pip outputs in tests/fixtures/pip/ are recorded on a lab host (Debian 12, pip 23.0.1) by the role's
own install from the pushed wheelhouse into /opt/sglang/venv, and by the same pip run again
(everything already satisfied) and asked for a version the wheelhouse lacks.

The plugin's host commands (start pip in its own session, poll, read the log) run here through a
local shell instead of SSH: the same sh, setsid, kill and tail a Debian host has. The stand-in for
pip prints a recorded output in two halves with a pause between them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail, AnsibleActionSkip
from conftest import REPO

spec = importlib.util.spec_from_file_location("sglang_pip", REPO / "action_plugins" / "sglang_pip.py")
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

FIXTURES = REPO / "tests" / "fixtures" / "pip"
DEPENDENCIES = (FIXTURES / "wheelhouse-dependencies.txt").read_text()
SGLANG = (FIXTURES / "wheelhouse-sglang.txt").read_text()
SATISFIED = (FIXTURES / "already-satisfied.txt").read_text()
NO_MATCH = (FIXTURES / "no-matching-version.txt").read_text()


def test_progress_names_the_step_with_the_wheel_file_not_its_path():
    lines = DEPENDENCIES.splitlines()
    torch = next(i for i, line in enumerate(lines) if line.startswith("Processing ") and "/torch-" in line)
    step = plugin.progress_line("\n".join(lines[: torch + 1]))
    assert step.startswith("Processing torch-") and step.endswith(".whl"), step
    assert "/" not in step, step


def test_progress_of_a_finished_install_is_its_last_step():
    assert plugin.progress_line(SGLANG) == "Successfully installed sglang-0.5.23"
    # Inside "Installing collected packages" pip replaced the Debian venv's setuptools: said as part of it.
    collecting = DEPENDENCIES.split("\nSuccessfully installed")[0]
    assert (
        plugin.progress_line(collecting)
        == "Installing 112 collected package(s); Successfully uninstalled setuptools-66.1.1"
    )
    collected = plugin.progress_line(collecting.split("\n  Attempting uninstall")[0])
    assert collected.startswith("Installing 112 collected package(s): pure_eval, ptyprocess, "), collected
    assert collected.endswith("...") and len(collected) == 160, collected


def test_progress_skips_lines_that_name_no_step():
    assert plugin.progress_line("  warning: something\n\n") == ""
    assert plugin.progress_line(NO_MATCH).startswith("ERROR: No matching distribution found for sglang==")


def test_installed_packages_are_what_pip_says_it_installed():
    installed = plugin.installed_packages(DEPENDENCIES)
    assert "torch-2.14.1" in installed and "setuptools-84.2.1" in installed, installed
    collected = DEPENDENCIES.split("Installing collected packages: ")[1].splitlines()[0].split(", ")
    assert len(installed) == len(collected)
    assert plugin.installed_packages(SGLANG) == ["sglang-0.5.23"]
    # Everything already satisfied: pip installed nothing, so nothing changed.
    assert "Requirement already satisfied: " in SATISFIED
    assert plugin.installed_packages(SATISFIED) == []


def test_error_lines_are_pips_errors():
    errors = [line for line in NO_MATCH.splitlines() if line.startswith("ERROR:")]
    assert plugin.error_lines(NO_MATCH) == errors and len(errors) == 2
    assert plugin.error_lines("a\nb\nTraceback\nKeyError: x\n", keep=2) == ["Traceback", "KeyError: x"]


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("running\n@@sglang-pip@@\nProcessing x\n", ("running", None, "Processing x\n")),
        ("rc=0\n@@sglang-pip@@\nSuccessfully installed a-1\n", ("done", 0, "Successfully installed a-1\n")),
        ("rc=1\n@@sglang-pip@@\n", ("done", 1, "")),
        ("vanished\n@@sglang-pip@@\n", ("vanished", None, "")),
        ("rc=\n@@sglang-pip@@\n", ("vanished", None, "")),
    ],
)
def test_parse_status(stdout, expected):
    assert plugin.parse_status(stdout) == expected


# A stand-in for pip: prints the first half of a recorded output, pauses, prints the rest, exits rc.
FAKE_PIP = r"""
import sys, time
text = open(sys.argv[1]).read().splitlines(True)
half = len(text) // 2
sys.stdout.write(''.join(text[:half])); sys.stdout.flush()
time.sleep(float(sys.argv[2]))
sys.stdout.write(''.join(text[half:])); sys.stdout.flush()
sys.exit(int(sys.argv[3]))
"""


class LocalAction(plugin.ActionModule):
    """The plugin with its host commands run by a local sh (what SSH would run on the host)."""

    commands: list[str]
    # Ansible's SSH connection runs commands on a tty by default: every line then ends in CRLF.
    tty = False

    def _low_level_execute_command(self, cmd, sudoable=True, **kwargs):
        self.commands.append(cmd)
        proc = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60)
        out = proc.stdout.replace("\n", "\r\n") if self.tty else proc.stdout
        return {"rc": proc.returncode, "stdout": out, "stderr": proc.stderr}


@pytest.fixture
def action(monkeypatch):
    shown: list[str] = []
    monkeypatch.setattr(plugin.display, "display", lambda msg, *a, **k: shown.append(msg))

    def make(args: dict, check_mode: bool = False, tty: bool = False) -> LocalAction:
        task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, action="sglang_pip")
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="unused"))
        act = LocalAction(task, connection, None, None, None)
        act.tty = tty
        act.commands = []
        act.shown = shown
        return act

    return make


def pip_args(tmp_path, recorded: str, pause: float, rc: int, **extra) -> dict:
    out = tmp_path / "recorded.txt"
    out.write_text(recorded)
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    return {
        "argv": [sys.executable, str(script), str(out), str(pause), str(rc)],
        "log": str(tmp_path / "venv" / "sglang-deploy-pip.log"),
        "poll": 1,
        "label": "SGLang 0.5.23",
        **extra,
    }


@pytest.mark.parametrize("tty", [False, True], ids=["no-tty", "tty"])
def test_an_install_prints_its_steps_while_it_runs_and_is_a_change(action, tmp_path, tty):
    (tmp_path / "venv").mkdir()
    act = action(pip_args(tmp_path, DEPENDENCIES, pause=2.5, rc=0), tty=tty)
    result = act.run(task_vars={"inventory_hostname": "gpu1"})
    assert result["changed"] is True and not result.get("failed"), result
    assert result["rc"] == 0 and result["installed"] == plugin.installed_packages(DEPENDENCIES)
    assert result["stdout"] == DEPENDENCIES
    log = tmp_path / "venv" / "sglang-deploy-pip.log"
    assert oct(log.stat().st_mode & 0o777) == "0o600" and log.read_text() == DEPENDENCIES
    # While pip paused halfway, a line named the step it was at (not "starting", not the end).
    half = "".join(DEPENDENCIES.splitlines(True)[: len(DEPENDENCIES.splitlines()) // 2])
    midway = f"gpu1: SGLang 0.5.23 [0m01s]: {plugin.progress_line(half)}"
    assert any(
        line.startswith("gpu1: SGLang 0.5.23 [0m0") and line.endswith(plugin.progress_line(half))
        for line in act.shown
    ), (midway, act.shown)
    assert act.shown[0] == f"gpu1: SGLang 0.5.23: started, output in {log}"
    assert act.shown[-1].startswith("gpu1: SGLang 0.5.23 [0m0") and act.shown[-1].endswith(
        f"done, installed {len(result['installed'])} package(s)"
    ), act.shown


def test_nothing_to_install_is_no_change(action, tmp_path):
    (tmp_path / "venv").mkdir()
    act = action(pip_args(tmp_path, SATISFIED, pause=0, rc=0))
    result = act.run(task_vars={"inventory_hostname": "gpu1"})
    assert result["changed"] is False and result["installed"] == [] and result["rc"] == 0, result
    assert act.shown[-1].endswith("done, nothing to install"), act.shown


def test_a_failing_pip_fails_with_its_errors_and_status(action, tmp_path):
    (tmp_path / "venv").mkdir()
    act = action(pip_args(tmp_path, NO_MATCH, pause=0, rc=1))
    result = act.run(task_vars={"inventory_hostname": "gpu1"})
    assert result["failed"] is True and result["rc"] == 1 and result["changed"] is False, result
    assert result["msg"].startswith("SGLang 0.5.23: pip exited 1 after 0m0"), result["msg"]
    for line in plugin.error_lines(NO_MATCH):
        assert line in result["msg"]
    assert result["msg"].endswith(f"(full output: {tmp_path}/venv/sglang-deploy-pip.log on the host)")


def test_a_pip_past_its_timeout_is_stopped_and_fails(action, tmp_path):
    (tmp_path / "venv").mkdir()
    act = action(pip_args(tmp_path, DEPENDENCIES, pause=60, rc=0, timeout=2))
    begin = time.monotonic()
    stopped = r"SGLang 0.5.23: pip still running after 0m0\ds \(timeout 2 s\): stopped; last step: Proc"
    with pytest.raises(AnsibleActionFail, match=stopped):
        act.run(task_vars={"inventory_hostname": "gpu1"})
    assert time.monotonic() - begin < 15
    # The whole session is gone: no stand-in pip is left running on its recorded output.
    time.sleep(0.5)
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "fake_pip.py")], capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout


def test_a_pip_that_ends_without_a_status_fails(action, tmp_path):
    (tmp_path / "venv").mkdir()
    args = pip_args(tmp_path, SGLANG, pause=0, rc=0)
    # The session's shell is killed before it can write the exit status (as on a reboot or an OOM kill).
    script = tmp_path / "fake_pip.py"
    script.write_text("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n")
    act = action(args)
    result = act.run(task_vars={"inventory_hostname": "gpu1"})
    assert result["failed"] is True and result["rc"] is None, result
    assert "pip ended without an exit status" in result["msg"], result["msg"]


def test_check_mode_is_skipped_and_runs_nothing(action, tmp_path):
    act = action(pip_args(tmp_path, SGLANG, pause=0, rc=0), check_mode=True)
    with pytest.raises(AnsibleActionSkip):
        act.run(task_vars={})
    assert act.commands == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"argv": [], "log": "/x.log"}, "argv must be a non-empty list"),
        ({"argv": ["pip", ""], "log": "/x.log"}, "argv must be a non-empty list"),
        ({"argv": ["pip"], "log": "x.log"}, "log must be an absolute path on the host (is 'x.log')"),
        ({"argv": ["pip"], "log": "/x.log", "poll": 30}, "poll must be 1..15 seconds (is 30)"),
        ({"argv": ["pip"], "log": "/x.log", "poll": "often"}, "poll and timeout must be integers"),
        ({"argv": ["pip"], "log": "/x.log", "color": True}, "Invalid options for sglang_pip: color"),
        ({"argv": ["pip"], "log": "/x.log", "lock": {"dir": "/run/x"}}, "lock must be a dict with dir, name"),
    ],
)
def test_bad_arguments_fail_before_the_host_is_touched(action, args, message):
    act = action(args)
    with pytest.raises(AnsibleActionFail, match=message.replace("(", r"\(").replace(")", r"\)")):
        act.run(task_vars={})
    assert act.commands == []


def test_start_command_runs_argv_exactly(tmp_path):
    """Arguments with spaces, quotes and $ reach the process unchanged (no shell expansion)."""
    log = tmp_path / "out.log"
    argv = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "it's", "$HOME", '"q"']
    pid = subprocess.run(
        ["sh", "-c", plugin.start_command(argv, str(log))], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert pid.isdigit()
    deadline = time.monotonic() + 10
    while not (tmp_path / "out.log.rc").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (tmp_path / "out.log.rc").read_text().strip() == "0"
    assert log.read_text() == str(["a b", "it's", "$HOME", '"q"']) + "\n"
    assert os.stat(tmp_path / "out.log.rc").st_mode & 0o077 == 0


class LockedAction(LocalAction):
    """And its sglang_lock calls run by the real module here (what it would run on the host)."""

    def _execute_module(self, module_name=None, module_args=None, task_vars=None, **kwargs):
        from conftest import call_main, load_module

        self.commands.append(f"module {module_name} {module_args.get('state')}")
        result, _text = call_main(load_module(module_name), dict(module_args))
        return result


def held_lock(tmp_path, token: str, lease: int) -> dict:
    from ansible.module_utils import sglang_lock as lock_record

    directory = tmp_path / "run" / "sglang-deploy"
    directory.mkdir(parents=True, mode=0o700)
    record = lock_record.new_record(
        {"name": "sglang", "doing": "installing", "lease": lease, "controller": {"host": "ctl-a", "pid": 7}},
        None,
        token,
    )
    lock_record.write_record(str(directory / "sglang.lock"), record)
    return {"dir": str(directory), "name": "sglang", "token": token}


def locked_action(action, args):
    act = action(args)
    locked = LockedAction(act._task, act._connection, None, None, None)
    locked.commands, locked.shown, locked.tty = [], act.shown, False
    return locked


def test_the_install_checks_the_deploy_lock_first_and_renews_its_lease_while_pip_runs(action, tmp_path):
    """A run whose lock was taken over installs nothing; one that holds it keeps it however long pip runs:
    the lease (here shorter than the install) is renewed while pip works, and the lock says so."""
    import json

    (tmp_path / "venv").mkdir()
    lock = held_lock(tmp_path, "a" * 32, lease=2)
    path = tmp_path / "run" / "sglang-deploy" / "sglang.lock"
    lost = locked_action(
        action, pip_args(tmp_path, DEPENDENCIES, pause=0, rc=0, lock=dict(lock, token="b" * 32))
    )
    with pytest.raises(AnsibleActionFail, match="no longer holds the deploy lock of sglang.*PID 7"):
        lost.run(task_vars={"inventory_hostname": "gpu1"})
    assert lost.commands == ["module sglang_lock renewed"]  # pip never started

    act = locked_action(action, pip_args(tmp_path, DEPENDENCIES, pause=4, rc=0, lock=lock))
    result = act.run(task_vars={"inventory_hostname": "gpu1"})
    assert result["changed"] is True and not result.get("failed"), result
    renewals = [c for c in act.commands if c.startswith("module sglang_lock")]
    assert len(renewals) >= 3, act.commands  # before pip, and at least twice while it ran
    record = json.loads(path.read_text())
    assert record["token"] == "a" * 32 and record["lease_seconds"] == 2
    assert record["doing"].startswith("SGLang 0.5.23: pip install"), record["doing"]


def test_an_install_whose_lock_is_taken_over_is_stopped(action, tmp_path):
    from ansible.module_utils import sglang_lock as lock_record

    (tmp_path / "venv").mkdir()
    lock = held_lock(tmp_path, "a" * 32, lease=2)
    act = locked_action(action, pip_args(tmp_path, DEPENDENCIES, pause=60, rc=0, lock=lock))
    real = act._execute_module

    def taken_over_after_the_first(**kwargs):
        result = real(**kwargs)
        other = lock_record.new_record(
            {"name": "sglang", "doing": "deploying", "lease": 60, "controller": {"host": "ctl-b", "pid": 8}},
            None,
            "c" * 32,
        )
        lock_record.write_record(str(tmp_path / "run" / "sglang-deploy" / "sglang.lock"), other)
        return result

    act._execute_module = taken_over_after_the_first
    begin = time.monotonic()
    with pytest.raises(
        AnsibleActionFail, match="pip stopped.*no longer holds the deploy lock.*PID 8 on controller ctl-b"
    ):
        act.run(task_vars={"inventory_hostname": "gpu1"})
    assert time.monotonic() - begin < 15
    time.sleep(0.5)
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "fake_pip.py")], capture_output=True, text=True)
    assert ps.stdout.strip() == "", ps.stdout
