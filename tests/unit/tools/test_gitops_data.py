"""A pull request's data is inert (issue 37, item 5): host names and addresses are validated where the data
enters (tools/gitops/datacheck.py, and tools/gitops/gitops.py for every host ansible-inventory lists), and
it may set only the options of the roles' argument specs plus a short allowlist of connection variables."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import run_playbook

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools" / "gitops"))

import datacheck  # noqa: E402
import gitops  # noqa: E402

SGLANG_VARS = "inventory/lab/group_vars/gpu_nodes/sglang.yml"
GPU_VARS = "inventory/sample/group_vars/gpu_nodes/gpu.yml"
SAMPLE_HOSTS = "inventory/sample/hosts.yml"
TRAVERSAL = "../../../../tmp/x"


@pytest.fixture(scope="module")
def specs():
    return datacheck.role_specs(gitops.role_spec_texts(REPO))


def text(rel: str) -> str:
    return (REPO / rel).read_text()


def hosts_yml(host: str, **hostvars) -> str:
    return yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {host: hostvars or None}}}}})


@pytest.mark.parametrize(
    "host",
    [TRAVERSAL, "a/b", ".hidden", "-oProxyCommand=sh", "two words", "x" * 254, "node\n1", "..", "a..b"],
)
def test_a_host_name_that_is_not_a_plain_name_is_refused_naming_the_host(specs, host):
    with pytest.raises(datacheck.DataError, match="is not a host name") as refused:
        datacheck.check_file(SAMPLE_HOSTS, hosts_yml(host), text(SAMPLE_HOSTS), specs)
    assert str(refused.value).startswith(f"{SAMPLE_HOSTS}: host {json.dumps(host)[:40]}")


@pytest.mark.parametrize("host", ["gpu-node-09", "lab1", "node_2.dc1.example", "10.0.0.9"])
def test_plain_host_names_are_data(specs, host):
    assert datacheck.check_file(SAMPLE_HOSTS, hosts_yml(host), None, specs)[0] == f"host {host} added"


def test_a_host_vars_file_of_a_bad_host_name_is_refused(specs):
    path = "inventory/site/host_vars/-oProxyCommand=sh.yml"
    with pytest.raises(datacheck.DataError, match=r"host \"-oProxyCommand=sh\".* not a host name"):
        datacheck.check_file(path, "sglang_port: 30000\n", None, specs)


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [
        ("ansible_host", "-oProxyCommand=sh", "not a host name or IP address"),
        ("ansible_host", "a b", "not a host name or IP address"),
        ("ansible_host", "node;id", "not a host name or IP address"),
        ("ansible_host", "../x", "not a host name or IP address"),
        ("ansible_host", 10, "not a host name or IP address"),
        ("ansible_port", "22 -oX", "a port number"),
        ("ansible_port", 70000, "a port number"),
        ("ansible_user", "-oProxyCommand=sh", "an account name"),
        ("ansible_user", "root; id", "an account name"),
        ("ansible_become", "yes please", "true or false"),
    ],
)
def test_a_bad_connection_value_is_refused_naming_the_variable(specs, name, value, error):
    head = hosts_yml("gpu-node-09", **{name: value})
    with pytest.raises(datacheck.DataError, match=rf"host gpu-node-09: {name}: .*{error}"):
        datacheck.check_file(SAMPLE_HOSTS, head, None, specs)


@pytest.mark.parametrize("address", ["10.0.0.9", "fe80::1", "gpu-node-09.example.internal", "gpu9"])
def test_addresses_and_the_connection_allowlist_are_data(specs, address):
    head = hosts_yml(
        "gpu-node-09", ansible_host=address, ansible_port=2222, ansible_user="deploy", ansible_become=True
    )
    assert datacheck.check_file(SAMPLE_HOSTS, head, None, specs) == [
        "host gpu-node-09 added",
        "host gpu-node-09: ansible_become",
        "host gpu-node-09: ansible_host",
        "host gpu-node-09: ansible_port",
        "host gpu-node-09: ansible_user",
    ]


@pytest.mark.parametrize(
    "name",
    ["__sglang_rolling", "_sglang_rolling", "__sglang_plan_secrets_known", "rolling", "window", "lab_extra"],
)
def test_a_variable_no_role_names_is_refused_naming_it_and_the_file(specs, name):
    head = text(SGLANG_VARS) + f"{name}: true\n"
    with pytest.raises(
        datacheck.DataError, match=rf"{SGLANG_VARS}: group gpu_nodes: {name} is not an option of any role"
    ):
        datacheck.check_file(SGLANG_VARS, head, text(SGLANG_VARS), specs)


def test_a_connection_setting_outside_the_allowlist_is_refused(specs):
    head = hosts_yml("gpu-node-09", ansible_become_method="su")
    with pytest.raises(
        datacheck.DataError, match="ansible_become_method is a connection or privilege setting"
    ):
        datacheck.check_file(SAMPLE_HOSTS, head, None, specs)


@pytest.mark.parametrize("name", ["PYTHONPATH", "LD_PRELOAD", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_an_environment_entry_that_would_run_code_or_go_online_in_the_plan_is_refused(specs, name):
    head = text(SGLANG_VARS) + f"sglang_environment:\n  {name}: '0'\n"
    with pytest.raises(datacheck.DataError, match=rf"sglang_environment: {name} .*the plan"):
        datacheck.check_file(SGLANG_VARS, head, text(SGLANG_VARS), specs)


def test_a_site_copied_from_the_sample_inventory_is_data(specs):
    # `cp -r inventory/sample inventory/<site>` (README, step 1) in a pull request gets a plan.
    for rel in (SAMPLE_HOSTS, GPU_VARS, "inventory/sample/group_vars/gpu_nodes/sglang.yml"):
        site = rel.replace("inventory/sample/", "inventory/site/")
        assert datacheck.check_file(site, text(rel), None, specs), rel
    with pytest.raises(datacheck.DataError, match="nvidia_gpu_check_expected_count: .*int"):
        datacheck.check_file(GPU_VARS, "nvidia_gpu_check_expected_count: eight\n", None, specs)


def test_the_plans_parse_runs_offline():
    """The plan runs the installed SGLang's parser on the host with the pull request's model path: the
    inspection runs with the Hugging Face libraries offline (nothing fetched, no remote code downloaded), and
    the pull request's data cannot turn that off (above)."""
    play = yaml.safe_load(text("playbooks/plan.yml"))[0]
    inspect = next(t for t in play["tasks"] if t.get("name") == "Inspect the host")
    assert {k: inspect["environment"][k] for k in datacheck.OFFLINE_ENV} == dict.fromkeys(
        datacheck.OFFLINE_ENV, "1"
    )
    assert {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"} <= set(datacheck.OFFLINE_ENV)


def fake_inventory(tmp_path: Path, host: str) -> str:
    listing = {"gpu_nodes": {"hosts": [host]}, "all": {"children": ["gpu_nodes"]}}
    script = tmp_path / "ansible-inventory"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(listing)}\nEOF\n")
    script.chmod(0o755)
    return str(script)


