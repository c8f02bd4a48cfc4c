"""library/sglang_unit.py: real main(); ``systemctl show`` answers are recorded real outputs
(tests/fixtures/systemd/unit-show-*.txt, see SOURCE.md), ``systemd-analyze verify`` is the real one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from conftest import FIXTURES

SHOW = FIXTURES / "systemd"
SENTINEL = "sk-sentinel-unit-77"
UNIT = """[Unit]
Description=SGLang

[Service]
Type=simple
EnvironmentFile=/etc/sglang/sglang.env
ExecStart=/usr/bin/python3 -m sglang.launch_server "--speculative-draft-window-size" "{window}"
KillMode=control-group

[Install]
WantedBy=multi-user.target
"""
ENV = f"SGLANG_API_KEY={SENTINEL}\nHF_HOME=/var/lib/sglang/hf\n"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Fake systemctl (show answers from recorded files, in order); the real systemd-analyze."""
    state = {"show": [], "calls": []}

    def fake(self, cmd, **kwargs):
        name = os.path.basename(cmd[0])
        if name == "systemd-analyze":
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, **kwargs.get("environ_update", {})}
            )
            state["calls"].append(["systemd-analyze", cmd[1], proc.returncode])
            return proc.returncode, proc.stdout, proc.stderr
        assert name == "systemctl", cmd
        state["calls"].append(cmd[1:])
        if cmd[1] == "show":
            fixture = state["show"].pop(0) if len(state["show"]) > 1 else state["show"][0]
            return 0, (SHOW / fixture).read_text(), ""
        return 0, "", ""

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    monkeypatch.setattr(
        AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False, opt_dirs=None: shutil.which(name) or f"/usr/bin/{name}",
    )
    (tmp_path / "system").mkdir()
    (tmp_path / "etc").mkdir()
    state["args"] = {
        "name": "sglang.service",
        "unit_path": str(tmp_path / "system" / "sglang.service"),
        "unit_content": UNIT.format(window=2048),
        "env_path": str(tmp_path / "etc" / "sglang.env"),
        "env_content": ENV,
        "previous_dir": str(tmp_path / "previous"),
    }
    state["tmp"] = tmp_path
    return state


def actions(state):
    return [c for c in state["calls"] if c[0] != "show"]


def test_first_install_writes_both_files_reloads_and_enables(run_module, host):
    host["show"] = ["unit-show-not-found.txt", "unit-show-enabled.txt"]
    result, failed = run_module("sglang_unit", host["args"])
    assert not failed, result
    assert (
        result["unit_changed"]
        and result["env_changed"]
        and result["daemon_reloaded"]
        and result["enabled_now"]
    )
    assert actions(host) == [
        ["systemd-analyze", "verify", 0],
        ["daemon-reload"],
        ["enable", "--", "sglang.service"],
    ]
    unit, env = host["args"]["unit_path"], host["args"]["env_path"]
    assert Path(unit).read_text() == UNIT.format(window=2048) and Path(env).read_text() == ENV
    assert stat.S_IMODE(os.stat(unit).st_mode) == 0o644 and stat.S_IMODE(os.stat(env).st_mode) == 0o600
    assert result["status"]["UnitFileState"] == "enabled" and result["status"]["LoadState"] == "loaded"
    assert not os.path.exists(host["args"]["previous_dir"])  # nothing was replaced
    assert SENTINEL not in run_module.last_output


