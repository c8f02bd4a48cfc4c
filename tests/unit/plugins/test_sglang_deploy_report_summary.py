"""templates/deploy_summary.j2: what deploy.yml prints per host (playbooks/sglang.yml), rendered with jinja2
and Ansible's filters from the REAL result of sglang_running_args on recorded outputs: the SGLang-built
/server_info of a DFLASH window-2048 server (546 keys, an API key) and the recorded lab DDTree deploy
(budget 8, top-k 4 from the process environment, window 4096). The summary shows each MANAGED key as the
running server reported it and where it was read, and the path of the full report - never the whole
/server_info, which the module returns only for that report (full_server_info), secrets redacted.

Rendered as deploys render it: by the action plugin sglang_deploy_report (playbooks/tasks/deploy_report.yml),
with Ansible's templating engine and the template's three variables only. The plugin replaced a debug task
whose msg was the template lookup; the lines are proven the same as that lookup printed.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from ansible.module_utils import sglang_speculation as speculation_utils
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from conftest import REPO

# The recorded sglang_running_args cases are the library test's (tests/unit/library/).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "library"))
from test_sglang_running_args import (
    DD,
    DD_EXPECTED,
    EXPECTED_2048,
    SENTINEL,
    FakeHost,
    S,
    args,
    ddtree_args,
    ddtree_host,
)

spec = importlib.util.spec_from_file_location(
    "deploy_report_action", REPO / "action_plugins" / "sglang_deploy_report.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

REPORT = "/srv/deploy/out/deploy/20261203T120000Z/lab1.json"
TEMPLATE = str(REPO / "templates" / "deploy_summary.j2")
# The msg of the debug task that printed the summary before the action plugin rendered it, verbatim (in
# YAML's double quotes, as in Python's, '\n' is a newline: the Jinja string literal holds one).
LOOKUP = (
    "{{ lookup('ansible.builtin.template', playbook_dir | dirname ~ '/templates/deploy_summary.j2')"
    " | trim | split('\n') }}"
)


@pytest.fixture(autouse=True)
def _plugins(ansible_plugins):
    """Ansible's filters and lookups found by name, as in a playbook run."""


def render(verified, host="lab1", report_file=REPORT):
    """As playbooks/tasks/deploy_report.yml: the plugin's rendering, with the three variables only."""
    loader = DataLoader()
    variables = {"host": host, "verified": verified, "report_file": report_file}
    return plugin.render_summary(Templar(loader=loader), loader, TEMPLATE, variables)


def render_by_lookup(verified, host="lab1", report_file=REPORT):
    """The old debug task's msg: the template lookup over the task's variables (the debug task's vars on
    top of the host's), templated as Ansible templates a task argument."""
    task_vars = {
        "inventory_hostname": host,
        "__sglang_verified": verified,
        "__deploy_report_file": report_file,
        "playbook_dir": str(REPO / "playbooks"),
        "ansible_check_mode": False,
        # the debug task's vars
        "host": trust_as_template("{{ inventory_hostname }}"),
        "verified": trust_as_template("{{ __sglang_verified }}"),
        "report_file": trust_as_template("{{ __deploy_report_file }}"),
    }
    return Templar(loader=DataLoader(), variables=task_vars).template(trust_as_template(LOOKUP))


def verified(
    result,
    expected,
    expected_env=None,
    restarted=True,
    unit="h3a-sglang.service",
    profile="default",
    version="0.5.23",
):
    """The role's __sglang_verified (roles/sglang/tasks/verify.yml) around the assertion's result."""
    return {
        "unit": unit,
        "invocation_id": result["evidence"]["invocation_id"],
        "restarted": restarted,
        "build_profile": profile,
        "sglang_version": version,
        "host": "127.0.0.1",
        "port": expected["port"],
        "expected": expected,
        "expected_env": expected_env or {},
        "running": result,
    }


@pytest.fixture
def dflash(monkeypatch, run_module):
    FakeHost(monkeypatch)
    result, failed = run_module("sglang_running_args", args(full_server_info=True))
    assert not failed, result["msg"]
    assert SENTINEL not in run_module.last_output
    return result


