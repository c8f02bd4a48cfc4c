"""sglang_lock (real main(), real processes and files) and the controller side of its action plugin.

The lock spans Ansible tasks, which are separate processes: each call decides from the holder record
on the host. These tests hold the lock from one call and contend for it from the next, as two runs do.
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
from ansible.module_utils import sglang_lock as lock_record
from conftest import REPO, call_main, load_module

CONTROLLER = {
    "host": "ctl-a",
    "user": "alice",
    "pid": 4242,
    "pid_start": 1,
    "machine_id": "0" * 32,
    "boot_id": "b" * 36,
    "playbook": "deploy.yml",
    "play": "Deploy SGLang and verify the running server",
}


def said(result):
    """What the module said: its message, which it also warns (the warnings themselves are not in the
    result once anything in this process imported Ansible's controller code: then they go to Display)."""
    return result.get("message", "")


def lock(tmp_path, **args):
    (tmp_path / "run").mkdir(exist_ok=True)  # stands for /run, which exists on every host
    args.setdefault("name", "sglang")
    args.setdefault("dir", str(tmp_path / "run" / "sglang-deploy"))
    return call_main(load_module("sglang_lock"), args)


@pytest.fixture
def live():
    """A live process on this host standing for a holder's connection process."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_free_lock_is_taken_root_only_and_released(tmp_path, live):
    (result, text) = lock(
        tmp_path, doing="installing and configuring sglang", anchor_pid=live.pid, controller=CONTROLLER
    )
    assert not result.get("failed"), text
    assert result["changed"] is False and len(result["token"]) == 32 and "took_over" not in result
    path = tmp_path / "run" / "sglang-deploy" / "sglang.lock"
    assert result["lock_file"] == str(path)
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    record = json.loads(path.read_text())
    assert record["token"] == result["token"] and record["controller"] == CONTROLLER
    assert record["anchor"]["pid"] == live.pid and record["anchor"]["comm"] == "sleep"
    assert record["doing"] == "installing and configuring sglang"
    released, _ = lock(tmp_path, state="released", token=result["token"])
    assert released["released"] is True and released["changed"] is False
    assert not path.exists()


def test_live_holder_refuses_a_second_deploy_naming_it(tmp_path, live):
    first, _ = lock(
        tmp_path, doing="restarting sglang.service with proof", anchor_pid=live.pid, controller=CONTROLLER
    )
    before = (tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_bytes()
    started = time.monotonic()
    second, text = lock(tmp_path, controller=dict(CONTROLLER, host="ctl-b", user="bob", pid=77))
    refused_after = time.monotonic() - started
    assert second["failed"] is True and second["token"] == ""
    msg = second["msg"]
    for part in (
        "ansible-playbook PID 4242",
        "controller ctl-a",
        "user alice",
        "playbook deploy.yml",
        "restarting sglang.service with proof",
        f"sleep PID {live.pid}",
        first["holder"]["acquired"],
        "sglang_lock_wait",
    ):
        assert part in msg, (part, msg)
    assert second["holder"]["token"] == first["token"]
    assert refused_after < 2
    assert (tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_bytes() == before


def test_wait_acquires_when_the_holder_releases(tmp_path, live):
    first, _ = lock(tmp_path, anchor_pid=live.pid, controller=CONTROLLER)
    child = os.fork()
    if child == 0:  # the holder: releases 1.5 s later, through the module
        try:
            time.sleep(1.5)
            lock(tmp_path, state="released", token=first["token"])
        finally:
            os._exit(0)
    try:
        started = time.monotonic()
        second, text = lock(tmp_path, wait=30, anchor_pid=live.pid, controller=dict(CONTROLLER, pid=77))
        waited = time.monotonic() - started
    finally:
        os.waitpid(child, 0)
    assert not second.get("failed"), text
    assert second["token"] != first["token"] and "took_over" not in second
    assert 1.0 < waited < 10 and 1.0 < second["waited"] < 10


def test_wait_that_runs_out_is_refused_and_says_it_waited(tmp_path, live):
    lock(tmp_path, anchor_pid=live.pid, controller=CONTROLLER)
    started = time.monotonic()
    second, _ = lock(tmp_path, wait=1, controller=dict(CONTROLLER, pid=77))
    assert second["failed"] is True and "after waiting 1 s" in second["msg"]
    assert 1.0 <= time.monotonic() - started < 5


def named_process(tmp_path, name, argv0=None):
    """A live process on this host whose comm is ``name`` (a copy of sleep under that name), its argv[0]
    ``argv0``: what /proc shows of a holder's sshd or of a local run's ansible-playbook."""
    exe = tmp_path / name
    exe.write_bytes(Path("/bin/sleep").read_bytes())
    exe.chmod(0o755)
    return subprocess.Popen([argv0 or str(exe), "60"], executable=str(exe))


def test_holder_whose_connection_process_is_gone_keeps_its_lock_while_its_lease_runs(tmp_path):
    """Without ControlMaster each task has its own sshd: the one a holder took the lock under ends with that
    task, while the run goes on. Its end proves nothing; the lease (renewed by every locked call) does."""
    sshd = named_process(tmp_path, "sshd")
    first, _ = lock(tmp_path, anchor_pid=sshd.pid, controller=CONTROLLER, doing="installing sglang")
    assert first["holder"]["anchor"]["comm"] == "sshd"
    sshd.kill()
    sshd.wait()
    second, text = lock(tmp_path, controller=dict(CONTROLLER, host="ctl-b", pid=77))
    assert second["failed"] is True and "took_over" not in second, text
    assert f"on this host sshd PID {sshd.pid}" in second["msg"] and "installing sglang" in second["msg"]
    record = json.loads((tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_text())
    assert record["token"] == first["token"]


def test_holder_whose_process_is_gone_is_taken_over_and_reported(tmp_path):
    """A local run (pull mode, ansible_connection local): its anchor is its own ansible-playbook on this
    host, whose end is certain death."""
    proc = named_process(tmp_path, "python3", argv0="/usr/bin/ansible-playbook")
    first, _ = lock(tmp_path, anchor_pid=proc.pid, controller=CONTROLLER, doing="restarting sglang.service")
    proc.kill()
    proc.wait()
    second, text = lock(tmp_path, controller=dict(CONTROLLER, pid=77))
    assert not second.get("failed"), text
    took = second["took_over"]
    assert took["token"] == first["token"] and took["doing"] == "restarting sglang.service"
    assert took["reason"] == f"its ansible-playbook process on this host (PID {proc.pid}) is gone"
    warning = said(second)
    assert "took over the deploy lock of sglang" in warning and "ansible-playbook PID 4242" in warning
    record = json.loads((tmp_path / "run" / "sglang-deploy" / "sglang.lock").read_text())
    assert record["token"] == second["token"]


def test_a_locked_write_checks_the_token_and_renews_the_lease(tmp_path, live):
    """hold(): what every module that writes under the lock calls first (one shared check)."""
    first, _ = lock(tmp_path, anchor_pid=live.pid, lease=60, controller=CONTROLLER, doing="installing")
    directory = str(tmp_path / "run" / "sglang-deploy")
    path = tmp_path / "run" / "sglang-deploy" / "sglang.lock"
    before = json.loads(path.read_text())
    time.sleep(1.1)
    mine = lock_record.hold({"dir": directory, "name": "sglang", "token": first["token"]})
    record = json.loads(path.read_text())
    assert mine == record and record["token"] == first["token"] and record["doing"] == "installing"
    # No lease given: the record's own, counted from now.
    assert record["lease_seconds"] == 60 and record["lease_until_boottime"] > before["lease_until_boottime"]
    lock_record.hold({"dir": directory, "name": "sglang", "token": first["token"]}, doing="marking")
    assert json.loads(path.read_text())["doing"] == "marking"
    kept = path.read_bytes()
    with pytest.raises(lock_record.LockError, match="no longer holds the deploy lock of sglang.*PID 4242"):
        lock_record.hold({"dir": directory, "name": "sglang", "token": "0" * 32}, doing="pip install")
    assert path.read_bytes() == kept


def test_expired_lease_and_another_boot_are_taken_over(tmp_path, live, monkeypatch):
    lock(tmp_path, anchor_pid=live.pid, lease=1, controller=CONTROLLER)
    time.sleep(1.2)
    second, text = lock(tmp_path, anchor_pid=live.pid, controller=dict(CONTROLLER, pid=77))
    assert "its lease ran out at" in second["took_over"]["reason"], text

    module = load_module("sglang_lock")
    other_boot = tmp_path / "boot_id"
    other_boot.write_text("00000000-1111-2222-3333-444444444444\n")
    # The record's boot id is read where the record is made (module_utils/sglang_lock.py, shared).
    monkeypatch.setattr(lock_record, "BOOT_ID", str(other_boot))
    third, text = call_main(
        module,
        {
            "name": "sglang",
            "dir": str(tmp_path / "run" / "sglang-deploy"),
            "anchor_pid": live.pid,
            "controller": dict(CONTROLLER, pid=78),
        },
    )
    assert third["took_over"]["reason"].startswith("the host booted since it took the lock"), text
    assert third["took_over"]["token"] == second["token"]


def test_takeover_of_a_holder_proven_dead_on_its_controller_needs_its_token(tmp_path, live):
    first, _ = lock(tmp_path, anchor_pid=live.pid, controller=CONTROLLER)
    wrong, _ = lock(tmp_path, takeover="f" * 32, controller=dict(CONTROLLER, pid=77))
    assert wrong["failed"] is True
    reason = "its ansible-playbook process (PID 4242) on controller ctl-a is gone"
    right, text = lock(
        tmp_path, takeover=first["token"], takeover_reason=reason, controller=dict(CONTROLLER, pid=77)
    )
    assert not right.get("failed"), text
    assert right["took_over"]["reason"] == reason


def test_released_and_renewed_only_by_the_owner_token(tmp_path, live):
    first, _ = lock(tmp_path, anchor_pid=live.pid, controller=CONTROLLER)
    path = tmp_path / "run" / "sglang-deploy" / "sglang.lock"
    before = path.read_bytes()
    other, text = lock(tmp_path, state="released", token="0" * 32)
    assert not other.get("failed") and other["released"] is False, text
    assert "not this run's any more" in said(other)
    assert path.read_bytes() == before
    renew, _ = lock(tmp_path, state="renewed", token="0" * 32, doing="restarting sglang.service")
    assert renew["failed"] is True and "this run no longer holds the deploy lock" in renew["msg"]
    assert "ansible-playbook PID 4242" in renew["msg"] and path.read_bytes() == before
    renewed, _ = lock(tmp_path, state="renewed", token=first["token"], lease=90, doing="rolling back")
    record = json.loads(path.read_text())
    assert renewed["token"] == first["token"] and record["doing"] == "rolling back"
    assert record["lease_seconds"] == 90 and record["acquired"] == first["holder"]["acquired"]
    assert record["anchor"] == first["holder"]["anchor"]
    mine, _ = lock(tmp_path, state="released", token=first["token"])
    assert mine["released"] is True and not path.exists()
    again, _ = lock(tmp_path, state="released", token=first["token"])
    assert again["released"] is False and not again.get("failed")


def test_check_mode_takes_nothing_and_warns_about_a_deploy_in_progress(tmp_path, live):
    free, _ = lock(tmp_path, _ansible_check_mode=True)
    assert not free.get("failed") and free["token"] == ""
    assert not (tmp_path / "run" / "sglang-deploy").exists()
    lock(tmp_path, anchor_pid=live.pid, controller=CONTROLLER, doing="restarting sglang.service")
    path = tmp_path / "run" / "sglang-deploy" / "sglang.lock"
    before = path.read_bytes()
    held, _ = lock(tmp_path, _ansible_check_mode=True, controller=dict(CONTROLLER, pid=77))
    assert not held.get("failed") and held["token"] == ""
    assert "sglang is being deployed now by ansible-playbook PID 4242" in said(held)
    assert path.read_bytes() == before


def test_a_symlinked_lock_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sglang-deploy").symlink_to(target)  # e.g. planted by another user
    result, _ = lock(tmp_path)
    assert result["failed"] is True and "is not a directory" in result["msg"]
    assert list(target.iterdir()) == []


def _action_plugin():
    path = REPO / "action_plugins" / "sglang_lock.py"
    spec = importlib.util.spec_from_file_location("_action_sglang_lock", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_controller_side_proves_only_its_own_dead_runs(live):
    plugin = _action_plugin()
    me = plugin.controller_identity({"ansible_play_name": "p"})
    assert me["pid_start"] == plugin._start_ticks(me["pid"]) and me["play"] == "p"
    alive = {"controller": dict(me, pid=live.pid, pid_start=plugin._start_ticks(live.pid), host="ctl")}
    assert plugin.dead_here(alive, me) is None
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = {"controller": dict(alive["controller"], pid=gone.pid)}
    reason = plugin.dead_here(dead, me)
    assert reason == f"its ansible-playbook process (PID {gone.pid}) on controller ctl is gone"
    reused = {"controller": dict(alive["controller"], pid_start=alive["controller"]["pid_start"] + 1)}
    assert plugin.dead_here(reused, me) is not None
    elsewhere = {"controller": dict(dead["controller"], machine_id="f" * 32)}
    assert plugin.dead_here(elsewhere, me) is None