def test_unchanged_files_on_an_enabled_current_unit_change_nothing(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    mtime = os.stat(host["args"]["unit_path"]).st_mtime_ns
    result, failed = run_module("sglang_unit", host["args"])
    assert not failed and result["changed"] is False, result
    assert actions(host) == []
    assert os.stat(host["args"]["unit_path"]).st_mtime_ns == mtime


def test_window_change_keeps_the_previous_unit_and_diffs_only_the_unit(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    args = dict(
        host["args"], unit_content=UNIT.format(window=4096), env_content=ENV + "X=1\n", _ansible_diff=True
    )
    result, failed = run_module("sglang_unit", args)
    assert not failed, result
    assert (
        result["unit_changed"]
        and result["env_changed"]
        and result["daemon_reloaded"]
        and not result["enabled_now"]
    )
    assert actions(host) == [["systemd-analyze", "verify", 0], ["daemon-reload"]]
    assert '"4096"' in result["diff"]["after"] and '"2048"' in result["diff"]["before"]
    assert SENTINEL not in run_module.last_output
    previous = host["tmp"] / "previous"
    assert (previous / "sglang.service.previous").read_text() == UNIT.format(window=2048)
    assert (previous / "sglang.env.previous").read_text() == ENV
    assert stat.S_IMODE(os.stat(previous / "sglang.env.previous").st_mode) == 0o600
    assert '"4096"' in Path(host["args"]["unit_path"]).read_text()


def test_env_only_change_does_not_reload_systemd(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    result, failed = run_module("sglang_unit", dict(host["args"], env_content=ENV + "NCCL_P2P_DISABLE=1\n"))
    assert (
        not failed and result["env_changed"] and not result["unit_changed"] and not result["daemon_reloaded"]
    )
    assert actions(host) == []


def test_a_file_changed_since_the_decision_read_it_fails_and_nothing_is_written(run_module, host):
    """expect_changed (the decision's files): the unit is to change, but the env file differs although the
    decision saw it current (edited by hand meanwhile): the call fails naming it, no marker, no file, no
    daemon-reload. What the decision expected alone goes through."""
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    Path(host["args"]["env_path"]).write_text(ENV + "EDITED_BY_HAND=1\n")
    marker = host["tmp"] / "state" / "sglang.pending.json"
    expect = {"unit": True, "env": False, "config": False, "current": False, "verified": False}
    args = dict(
        host["args"], unit_content=UNIT.format(window=4096), pending_path=str(marker), expect_changed=expect
    )
    result, failed = run_module("sglang_unit", args)
    assert failed, result
    assert result["msg"] == (
        f"{args['env_path']} of sglang.service changed on disk after this run read it (by hand?); nothing "
        "was written. The next run decides again from what is on disk."
    )
    assert not (result["unit_changed"] or result["env_changed"]) and not marker.exists()
    assert '"2048"' in Path(args["unit_path"]).read_text()
    assert "EDITED_BY_HAND" in Path(args["env_path"]).read_text()
    assert [c[0] for c in actions(host)] == ["systemd-analyze"], actions(host)
    # The decision expected both: written.
    result, failed = run_module("sglang_unit", dict(args, expect_changed=dict(expect, env=True)))
    assert not failed and result["unit_changed"] and result["env_changed"], result
    assert Path(args["env_path"]).read_text() == ENV


def test_a_unit_systemd_refuses_leaves_the_host_as_it_was(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    bad = UNIT.format(window=4096).replace("KillMode=control-group", "ExecStartPre=relative/path")
    result, failed = run_module(
        "sglang_unit", dict(host["args"], unit_content=bad, env_content=ENV + "Y=2\n")
    )
    assert failed
    assert "systemd-analyze verify refused the new sglang.service" in result["msg"]
    assert "relative/path" in result["msg"] and host["args"]["unit_path"] in result["msg"]
    assert actions(host) == [["systemd-analyze", "verify", 1]]
    assert Path(host["args"]["unit_path"]).read_text() == UNIT.format(window=2048)
    assert Path(host["args"]["env_path"]).read_text() == ENV
    assert not os.path.exists(host["args"]["previous_dir"])


def test_check_mode_validates_reports_and_writes_nothing(run_module, host):
    host["show"] = ["unit-show-not-found.txt"]
    result, failed = run_module("sglang_unit", dict(host["args"], _ansible_check_mode=True))
    assert not failed and result["changed"] and result["unit_changed"] and result["daemon_reloaded"]
    assert actions(host) == [["systemd-analyze", "verify", 0]]
    assert not os.path.exists(host["args"]["unit_path"]) and not os.path.exists(host["args"]["env_path"])
    assert result["status"]["LoadState"] == "not-found"


def test_systemd_holding_an_older_definition_is_reloaded(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    host["calls"].clear()
    host["show"] = ["unit-show-need-reload.txt", "unit-show-enabled.txt"]
    result, failed = run_module("sglang_unit", host["args"])
    assert not failed and result["changed"] and result["daemon_reloaded"]
    assert not result["unit_changed"] and not result["env_changed"]
    assert actions(host) == [["daemon-reload"]]
    assert result["status"]["NeedDaemonReload"] == "no"


def test_wrong_mode_is_corrected(run_module, host):
    host["show"] = ["unit-show-enabled.txt"]
    run_module("sglang_unit", host["args"])
    os.chmod(host["args"]["env_path"], 0o644)
    result, failed = run_module("sglang_unit", host["args"])
    assert not failed and result["env_changed"] and not result["unit_changed"]
    assert stat.S_IMODE(os.stat(host["args"]["env_path"]).st_mode) == 0o600


def test_pending_marker_is_written_before_the_files_and_only_when_a_file_changes(
    run_module, host, monkeypatch
):
    host["show"] = ["unit-show-enabled.txt"]
    marker = host["tmp"] / "state" / "sglang.pending.json"
    args = dict(host["args"], pending_path=str(marker), pending_by={"controller": {"user": "alice"}})
    result, failed = run_module("sglang_unit", args)
    assert not failed and result["pending_marker"]["files"]["unit"]["sha256_before"] is None, result
    assert json.loads(marker.read_text()) == result["pending_marker"]
    marker.unlink()  # what the verified deploy's record does (sglang_history clear_pending)

    # Nothing changes: no marker. Check mode: none either.
    result, failed = run_module("sglang_unit", args)
    assert not failed and result["pending_marker"] is None and not marker.exists()
    result, failed = run_module(
        "sglang_unit", dict(args, unit_content=UNIT.format(window=4096), _ansible_check_mode=True)
    )
    assert not failed and result["unit_changed"] and result["pending_marker"] is None and not marker.exists()

    # ENOSPC while the unit is written: the env file is new already, the marker names both.
    real_replace = os.replace

    def full_disk(src, dst):
        if dst == args["unit_path"]:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        run_module(
            "sglang_unit", dict(args, unit_content=UNIT.format(window=4096), env_content=ENV + "X=1\n")
        )
    monkeypatch.setattr(os, "replace", real_replace)
    left = json.loads(marker.read_text())
    assert set(left["files"]) == {"unit", "env"} and left["by"] == {"controller": {"user": "alice"}}
    assert left["files"]["unit"]["sha256"] == hashlib.sha256(UNIT.format(window=4096).encode()).hexdigest()
    assert Path(args["env_path"]).read_text() == ENV + "X=1\n"
    assert '"2048"' in Path(args["unit_path"]).read_text()


def test_the_deploy_lock_is_renewed_for_the_restart_in_the_call_that_writes(run_module, host, tmp_path):
    """With ``lock``, the record says what comes next (the restart) and its lease is extended, before the
    files are written; a lock that is not this run's any more fails the call, naming its holder."""
    from ansible.module_utils import sglang_lock as lock_record

    lock_dir = tmp_path / "lock"
    lock_dir.mkdir(mode=0o700)
    held = lock_record.new_record(
        {"name": "sglang", "doing": "preparing", "lease": 60, "controller": {"host": "ctl-a", "pid": 7}},
        None,
        "a" * 32,
    )
    lock_record.write_record(str(lock_dir / "sglang.lock"), held)
    host["show"] = ["unit-show-enabled.txt"]
    lock = {"dir": str(lock_dir), "name": "sglang", "token": "a" * 32, "lease": 900, "doing": "restarting x"}
    result, failed = run_module("sglang_unit", dict(host["args"], lock=lock))
    assert not failed and result["lock_renewed"] and result["unit_changed"], result
    record = json.loads((lock_dir / "sglang.lock").read_text())
    assert record["doing"] == "restarting x" and record["lease_seconds"] == 900
    assert record["acquired"] == held["acquired"] and record["controller"] == held["controller"]

    other = dict(lock, token="b" * 32)
    result, failed = run_module(
        "sglang_unit", dict(host["args"], unit_content=UNIT.format(window=4096), lock=other)
    )
    assert failed and "no longer holds the deploy lock of sglang" in result["msg"], result
    assert "ansible-playbook PID 7 on controller ctl-a" in result["msg"]
    assert json.loads((lock_dir / "sglang.lock").read_text())["token"] == "a" * 32


def test_a_lock_that_is_not_this_runs_fails_before_anything_is_written(run_module, host, tmp_path):
    """A run whose lock was taken over writes nothing: no pending marker, no file, no daemon-reload, no
    enable (the lock is checked, and renewed, before the first write)."""
    from ansible.module_utils import sglang_lock as lock_record

    lock_dir = tmp_path / "lock"
    lock_dir.mkdir(mode=0o700)
    held = lock_record.new_record(
        {"name": "sglang", "doing": "deploying", "lease": 60, "controller": {"host": "ctl-b", "pid": 8}},
        None,
        "b" * 32,
    )
    lock_record.write_record(str(lock_dir / "sglang.lock"), held)
    host["show"] = ["unit-show-not-found.txt"]  # a first install: it would reload and enable
    marker = tmp_path / "state" / "sglang.pending.json"
    lock = {"dir": str(lock_dir), "name": "sglang", "token": "a" * 32, "lease": 900, "doing": "restarting x"}
    args = dict(host["args"], pending_path=str(marker), lock=lock)
    result, failed = run_module("sglang_unit", args)
    assert failed and "no longer holds the deploy lock of sglang" in result["msg"], result
    assert "ansible-playbook PID 8 on controller ctl-b" in result["msg"]
    assert "nothing was changed" in result["msg"]
    assert not marker.exists()
    assert not Path(args["unit_path"]).exists() and not Path(args["env_path"]).exists()
    assert [c[0] for c in actions(host)] == ["systemd-analyze"], actions(host)  # the unit checked, no more
    assert json.loads((lock_dir / "sglang.lock").read_text()) == held
