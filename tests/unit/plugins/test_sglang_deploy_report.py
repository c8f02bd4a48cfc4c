"""action_plugins/sglang_deploy_report.py: one host's deploy report written on the controller, and its
summary (templates/deploy_summary.j2) rendered and returned as the lines to print, in one task
(playbooks/tasks/deploy_report.yml)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
from types import SimpleNamespace

import pytest
import yaml
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from conftest import REPO, load_module

spec = importlib.util.spec_from_file_location(
    "deploy_report_action", REPO / "action_plugins" / "sglang_deploy_report.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

TEMPLATE = str(REPO / "templates" / "deploy_summary.j2")
SECRET_KEY = "unmanaged_key_of_server_info"
# The role's __sglang_verified, reduced to what the summary reads, with a /server_info for the report.
VERIFIED = {
    "unit": "sglang.service",
    "invocation_id": "5f67eaa332b14ce095abdbeeeb5c0407",
    "restarted": False,
    "build_profile": "default",
    "sglang_version": "0.5.23",
    "host": "127.0.0.1",
    "port": 30000,
    "expected": {"port": 30000, "speculative_draft_window_size": 2048},
    "expected_env": {},
    "running": {
        "msg": "2 managed key(s) agree in server_info",
        "source": "/server_info",
        "read_from": {"port": ["/server_info"], "speculative_draft_window_size": ["/server_info"]},
        "reported": {"server_info": {"port": 30000, "speculative_draft_window_size": 2048}},
        "evidence": {"main_pid": 98},
        "server_info_json": json.dumps(
            {"port": 30000, "speculative_draft_window_size": 2048, SECRET_KEY: "x" * 20000}
        ),
    },
}


@pytest.fixture
def action(ansible_plugins):
    """The plugin as the task executor runs it: a templar over ALL the task's variables."""

    def make(args: dict, check_mode: bool = False, task_vars: dict | None = None):
        task_vars = {"inventory_hostname": "lab1", "host": "not-the-summary-host", **(task_vars or {})}
        task = SimpleNamespace(args=args, async_val=0, check_mode=check_mode, action="sglang_deploy_report")
        connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
        loader = DataLoader()
        act = plugin.ActionModule(
            task, connection, None, loader, Templar(loader=loader, variables=task_vars), None
        )
        act.task_vars = task_vars
        return act

    return make


def task_args(path, template=TEMPLATE, **summary_vars) -> dict:
    """The arguments playbooks/tasks/deploy_report.yml passes, templated."""
    return {
        "path": str(path),
        "report": {"host": "lab1", "unit": VERIFIED["unit"]},
        "server_info_json": VERIFIED["running"]["server_info_json"],
        "summary_template": template,
        "summary_vars": summary_vars or {"host": "lab1", "verified": VERIFIED, "report_file": str(path)},
    }


def test_the_report_is_written_whole_host_first_and_private(tmp_path):
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
    # The whole /server_info (secrets redacted, the rest of the configuration not): the operator's only.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["lab1.json"]  # no temporary file left


def test_the_reports_of_a_run_are_private_whatever_the_umask(tmp_path):
    run = tmp_path / "out" / "deploy" / "20261205T120000Z"
    old = os.umask(0)
    try:
        for host in ("lab1", "lab2"):
            plugin.write_report(str(run / f"{host}.json"), {"host": host})
    finally:
        os.umask(old)
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.iterdir()} == {
        "lab1.json": 0o600,
        "lab2.json": 0o600,
    }
    assert stat.S_IMODE(run.stat().st_mode) == 0o700


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


def test_one_task_writes_the_report_and_returns_only_the_summary_lines(action, tmp_path):
    path = tmp_path / "out" / "deploy" / "20261205T120000Z" / "lab1.json"
    act = action(task_args(path))
    result = act.run(task_vars=act.task_vars)
    # the report: whole, /server_info included, as an object after the report's keys
    body = json.loads(path.read_text())
    assert body["host"] == "lab1" and body["server_info"][SECRET_KEY] == "x" * 20000
    assert list(body) == ["host", "written", "unit", "server_info"]
    # the result: small, printed by the default callback as a debug task's msg
    assert set(result) == {"changed", "path", "msg", "_ansible_verbose_always"}, sorted(result)
    assert result["changed"] is False and result["path"] == str(path)
    assert result["_ansible_verbose_always"] is True
    assert result["msg"] == [
        "lab1: sglang.service runs the intended arguments, invocation 5f67eaa332b14ce095abdbeeeb5c0407 "
        "(not restarted: it already ran them)",
        "SGLang 0.5.23, build profile default: 2 managed key(s) agree in server_info",
        "Managed running arguments (value as this invocation reports it; the sources that agree):",
        "  port: 30000 (from /server_info)",
        "  speculative_draft_window_size: 2048 (from /server_info)",
        f"Full report (the whole /server_info and the assertion): {path}",
    ]
    assert SECRET_KEY not in json.dumps(result) and len(json.dumps(result)) < 1000


