"""module_utils/sglang_argv.py and library/sglang_argv.py on REAL parser dumps.

The dumps are in tests/fixtures/capabilities (see SOURCE.md there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.module_utils.sglang_argv import build_argv, flag_dests
from ansible.module_utils.sglang_options import ACCEPTED_DESTS, KEY_ALIASES, read_argv
from ansible.module_utils.sglang_serverargs import values_equal

CAPS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "capabilities"
CAPS = {
    name: json.loads((CAPS_DIR / f"sglang-{name}.json").read_text())
    for name in ("0.5.23", "0.5.18", "0.5.11", "ddtree-fork-rancy-wang")
}
FORK = "ddtree-fork-rancy-wang"
DFLASH = {
    "model_path": "/srv/models/target",
    "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "/srv/models/draft",
}


def value_after(argv, flag):
    assert flag in argv, argv
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(
    "build, flag",
    [
        ("0.5.23", "--speculative-draft-window-size"),
        ("0.5.18", "--speculative-draft-window-size"),  # visible name preferred over the hidden alias
        ("0.5.11", "--speculative-dflash-draft-window-size"),
        (FORK, "--speculative-draft-window-size"),
    ],
)
def test_window_maps_to_the_flag_the_build_has(build, flag):
    argv, managed = build_argv(dict(DFLASH, speculative_draft_window_size=2048), CAPS[build])
    assert value_after(argv, flag) == "2048"
    other = {"--speculative-draft-window-size", "--speculative-dflash-draft-window-size"} - {flag}
    assert not other & set(argv)
    assert managed["speculative_draft_window_size"] == 2048


def test_budget_fails_on_0523_naming_version_and_remedy():
    with pytest.raises(ValueError) as err:
        build_argv(dict(DFLASH, speculative_ddtree_budget=64), CAPS["0.5.23"])
    text = str(err.value)
    assert text.startswith("speculative_ddtree_budget: SGLang 0.5.23 has no tree-budget flag")
    assert "--speculative-ddtree-budget" in text
    assert "sglang_build_profile" in text


def test_budget_maps_on_the_fork_dump():
    settings = dict(DFLASH, speculative_algorithm="ddtree", speculative_ddtree_budget=64)
    argv, managed = build_argv(settings, CAPS[FORK])
    assert value_after(argv, "--speculative-ddtree-budget") == "64"
    assert value_after(argv, "--speculative-algorithm") == "DDTREE"
    assert managed["speculative_ddtree_budget"] == 64


@pytest.mark.parametrize(
    "build, expect",
    [
        (
            "0.5.23",
            "does not accept --speculative-dflash-draft-window-size "
            "(renamed: use --speculative-draft-window-size",
        ),
        (
            "0.5.18",
            "marks --speculative-dflash-draft-window-size as deprecated/hidden; "
            "use --speculative-draft-window-size",
        ),
    ],
)
def test_renamed_flag_as_extra_arg_fails_naming_the_replacement(build, expect):
    extra = [{"arg": "--speculative-dflash-draft-window-size", "value": 2048}]
    with pytest.raises(ValueError) as err:
        build_argv(DFLASH, CAPS[build], extra)
    assert str(err.value).startswith("extra_args[0] (--speculative-dflash-draft-window-size): ")
    assert expect in str(err.value)


def test_old_flag_is_a_valid_extra_on_0511():
    argv, managed = build_argv(
        DFLASH, CAPS["0.5.11"], [{"arg": "--speculative-dflash-draft-window-size", "value": "2048"}]
    )
    assert argv[-2:] == ["--speculative-dflash-draft-window-size", "2048"]
    assert managed["speculative_draft_window_size"] == 2048


@pytest.mark.parametrize(
    "settings, extra, expect",
    [
        (
            {"reasoning_parser": "kimi_k9"},
            [],
            "reasoning_parser: 'kimi_k9' is not accepted by SGLang 0.5.23 (choices:",
        ),
        (
            {"speculative_algorithm": "MEDUSA"},
            [],
            "speculative_algorithm: 'MEDUSA' is not a speculative algorithm",
        ),
        ({}, [{"arg": "--kv-canary-real-data", "value": "some"}], "'some' is not accepted by SGLang 0.5.23"),
        (
            {},
            [{"arg": "--no-such-flag", "value": 1}],
            "extra_args[0] (--no-such-flag): SGLang 0.5.23 does not accept",
        ),
        ({}, [{"arg": "--tp", "value": 8}], "does not accept --tp"),  # abbreviations are not exact flags
        ({"tp_size": 8}, [{"arg": "--tp-size", "value": 4}], "duplicates the managed setting tp_size"),
        (
            {"tp_size": 8},
            [{"arg": "--tensor-parallel-size", "value": 4}],
            "duplicates the managed setting tp_size",
        ),
        ({}, [{"arg": "--served-model-name", "value": "a\nb"}], "must not contain a newline or NUL"),
        ({}, [{"arg": "--served-model-name", "value": "a\x00b"}], "must not contain a newline or NUL"),
        ({}, [{"arg": "--trust-remote-code", "value": "yes"}], "is a switch and takes no value"),
        ({}, [{"arg": "--max-running-requests"}], "needs a value"),
        ({}, [{"arg": "--api-key", "value": "k"}], "secrets cannot be extra args"),
        ({"api_key": "k"}, [], "a secret must be passed through secret_env"),
        ({"trust_remote_code": "yes"}, [], "is a switch; the value must be true or false"),
        ({"tp_size": True}, [], "tp_size: a boolean is not a valid value"),
        ({"served_model_name": "-x"}, [], "would be read as a flag"),
    ],
)
def test_errors_name_the_setting(settings, extra, expect):
    with pytest.raises(ValueError) as err:
        build_argv(settings, CAPS["0.5.23"], extra)
    assert expect in str(err.value)


def test_algorithm_is_case_insensitive_and_checked_against_installed_list():
    argv, managed = build_argv({"speculative_algorithm": "nextn"}, CAPS["0.5.23"])
    assert argv == ["--speculative-algorithm", "NEXTN"]
    # 0.5.11 validated the algorithm with parser choices; DSPARK did not exist yet.
    with pytest.raises(ValueError, match="not accepted by SGLang 0.5.11"):
        build_argv({"speculative_algorithm": "dspark"}, CAPS["0.5.11"])
    with pytest.raises(ValueError, match="not a speculative algorithm of SGLang 0.5.23"):
        build_argv({"speculative_algorithm": "DDTREE"}, CAPS["0.5.23"])


def test_secrets_become_env_references():
    argv, managed = build_argv(
        dict(DFLASH, api_key="s3cret-value", admin_api_key="adm1n-value"),
        CAPS["0.5.23"],
        secret_env={"api_key": "SGLANG_API_KEY", "admin_api_key": "SGLANG_ADMIN_API_KEY"},
    )
    assert value_after(argv, "--api-key") == "${SGLANG_API_KEY}"
    assert value_after(argv, "--admin-api-key") == "${SGLANG_ADMIN_API_KEY}"
    assert managed["api_key"] == "${SGLANG_API_KEY}"
    assert "s3cret-value" not in json.dumps([argv, managed])
    assert "adm1n-value" not in json.dumps([argv, managed])


def test_booleans_none_and_order():
    argv, managed = build_argv(
        {
            "tp_size": 8,
            "model_path": "/m",
            "trust_remote_code": True,
            "enable_metrics": False,
            "mem_fraction_static": 0.88,
            "max_running_requests": None,
        },
        CAPS["0.5.23"],
    )
    assert argv == [
        "--model-path",
        "/m",
        "--mem-fraction-static",
        "0.88",
        "--tp-size",
        "8",
        "--trust-remote-code",
    ]
    assert managed == {
        "model_path": "/m",
        "mem_fraction_static": 0.88,
        "tp_size": 8,
        "trust_remote_code": True,
        "enable_metrics": False,
    }


def test_boolean_optional_action_false_uses_the_no_flag():
    # --speculative-enable-w4a4-mxfp4-megamoe is a BooleanOptionalAction with default None on 0.5.23.
    argv, _ = build_argv({"speculative_enable_w4a4_mxfp4_megamoe": False}, CAPS["0.5.23"])
    assert argv == ["--no-speculative-enable-w4a4-mxfp4-megamoe"]


def test_false_for_a_default_true_switch_fails_clearly():
    caps = json.loads(json.dumps(CAPS["0.5.23"]))
    caps["options"]["enable_metrics"]["actions"][0]["default"] = True  # a build whose switch defaults on
    with pytest.raises(
        ValueError, match="enable_metrics: must be false, but SGLang 0.5.23 defaults it to True"
    ):
        build_argv({"enable_metrics": False}, caps)


def test_dflash_block_size_aliases():
    with pytest.raises(
        ValueError, match="speculative_dflash_block_size: 8 differs from speculative_num_draft_tokens 16"
    ):
        build_argv(
            dict(DFLASH, speculative_dflash_block_size=8, speculative_num_draft_tokens=16), CAPS["0.5.23"]
        )
    argv, _ = build_argv(dict(DFLASH, speculative_dflash_block_size=16), CAPS["0.5.23"])
    assert value_after(argv, "--speculative-dflash-block-size") == "16"


def test_parallel_sizes_on_0511_use_its_dests():
    argv, managed = build_argv({"tp_size": 8, "pp_size": 1}, CAPS["0.5.11"])
    assert argv == ["--pipeline-parallel-size", "1", "--tensor-parallel-size", "8"]
    assert managed == {"pp_size": 1, "tp_size": 8}


@pytest.mark.parametrize("build", sorted(CAPS))
def test_read_argv_round_trips_build_argv(build):
    settings = dict(
        DFLASH,
        speculative_draft_window_size=2048,
        tp_size=8,
        trust_remote_code=True,
        mem_fraction_static=0.9,
        api_key="x",
    )
    argv, managed = build_argv(
        settings,
        CAPS[build],
        [{"arg": "--max-running-requests", "value": "32"}],
        {"api_key": "SGLANG_API_KEY"},
    )
    parsed = read_argv(argv, flag_dests(CAPS[build]))
    assert sorted(parsed) == sorted(managed)
    for key, value in managed.items():
        assert values_equal(key, value, parsed[key]), (key, value, parsed[key])


def test_read_argv_forms():
    caps = CAPS["0.5.23"]
    parsed = read_argv(
        [
            "serve",
            "--model=/m",
            "--tp-size",
            "8",
            "--speculative-draft-window-size",
            "1024",
            "--no-speculative-enable-w4a4-mxfp4-megamoe",
            "--cuda-graph-bs-decode",
            "1",
            "2",
            "4",
        ],
        flag_dests(caps),
    )
    assert parsed == {
        "model_path": "/m",
        "tp_size": "8",
        "speculative_draft_window_size": "1024",
        "speculative_enable_w4a4_mxfp4_megamoe": False,
        "cuda_graph_bs_decode": ["1", "2", "4"],
    }
    # 0.5.18's hidden deprecated alias is read onto the canonical key
    assert read_argv(["--speculative-dflash-draft-window-size", "512"], flag_dests(CAPS["0.5.18"])) == {
        "speculative_draft_window_size": "512"
    }


def test_alias_table_shape():
    assert ACCEPTED_DESTS["speculative_draft_window_size"][0] == "speculative_draft_window_size"
    assert KEY_ALIASES["speculative_draft_window_size"] == ("speculative_dflash_draft_window_size",)
    # every canonical key is a 0.5.23 dest
    for key in ACCEPTED_DESTS:
        if key != "speculative_ddtree_budget":
            assert key in CAPS["0.5.23"]["options"], key


def test_module_wraps_builder(run_module):
    result, failed = run_module(
        "sglang_argv",
        {
            "settings": dict(DFLASH, speculative_draft_window_size=2048, api_key="s3cret-value"),
            "secret_env": {"api_key": "SGLANG_API_KEY"},
            "capabilities": CAPS["0.5.11"],
        },
    )
    assert not failed, result
    assert value_after(result["argv"], "--speculative-dflash-draft-window-size") == "2048"
    assert "--api-key '${SGLANG_API_KEY}'" in result["display_argv"]
    assert result["changed"] is False
    assert "s3cret-value" not in run_module.last_output  # not even in invocation.module_args


def test_module_fails_naming_the_setting(run_module):
    result, failed = run_module(
        "sglang_argv",
        {"settings": dict(DFLASH, speculative_ddtree_budget=32), "capabilities": CAPS["0.5.23"]},
    )
    assert failed
    assert result["msg"].startswith("speculative_ddtree_budget: SGLang 0.5.23 has no tree-budget flag")