def test_dflash_summary_shows_the_managed_keys_as_running_and_where_each_was_read(dflash):
    lines = render(verified(dflash, EXPECTED_2048))
    text = "\n".join(lines)
    assert lines[0] == (
        "lab1: h3a-sglang.service runs the intended arguments, invocation 5f67eaa332b14ce095abdbeeeb5c0407 "
        "(restarted by this run)"
    )
    assert lines[1] == (
        "SGLang 0.5.23, build profile default: 5 managed key(s) agree in cmdline, journal, server_info for "
        "invocation 5f67eaa332b14ce095abdbeeeb5c0407"
    )
    every = "(from /server_info, journal server_args, /proc/98/cmdline)"
    managed = [line for line in lines if line.startswith("  ")]
    assert managed == [
        f"  model_path: /tmp/m {every}",
        f"  port: 30000 {every}",  # the server's integer, not the argv string '30000'
        f"  speculative_algorithm: DFLASH {every}",
        f"  speculative_draft_model_path: /tmp/d {every}",
        "  speculative_draft_window_size: 2048 (from /server_info, journal server_args, /proc/98/cmdline, "
        "DFLASH draft runner)",
    ]
    assert lines[-3].startswith("DFLASH draft runner line of this invocation: algorithm=DFLASH, ")
    assert "draft_window_size=2048, compact_cache=true" in lines[-3]
    # the key is proven (200 with it, 401 without), never shown
    assert lines[-2] == (
        "API key required: GET /server_info answered 200 with the intended key, 401 without a key"
    )
    assert lines[-1] == f"Full report (the whole /server_info and the assertion): {REPORT}"
    assert SENTINEL not in text


def test_the_summary_is_not_the_whole_server_info(dflash):
    body = json.loads((S / "dflash-2048.json").read_text())
    text = "\n".join(render(verified(dflash, EXPECTED_2048)))
    assert len(body) > 500 and len(json.dumps(body)) > 15000
    assert len(text) < 1500
    shown = {line.split(":")[0].strip() for line in text.split("\n") if line.startswith("  ")}
    assert shown == set(EXPECTED_2048)
    for key in set(body) - set(EXPECTED_2048):
        assert f"\n  {key}:" not in text, key


def test_the_report_gets_the_whole_server_info_redacted(dflash, monkeypatch, run_module):
    body = json.loads((S / "dflash-2048.json").read_text())
    full = json.loads(dflash["server_info_json"])
    assert set(full) == set(body)
    assert full["api_key"] == "<redacted>" and SENTINEL in body["api_key"]
    assert SENTINEL in json.dumps(body["launch_command"]) and SENTINEL not in json.dumps(full)
    assert {k: v for k, v in full.items() if k not in ("api_key", "launch_command")} == {
        k: v for k, v in body.items() if k not in ("api_key", "launch_command")
    }
    # other callers (the plan, the sweep) do not carry it
    FakeHost(monkeypatch)
    result, failed = run_module("sglang_running_args", args())
    assert not failed and "server_info_json" not in result
    assert result["reported"]["server_info"] == dflash["reported"]["server_info"]


def test_the_whole_server_info_is_redacted_by_key_before_it_becomes_text(monkeypatch, run_module):
    """Secret-named keys whose values are no secret the module was given are masked by their names, as in the
    object: an HF token, and a numeric password, which no pattern of the text redaction would find in JSON."""
    body = json.loads((S / "dflash-2048.json").read_text())
    body["hf_token"] = "hf_" + "q" * 30
    body["ssl_keyfile_password"] = 987654321987
    FakeHost(monkeypatch, http={"/server_info": (200, json.dumps(body).encode())})
    result, failed = run_module("sglang_running_args", args(full_server_info=True))
    assert not failed, result["msg"]
    full = json.loads(result["server_info_json"])
    assert full["hf_token"] == full["ssl_keyfile_password"] == "<redacted>"
    assert "q" * 30 not in result["server_info_json"] and "987654321987" not in result["server_info_json"]


def test_ddtree_summary_environment_knob_runner_lines_and_warnings(monkeypatch, run_module):
    """The recorded lab DDTree deploy: top-k from the running process's environment, the tree budget
    from the DDTree worker line, the build's warning shown; a run that did not restart says so."""
    ddtree_host(monkeypatch)
    result, failed = run_module("sglang_running_args", ddtree_args(full_server_info=True))
    assert not failed, result["msg"]
    body = json.loads((DD / "server_info.json").read_text())
    assert set(json.loads(result["server_info_json"])) == set(body)
    lines = render(
        verified(
            result,
            DD_EXPECTED,
            {"SGLANG_DDTREE_MAX_TOPK": "4"},
            restarted=False,
            unit="sglang-k26-ddtree.service",
            profile="ddtree-pr29907",
            version="0.0.0.dev0+labreplay.ddtree.pr29907",
        ),
    )
    text = "\n".join(lines)
    assert lines[0].endswith("(not restarted: it already ran them)")
    assert lines[0].startswith("lab1: sglang-k26-ddtree.service runs the intended arguments, invocation ")
    assert lines[1].startswith(
        "SGLang 0.0.0.dev0+labreplay.ddtree.pr29907, build profile ddtree-pr29907: 7 managed key(s) agree"
    )
    every = "/server_info, journal server_args, /proc/949/cmdline"
    assert f"  speculative_ddtree_budget: 8 (from {every}, DDTree worker)" in lines
    assert f"  speculative_draft_window_size: 4096 (from {every}, DFLASH draft runner)" in lines
    assert f"  page_size: 1 (from {every})" in lines
    assert "Environment of the running process (/proc/949/environ):" in lines
    assert "  SGLANG_DDTREE_MAX_TOPK: 4 (from /proc/949/environ)" in lines
    assert len([line for line in lines if line.startswith("  ")]) == len(DD_EXPECTED) + 1
    assert any(
        line.startswith("DDTree worker line of this invocation: ") and "tree_budget=8" in line
        for line in lines
    )
    assert any(
        line.startswith("warning: ") and "has no effect with speculative_algorithm=DDTREE" in line
        for line in lines
    )
    assert len(text) < 3000 < len(json.dumps(body))


