"""module_utils/sglang_options.py: the one owner of SGLang option knowledge, on the RECORDED parser
dumps of four builds (tests/fixtures/capabilities/SOURCE.md): SGLang 0.5.23, SGLang 0.5.11 (the old
window flag), the DDTree PR sgl-project/sglang#29907 and the Rancy-Wang/sglang ddtree-v2 fork.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible.module_utils import sglang_options as so
from ansible.module_utils.sglang_argv import build_command

CAPS_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "capabilities"
DUMPS = {
    "ddtree-db-guo": "sglang-ddtree-fork-db-guo.json",
    "upstream": "sglang-0.5.23.json",
    "dflash-old-window": "sglang-0.5.11.json",
    "ddtree-pr29907": "sglang-ddtree-pr29907.json",
    "ddtree-rancy-wang": "sglang-ddtree-fork-rancy-wang.json",
}
CAPS = {name: json.loads((CAPS_DIR / dump).read_text()) for name, dump in DUMPS.items()}
BASE = {
    "model_path": "/srv/models/target",
    "speculative_draft_model_path": "/srv/models/draft",
    "speculative_draft_window_size": 2048,
}


def profile(name, declared=None):
    found, errors = so.select_profile(name, declared)
    assert not errors, errors
    return found


# PR #29907 checks page_size before its default applies: DDTREE needs --page-size 1 given explicitly.
PAGE1 = [{"arg": "--page-size", "value": 1}]


def command(name, **settings):
    extra = PAGE1 if name == "ddtree-pr29907" and settings.get("speculative_algorithm") == "DDTREE" else []
    return build_command(dict(BASE, **settings), CAPS[name], profile(name), extra)


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_every_shipped_profile_builds_a_dflash_command_on_its_own_recorded_parser(name):
    built = command(name, speculative_algorithm="DFLASH")
    assert built["managed"]["speculative_draft_window_size"] == 2048
    assert built["require_window"] is True
    flag = (
        "--speculative-dflash-draft-window-size"
        if name == "dflash-old-window"
        else "--speculative-draft-window-size"
    )
    assert built["argv"][built["argv"].index(flag) + 1] == "2048"


@pytest.mark.parametrize("name", ["ddtree-pr29907", "ddtree-rancy-wang"])
def test_ddtree_honours_the_window_and_takes_the_budget_flag(name):
    built = command(name, speculative_algorithm="DDTREE", speculative_ddtree_budget=8)
    argv = built["argv"]
    assert argv[argv.index("--speculative-algorithm") + 1] == "DDTREE"
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "8"
    # the bug of issue 13: DDTREE was missing from the window-honouring set, so every DDTREE deploy
    # with a window failed verification after the restart.
    assert so.window_support("DDTREE") == "honoured"
    assert built["require_window"] is True


def test_pr29907_takes_the_tree_topk_from_the_environment():
    built = command(
        "ddtree-pr29907",
        speculative_algorithm="DDTREE",
        speculative_ddtree_budget=8,
        speculative_eagle_topk=4,
    )
    assert built["env"] == {"SGLANG_DDTREE_MAX_TOPK": "4"}
    assert built["env_managed"] == {"speculative_eagle_topk": "SGLANG_DDTREE_MAX_TOPK"}
    assert "--speculative-eagle-topk" not in built["argv"]
    assert "speculative_eagle_topk" not in built["managed"]
    # the same knob with DFLASH on the same build is a flag (and DFLASH forces it to 1)
    with pytest.raises(ValueError, match=r"sglang_speculative_topk=4: .*forces speculative_eagle_topk to 1"):
        command("ddtree-pr29907", speculative_algorithm="DFLASH", speculative_eagle_topk=4)


def test_rancy_wang_refuses_a_tree_topk_naming_the_build_and_the_knob():
    with pytest.raises(ValueError) as err:
        command("ddtree-rancy-wang", speculative_algorithm="DDTREE", speculative_eagle_topk=4)
    text = str(err.value)
    assert text.startswith("sglang_speculative_topk=4: sglang_build_profile ddtree-rancy-wang")
    assert "forces speculative_eagle_topk to 1 with speculative_algorithm DDTREE" in text
    # top-k 1 is what it forces: accepted
    assert command("ddtree-rancy-wang", speculative_algorithm="DDTREE", speculative_eagle_topk=1)["env"] == {}


def test_a_ddtree_profile_on_a_build_without_ddtree_is_refused_naming_the_profile():
    with pytest.raises(
        ValueError, match=r"^sglang_build_profile: ddtree-pr29907 .* --speculative-ddtree-budget"
    ):
        build_command(dict(BASE, speculative_algorithm="DFLASH"), CAPS["upstream"], profile("ddtree-pr29907"))
    # and the old window spelling's profile on 0.5.23 (which removed that flag)
    with pytest.raises(ValueError, match="--speculative-dflash-draft-window-size"):
        build_command(
            dict(BASE, speculative_algorithm="DFLASH"), CAPS["upstream"], profile("dflash-old-window")
        )


@pytest.mark.parametrize("budget", [0, -1, 4097])
def test_budget_outside_the_bounds_is_refused(budget):
    _, _, errors = so.plan_settings(
        {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": budget}, profile("ddtree-pr29907")
    )
    assert errors and errors[0].startswith(f"sglang_speculative_tree_budget={budget}: must be from 1 to 4096")


def test_a_declared_profile_limit_is_the_builds_limit():
    declared = {
        "my-fork": {"dests": ["speculative_ddtree_budget"], "limits": {"speculative_ddtree_budget": [1, 32]}}
    }
    _, _, errors = so.plan_settings(
        {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 64}, profile("my-fork", declared)
    )
    assert errors == [
        "sglang_speculative_tree_budget=64: must be from 1 to 32 with sglang_build_profile my-fork (my-fork)"
    ]


def test_an_env_knob_set_by_hand_too_is_refused():
    _, _, errors = so.plan_settings(
        {"speculative_algorithm": "DDTREE", "speculative_eagle_topk": 4},
        profile("ddtree-pr29907"),
        ["SGLANG_DDTREE_MAX_TOPK"],
        {"page_size": 1},
    )
    assert errors and errors[0].startswith("sglang_environment.SGLANG_DDTREE_MAX_TOPK: set by hand")


def test_unknown_profile_and_bad_declared_profiles_name_the_setting():
    found, errors = so.select_profile("ddtree-nope")
    assert found is None and errors[0].startswith(
        "sglang_build_profile='ddtree-nope': not a known build profile"
    )
    bad = {"fork": {"env_knobs": {"DDTREE": {"speculative_eagle_topk": "SGLANG_X\nEvil=1"}}, "colour": 1}}
    _, errors = so.select_profile("fork", bad)
    assert any(e.startswith("sglang_build_profiles.fork: unknown key(s) colour") for e in errors)
    assert any(
        e.startswith("sglang_build_profiles.fork.env_knobs.DDTREE.speculative_eagle_topk: ") for e in errors
    )
    _, errors = so.select_profile("fork", {"fork": {"forced": {"ddtree": {"speculative_eagle_topk": 1}}}})
    assert errors == [
        "sglang_build_profiles.fork.forced.ddtree: the algorithm must be an upper-case name such as DDTREE"
    ]


def test_shipped_profiles_are_valid_and_cite_a_source():
    for name, data in so.PROFILES.items():
        assert so._profile_errors(name, data, name) == []
        assert data["source"], name


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "[2026-12-02 16:27:55 TP0] Initialized DFLASH draft runner. attention_backend=triton, "
            "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True",
            {
                "runner": "DFLASH draft runner",
                "algorithm": "DFLASH",
                "attention_backend": "triton",
                "model": "DFlashDraftModel",
                "block_size": 16,
                "draft_window_size": 2048,
                "compact_cache": True,
            },
        ),
        (
            # the operator's DDTree build, window not set (reference sglang.md)
            "Initialized DDTREE draft runner ... draft_window_size=None, compact_cache=False",
            {
                "runner": "DDTREE draft runner",
                "algorithm": "DDTREE",
                "draft_window_size": None,
                "compact_cache": False,
            },
        ),
    ],
)
def test_draft_runner_lines(line, expected):
    assert so.parse_draft_runner(line) == expected


def test_ddtree_worker_lines_of_the_recorded_builds():
    # format strings: PR #29907 ddtree_worker.py, Rancy-Wang ddtree_worker_v2.py (fixtures/ddtree/SOURCE.md)
    assert so.parse_draft_runner(
        "[2026-12-03 18:20:01 TP0] Initialized DDTree worker. block_size=16, tree_budget=8, max_tree_nodes=9"
    ) == {
        "runner": "DDTree worker",
        "algorithm": "DDTREE",
        "block_size": 16,
        "tree_budget": 8,
        "max_tree_nodes": 9,
    }
    found = so.parse_draft_runner(
        "Initialized DDTREE v2 worker. block_size=16, tree_budget=32, max_tree_nodes=33, "
        "prune=False, tree_attention=True, cpu_build=False, cpu_follow=False, "
        "graph_buckets=None"
    )
    assert found["runner"] == "DDTREE v2 worker" and found["tree_budget"] == 32
    # which line proves what, per build
    assert so.runner_lines(profile("ddtree-pr29907"), "DDTREE") == {
        "window": "DFLASH draft runner",
        "budget": "DDTree worker",
    }
    assert so.runner_lines(profile("upstream"), "dflash") == {"window": "DFLASH draft runner", "budget": None}
    assert (
        command("ddtree-pr29907", speculative_algorithm="DDTREE")["runner_lines"]["budget"] == "DDTree worker"
    )


def test_knob_bounds_are_the_one_set():
    assert so.knob_error("window", "2048") is None
    assert so.knob_error("window", "1048577").startswith(
        "window='1048577': must be an integer from 1 to 1048576"
    )
    assert so.knob_error("budget", "0").startswith("budget='0': must be an integer from 1 to 4096")
    assert so.knob_error("budget", "8.5") is not None and so.knob_error("budget", "-3") is not None
    assert so.BOUNDS["speculative_draft_window_size"] == (1, 1048576)


def test_read_argv_with_the_installed_parsers_flag_map():
    argv = [
        "/opt/v/bin/python",
        "/opt/sglang-lab/sglang_lab_server.py",
        "--model",
        "/m",
        "--tp",
        "8",
        "--speculative-dflash-draft-window-size",
        "1024",
        "--no-foo",
        "--x=1",
        "--list",
        "a",
        "b",
    ]
    assert so.read_argv(argv, {"--tp": "tp_size"}) == {
        "model_path": "/m",
        "tp_size": "8",
        "speculative_draft_window_size": "1024",
        "foo": False,
        "x": "1",
        "list": ["a", "b"],
    }


def test_build_specific_flags_are_mapped():
    # Rancy-Wang: the block size of DDTREE goes to --speculative-ddtree-block-size
    built = command(
        "ddtree-rancy-wang",
        speculative_algorithm="DDTREE",
        speculative_dflash_block_size=8,
        speculative_draft_window_size=2048,
    )
    assert built["argv"][built["argv"].index("--speculative-ddtree-block-size") + 1] == "8"
    assert "--speculative-dflash-block-size" not in built["argv"]
    # DB-Guo: DDTree is the DFLASH switch --speculative-dflash-enable-ddtree
    built = command("ddtree-db-guo", speculative_algorithm="DFLASH")
    assert "--speculative-dflash-enable-ddtree" in built["argv"]
    assert built["managed"]["speculative_dflash_enable_ddtree"] is True


def test_pr29907_requires_an_explicit_page_size_and_notes_the_topk_cap():
    with pytest.raises(ValueError, match=r"sglang_extra_args --page-size=None: .*requires page_size 1"):
        build_command(
            dict(BASE, speculative_algorithm="DDTREE"), CAPS["ddtree-pr29907"], profile("ddtree-pr29907")
        )
    built = build_command(
        dict(BASE, speculative_algorithm="DDTREE", speculative_eagle_topk=4),
        CAPS["ddtree-pr29907"],
        profile("ddtree-pr29907"),
        [{"arg": "--page-size", "value": 1}],
    )
    assert built["notes"] and built["notes"][0].startswith(
        "speculative_eagle_topk: SGLANG_DDTREE_MAX_TOPK caps"
    )


# ------------------------------------------------------------------ the configuration's hash
def hashed(name, label="config_hash", extra=(), **settings):
    extra = [*(PAGE1 if name == "ddtree-pr29907" else []), *extra]
    return build_command(dict(BASE, **settings), CAPS[name], profile(name), extra, config_hash_label=label)


@pytest.mark.parametrize("name", sorted(DUMPS))
def test_every_metric_is_labelled_with_the_hash_of_the_command_line_without_that_label(name):
    built = hashed(name, speculative_algorithm="DFLASH", enable_metrics=True)
    argv = built["argv"]
    assert "--enable-metrics" in argv
    labels = argv[argv.index("--extra-metric-labels") + 1]
    assert json.loads(labels) == {"config_hash": built["config_hash"]}
    assert built["managed"]["extra_metric_labels"] == {"config_hash": built["config_hash"]}
    assert len(built["config_hash"]) == 12 and int(built["config_hash"], 16) >= 0
    # The label in argv changes nothing it names: the same settings built without the label hash the same.
    unlabelled = hashed(name, label=None, speculative_algorithm="DFLASH", enable_metrics=True)
    assert "--extra-metric-labels" not in unlabelled["argv"]
    assert unlabelled["config_hash"] == built["config_hash"]
    assert hashed(name, speculative_algorithm="DFLASH", enable_metrics=True) == built


@pytest.mark.parametrize(
    ("change", "same"),
    [
        ({"speculative_draft_window_size": 4096}, False),
        ({"enable_metrics": False}, False),
        ({"mem_fraction_static": 0.8}, False),
        # The listener is where it serves, not what: hosts with the same configuration share the hash.
        ({"host": "10.214.0.7", "port": 30001}, True),
        # The secret is in the --config file: the hash sees only that it is set, never its value.
        ({"api_key": True}, False),
    ],
)
def test_the_hash_follows_what_the_server_runs_not_where_it_listens(change, same):
    base = dict(speculative_algorithm="DFLASH", enable_metrics=True, host="127.0.0.1", port=30000)
    before, after = (
        build_command(
            dict(BASE, **settings),
            CAPS["upstream"],
            profile("upstream"),
            config_path="/etc/sglang/sglang.yaml",
            config_hash_label="config_hash",
        )
        for settings in (base, dict(base, **change))
    )
    assert (after["config_hash"] == before["config_hash"]) is same


def test_a_knob_the_build_reads_from_the_environment_is_in_the_hash():
    """PR #29907 takes the tree top-k from SGLANG_DDTREE_MAX_TOPK: argv alike, the hash differs."""
    four = hashed(
        "ddtree-pr29907",
        speculative_algorithm="DDTREE",
        speculative_ddtree_budget=8,
        speculative_eagle_topk=4,
    )
    two = hashed(
        "ddtree-pr29907",
        speculative_algorithm="DDTREE",
        speculative_ddtree_budget=8,
        speculative_eagle_topk=2,
    )
    assert [a for a in four["argv"] if "config_hash" not in a] == [
        a for a in two["argv"] if "config_hash" not in a
    ]
    assert four["config_hash"] != two["config_hash"]


