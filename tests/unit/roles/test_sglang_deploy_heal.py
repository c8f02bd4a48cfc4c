"""roles/sglang/files/sglang-deploy-heal (the boot-time heal of P19), run as the unit runs it, on a tmp
tree: the pending marker is what library/sglang_unit.py writes, the known-good set what
library/sglang_history.py keeps (both produced by the real modules here, not written by hand). systemctl
is a stand-in script that logs its arguments (daemon-reload prints nothing)."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from conftest import REPO

HEAL = REPO / "roles" / "sglang" / "files" / "sglang-deploy-heal"
GOOD_UNIT = "[Service]\nExecStart=/opt/sglang/venv/bin/sglang serve --speculative-draft-window-size 2048\n"
NEW_UNIT = GOOD_UNIT.replace("2048", "4096")
GOOD_ENV = "HF_HOME=/var/lib/sglang/.cache/huggingface\n"
NEW_ENV = GOOD_ENV + "SGLANG_LAB_LOAD_SECONDS=40\n"
CONFIG = "api-key: sk-heal-test\n"
CONTROLLER = {"host": "ctl1", "user": "alice", "pid": 4242, "playbook": "deploy.yml"}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def host(tmp_path, monkeypatch, run_module):
    """A verified 2048 deploy (known-good kept by sglang_history), then an interrupted 4096 one: sglang_unit
    wrote the marker and the files, and the run stopped there."""
    root = tmp_path
    for d in ("system", "etc", "state", "run"):
        (root / d).mkdir()
    systemctl = root / "systemctl"
    systemctl.write_text(f'#!/bin/sh\necho "$@" >> {root / "systemctl.log"}\nexit "${{SYSTEMCTL_RC:-0}}"\n')
    systemctl.chmod(0o755)
    # systemctl show/daemon-reload/enable and systemd-analyze: what sglang_unit asks is not under test here.
    monkeypatch.setattr(AnsibleModule, "run_command", lambda self, cmd, **kw: (0, "", ""))
    monkeypatch.setattr(
        AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False, opt_dirs=None: shutil.which(name) or f"/usr/bin/{name}",
    )
    paths = {
        "unit": root / "system" / "sglang.service",
        "env": root / "etc" / "sglang.env",
        "config": root / "etc" / "sglang.yaml",
    }
    group = grp.getgrgid(os.getgid()).gr_name
    unit_args = {
        "name": "sglang.service",
        "unit_path": str(paths["unit"]),
        "env_path": str(paths["env"]),
        "config_path": str(paths["config"]),
        "config_content": CONFIG,
        "config_group": group,
        "previous_dir": str(root / "state" / "previous"),
        "pending_path": str(root / "state" / "sglang.pending.json"),
        # The shape of the deploy lock's holder record (action_plugins/sglang_lock.py controller_identity).
        "pending_by": {"controller": CONTROLLER, "lock_token": "t-1"},
    }
    # The verified deploy: files written, then kept as known-good by the record (marker cleared).
    result, failed = run_module("sglang_unit", dict(unit_args, unit_content=GOOD_UNIT, env_content=GOOD_ENV))
    assert not failed, result
    result, failed = run_module(
        "sglang_history",
        {
            "path": str(root / "state" / "history.jsonl"),
            "clear_pending": unit_args["pending_path"],
            "known_good": {
                "dir": str(root / "state" / "known-good"),
                "files": {k: str(v) for k, v in paths.items()},
                "meta_name": "sglang.json",
                "meta": {"unit": "sglang.service"},
            },
            "record": {"result": "verified"},
        },
    )
    assert not failed and result["pending_cleared"], result
    # The interrupted run.
    result, failed = run_module("sglang_unit", dict(unit_args, unit_content=NEW_UNIT, env_content=NEW_ENV))
    assert not failed and result["unit_changed"] and result["env_changed"], result
    assert paths["unit"].read_text() == NEW_UNIT
    argv = [
        sys.executable,
        str(HEAL),
        "--name",
        "sglang",
        "--unit-path",
        str(paths["unit"]),
        "--env-path",
        str(paths["env"]),
        "--config-path",
        str(paths["config"]),
        "--config-group",
        group,
        "--known-good-dir",
        str(root / "state" / "known-good"),
        "--marker",
        unit_args["pending_path"],
        "--history",
        str(root / "state" / "history.jsonl"),
        "--lock",
        str(root / "run" / "sglang.lock"),
        "--systemctl",
        str(systemctl),
        "--lib",
        str(REPO / "module_utils"),
    ]
    return {"root": root, "paths": paths, "argv": argv, "marker": Path(unit_args["pending_path"])}


def heal(host, **env):
    return subprocess.run(
        host["argv"], capture_output=True, text=True, env={**os.environ, **env}, check=False
    )


def history(host) -> list[dict]:
    return [json.loads(x) for x in (host["root"] / "state" / "history.jsonl").read_text().splitlines()]


def reloads(host) -> list[str]:
    log = host["root"] / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


def test_the_marker_written_by_sglang_unit_names_the_interrupted_write(host):
    marker = json.loads(host["marker"].read_text())
    assert marker["unit"] == "sglang.service" and marker["by"] == {
        "controller": CONTROLLER,
        "lock_token": "t-1",
    }
    assert set(marker["files"]) == {"unit", "env"}  # the --config file did not change
    assert marker["files"]["unit"] == {
        "path": str(host["paths"]["unit"]),
        "sha256": sha(NEW_UNIT),
        "sha256_before": sha(GOOD_UNIT),
    }
    assert stat.S_IMODE(host["marker"].stat().st_mode) == 0o600


def test_interrupted_deploy_is_restored_to_known_good_reloaded_recorded_and_the_marker_removed(host):
    r = heal(host)
    assert r.returncode == 0, r.stdout + r.stderr
    paths = host["paths"]
    assert paths["unit"].read_text() == GOOD_UNIT and paths["env"].read_text() == GOOD_ENV
    assert paths["config"].read_text() == CONFIG
    assert stat.S_IMODE(paths["unit"].stat().st_mode) == 0o644
    assert stat.S_IMODE(paths["env"].stat().st_mode) == 0o600
    assert stat.S_IMODE(paths["config"].stat().st_mode) == 0o640
    assert reloads(host) == ["daemon-reload"]
    assert not host["marker"].exists()
    record = history(host)[-1]
    assert record["result"] == "healed_at_boot" and record["unit"] == "sglang.service"
    assert record["unit_sha256"] == sha(GOOD_UNIT) and record["env_sha256"] == sha(GOOD_ENV)
    assert record["restored"] == [str(paths["env"]), str(paths["unit"])]  # the config was known-good already
    assert record["pending"]["files"]["unit"]["sha256"] == sha(NEW_UNIT)
    out = r.stdout
    assert out.startswith("<5>a deploy of sglang.service stopped between writing and verifying (")
    assert "by ansible-playbook PID 4242 on controller ctl1 (user alice, playbook deploy.yml)" in out
    assert "started " in out and str(paths["unit"]) in out
    assert "starts the last VERIFIED configuration" in out and "healed_at_boot" in out

    # At the next boot there is nothing left to do.
    r = heal(host)
    assert r.returncode == 0 and "no interrupted deploy of sglang.service" in r.stdout
    assert reloads(host) == ["daemon-reload"] and len(history(host)) == 2


def test_without_a_marker_nothing_is_touched(host):
    host["marker"].unlink()
    r = heal(host)
    assert r.returncode == 0 and r.stdout.startswith("<5>no interrupted deploy")
    assert host["paths"]["unit"].read_text() == NEW_UNIT and reloads(host) == []
    assert [x["result"] for x in history(host)] == ["verified"]


def test_a_held_deploy_lock_leaves_the_files_to_that_deploy(host):
    (host["root"] / "run" / "sglang.lock").write_text("{}")
    r = heal(host)
    assert r.returncode == 0 and "a deploy holds" in r.stdout
    assert host["paths"]["unit"].read_text() == NEW_UNIT and host["marker"].exists() and reloads(host) == []


def test_a_known_good_file_that_does_not_match_its_recorded_hash_is_not_restored(host):
    (host["root"] / "state" / "known-good" / "sglang.service").write_text(GOOD_UNIT + "# edited\n")
    r = heal(host)
    assert r.returncode == 1
    assert r.stdout.startswith("<3>") and "NOT healed: the known-good copies are not the ones" in r.stdout
    assert "sglang.service (sha256 " in r.stdout  # the same reader and message as the rollback's
    assert host["paths"]["unit"].read_text() == NEW_UNIT and host["paths"]["env"].read_text() == NEW_ENV
    assert host["marker"].exists() and reloads(host) == []
    assert history(host)[-1]["result"] == "heal_failed"


def test_no_known_good_set_keeps_the_marker_and_says_the_files_are_unverified(host):
    # The known-good set is a symlink to its generation directory (library/sglang_history.py): remove both.
    link = host["root"] / "state" / "known-good"
    shutil.rmtree(link.resolve())
    link.unlink()
    r = heal(host)
    assert (
        r.returncode == 1 and "cannot read the known-good metadata" in r.stdout and "UNVERIFIED" in r.stdout
    )
    assert host["marker"].exists() and host["paths"]["unit"].read_text() == NEW_UNIT


def test_a_failed_daemon_reload_keeps_the_marker(host):
    r = heal(host, SYSTEMCTL_RC="1")
    assert r.returncode == 1 and "daemon-reload failed (rc 1)" in r.stdout
    assert host["marker"].exists()
    assert [x["result"] for x in history(host)] == ["verified"]


def test_an_unreadable_marker_is_still_healed(host):
    host["marker"].write_text("{truncated")
    r = heal(host)
    assert r.returncode == 0 and "unreadable marker (not JSON" in r.stdout
    assert host["paths"]["unit"].read_text() == GOOD_UNIT and not host["marker"].exists()