def test_every_host_the_inventory_lists_is_validated_before_anything_uses_its_name(tmp_path):
    # Whatever brought it in (an untracked inventory, the base's own files), a host the plan would write a
    # report for is a plain name.
    tool = fake_inventory(tmp_path, TRAVERSAL)
    with pytest.raises(
        gitops.GitopsError, match=rf"host {re.escape(json.dumps(TRAVERSAL))} is not a host name"
    ):
        gitops.inventory_hosts(tool, dict(os.environ), tmp_path, "hosts.yml", None)
    assert gitops.inventory_hosts(
        fake_inventory(tmp_path, "gpu-node-01"), dict(os.environ), tmp_path, "h", None
    ) == ["gpu-node-01"]


def test_the_plan_comment_reads_no_path_built_from_an_unvalidated_name(tmp_path):
    (tmp_path / "x.json").write_text('{"status": "ok"}')
    reports = tmp_path / "a" / "b" / "c" / "reports"
    reports.mkdir(parents=True)
    with pytest.raises(gitops.GitopsError, match="not a host name"):
        gitops.collect(reports, ["../../../../x"], "", 0)


def test_the_plan_playbook_writes_no_report_outside_its_directory(tmp_path):
    """playbooks/plan.yml run directly with a host named like a path: the host is refused by name before any
    report is written; nothing lands outside gitops_report_dir."""
    reports = tmp_path / "a" / "b" / "c" / "reports"
    reports.mkdir(parents=True)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(hosts_yml("../../../escaped", ansible_connection="local"))
    run = run_playbook(
        "-i",
        inventory,
        "playbooks/plan.yml",
        "--check",
        "-e",
        json.dumps({"gitops_report_dir": str(reports)}),
    )
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert not (tmp_path / "a" / "escaped.json").exists(), out
    assert list(tmp_path.rglob("*.json")) == [], out
    assert "../../../escaped" in out and "not a file name inside gitops_report_dir" in out, out
