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
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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

    def commit(self, msg: str, key: Path | None = None, date: str | None = None) -> str:
        (self.up / "inv.yml").write_text(f"# {msg}\nall: {{}}\n")
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
    monkeypatch.setattr(pull, "LOCK", str(tmp_path / "pull.lock"))
    assert pull.main() == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert "FAILED: git fetch" in text and "https://<redacted>@127.0.0.1:9" in text
    assert token not in text and "deploy-bot" not in text
