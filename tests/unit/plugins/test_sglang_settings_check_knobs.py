"""Misspelt -e knobs are refused by name (issue 18, item 7).

Ansible ignores an extra var nothing reads, so `-e windw=4096` deployed the old window and the run
"succeeded". The `knobs` mode of action_plugins/sglang_settings_check.py reads the names given with
-e on the command line (key=value, JSON, YAML, @file) and refuses those that are no variable of this
repository but close to a knob. First the rule, then playbooks/preflight.yml for real (controller only:
its play runs on localhost; the inventory's gpu_nodes host is never contacted).
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import yaml
from conftest import REPO, run_playbook

spec = importlib.util.spec_from_file_location(
    "settings_check", REPO / "action_plugins" / "sglang_settings_check.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
KNOBS = "window, budget, topk, steps, draft_tokens, algorithm"


@pytest.mark.parametrize(
    ("name", "knob"),
    [
        ("windw", "window"),
        ("Window", "window"),
        ("widow", "window"),
        ("window_size", "window"),
        ("win", "window"),
        ("bugdet", "budget"),
        ("tree_budget", "budget"),
        ("top_k", "topk"),
        ("top-k", "topk"),
        ("num_steps", "steps"),
        ("step", "steps"),
        ("draft_token", "draft_tokens"),
        ("num_draft_tokens", "draft_tokens"),
        ("algo", "algorithm"),
        ("speculative_algorithm", "algorithm"),
    ],
)
def test_a_misspelt_knob_is_refused_naming_the_knob(name, knob):
    assert plugin.check_knobs({}, [name]) == [
        f"{name}: not a knob; did you mean {knob}? (the knobs: {KNOBS}; nothing was deployed)"
    ]


@pytest.mark.parametrize(
    "name",
    [
        "window",
        "budget",
        "topk",
        "steps",
        "draft_tokens",
        "algorithm",  # the knobs themselves
        "sglang_speculative_draft_window_size",
        "sglang_stable_seconds",
        "sglang_pull_branch",
        "sweep_name",
        "sweep_steps",
        "sweep_plan_only",
        "gitops_report_dir",
        "nvidia_driver_reboot_allowed",
        "nvidia_nccl_p2p_disable",
        "cuda_toolkit_enabled",
        "model_weights_hf_token",
        "ansible_python_interpreter",
        "__internal",
        "hf_token",
        "my_site",
        "vault_password_file",
        "model",
        "port",
        "lab_run",  # far from every knob
    ],
)
def test_known_variables_and_unrelated_names_pass(name):
    assert plugin.check_knobs({}, [name]) == []


def test_every_role_variable_has_a_known_prefix():
    """A variable of any role of this repository is never taken for a misspelt knob."""
    for role in sorted((REPO / "roles").iterdir()):
        names = set()
        defaults = role / "defaults" / "main.yml"
        if defaults.is_file():
            names |= set(yaml.safe_load(defaults.read_text()) or {})
        specs = role / "meta" / "argument_specs.yml"
        if specs.is_file():
            for entry in yaml.safe_load(specs.read_text())["argument_specs"].values():
                names |= set(entry.get("options") or {})
        assert names, role
        assert [n for n in names if not n.startswith(plugin.KNOWN_VAR_PREFIXES)] == [], role.name


def test_values_are_still_checked_and_every_problem_is_reported():
    assert plugin.check_knobs({"window": "4096x"}, ["window", "windw"]) == [
        f"windw: not a knob; did you mean window? (the knobs: {KNOBS}; nothing was deployed)",
        "window='4096x': must be an integer from 1 to 1048576 (speculative draft window in tokens),"
        " e.g. -e window=2048",
    ]


# ------------------------------------------------------------------ playbooks/preflight.yml, for real


def preflight(tmp_path, *extra):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {"gpu_nodes": {"hosts": {"never-contacted": {"ansible_host": "192.0.2.1"}}}}
                }
            }
        )
    )
    done = run_playbook(
        "-i",
        inventory,
        "playbooks/preflight.yml",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        *extra,
        json_output=True,
    )
    plays = json.loads(done.stdout)["plays"]
    results = [r for t in plays[0]["tasks"] for r in t["hosts"].values()]
    return done.returncode, [r["msg"] for r in results if r.get("failed")]


def test_preflight_refuses_misspelt_knobs_from_every_form_of_extra_vars(tmp_path):
    extra_file = tmp_path / "extra.yml"
    extra_file.write_text("window_size: 2048\nsglang_stable_seconds: 5\n")
    rc, failed = preflight(
        tmp_path, "-e", "windw=4096", "-e", '{"top_k": 4}', "-e", f"@{extra_file}", "-e", "{budget: 8}"
    )
    assert rc == 2 and len(failed) == 1, failed
    assert failed[0].split(" | ") == [
        f"{name}: not a knob; did you mean {knob}? (the knobs: {KNOBS}; nothing was deployed)"
        for name, knob in (("windw", "window"), ("top_k", "topk"), ("window_size", "window"))
    ]


def test_preflight_passes_knobs_and_other_variables(tmp_path):
    rc, failed = preflight(
        tmp_path,
        "-e",
        "window=4096",
        "-e",
        "sweep_name=ddtree",
        "-e",
        "my_site=eu",
        "-e",
        '{"nvidia_driver_reboot_allowed": true}',
    )
    assert (rc, failed) == (0, [])
