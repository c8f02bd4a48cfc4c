"""tools/gitops: controller paths another local user cannot pre-create (issue 16, item 5).

The deploy lock lives in a directory of the invoking user's with mode 0700 and neither it nor the lock
file is opened through a symlink; ansible's SSH ControlPath sockets live under the user's home."""

from __future__ import annotations

import configparser
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools" / "gitops"))

import gitops  # noqa: E402

HOLDER = {"commit": "c0ffee", "pid": 1}


def lock(lock_dir: Path, wait: float = 0):
    return gitops.deploy_lock(lock_dir, "inventory/site/hosts.yml", wait, HOLDER)


def test_default_lock_dir_is_the_users_own(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert gitops.default_lock_dir() == tmp_path / "run" / "sglang-gitops"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert gitops.default_lock_dir() == tmp_path / "home" / ".cache" / "sglang-gitops"


def test_lock_dir_is_created_0700_and_the_holder_written(tmp_path):
    lock_dir = tmp_path / "a" / "locks"
    with lock(lock_dir) as path:
        assert path == lock_dir / "inventory_site_hosts.yml.lock"
        assert (os.stat(lock_dir).st_mode & 0o777) == 0o700
        assert (os.stat(path).st_mode & 0o777) == 0o600
        assert json.loads(path.read_text()) == HOLDER


def test_planted_lock_file_symlink_is_not_followed(tmp_path):
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (lock_dir / "inventory_site_hosts.yml.lock").symlink_to(victim)
    with pytest.raises(gitops.GitopsError, match="symlink is never followed"), lock(lock_dir):
        pass
    assert victim.read_text() == "precious\n"


def test_symlinked_lock_dir_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "locks").symlink_to(real)
    with pytest.raises(gitops.GitopsError, match="--lock-dir .*symlink is never followed"):
        lock(tmp_path / "locks").__enter__()
    assert list(real.iterdir()) == []


def test_lock_dir_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(gitops.GitopsError, match=r"mode 1777, others may create or replace"), lock(shared):
        pass
    assert list(shared.iterdir()) == []


def test_lock_dir_of_another_user_is_refused(tmp_path):
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    if os.geteuid() == 0:
        os.chown(other, 65534, 65534)
        expected = "owned by uid 65534"
    else:  # a directory root owns, as an unprivileged user sees it
        other = Path("/")
        expected = "owned by uid 0"
    with pytest.raises(gitops.GitopsError, match=expected), lock(other):
        pass


def test_held_lock_names_the_holder(tmp_path):
    lock_dir = tmp_path / "locks"
    with lock(lock_dir) as path:
        fd = os.open(path, os.O_RDONLY)
        try:
            # flock is per open file description: a second open in this process is a second holder.
            held = "another deploy of inventory/site/hosts.yml holds .*c0ffee"
            with pytest.raises(gitops.LockHeld, match=held), lock(lock_dir):
                pass
        finally:
            os.close(fd)
    fd = os.open(lock_dir / "inventory_site_hosts.yml.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released after the with block
    os.close(fd)


def test_apply_exits_1_not_3_for_a_bad_lock_dir(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = subprocess.run(
        [
            sys.executable,
            REPO / "tools" / "gitops" / "apply",
            "--repo",
            REPO,
            "--inventory",
            "inventory/sample/hosts.yml",
            "--lock-dir",
            shared,
            "--out",
            tmp_path / "out",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert f"--lock-dir {shared}: mode 0777" in r.stderr


def test_ssh_control_path_is_under_the_users_home():
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    ssh = cfg["ssh_connection"]
    assert ssh["control_path_dir"].startswith("~/"), ssh["control_path_dir"]
    assert "ControlPath" not in ssh.get("ssh_args", "")
    assert "control_path" not in ssh
