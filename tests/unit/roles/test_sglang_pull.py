"""roles/sglang_pull/files/sglang-pull on local git repositories (issue 16, item 4).

Real git, real ssh-keygen signatures; ansible-pull is a recording stand-in (the lab test
tests/integration/test_gitops.py runs the real one on a lab host). Pull mode moves forward only,
judges a key's validity at the time of the fetch, reports a failure once, resumes an interrupted
run, and never prints a credential of the repository URL."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_playbook

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "roles" / "sglang_pull" / "files" / "sglang-pull"


@pytest.fixture
def pull():
    loader = importlib.machinery.SourceFileLoader("sglang_pull_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def sh(*argv, cwd=None, env=None, check=True):
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{argv}: {r.stderr}")
    return r.stdout.strip()


class World:
    """An upstream repository, a signing key, a pull configuration, a recording ansible-pull."""

    def __init__(self, tmp: Path, signer_options: str = 'namespaces="git"'):
        self.tmp = tmp
        self.up = tmp / "upstream"
        sh("git", "init", "--quiet", "-b", "deploy", self.up)
        self.key = tmp / "signing_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "t", "-f", self.key)
        self.other_key = tmp / "other_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "o", "-f", self.other_key)
        kind, b64 = (tmp / "signing_key.pub").read_text().split()[:2]
        self.signers = tmp / "allowed_signers"
        self.signers.write_text(f"ops@lab.invalid {signer_options} {kind} {b64}\n")
        self.calls = tmp / "calls"
        self.rc = tmp / "rc"
        fake = tmp / "ansible-pull"
        rc = f"$(cat {self.rc} 2>/dev/null || echo 0)"
        fake.write_text(f'#!/bin/sh\necho "$*" >> {self.calls}\nexit {rc}\n')
        fake.chmod(0o755)
        # The real ansible-inventory of the controller's toolchain, where the pull venv has it.
        (tmp / "ansible-inventory").symlink_to(REPO / ".venv" / "bin" / "ansible-inventory")
        self.cfg = {
            "url": str(self.up),
            "branch": "deploy",
            "allowed_signers": str(self.signers),
            "inventory": "inv.yml",
            "limit": "h1",
            "playbook": "deploy.yml",
            "state_dir": str(tmp / "state"),
            "ansible_pull": str(fake),
        }
        (tmp / "state").mkdir(mode=0o700)

    def commit(
        self, msg: str, key: Path | None = None, date: str | None = None, inventory: str = "all: {}\n"
    ) -> str:
        (self.up / "inv.yml").write_text(f"# {msg}\n{inventory}")
        sh("git", "-C", self.up, "add", "inv.yml")
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}"] if key else []
        env = dict(
            os.environ,
            GIT_AUTHOR_NAME="t",
            GIT_AUTHOR_EMAIL="t@lab.invalid",
            GIT_COMMITTER_NAME="t",
            GIT_COMMITTER_EMAIL="t@lab.invalid",
        )
        if date:
            env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        sh("git", "-C", self.up, *sign, "commit", "--quiet", *(["-S"] if key else []), "-m", msg, env=env)
        return sh("git", "-C", self.up, "rev-parse", "HEAD")

    def point(self, commit: str) -> None:
        sh("git", "-C", self.up, "update-ref", "refs/heads/deploy", commit)

    def deployed(self) -> list[str]:
        if not self.calls.exists():
            return []
        return [ln.split("--checkout ")[1].split()[0] for ln in self.calls.read_text().splitlines()]

    def state(self) -> dict:
        return json.loads((self.tmp / "state" / "state.json").read_text())


def test_forward_only_refuses_a_replayed_older_commit_and_another_branch(pull, tmp_path, capsys):
    w = World(tmp_path)
    c1 = w.commit("one", w.key)
    assert pull.run(w.cfg) == 0
    c2 = w.commit("two", w.key)
    assert pull.run(w.cfg) == 0
    assert w.deployed() == [c1, c2] and w.state()["applied"] == c2
    # Replay: the branch is rewound to an older signed release.
    w.point(c1)
    capsys.readouterr()
    assert pull.run(w.cfg) == 1
    out = capsys.readouterr().out
    assert f"REFUSED: commit {c1} is OLDER than the applied {c2}" in out and "the host is unchanged" in out
    assert w.deployed() == [c1, c2] and w.state()["applied"] == c2
    # Reported once: the next run says so in one line, exits 0 and deploys nothing.
    assert pull.run(w.cfg) == 0
    assert "already reported" in capsys.readouterr().out and w.deployed() == [c1, c2]
    # A signed commit of another branch (not descending from the applied one) force-pushed there.
    sh("git", "-C", w.up, "checkout", "--quiet", "-b", "feature", c1)
    other = w.commit("feature work", w.key)
    w.point(other)
    assert pull.run(w.cfg) == 1
    assert f"commit {other} does not descend from the applied {c2}" in capsys.readouterr().out
    assert w.deployed() == [c1, c2] and w.state()["applied"] == c2
    # Moving forward from the applied commit is applied again.
    sh("git", "-C", w.up, "checkout", "--quiet", "-B", "deploy", c2)
    c3 = w.commit("three", w.key)
    assert pull.run(w.cfg) == 0 and w.deployed() == [c1, c2, c3]


def test_a_key_outside_its_validity_is_refused_at_the_fetch_time(pull, tmp_path, capsys):
    # The key was valid until 2021; the commit claims to be from 2020.
    w = World(tmp_path, 'namespaces="git",valid-before="20210101"')
    old = w.commit("backdated", w.key, date="2020-06-01T12:00:00Z")
    # git verify-commit judges the key at the commit's own (claimed) date and accepts it.
    pinned = f"gpg.ssh.allowedSignersFile={w.signers}"
    gv = subprocess.run(
        ["git", "-C", w.up, "-c", "gpg.format=ssh", "-c", pinned, "verify-commit", old],
        capture_output=True,
        text=True,
    )
    assert gv.returncode == 0 and 'Good "git" signature' in gv.stderr, gv.stderr
    assert pull.run(w.cfg) == 1
    out = capsys.readouterr().out
    assert f"REFUSED: commit {old} is not signed by a key in {w.signers} valid at the fetch" in out
    assert w.deployed() == [] and w.state().get("applied") is None


def test_a_key_valid_only_later_is_refused(pull, tmp_path, capsys):
    w = World(tmp_path, 'namespaces="git",valid-after="29990101"')
    w.commit("future key", w.key)
    assert pull.run(w.cfg) == 1
    assert "valid at the fetch" in capsys.readouterr().out and w.deployed() == []


def test_unsigned_and_unpinned_commits_are_refused(pull, tmp_path, capsys):
    w = World(tmp_path)
    unsigned = w.commit("unsigned")
    assert pull.run(w.cfg) == 1
    out = capsys.readouterr().out
    assert f"commit {unsigned} is not signed by a key in {w.signers} (no SSH signature)" in out
    stranger = w.commit("stranger", w.other_key)
    assert pull.run(w.cfg) == 1
    out = capsys.readouterr().out
    assert f"commit {stranger} is not signed by a key in {w.signers} valid at the fetch" in out
    assert w.deployed() == []


def test_a_failed_deploy_is_reported_once_not_retried(pull, tmp_path, capsys):
    w = World(tmp_path)
    c1 = w.commit("one", w.key)
    w.rc.write_text("2\n")
    assert pull.run(w.cfg) == 1
    assert f"FAILED: ansible-pull of {c1} exited 2" in capsys.readouterr().out
    for _ in range(2):
        assert pull.run(w.cfg) == 0
        assert "not retried" in capsys.readouterr().out
    assert w.deployed() == [c1] and w.state()["failed"] == c1


def test_an_interrupted_run_is_resumed_with_the_last_applied_commit(pull, tmp_path, capsys):
    w = World(tmp_path)
    c1 = w.commit("one", w.key)
    assert pull.run(w.cfg) == 0
    c2 = w.commit("two", w.key)
    # The run deploying c2 was killed (TimeoutStartSec, reboot) in the middle of its deploy.
    state = w.state()
    state["in_progress"] = {"commit": c2, "started": "2026-01-01T00:00:00Z"}
    (tmp_path / "state" / "state.json").write_text(json.dumps(state))
    assert pull.run(w.cfg) == 1
    assert f"resumed: {c1} deployed again; {c2} is recorded as failed" in capsys.readouterr().out
    assert w.deployed() == [c1, c1]
    st = w.state()
    assert st["applied"] == c1 and st["failed"] == c2 and st["in_progress"] is None
    assert pull.run(w.cfg) == 0 and w.deployed() == [c1, c1]


def test_no_credential_of_the_url_is_printed(pull, tmp_path, monkeypatch, capsys):
    w = World(tmp_path)
    token = "glpat-s3cr3t-T0ken"
    cfg = dict(w.cfg, url=f"https://deploy-bot:{token}@127.0.0.1:9/sglang-deploy.git?private_token={token}x")
    config = tmp_path / "pull.json"
    config.write_text(json.dumps(cfg))
    monkeypatch.setattr(pull, "CONFIG", str(config))
    assert pull.main() == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "FAILED: git fetch" in text and "https://<redacted>@127.0.0.1:9" in text
    assert token not in text and "deploy-bot" not in text


ROUTED = """all:
  children:
    gpu_nodes:
      hosts:
        h1: {}
    routers:
      hosts:
        r1: {}
