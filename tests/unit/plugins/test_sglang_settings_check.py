"""action_plugins/sglang_settings_check.py: the controller-side rules of the sglang role.

The settings start from roles/sglang/defaults/main.yml and the rule data from roles/sglang/vars/main.yml
(the files the role uses), with the two templated defaults resolved as Ansible resolves them. The
unknown-variable check gets the options roles/sglang/tasks/preflight.yml gives it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, run_playbook

ROLE = REPO / "roles" / "sglang"
spec = importlib.util.spec_from_file_location(
    "settings_check", REPO / "action_plugins" / "sglang_settings_check.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
INTS, STRINGS = VARS["__sglang_int_settings"], VARS["__sglang_string_settings"]
SENTINEL = "sk-sentinel-settings-41"
# The role's one preflight task, as the role runs it.
(PREFLIGHT,) = yaml.safe_load((ROLE / "tasks" / "preflight.yml").read_text())
PATTERN = PREFLIGHT["sglang_settings_check"]["var_pattern"]
SPECS = ROLE / "meta" / "argument_specs.yml"


@pytest.fixture
def settings(tmp_path):
    s = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    s["sglang_launcher"] = [s["sglang_venv"] + "/bin/sglang", "serve"]
    s["sglang_releases_dir"] = "/opt/sglang/releases"
    s["sglang_start_limit_interval_sec"] = (
        s["sglang_start_limit_burst"] * (s["sglang_ready_timeout"] + s["sglang_restart_sec"]) + 30
    )
    s["environment"] = {
        "HF_HOME": "/var/lib/sglang/.cache/huggingface",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    s["cache_paths"] = ["/var/lib/sglang/.cache/huggingface"]
    s["sglang_api_key"] = SENTINEL
    return s


def errors(s):
    return plugin.check_settings(s, INTS, STRINGS)


def test_the_role_defaults_pass(settings):
    assert errors(settings) == []


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (
            "sglang_speculative_draft_window_size",
            "2048",
            'sglang_speculative_draft_window_size="2048" (str): must be an integer from 1 to 1048576 or null'
            ' (a quoted "2048" is a string: use | int or an unquoted number)',
        ),
        ("sglang_port", 0, "sglang_port=0 (int): must be an integer from 1 to 65535 (a quoted"),
        ("sglang_port", True, "sglang_port=true (bool): must be an integer from 1 to 65535"),
        (
            "sglang_speculative_topk",
            2.5,
            "sglang_speculative_topk=2.5 (float): must be an integer from 1 to 64 or null",
        ),
        ("sglang_tp_size", 3, "sglang_tp_size=3: must be 1, 2, 4 or 8"),
        (
            "sglang_mem_fraction_static",
            1.0,
            "sglang_mem_fraction_static=1.0: must be a number with 0 < x < 1, or null",
        ),
        ("sglang_served_model_name", "a\nb", "sglang_served_model_name: must be a string without newline"),
        (
            "sglang_host",
            "",
            "sglang_host: must not be an empty string (null leaves the flag to SGLang's default)",
        ),
        ("sglang_model_path", "models/x", 'sglang_model_path="models/x": must be an absolute path'),
        (
            "sglang_read_write_paths",
            ["/a b"],
            'sglang_read_write_paths: "/a b" must be an absolute path without',
        ),
        (
            "sglang_speculative_algorithm",
            "DFLASH;rm",
            'sglang_speculative_algorithm="DFLASH;rm": must be an algorithm',
        ),
        (
            "sglang_speculative_draft_model_path",
            None,
            "sglang_speculative_draft_model_path=null: must be an absolute path, and is required with"
            " sglang_speculative_algorithm=DFLASH",
        ),
        ("sglang_user", "Root", 'sglang_user="Root", sglang_group="sglang": must be POSIX user/group names'),
        ("sglang_user", "root", 'sglang_user="root": must not be root'),
        ("sglang_plan_user", "root", 'sglang_plan_user="root": must not be root'),
        ("sglang_plan_user", "sglang", 'sglang_plan_user="sglang": must differ from sglang_user'),
        ("sglang_service_name", "sglang.service", 'sglang_service_name="sglang.service": letters, digits'),
        (
            "sglang_start_limit_interval_sec",
            30,
            "sglang_start_limit_interval_sec=30 must exceed sglang_start_limit_burst x sglang_restart_sec"
            " (30 s)",
        ),
        ("sglang_version", "latest", 'sglang_version="latest": must be a release version such as 0.5.23'),
        ("sglang_launcher", [], "sglang_launcher: must be a non-empty list of strings"),
        ("sglang_releases_dir", "releases", 'sglang_releases_dir="releases": must be an absolute path'),
        ("sglang_releases_keep", 0, "sglang_releases_keep=0 (int): must be an integer from 1 to 100"),
        (
            "sglang_config_hash_label",
            "config-hash",
            'sglang_config_hash_label="config-hash": must be a Prometheus label name',
        ),
        (
            "sglang_config_hash_label",
            "__hash",
            'sglang_config_hash_label="__hash": must be a Prometheus label',
        ),
        (
            "sglang_metrics_textfile",
            "sglang_deploy.prom",
            'sglang_metrics_textfile="sglang_deploy.prom": must be an absolute path ending in .prom',
        ),
        (
            "sglang_metrics_textfile",
            "/var/lib/node_exporter/sglang.txt",
            'sglang_metrics_textfile="/var/lib/node_exporter/sglang.txt": must be an absolute path ending',
        ),
        ("sglang_min_accept_length", 0, "sglang_min_accept_length=0: must be a number > 0, or null"),
        ("sglang_min_accept_length", "2.5", 'sglang_min_accept_length="2.5": must be a number > 0, or null'),
        ("sglang_watch_interval", 0, "sglang_watch_interval=0 (int): must be an integer from 1 to 86400"),
        ("sglang_watch_hours", -1, "sglang_watch_hours=-1 (int): must be an integer from 0 to 8760"),
        ("sglang_watch_revert_count", 0, "sglang_watch_revert_count=0 (int): must be an integer from 1 to"),
    ],
)
def test_one_broken_rule_names_its_setting(settings, name, value, expected):
    settings[name] = value
    found = errors(settings)
    assert any(expected in e for e in found), found
    assert SENTINEL not in " ".join(found)


def test_window_below_block_and_block_differs_from_draft_tokens(settings):
    settings.update(
        sglang_speculative_draft_window_size=8,
        sglang_speculative_block_size=16,
        sglang_speculative_num_draft_tokens=32,
    )
    assert errors(settings) == [
        "sglang_speculative_draft_window_size=8 must be >= the block size (sglang_speculative_block_size=16,"
        " sglang_speculative_num_draft_tokens=32); SGLang refuses it at start",
        "sglang_speculative_block_size=16 and sglang_speculative_num_draft_tokens=32: for DFLASH the block"
        " size IS the number of draft tokens; set one of them (SGLang fails when both are set and differ)",
    ]


def test_environment_rules(settings):
    settings["environment"] = {
        "nccl_debug": "INFO",
        "SGLANG_API_KEY": "x",
        "A": "x\ny",
        "B": True,
        "CUDA_VISIBLE_DEVICES": "GPU-1a2b",
    }
    found = errors(settings)
    assert 'sglang_environment: the name "nccl_debug" must match ^[A-Z_][A-Z0-9_]*$' in found[0]
    assert found[1].startswith('sglang_environment: the name "SGLANG_API_KEY"')
    assert found[2].startswith("sglang_environment.A: must be a string or number") and "(got str)" in found[2]
    assert found[3].endswith("(got bool)")
    assert found[4].startswith(
        'sglang_environment.CUDA_VISIBLE_DEVICES="GPU-1a2b": must list numeric device ids'
    )
    settings["environment"] = {}
    settings["cache_paths"] = ["/var/lib/my cache"]
    assert errors(settings)[0].startswith('sglang_environment: the cache directory "/var/lib/my cache"')


def test_api_key_is_described_never_shown(settings):
    settings["sglang_api_key"] = f" {SENTINEL}\n"
    found = errors(settings)
    assert found == [
        "sglang_api_key: must be a string without control characters or leading/trailing spaces"
        " (value not shown)"
    ]


@pytest.mark.parametrize(
    ("decision", "value", "error"),
    [
        (True, None, None),
        (True, "1", None),
        ("true", 1, None),
        (False, "0", None),
        (None, "1", None),  # no decision: sglang_environment is the operator's own
        (
            True,
            "0",
            'sglang_environment.NCCL_P2P_DISABLE="0" contradicts nvidia_nccl_p2p_disable: true,'
            " which sets NCCL_P2P_DISABLE=1 in the service environment",
        ),
        (
            False,
            "1",
            'sglang_environment.NCCL_P2P_DISABLE="1" contradicts nvidia_nccl_p2p_disable: false,'
            " which keeps NCCL P2P on in the service environment",
        ),
        ("maybe", None, 'nvidia_nccl_p2p_disable="maybe": must be true or false'),
    ],
)
def test_nccl_decision_owns_nccl_p2p_disable(settings, decision, value, error):
    settings["nvidia_nccl_p2p_disable"] = decision
    settings["sglang_environment"] = {} if value is None else {"NCCL_P2P_DISABLE": value}
    found = errors(settings)
    if error is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(error), found


@pytest.mark.parametrize("key", [f"-{SENTINEL}", f"--{SENTINEL}", "-"])
def test_api_key_starting_with_a_dash_is_refused_unseen(settings, key):
    """Issue 18: `--api-key -k...` makes SGLang's argparse exit 2 at start, yet every gate passed it
    (the preflight parses a placeholder, never the key)."""
    settings["sglang_api_key"] = key
    assert errors(settings) == [
        "sglang_api_key: must not start with '-' (SGLang's argparse would read it as an option"
        " and exit 2 at start; value not shown)"
    ]
    settings["sglang_api_key"] = f"k-{SENTINEL}-"  # a dash inside or at the end is fine
    assert errors(settings) == []


def test_a_secret_extra_argument_is_refused_without_showing_it(settings):
    settings["sglang_extra_args"] = [
        {"arg": "--api-key", "value": SENTINEL},
        {"arg": "--hf-token=" + SENTINEL},
        {"arg": "bad"},
    ]
    found = errors(settings)
    assert found == [
        "sglang_extra_args: --api-key, --hf-token takes a secret (value not shown); extra arguments"
        " are written into the unit in clear text: set sglang_api_key instead"
    ]


def test_extra_arguments_each_named_by_position(settings):
    settings["sglang_extra_args"] = [
        {"arg": "--enable-metrics"},
        {"arg": "--x", "value": 1, "other": 2},
        {"arg": "--max-running-requests=3"},
        {"arg": "--ok", "value": None},
    ]
    found = errors(settings)
    assert [e.split(" ", 1)[0] for e in found] == [
        "sglang_extra_args[1]",
        "sglang_extra_args[2]",
        "sglang_extra_args[3]",
    ]
    assert found[0].startswith('sglang_extra_args[1] {"arg": "--x", "value": 1, "other": 2}: each item has')


def test_install_source_rules(settings, tmp_path):
    settings.update(sglang_install_source="wheelhouse", sglang_wheelhouse_src=str(tmp_path))
    assert errors(settings) == [
        f'sglang_wheelhouse_src="{tmp_path}": must be an absolute directory on the'
        " controller holding an sglang-*.whl (build it with `make wheelhouse`)"
    ]
    (tmp_path / "sglang-0.5.23-py3-none-any.whl").write_text("")
    assert errors(settings) == []
    settings.update(sglang_install_source="git", sglang_git_ref="")
    assert errors(settings)[0].startswith("sglang_install_source=git needs sglang_git_repo")
    settings.update(
        sglang_install_source="pypi",
        sglang_install_dependencies=False,
        sglang_dependency_requirements=["--index-url=http://x"],
    )
    assert errors(settings)[0].startswith("sglang_install_dependencies=false: sglang_dependency_requirements")


def test_every_broken_rule_is_reported_at_once(settings):
    settings.update(sglang_port=0, sglang_tp_size=3, sglang_host="")
    names = [e.split("=")[0].split(":")[0] for e in errors(settings)]
    assert names == ["sglang_port", "sglang_tp_size", "sglang_host"]


@pytest.mark.parametrize(
    "value", ["x" * 43, "x" * 44, "x" * 60, "word " * 20, ["a b", "c d e f g h i j k l m n"]]
)
def test_long_values_are_cut_like_jinja_truncate(value):
    import json

    from jinja2 import Environment

    jinja = Environment().from_string("{{ v | truncate(40) }}")
    assert plugin.shown(value, 40) == jinja.render(v=json.dumps(value))


# ------------------------------------------------------------------ sglang_* variables that are no setting


def unknown_message(*names):
    """The message of the assert the role had before this check moved into the plugin, word for word."""
    return (
        f"{', '.join(names)}: not a variable of the sglang role (misspelt?);"
        " the settings are listed in roles/sglang/meta/argument_specs.yml"
    )


def run_task(settings, task_vars):
    """The plugin as the role's preflight task runs it: the variables are the task's variables."""
    args = {
        "argument_specs": str(SPECS),
        "accept_vars": VARS["__sglang_playbook_vars"],
        "var_pattern": PATTERN,
        "settings": settings,
        "int_settings": INTS,
        "string_settings": STRINGS,
    }
    task = SimpleNamespace(args=args, async_val=0, check_mode=False, action="sglang_settings_check")
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    return plugin.ActionModule(task, connection, None, None, None, None).run(task_vars=task_vars)


@pytest.fixture
def task_vars(settings):
    """Every role default, and variables of the other roles and of the playbooks that share the prefix."""
    role_vars = {name: value for name, value in settings.items() if name.startswith("sglang_")}
    return dict(
        role_vars,
        inventory_hostname="lab1",
        sglang_pull_interval=300,
        sglang_router_port=30100,
        sglang_rollout_batch=2,
        my_sglang_note="x",
        SGLANG_X=1,
    )


def test_a_misspelt_variable_is_named_and_the_others_of_the_prefix_are_not(settings, task_vars):
    task_vars.update(sglang_speculative_draft_windw_size=4096, sglang_tp=8)
    result = run_task(settings, task_vars)
    assert result["failed"] is True
    assert result["msg"] == unknown_message("sglang_speculative_draft_windw_size", "sglang_tp")
    assert result["unknown_vars"] == ["sglang_speculative_draft_windw_size", "sglang_tp"]


def test_the_role_settings_and_the_other_roles_variables_pass(settings, task_vars):
    result = run_task(settings, task_vars)
    assert (result.get("failed"), result["msg"], result["unknown_vars"]) == (
        None,
        "all settings are valid",
        [],
    )


def test_unknown_variables_and_broken_rules_are_reported_together_unknown_first(settings, task_vars):
    task_vars["sglang_prot"] = 30001
    settings.update(sglang_port=0, sglang_host="")
    result = run_task(settings, task_vars)
    assert [e.split(":")[0].split("=")[0] for e in result["errors"]] == [
        "sglang_prot",
        "sglang_port",
        "sglang_host",
    ]
    assert result["errors"][0] == unknown_message("sglang_prot")
    assert result["msg"] == " | ".join(result["errors"])


def test_an_unreadable_argument_spec_fails_the_task_naming_the_file(settings, task_vars, tmp_path):
    from ansible.errors import AnsibleActionFail

    task = SimpleNamespace(
        args={
            "argument_specs": str(tmp_path / "missing.yml"),
            "var_pattern": PATTERN,
            "settings": settings,
            "int_settings": INTS,
            "string_settings": STRINGS,
        },
        async_val=0,
        check_mode=False,
        action="sglang_settings_check",
    )
    act = plugin.ActionModule(
        task, SimpleNamespace(_shell=SimpleNamespace(tmpdir=None)), None, None, None, None
    )
    with pytest.raises(AnsibleActionFail, match="cannot read the role's variables from .*missing.yml"):
        act.run(task_vars=task_vars)


def test_the_argument_spec_is_parsed_once_per_process_and_version(tmp_path, monkeypatch):
    """The role's spec is parsed when the plugin is imported (in ansible-playbook's process: the workers
    it forks inherit it); a file is parsed again only when it changed."""
    assert plugin.spec_names(SPECS) == set(
        yaml.safe_load(SPECS.read_text())["argument_specs"]["main"]["options"]
    )
    assert any(key[0] == os.path.realpath(SPECS) for key in plugin._SPEC_NAMES)
    parses = []
    load = plugin.yaml.load
    monkeypatch.setattr(plugin.yaml, "load", lambda *a, **k: parses.append(1) or load(*a, **k))
    plugin.spec_names(SPECS)
    assert parses == []
    spec = tmp_path / "argument_specs.yml"
    spec.write_text("argument_specs: {main: {options: {sglang_a: {type: int}}}}\n")
    assert plugin.spec_names(spec) == {"sglang_a"} and plugin.spec_names(spec) == {"sglang_a"}
    assert parses == [1]
    spec.write_text("argument_specs: {main: {options: {sglang_a: {type: int}, sglang_bc: {}}}}\n")
    assert plugin.spec_names(spec) == {"sglang_a", "sglang_bc"} and parses == [1, 1]


def test_misspelt_variables_from_every_source_are_caught_as_varnames_finds_them(tmp_path):
    """One controller-only run of the role's preflight (nothing is contacted): a misspelt variable in
    group vars, host vars, -e, play vars, the include's vars and a fact is named; the variables
    ``lookup('ansible.builtin.varnames')`` finds with the same pattern are the ones the plugin saw."""
    inventory = tmp_path / "inventory.yml"
    host = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "sglang_host_varz": 1,
        "sglang_port": 30000,
    }
    group = {"sglang_group_varz": 1, "sglang_pull_interval": 300}
    inventory.write_text(
        yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"h1": host}, "vars": group}}}})
    )
    play = [
        {
            "hosts": "gpu_nodes",
            "gather_facts": False,
            "vars": {"sglang_play_varz": 1, "sglang_rollout_batch": 1},
            "tasks": [
                {"ansible.builtin.set_fact": {"sglang_fact_varz": 1}},
                {
                    "block": [
                        {
                            "ansible.builtin.include_role": {"name": "sglang", "tasks_from": "preflight.yml"},
                            "vars": {"sglang_include_varz": 1},
                        }
                    ],
                    "rescue": [
                        {
                            "name": "Found",
                            "ansible.builtin.debug": {
                                "msg": {
                                    "failed": "{{ ansible_failed_result }}",
                                    "varnames": f"{{{{ query('ansible.builtin.varnames', '{PATTERN}') }}}}",
                                }
                            },
                        }
                    ],
                },
            ],
        }
    ]
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump(play, sort_keys=False))
    extra = ["-e", "sglang_extra_varz=1", "-e", '{"sglang_router_port": 30100}']
    done = run_playbook("-i", inventory, playbook, *extra, json_output=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    (found,) = [t["hosts"]["h1"]["msg"] for t in tasks if t["task"]["name"] == "Found"]
    planted = ["sglang_extra_varz", "sglang_fact_varz", "sglang_group_varz", "sglang_host_varz"]
    planted += ["sglang_include_varz", "sglang_play_varz"]
    assert found["failed"]["msg"] == unknown_message(*sorted(planted))
    assert found["failed"]["unknown_vars"] == sorted(planted)
    # What varnames finds after the include (its vars, and the role's defaults, are the include's own).
    known = plugin.spec_names(SPECS) | set(VARS["__sglang_playbook_vars"])
    assert sorted(set(found["varnames"]) - known | {"sglang_include_varz"}) == sorted(planted)
