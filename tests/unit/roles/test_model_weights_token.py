"""roles/model_weights/tasks/token.yml on this machine (issue 18, item 9): the token file's directory is
created when it is missing and never changed when it exists.

Before: the directory was forced to 0700 on every run, so a token in /etc/sglang (0755, the sglang role's
directory) flipped it back and forth on every deploy (never converging), and /etc/hf_token made /etc
0700. Two real runs of the task file (``ansible_connection: local``, root: the files are root-owned) on
a directory tree under pytest's tmp_path.
"""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import yaml
from conftest import run_playbook

SENTINEL = "hf_SENTINEL_token_18"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="writes root-owned files (owner: root)")


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def run(tmp_path, token_files):
    play = [
        {
            "name": "Write the Hugging Face token as the model_weights role does",
            "hosts": "localhost",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Write the token file",
                    "ansible.builtin.include_role": {"name": "model_weights", "tasks_from": "token.yml"},
                    "vars": {"model_weights_hf_token": SENTINEL, "model_weights_hf_token_file": "{{ item }}"},
                    "loop": [str(p) for p in token_files],
                }
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    done = run_playbook(
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        tmp_path / "play.yml",
        json_output=True,
        env={"ANSIBLE_PIPELINING": "1"},
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert SENTINEL not in done.stdout
    return json.loads(done.stdout)["stats"]["localhost"]


def test_an_existing_directory_keeps_its_mode_and_a_missing_one_is_created_0700(tmp_path):
    etc = tmp_path / "etc"
    sglang_dir = etc / "sglang"  # /etc/sglang: 0755, managed by the sglang role
    sglang_dir.mkdir(parents=True)
    etc.chmod(0o755)
    sglang_dir.chmod(0o755)
    new_dir = tmp_path / "srv" / "secrets"
    # (etc / 'hf_token', the /etc case, takes the same path as the token in /etc/sglang.)
    files = [sglang_dir / "hf_token", new_dir / "hf_token"]

    first = run(tmp_path, files)
    assert mode(sglang_dir) == 0o755 and mode(etc) == 0o755  # before: both 0700
    assert mode(new_dir) == 0o700 and new_dir.stat().st_uid == 0
    for path in files:
        assert path.read_text() == SENTINEL + "\n" and mode(path) == 0o600 and path.stat().st_uid == 0
    assert first["changed"] >= 2 and first["failures"] == 0

    # What the sglang role does on every run: /etc/sglang back to 0755. The next run keeps it.
    second = run(tmp_path, files)
    assert second["changed"] == 0, second
    assert mode(sglang_dir) == 0o755 and mode(etc) == 0o755 and mode(new_dir) == 0o700
