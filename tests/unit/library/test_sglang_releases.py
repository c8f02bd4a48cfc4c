"""SGLang releases (issue 14 item 1): module_utils/sglang_release.py (the key) and library/sglang_releases.py
(keep the last N, never the running or known-good one), real main() on real directories (tmp_path). The
marker is the recorded lab install marker (tests/fixtures/host_probe/marker-lab.json) with the release key."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ansible.module_utils.sglang_release import prune_plan, release_key
from conftest import FIXTURES

MARKER = "sglang-deploy-install.json"
WANTED = json.loads((FIXTURES / "host_probe" / "marker-lab.json").read_text())


def make_release(root: Path, version: str, mtime: float, complete: bool = True) -> Path:
    wanted = dict(WANTED, version=version)
    key = release_key(wanted, "3.11")
    path = root / key
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").write_text("")
    if complete:
        (path / MARKER).write_text(json.dumps(dict(wanted, release=key, python="3.11")))
        os.utime(path / MARKER, (mtime, mtime))
    return path


def test_the_key_changes_with_version_git_ref_dependencies_and_python_only():
    base = release_key(WANTED, "3.11")
    assert base.startswith("0.5.23-py3.11-") and base == release_key(dict(WANTED), "3.11")
    # The same wheels from the package index or a wheelhouse are the same content.
    assert release_key(dict(WANTED, source="pypi"), "3.11") == base
    others = [
        release_key(dict(WANTED, version="0.5.24"), "3.11"),
        release_key(WANTED, "3.12"),
        release_key(dict(WANTED, dependencies=dict(WANTED["dependencies"], resolved_by_pip=True)), "3.11"),
        release_key(
            dict(WANTED, dependencies=dict(WANTED["dependencies"], requirements_sha256="0" * 64)), "3.11"
        ),
        release_key(dict(WANTED, source="git", git_repo="https://x/sglang.git", git_ref="v0.5.23"), "3.11"),
        release_key(
            dict(WANTED, source="git", git_repo="https://x/sglang.git", git_ref="main/../x y"), "3.11"
        ),
    ]
    assert len(set(others + [base])) == len(others) + 1
    assert others[4].startswith("git-v0.5.23-py3.11-")
    assert "/" not in others[5] and " " not in others[5]


def test_keeps_the_newest_and_never_the_running_or_known_good_release(run_module, tmp_path):
    old = make_release(tmp_path, "0.5.20", 1000)
    known_good = make_release(tmp_path, "0.5.21", 2000)
    mid = make_release(tmp_path, "0.5.22", 3000)
    new = make_release(tmp_path, "0.5.23", 4000)
    broken = make_release(tmp_path, "0.5.24", 5000, complete=False)
    meta = tmp_path / "known-good.json"
    meta.write_text(json.dumps({"release": {"path": str(known_good)}}))
    args = {
        "dir": str(tmp_path),
        "keep": 2,
        "marker_name": MARKER,
        "current": new.name,
        "known_good_meta": str(meta),
        "protect": [str(old / "bin" / "python")],  # what the running MainPID's argv[0] names
    }
    result, failed = run_module("sglang_releases", dict(args, _ansible_check_mode=True))
    assert not failed and result["changed"] is True
    assert sorted(r["name"] for r in result["removed"]) == sorted([mid.name, broken.name])
    assert all(p.exists() for p in (old, known_good, mid, new, broken)), "check mode removed something"

    result, failed = run_module("sglang_releases", args)
    assert not failed, result
    # keep=2: the two protected ones and this run's fill it; the running (old) one stays although oldest.
    assert sorted(os.listdir(tmp_path)) == sorted([old.name, known_good.name, new.name, meta.name])
    kept = {k["name"]: k["reason"] for k in result["kept"]}
    assert kept[old.name].startswith("holds ") and kept[known_good.name].startswith("holds ")
    assert kept[new.name] == "this run's release"

    result, failed = run_module("sglang_releases", args)
    assert not failed and result["changed"] is False and result["removed"] == []


def test_keep_counts_complete_releases_newest_first(tmp_path):
    releases = [make_release(tmp_path, f"0.5.{n}", 1000 + n) for n in range(5)]
    remove, kept = prune_plan(str(tmp_path), 3, [], MARKER)
    assert sorted(k["name"] for k in kept) == sorted(r.name for r in releases[2:])
    assert sorted(r["name"] for r in remove) == sorted(r.name for r in releases[:2])
    (tmp_path / ".removing-x").mkdir()
    remove, _kept = prune_plan(str(tmp_path), 5, [], MARKER)
    assert [r["name"] for r in remove] == [".removing-x"]


def test_keep_below_one_is_refused_naming_it(run_module, tmp_path):
    result, failed = run_module("sglang_releases", {"dir": str(tmp_path), "keep": 0, "marker_name": MARKER})
    assert failed and "keep must be at least 1" in result["msg"]


def test_link_becomes_a_symlink_to_the_current_release_and_a_real_venv_is_left_alone(run_module, tmp_path):
    releases = tmp_path / "releases"
    current = make_release(releases, "0.5.23", 1000)
    link = tmp_path / "venv"
    args = {
        "dir": str(releases),
        "keep": 3,
        "marker_name": MARKER,
        "current": current.name,
        "link": str(link),
    }
    result, failed = run_module("sglang_releases", args)
    assert not failed and result["changed"] is True and os.readlink(link) == str(current), result
    result, failed = run_module("sglang_releases", args)
    assert not failed and result["changed"] is False
    other = make_release(releases, "0.5.24", 2000)
    result, failed = run_module("sglang_releases", dict(args, current=other.name))
    assert not failed and os.readlink(link) == str(other)
    assert sorted(os.listdir(tmp_path)) == ["releases", "venv"]  # no temporary link left
    link.unlink()
    link.mkdir()  # the virtualenv an older role installed into
    result, failed = run_module("sglang_releases", args)
    assert not failed and result["changed"] is False and "is not a symlink" in result["link"]
    assert link.is_dir() and not link.is_symlink()


def test_a_run_whose_lock_was_taken_over_removes_nothing(run_module, tmp_path):
    """Issue 37 item 1: the release another run builds now has no marker yet, so it looks like an interrupted
    build; a run that lost its deploy lock must not remove it (nor re-point the link)."""
    from ansible.module_utils import sglang_lock as lock_record

    releases = tmp_path / "releases"
    current = make_release(releases, "0.5.23", 1000)
    building = make_release(releases, "0.5.24", 2000, complete=False)
    directory = tmp_path / "run" / "sglang-deploy"
    directory.mkdir(parents=True, mode=0o700)
    held = lock_record.new_record(
        {"name": "sglang", "doing": "installing", "lease": 60, "controller": {"host": "ctl-b", "pid": 8}},
        None,
        "b" * 32,
    )
    lock_record.write_record(str(directory / "sglang.lock"), held)
    args = {
        "dir": str(releases),
        "keep": 1,
        "marker_name": MARKER,
        "current": current.name,
        "link": str(tmp_path / "venv"),
        "lock": {"dir": str(directory), "name": "sglang", "token": "a" * 32},
    }
    result, failed = run_module("sglang_releases", args)
    assert failed and "no longer holds the deploy lock of sglang" in result["msg"], result
    assert "ansible-playbook PID 8 on controller ctl-b" in result["msg"]
    assert building.is_dir() and not (tmp_path / "venv").exists()
    result, failed = run_module("sglang_releases", dict(args, lock=dict(args["lock"], token="b" * 32)))
    assert not failed and not building.exists() and (tmp_path / "venv").is_symlink(), result