def test_no_server_info_read_is_written_as_null(action, tmp_path):
    path = tmp_path / "lab1.json"
    act = action({**task_args(path), "server_info_json": None})
    act.run(task_vars=act.task_vars)
    assert json.loads(path.read_text())["server_info"] is None


def test_the_summary_reads_its_summary_vars_and_no_task_variable(action, tmp_path):
    template = tmp_path / "t.j2"
    template.write_text("{{ host }}\n")
    act = action(task_args(tmp_path / "r.json", str(template), host="lab1"))
    assert act.run(task_vars=act.task_vars)["msg"] == ["lab1"]  # not the task's variable `host`
    template.write_text("{{ host }} {{ inventory_hostname }}\n")
    act = action(task_args(tmp_path / "r.json", str(template), host="lab1"))
    with pytest.raises(AnsibleError, match="inventory_hostname"):
        act.run(task_vars=act.task_vars)


def test_check_mode_writes_nothing_and_renders_nothing(action, tmp_path, monkeypatch):
    def refuse(*_args):
        raise AssertionError("rendered in check mode")

    monkeypatch.setattr(plugin, "render_summary", refuse)
    path = tmp_path / "out" / "lab1.json"
    act = action(task_args(path), check_mode=True)
    result = act.run(task_vars=act.task_vars)
    assert result == {
        "changed": False,
        "path": str(path),
        "skipped_reason": "check mode writes no report and shows no summary",
    }
    assert list(tmp_path.iterdir()) == []


def test_the_task_is_skipped_in_check_mode_and_passes_the_three_variables_the_template_documents():
    tasks = yaml.safe_load((REPO / "playbooks" / "tasks" / "deploy_report.yml").read_text())
    assert len(tasks) == 1  # one task per host: no debug task beside the report
    (task,) = tasks
    assert task["when"] == "not ansible_check_mode"
    args = task["sglang_deploy_report"]
    assert args["summary_template"] == "{{ playbook_dir | dirname }}/templates/deploy_summary.j2"
    assert set(args["summary_vars"]) == {"host", "verified", "report_file"}
    header = (REPO / "templates" / "deploy_summary.j2").read_text().split("-#}", 1)[0]
    documented = header.split("Variables:", 1)[1]
    for name in args["summary_vars"]:
        assert f"{name} (" in documented, name


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"summary_tempalte": TEMPLATE}, "Invalid options for sglang_deploy_report: summary_tempalte"),
        ({"summary_template": "templates/deploy_summary.j2"}, "summary_template must be the absolute path"),
        ({"summary_template": None, "summary_vars": {"host": "lab1"}}, "summary_vars needs summary_template"),
        ({"summary_vars": ["host"]}, "summary_vars must be a dict"),
        ({"report": "lab1"}, "report must be a dict"),
        ({"path": ""}, "path .* is required"),
        ({"server_info_json": "{not json"}, "server_info_json is not JSON"),
        ({"server_info_json": {"port": 30000}}, "server_info_json must be JSON text, got dict"),
        (
            {"report": {"host": "lab1", "server_info": {}}},
            "server_info_json or as report.server_info, not both",
        ),
    ],
)
def test_wrong_arguments_fail_before_anything_is_written(action, tmp_path, args, error):
    act = action({**task_args(tmp_path / "r.json"), **args})
    with pytest.raises(AnsibleActionFail, match=error):
        act.run(task_vars=act.task_vars)
    assert list(tmp_path.iterdir()) == []


def test_the_documented_options_are_the_arguments_the_plugin_takes():
    doc = yaml.safe_load(load_module("sglang_deploy_report").DOCUMENTATION)
    assert sorted(doc["options"]) == sorted(plugin.ARGS)
    assert frozenset(plugin.ARGS) == plugin.ActionModule._VALID_ARGS
