"""Sweep points a build cannot honour are rejected up front, on the controller (issue 13, item 5).

The `points` mode of action_plugins/sglang_settings_check.py on the seed's sweep (the example of
playbooks/sweep.yml: DDTree budget [8, 16, 32, 64] x top-k [1, 2, 4] at window 2048, the algorithm
set by sweep_settings) over the DDTree lab build's variables (inventory/lab/ddtree.yml); then the real
playbooks/sweep.yml with sweep_plan_only on a controller-only inventory (ansible_connection: local,
nothing deployed): the rejected points are recorded, shown in the plan and counted by the report.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys

import pytest
import yaml
from conftest import REPO, run_playbook

spec = importlib.util.spec_from_file_location(
    "settings_check", REPO / "action_plugins" / "sglang_settings_check.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

PLAY = yaml.safe_load((REPO / "playbooks" / "sweep.yml").read_text())[1]["vars"]
EXAMPLE_AXES, EXAMPLE_SETTINGS = PLAY["__sweep_example_axes"], PLAY["__sweep_example_settings"]
DEFAULTS = yaml.safe_load((REPO / "roles" / "sglang" / "defaults" / "main.yml").read_text())
DDTREE_LAB = yaml.safe_load((REPO / "inventory" / "lab" / "ddtree.yml").read_text())
JUDGED = (
    "sglang_build_profile",
    "sglang_build_profiles",
    "sglang_speculative_algorithm",
    "sglang_speculative_draft_window_size",
    "sglang_speculative_tree_budget",
    "sglang_speculative_topk",
    "sglang_speculative_num_steps",
    "sglang_speculative_num_draft_tokens",
    "sglang_speculative_block_size",
    "sglang_environment",
    "sglang_extra_args",
)


def example_points():
    """The points sweep_setup.yml enumerates for the example (baseline, then the matrix)."""
    points = [{"name": "baseline", "baseline": True, "settings": {}}]
    for values in itertools.product(*(axis["values"] for axis in EXAMPLE_AXES)):
        settings = dict(EXAMPLE_SETTINGS, **{a["variable"]: v for a, v in zip(EXAMPLE_AXES, values)})
        name = ",".join(f"{a['name']}={v}" for a, v in zip(EXAMPLE_AXES, values))
        points.append({"name": name, "baseline": False, "settings": settings})
    return points


def host_variables(**override):
    """What the sweep passes: the DDTree lab host's values (ddtree.yml over the role defaults)."""
    merged = {**DEFAULTS, **DDTREE_LAB, **override}
    return {name: merged.get(name) for name in JUDGED}


def test_the_example_is_the_seeds_sweep():
    assert [(a["name"], a["values"]) for a in EXAMPLE_AXES] == [
        ("budget", [8, 16, 32, 64]),
        ("topk", [1, 2, 4]),
        ("window", [2048]),
    ]
    assert EXAMPLE_SETTINGS == {"sglang_speculative_algorithm": "DDTREE"}
    topk = next(a for a in EXAMPLE_AXES if a["name"] == "topk")
    assert "arg" not in topk  # an environment knob on DDTree builds: the role asserts it from /proc
    assert [a.get("arg") for a in EXAMPLE_AXES if a["name"] != "topk"] == [
        "speculative_ddtree_budget",
        "speculative_draft_window_size",
    ]


def test_a_build_that_forces_topk_1_rejects_topk_2_and_4():
    points = example_points()
    rejected = plugin.check_points(points, host_variables(sglang_build_profile="ddtree-rancy-wang"))
    expected = [p["name"] for p in points if p["settings"].get("sglang_speculative_topk") in (2, 4)]
    assert len(expected) == 8 and sorted(rejected) == sorted(expected)
    for name, reason in rejected.items():
        topk = name.split("topk=")[1].split(",")[0]
        assert reason.startswith(f"sglang_speculative_topk={topk}: sglang_build_profile ddtree-rancy-wang ")
        assert "forces speculative_eagle_topk to 1 with speculative_algorithm DDTREE" in reason


def test_the_pr29907_build_honours_every_point():
    assert plugin.check_points(example_points(), host_variables()) == {}
    assert host_variables()["sglang_build_profile"] == "ddtree-pr29907"


def test_topk_set_by_hand_in_the_environment_rejects_the_topk_points():
    env = {"SGLANG_DDTREE_MAX_TOPK": "4"}
    rejected = plugin.check_points(example_points(), host_variables(sglang_environment=env))
    assert len(rejected) == 12 and "baseline" not in rejected
    for reason in rejected.values():
        assert reason.startswith("sglang_environment.SGLANG_DDTREE_MAX_TOPK: set by hand")


def test_an_unknown_profile_rejects_every_point_naming_it():
    rejected = plugin.check_points(example_points(), host_variables(sglang_build_profile="ddtree-nope"))
    assert len(rejected) == 13
    for reason in rejected.values():
        assert "sglang_build_profile='ddtree-nope': not a known build profile" in reason


