"""action_plugins/sglang_deploy_report.py: one host's deploy report written on the controller, in the
controller process (playbooks/tasks/deploy_report.yml)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location(
    "deploy_report_action", REPO / "action_plugins" / "sglang_deploy_report.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)


def test_the_report_is_written_whole_host_first_and_readable(tmp_path):
    path = tmp_path / "out" / "deploy" / "20261205T120000Z" / "lab1.json"
    report = {
        "host": "lab1",
        "unit": "sglang.service",
        "server_info": {"speculative_draft_window_size": 2048},
    }
    plugin.write_report(str(path), dict(report))
    body = json.loads(path.read_text())
    assert list(body)[:3] == ["host", "written", "unit"]
    assert body["server_info"] == report["server_info"] and body["written"].endswith("Z")
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o755 == 0o755
    assert [p.name for p in path.parent.iterdir()] == ["lab1.json"]  # no temporary file left


def test_a_failed_write_leaves_the_previous_report_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "lab1.json"
    path.write_text('{"host": "lab1", "old": true}\n')

    def refuse(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError):
        plugin.write_report(str(path), {"host": "lab1"})
    assert json.loads(path.read_text()) == {"host": "lab1", "old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["lab1.json"]