def test_the_same_settings_hash_the_same_whatever_the_build_spells_the_window():
    """0.5.11 spells the window --speculative-dflash-draft-window-size, 0.5.23
    --speculative-draft-window-size."""
    old, new = (hashed(name, speculative_algorithm="DFLASH") for name in ("dflash-old-window", "upstream"))
    assert old["argv"] != new["argv"]
    assert old["config_hash"] == new["config_hash"]


def test_the_operators_metric_labels_are_merged_and_the_hash_label_is_the_roles():
    team = [{"arg": "--extra-metric-labels", "value": {"team": "inference"}}]
    built = hashed("upstream", extra=team, speculative_algorithm="DFLASH")
    argv = built["argv"]
    assert argv.count("--extra-metric-labels") == 1
    assert json.loads(argv[argv.index("--extra-metric-labels") + 1]) == {
        "config_hash": built["config_hash"],
        "team": "inference",
    }
    # The operator's labels are configuration too.
    assert built["config_hash"] != hashed("upstream", speculative_algorithm="DFLASH")["config_hash"]
    as_text = [{"arg": "--extra-metric-labels", "value": '{"team": "inference"}'}]
    assert hashed("upstream", extra=as_text, speculative_algorithm="DFLASH")["argv"] == argv
    with pytest.raises(
        ValueError, match=r"^extra_args\[0\] \(--extra-metric-labels\): the role sets the label"
    ):
        hashed("upstream", extra=[{"arg": "--extra-metric-labels", "value": {"config_hash": "x"}}])
    with pytest.raises(ValueError, match=r"^extra_args\[0\] \(--extra-metric-labels\): must be a mapping"):
        hashed("upstream", extra=[{"arg": "--extra-metric-labels", "value": "team=inference"}])


def test_a_build_without_extra_metric_labels_is_refused_as_any_absent_flag():
    """Every recorded build has the flag; a build without it (the 0.5.23 dump less that option) is refused
    like any setting its parser cannot express, naming the setting and the role variable that turns it off."""
    caps = json.loads(json.dumps(CAPS["upstream"]))
    del caps["options"]["extra_metric_labels"]
    with pytest.raises(ValueError) as err:
        build_command(
            dict(BASE, speculative_algorithm="DFLASH"),
            caps,
            profile("upstream"),
            config_hash_label="config_hash",
        )
    assert str(err.value).startswith("extra_metric_labels: SGLang 0.5.23 has no matching flag")
    assert "sglang_config_hash_label" in str(err.value)
    assert "--extra-metric-labels" not in build_command(dict(BASE), caps, profile("upstream"))["argv"]