"""


def test_an_inventory_with_routers_is_refused_before_the_deploy(pull, tmp_path, capsys):
    """Pull mode runs deploy.yml with ansible_connection=local: a `delegate_to: <router>` would run on this
    host, find no router and restart a server in rotation (issue 37, item 6). Such a commit is refused,
    once."""
    w = World(tmp_path)
    c1 = w.commit("one", w.key)
    assert pull.run(w.cfg) == 0
    c2 = w.commit("behind a router", w.key, inventory=ROUTED)
    capsys.readouterr()
    assert pull.run(w.cfg) == 1
    out = capsys.readouterr().out
    assert f"REFUSED: commit {c2}: inventory inv.yml has hosts in group routers (r1)" in out, out
    assert "push deploy" in out and "the host is unchanged" in out
    assert w.deployed() == [c1] and w.state()["applied"] == c1 and w.state()["failed"] == c2
    assert pull.run(w.cfg) == 0 and "already reported" in capsys.readouterr().out


def holder(path: Path) -> subprocess.Popen:
    """Another process holding flock(2) on `path` until it is killed."""
    code = (
        "import fcntl, sys, time\n"
        f"f = open({str(path)!r}, 'a+')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def main_with(pull, monkeypatch, w: World, tmp_path: Path) -> int:
    config = tmp_path / "pull.json"
    config.write_text(json.dumps(w.cfg))
    monkeypatch.setattr(pull, "CONFIG", str(config))
    return pull.main()


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the planted lock file to another user (needs root)")
def test_a_local_user_cannot_stop_pull_mode_by_pre_creating_a_lock_file(pull, tmp_path, monkeypatch, capsys):
    # What any local user may do in /run/lock (mode 1777): create the lock file first and hold it.
    shared = tmp_path / "run-lock"
    shared.mkdir()
    shared.chmod(0o1777)
    planted = shared / "sglang-pull.lock"
    planted.touch()
    os.chown(planted, 65534, 65534)
    # The lock sglang-pull used to take; a lock in a directory others may write is no lock of root's.
    monkeypatch.setattr(pull, "LOCK", str(planted), raising=False)
    proc = holder(planted)
    try:
        w = World(tmp_path)
        c1 = w.commit("one", w.key)
        assert main_with(pull, monkeypatch, w, tmp_path) == 0
    finally:
        proc.kill()
        proc.wait()
    assert w.deployed() == [c1], capsys.readouterr().out


def test_the_lock_lives_in_the_root_only_state_directory(pull, tmp_path, monkeypatch, capsys):
    w = World(tmp_path)
    w.commit("one", w.key)
    monkeypatch.setattr(pull, "LOCK", str(tmp_path / "old.lock"), raising=False)
    proc = holder(tmp_path / "state" / "lock")
    try:
        assert main_with(pull, monkeypatch, w, tmp_path) == 0
    finally:
        proc.kill()
        proc.wait()
    assert f"another sglang-pull run holds {tmp_path}/state/lock" in capsys.readouterr().out
    assert w.deployed() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="gives the lock file to another user (needs root)")
@pytest.mark.parametrize("plant", ["writable state directory", "lock of another user", "lock is a symlink"])
def test_a_lock_another_user_could_have_planted_is_refused_loudly(pull, tmp_path, monkeypatch, capsys, plant):
    w = World(tmp_path)
    w.commit("one", w.key)
    state = tmp_path / "state"
    if plant == "writable state directory":
        state.chmod(0o777)
    elif plant == "lock of another user":
        (state / "lock").touch()
        os.chown(state / "lock", 65534, 65534)
    else:
        (state / "lock").symlink_to(tmp_path / "elsewhere")
    assert main_with(pull, monkeypatch, w, tmp_path) == 1
    out = capsys.readouterr().out
    assert "FAILED: lock " in out and str(state) in out, out
    assert w.deployed() == []


def test_setting_up_pull_mode_where_the_inventory_has_routers_is_refused(tmp_path):
    """playbooks/pull.yml refuses before it changes anything on a host behind a router (issue 37, item 6)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        ROUTED.replace("h1: {}", "h1: {ansible_connection: local}").replace(
            "r1: {}", "r1: {ansible_connection: local}"
        )
    )
    settings = {
        "sglang_pull_repo_url": "https://git.example.invalid/sglang-deploy.git",
        "sglang_pull_allowed_signers": [
            'ops@example.invalid namespaces="git" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA'
        ],
        "sglang_pull_inventory": "inventory/site/hosts.yml",
        # The settings check refuses this: a run that got past the router check would stop there.
        "sglang_pull_branch": "-not-a-branch",
    }
    run = run_playbook("-i", inventory, "playbooks/pull.yml", "--check", "-e", json.dumps(settings))
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "h1: pull mode is refused where the inventory has routers (r1)" in out, out
    assert "sglang_pull_branch" not in out.split("pull mode is refused")[0], out
