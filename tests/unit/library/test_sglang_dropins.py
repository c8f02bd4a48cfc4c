"""library/sglang_dropins.py: real main() on real files in tmp_path; the one command it runs,
``systemctl daemon-reload``, is answered from its recording (tests/fixtures/dropins/SOURCE.md), and the
drop-in moved is the one written on the lab host for the recordings."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from ansible.module_utils.basic import AnsibleModule
from conftest import FIXTURES

RECORDED = FIXTURES / "dropins"
OVERRIDE = (RECORDED / "override.conf").read_bytes()


@pytest.fixture
def systemctl(monkeypatch):
    calls = []

    def fake(self, cmd, **kwargs):
        rec = json.loads((RECORDED / "daemon-reload.json").read_text())
        assert [os.path.basename(cmd[0]), *cmd[1:]] == rec["argv"], cmd
        assert kwargs.get("environ_update", {}).get("LANG") == "C"
        calls.append(cmd[1:])
        return rec["rc"], rec["stdout"], rec["stderr"]

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, name, *a, **k: f"/usr/bin/{name}")
    return calls


def dropin(root, name="override.conf"):
    path = root / "etc" / "systemd" / "system" / "sglang.service.d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(OVERRIDE)
    path.chmod(0o644)
    return path


def test_moves_each_dropin_under_a_timestamped_dir_with_a_manifest_then_reloads(
    run_module, systemctl, tmp_path
):
    first, second = dropin(tmp_path), dropin(tmp_path, "50-user.conf")
    removed_dir = tmp_path / "state" / "removed-dropins"
    result, failed = run_module(
        "sglang_dropins",
        {"unit": "sglang.service", "paths": [str(first), str(second)], "removed_dir": str(removed_dir)},
    )
    assert not failed, result
    assert result["changed"] is True and result["daemon_reloaded"] is True
    assert systemctl == [["daemon-reload"]]
    assert not first.exists() and not second.exists() and not first.parent.exists()
    kept = sorted(removed_dir.iterdir())
    assert len(kept) == 1 and kept[0] == removed_dir / os.path.basename(result["dir"])
    for entry in result["removed"]:
        moved = kept[0] / entry["from"].lstrip("/")
        assert entry["to"] == str(moved) and moved.read_bytes() == OVERRIDE
        assert entry["sha256"] == hashlib.sha256(OVERRIDE).hexdigest() and entry["mode"] == "0644"
        assert oct(moved.stat().st_mode & 0o777) == "0o600"
    manifest = json.loads((kept[0] / "MANIFEST.json").read_text())
    assert manifest == {"unit": "sglang.service", "removed": result["removed"]}
    assert oct(removed_dir.stat().st_mode & 0o777) == "0o700"


def test_check_mode_reports_and_changes_nothing(run_module, systemctl, tmp_path):
    path = dropin(tmp_path)
    result, failed = run_module(
        "sglang_dropins",
        {
            "unit": "sglang.service",
            "paths": [str(path)],
            "removed_dir": str(tmp_path / "removed"),
            "_ansible_check_mode": True,
        },
    )
    assert not failed, result
    assert result["changed"] is True
    assert result["removed"] == [{"from": str(path), "to": None, "sha256": None}]
    assert path.read_bytes() == OVERRIDE and not (tmp_path / "removed").exists() and systemctl == []


def test_nothing_present_is_no_change_and_no_reload(run_module, systemctl, tmp_path):
    gone = tmp_path / "etc" / "systemd" / "system" / "sglang.service.d" / "gone.conf"
    result, failed = run_module(
        "sglang_dropins",
        {"unit": "sglang.service", "paths": [str(gone)], "removed_dir": str(tmp_path / "removed")},
    )
    assert not failed and result["changed"] is False and result["daemon_reloaded"] is False
    assert systemctl == [] and not (tmp_path / "removed").exists()


@pytest.mark.parametrize(
    "name",
    [
        "service.d/10-x.conf",
        "sglang-.service.d/10-x.conf",
        "sglang.service.d/notes.txt",
        "other.service.d/x.conf",
    ],
)
def test_a_shared_or_foreign_path_is_refused_and_nothing_moves(run_module, systemctl, tmp_path, name):
    own = dropin(tmp_path)
    other = tmp_path / "etc" / "systemd" / "system" / name
    other.parent.mkdir(parents=True, exist_ok=True)
    other.write_bytes(OVERRIDE)
    result, failed = run_module(
        "sglang_dropins",
        {"unit": "sglang.service", "paths": [str(own), str(other)], "removed_dir": str(tmp_path / "removed")},
    )
    assert failed and str(other) in result["msg"] and "nothing was changed" in result["msg"], result
    assert own.exists() and other.exists() and systemctl == [] and not (tmp_path / "removed").exists()