def test_points_of_a_sweep_over_dflash_on_upstream():
    """The lab integration sweep's extra point: top-k 2 with DFLASH on 0.5.23 (forces top-k 1)."""
    points = [
        {"name": "baseline", "settings": {}},
        {"name": "topk-2", "settings": {"sglang_speculative_topk": 2}},
        {"name": "window-1024", "settings": {"sglang_speculative_draft_window_size": 1024}},
    ]
    variables = {name: DEFAULTS.get(name) for name in JUDGED}
    rejected = plugin.check_points(points, variables)
    assert list(rejected) == ["topk-2"]
    assert rejected["topk-2"].startswith("sglang_speculative_topk=2: sglang_build_profile upstream ")


# ------------------------------------------------------------------ the playbook, controller only

HOSTS = {"ctl-rancy": "ddtree-rancy-wang", "ctl-pr29907": "ddtree-pr29907"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """ONE plan-only run of playbooks/sweep.yml (the example) on two controller-only hosts with the
    DDTree lab variables, one per build profile. Nothing is deployed: the hosts are this machine."""
    tmp_path = tmp_path_factory.mktemp("sweep-plan")
    state = tmp_path / "state"
    hosts = {
        name: {
            **DDTREE_LAB,
            "sglang_build_profile": profile,
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }
        for name, profile in HOSTS.items()
    }
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    extra = {
        "sweep_plan_only": True,
        "sweep_name": "ddtree",
        "sweep_state_dir": str(state),
        "sweep_bench_python": "/opt/sglang/venv/bin/python",
    }
    done = run_playbook(
        "-i",
        inventory,
        "playbooks/sweep.yml",
        "-e",
        json.dumps(extra),
        timeout=600,
        env={"PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}"},
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    out = {"log": " ".join(done.stdout.split()), "hosts": {}}
    for name in HOSTS:
        host = state / "hosts" / name
        records = [json.loads(p.read_text()) for p in (host / "points").glob("*.json")]
        out["hosts"][name] = {
            "dir": host,
            "plan": json.loads((host / "plan.json").read_text()),
            "records": {r["point"]["name"]: r for r in records},
        }
    out["report"] = json.loads((state / "report" / "sweep.json").read_text())
    out["md"] = (state / "report" / "sweep.md").read_text()
    return out


def test_plan_only_sweep_rejects_and_records_on_the_build_that_forces_topk_1(run):
    rancy = run["hosts"]["ctl-rancy"]
    names = [p["name"] for p in rancy["plan"]["points"]]
    assert len(names) == 13 and names[0] == "baseline"
    assert rancy["plan"]["settings"] == {"sglang_speculative_algorithm": "DDTREE"}
    assert rancy["plan"]["bench_python"] == "/opt/sglang/venv/bin/python"
    rejected = sorted(n for n in names if "topk=2" in n or "topk=4" in n)
    assert sorted(rancy["plan"]["rejected"]) == rejected == sorted(rancy["records"])
    for record in rancy["records"].values():
        assert record["result"] == "rejected" and record["host"] == "ctl-rancy"
        assert record["reason"].startswith("sglang_speculative_topk=")
        assert "sglang_build_profile ddtree-rancy-wang" in record["reason"]
        assert record["point"]["settings"]["sglang_speculative_algorithm"] == "DDTREE"
        assert "invocation_id" not in record and record["started"] is None
        assert set(record) >= {"sweep", "lab_run", "run_id", "point", "failed_task", "reason", "finished"}
    assert "8 rejected by the build (sglang_build_profile ddtree-rancy-wang)" in run["log"]
    assert "they are never run: budget=8,topk=2,window=2048, budget=8,topk=4,window=2048," in run["log"]
    assert "to measure now: baseline, budget=8,topk=1,window=2048, budget=16,topk=1," in run["log"]
    summary = {s["host"]: s for s in run["report"]["summary"]}
    assert (summary["ctl-rancy"]["rejected"], summary["ctl-rancy"]["pending"]) == (8, 5)
    section = run["md"].split("## Rejected points", 1)[1]
    assert all(f"- ctl-rancy {name}: sglang_speculative_topk=" in section for name in rejected)


def test_plan_only_sweep_rejects_nothing_on_the_pr29907_build(run):
    pr = run["hosts"]["ctl-pr29907"]
    assert pr["plan"]["rejected"] == {} and pr["records"] == {}
    assert "0 rejected by the build (sglang_build_profile ddtree-pr29907);" in run["log"]
    summary = {s["host"]: s for s in run["report"]["summary"]}
    assert (summary["ctl-pr29907"]["rejected"], summary["ctl-pr29907"]["pending"]) == (0, 13)


def test_plan_only_touches_no_host(run):
    assert run["log"].count("(sweep_plan_only: NOT run)") == 2
    assert "TASK [sglang :" not in run["log"]  # the role never ran
    for host in run["hosts"].values():
        assert not (host["dir"] / "sweep.json").exists()  # never marked running, never restored
    plots = {p["file"] for p in run["report"]["plots"]}
    assert {"throughput_vs_budget.png", "accept_length_vs_budget.png"} <= plots
