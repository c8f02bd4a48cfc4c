"""templates/deploy_summary.j2: what deploy.yml prints per host (playbooks/sglang.yml), rendered with jinja2
and Ansible's filters from the REAL result of sglang_running_args on recorded outputs: the SGLang-built
/server_info of a DFLASH window-2048 server (546 keys, an API key) and the recorded lab DDTree deploy
(budget 8, top-k 4 from the process environment, window 4096). The summary shows each MANAGED key as the
running server reported it and where it was read, and the path of the full report - never the whole
/server_info, which the module returns only for that report (full_server_info), secrets redacted.
"""

from __future__ import annotations

import json

import jinja2
import pytest
from ansible.plugins.filter.core import FilterModule
from conftest import REPO
from test_running_args import (
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

REPORT = "/srv/deploy/out/deploy/20261203T120000Z/lab1.json"


def render(verified, host="lab1", report_file=REPORT):
    """As playbooks/sglang.yml: lookup('template') (trim_blocks, Ansible's filters) | trim | split('\\n')."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(REPO / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
    )
    # Jinja's own filters and the one of Ansible the template uses (Ansible 2.19 replaces default, map...
    # with versions tied to its own templating engine; Jinja's are the same for this template).
    env.filters["to_json"] = FilterModule().filters()["to_json"]
    text = env.get_template("deploy_summary.j2").render(host=host, verified=verified, report_file=report_file)
    return text.strip().split("\n")


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
    full = dflash["server_info"]
    assert set(full) == set(body)
    assert full["api_key"] == "<redacted>" and SENTINEL in body["api_key"]
    assert SENTINEL in json.dumps(body["launch_command"]) and SENTINEL not in json.dumps(full)
    assert {k: v for k, v in full.items() if k not in ("api_key", "launch_command")} == {
        k: v for k, v in body.items() if k not in ("api_key", "launch_command")
    }
    # other callers (the plan, the sweep) do not carry it
    FakeHost(monkeypatch)
    result, failed = run_module("sglang_running_args", args())
    assert not failed and "server_info" not in result
    assert result["reported"]["server_info"] == dflash["reported"]["server_info"]


def test_ddtree_summary_environment_knob_runner_lines_and_warnings(monkeypatch, run_module):
    """The recorded lab DDTree deploy: top-k from the running process's environment, the tree budget
    from the DDTree worker line, the build's warning shown; a run that did not restart says so."""
    ddtree_host(monkeypatch)
    result, failed = run_module("sglang_running_args", ddtree_args(full_server_info=True))
    assert not failed, result["msg"]
    body = json.loads((DD / "server_info.json").read_text())
    assert set(result["server_info"]) == set(body)
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
