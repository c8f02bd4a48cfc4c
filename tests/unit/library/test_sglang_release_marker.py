"""library/sglang_release_marker.py (issue 37 item 9): the install marker that makes a release complete,
written last, and the sha256 the known-good record keeps of it, as the file on disk hashes (real main(), real
files).

The marker text is what the role renders (``__sglang_release_marker_text``, ``to_nice_json`` of the recorded
lab install marker with the release key and Python) followed by a newline."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from ansible.module_utils import sglang_lock as lock_record
from ansible.module_utils.sglang_known_good import release_problems
from ansible.module_utils.sglang_release import is_complete, read_marker, release_key
from conftest import FIXTURES

MARKER = "sglang-deploy-install.json"
WANTED = json.loads((FIXTURES / "host_probe" / "marker-lab.json").read_text())
KEY = release_key(WANTED, "3.11")
# What the role's copy of ``__sglang_release_marker_text ~ '\n'`` writes (to_nice_json: indent 4, sorted).
TEXT = json.dumps(dict(WANTED, release=KEY, python="3.11"), indent=4, sort_keys=True) + "\n"


@pytest.fixture
def release(tmp_path):
    path = tmp_path / "releases" / KEY
    (path / "bin").mkdir(parents=True)
    return path


def marker_args(release, **extra):
    return dict({"path": str(release), "name": MARKER, "content": TEXT}, **extra)


def test_the_marker_is_written_and_its_sha256_is_the_files_on_disk(run_module, release):
    result, failed = run_module("sglang_release_marker", marker_args(release))
    assert not failed and result["changed"] is True, result
    path = release / MARKER
    on_disk = hashlib.sha256(path.read_bytes()).hexdigest()
    assert path.read_text() == TEXT and result["marker"] == str(path)
    assert result["sha256"] == on_disk and stat.S_IMODE(os.stat(path).st_mode) == 0o644
    # The probe of the next pass reads the same sha256 and finds the release complete.
    assert read_marker(str(path))[1] == on_disk and is_complete(str(release), MARKER)
    # A known-good record made with it passes the rollback's release check.
    meta = {"release": {"path": str(release), "marker": str(path), "marker_sha256": result["sha256"]}}
    assert release_problems(meta, "sglang.json") == []
    # Again: nothing changes, the same sha256.
    again, failed = run_module("sglang_release_marker", marker_args(release))
    assert not failed and again["changed"] is False and again["sha256"] == on_disk, again


def test_check_mode_writes_nothing(run_module, release):
    result, failed = run_module("sglang_release_marker", marker_args(release, _ansible_check_mode=True))
    assert not failed and result["changed"] is True, result
    assert not (release / MARKER).exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            TEXT.replace(KEY, "0.5.24-py3.11-0123456789ab"),
            f"names the release '0.5.24-py3.11-0123456789ab', not {KEY!r}",
        ),
        ("[1, 2]\n", "is not a JSON object"),
        ("{not json\n", "is not a JSON object"),
    ],
    ids=["another-release", "not-an-object", "not-json"],
)
def test_a_marker_that_would_not_make_its_release_complete_is_refused(run_module, release, content, message):
    result, failed = run_module("sglang_release_marker", marker_args(release, content=content))
    assert failed and message in result["msg"] and "nothing was written" in result["msg"], result
    assert not (release / MARKER).exists()


def test_a_release_that_is_not_a_directory_is_refused(run_module, release, tmp_path):
    link = tmp_path / "releases" / "linked"
    link.symlink_to(release)
    result, failed = run_module(
        "sglang_release_marker", marker_args(link, content=TEXT.replace(KEY, "linked"))
    )
    assert failed and "is not a directory" in result["msg"], result
    assert not (release / MARKER).exists()


def test_a_run_whose_lock_was_taken_over_marks_nothing_complete(run_module, release, tmp_path):
    directory = tmp_path / "run" / "sglang-deploy"
    directory.mkdir(parents=True, mode=0o700)
    held = lock_record.new_record(
        {"name": "sglang", "doing": "deploying", "lease": 60, "controller": {"host": "ctl-b", "pid": 8}},
        None,
        "b" * 32,
    )
    lock_record.write_record(str(directory / "sglang.lock"), held)
    lock = {"dir": str(directory), "name": "sglang", "token": "a" * 32}
    result, failed = run_module("sglang_release_marker", marker_args(release, lock=lock))
    assert failed and "no longer holds the deploy lock of sglang" in result["msg"], result
    assert "ansible-playbook PID 8 on controller ctl-b" in result["msg"]
    assert not (release / MARKER).exists()
    mine, failed = run_module("sglang_release_marker", marker_args(release, lock=dict(lock, token="b" * 32)))
    assert not failed and (release / MARKER).exists(), mine
    assert (
        json.loads((directory / "sglang.lock").read_text())["doing"] == f"marking the release {KEY} complete"
    )