def test_a_key_no_source_reported_is_named_with_its_intended_value(dflash):
    """Only in check mode or a failed assertion could a key go unreported; the summary never hides it."""
    result = dict(dflash, reported={}, read_from=dict(dflash["read_from"], port=[]))
    lines = render(verified(result, EXPECTED_2048))
    assert "  port: not reported by any source (intended 30000)" in lines


def test_the_plugin_prints_the_lines_the_template_lookup_printed(dflash):
    """The merge of the debug task into sglang_deploy_report changed no line of the summary: the same
    list of strings, for a restart, a key no source reported, and variables holding backslashes, quotes
    and template markers (data, never templated again)."""
    cases = [
        (verified(dflash, EXPECTED_2048), "lab1", REPORT),
        (verified(dflash, EXPECTED_2048, restarted=False), "gpu-a.example", "/srv/deploy/out/x y/gpu-a.json"),
        (
            verified(
                dict(dflash, reported={}, read_from=dict(dflash["read_from"], port=[])),
                dict(EXPECTED_2048, model_path="/m/{{ a }}\\x 'q' \"d\" %s"),
                unit="sglang-{% raw %}.service",
            ),
            "lab1",
            "/srv/out/{{ run }}/lab1.json",
        ),
    ]
    for case in cases:
        lines = render(*case)
        assert lines == render_by_lookup(*case)
        assert all(type(line) is str for line in lines) and len(lines) > 5
    # the third case did render its awkward values as data
    assert "  port: not reported by any source (intended 30000)" in lines
    assert "  model_path: not reported by any source (intended /m/{{ a }}\\x 'q' \"d\" %s)" in lines
    assert lines[0].startswith("lab1: sglang-{% raw %}.service runs the intended arguments")
    assert lines[-1].endswith(": /srv/out/{{ run }}/lab1.json")


def test_the_plugin_prints_the_lines_the_template_lookup_printed_ddtree(monkeypatch, run_module):
    """The same for the recorded lab DDTree deploy: an environment knob, two runner lines, a warning."""
    ddtree_host(monkeypatch)
    result, failed = run_module("sglang_running_args", ddtree_args(full_server_info=True))
    assert not failed, result["msg"]
    case = verified(result, DD_EXPECTED, {"SGLANG_DDTREE_MAX_TOPK": "4"}, restarted=False)
    lines = render(case)
    assert lines == render_by_lookup(case)
    assert any(line.startswith("warning: ") for line in lines)
    assert "Environment of the running process (/proc/949/environ):" in lines


def test_the_acceptance_length_of_the_restart_is_shown_labelled_when_the_lab_stand_in_made_it(dflash):
    """The verified restart's speculation probe (sglang_verified_restart, P25) on the lab server's recorded
    /generate answer (tests/fixtures/speculation/): the figure, how it was computed, and that the lab's
    stand-in made it; a probe without an answer says why; no restart, no line."""
    answer = json.loads(
        (REPO / "tests" / "fixtures" / "speculation" / "generate-dflash-2048.json").read_text()
    )
    figures = dict(speculation_utils.acceptance(answer["meta_info"]), new_tokens=64)
    lines = render(dict(verified(dflash, EXPECTED_2048), speculation=figures))
    assert lines[-2] == (
        "Speculative decoding acceptance length 4.0 (completion_tokens 64 / spec_verify_ct 16, one /generate "
        "after the proof): measured on the lab stand-in server, not a model"
    )
    real = dict(figures, stand_in=False, window_warning="the draft window 4096 exceeds ...")
    lines = render(dict(verified(dflash, EXPECTED_2048), speculation=real))
    assert lines[-3:-1] == [
        "Speculative decoding acceptance length 4.0 (completion_tokens 64 / spec_verify_ct 16, one /generate "
        "after the proof)",
        "warning: the draft window 4096 exceeds ...",
    ]
    lines = render(dict(verified(dflash, EXPECTED_2048), speculation={"error": "POST ... refused"}))
    assert (
        lines[-2]
        == "Speculative decoding: no acceptance length (the /generate after the proof): POST ... refused"
    )
    for none in (None, {}):
        lines = render(dict(verified(dflash, EXPECTED_2048, restarted=False), speculation=none))
        assert not any("acceptance length" in line for line in lines)
