"""module_utils/sglang_serverargs on real server_args lines (0.5.23 dict form, older dataclass form)."""

from __future__ import annotations

import pytest
from ansible.module_utils import sglang_options as so
from ansible.module_utils import sglang_serverargs as sa
from conftest import FIXTURES

D = FIXTURES / "serverargs"


def parsed(name):
    return sa.parse_server_args((D / name).read_text())


@pytest.mark.parametrize(
    "name, window, algo",
    [
        ("dflash-2048.log", 2048, "DFLASH"),
        ("dflash-nowindow.log", None, "DFLASH"),
        ("dflash-lower-window-tp.log", 4096, "DFLASH"),  # argv said "dflash": SGLang upper-cased it
        ("ngram-window.log", 2048, "NGRAM"),
        ("plain.log", None, None),
    ],
)
def test_dict_form_of_0_5_23(name, window, algo):
    r = parsed(name)
    assert r["form"] == "dict" and r["partial"] is False
    assert len(r["args"]) == 546
    assert r["args"]["speculative_draft_window_size"] == window
    assert r["args"]["speculative_algorithm"] == algo
    assert r["args"]["cuda_graph_config"]["decode"]["max_bs"] == 160  # nested dicts survive


def test_dataclass_form_complete_line():
    r = parsed("dataclass-docs-offline-engine.txt")
    assert r["form"] == "dataclass" and r["partial"] is False
    assert r["args"]["model_path"] == "qwen/qwen2.5-0.5b-instruct"
    assert r["args"]["speculative_algorithm"] is None
    assert r["args"]["cuda_graph_bs"][:3] == [1, 2, 4]
    assert list(r["args"])[-1] == "forward_hooks"


def test_text_after_the_closing_bracket_is_not_part_of_the_arguments():
    """The repr ends at the bracket that closes it; what follows on the line does not make it partial."""
    line = (D / "dflash-2048.log").read_text().rstrip("\n")
    r = sa.parse_server_args(line + " (logged once) {not: args}")
    assert r == sa.parse_server_args(line)
    assert r["partial"] is False and r["args"]["speculative_draft_window_size"] == 2048


def test_cut_dataclass_line_parses_up_to_the_break():
    r = parsed("dataclass-issue-12726.txt")
    assert r["form"] == "dataclass" and r["partial"] is True
    assert r["args"]["max_running_requests"] == 48
    assert r["args"]["mem_fraction_static"] == 0.835
    assert "max_total_tokens" not in r["args"] and list(r["args"])[-1] == "max_queued_requests"


def test_non_literal_values_are_kept_as_source_text():
    r = sa.parse_server_args("x server_args=ServerArgs(model_path='/m', dtype=torch.bfloat16, tp_size=8)")
    assert r["args"] == {"model_path": "/m", "dtype": "torch.bfloat16", "tp_size": 8}
    r = sa.parse_server_args("server_args={'a': 1, 'b': <Foo object at 0x7f>, 'c': 3}")
    assert r["args"] == {"a": 1} and r["partial"] is True


def test_unknown_form_and_missing_marker_raise():
    with pytest.raises(sa.ServerArgsParseError):
        sa.parse_server_args("no marker here")
    with pytest.raises(sa.ServerArgsParseError):
        sa.parse_server_args("server_args=Namespace(a=1)")


def test_compare_is_alias_aware_and_type_tolerant():
    reported = {
        "speculative_dflash_draft_window_size": 2048,
        "speculative_algorithm": "DFLASH",
        "mem_fraction_static": 0.85,
        "trust_remote_code": True,
        "tp_size": 8,
        "tree_budget": 64,
    }
    expected = {
        "speculative_draft_window_size": "2048",
        "speculative_algorithm": "dflash",
        "mem_fraction_static": "0.85",
        "trust_remote_code": True,
        "tp_size": 8,
        "speculative_ddtree_budget": 64,
        "reasoning_parser": None,
    }
    assert sa.compare(expected, reported, "x") == []
    diffs = sa.compare(
        {"speculative_draft_window_size": 4096, "tp_size": "8x", "api_key": "S3CRETVALUE"},
        dict(reported, api_key="OTHER"),
        "journal",
    )
    assert diffs == [
        "api_key: expected <redacted>, running <redacted> (journal)",
        "speculative_draft_window_size (as speculative_dflash_draft_window_size): "
        "expected 4096, running 2048 (journal)",
        "tp_size: expected '8x', running 8 (journal)",
    ]
    assert sa.compare({"speculative_eagle_topk": 1}, {}, "s") == [
        "speculative_eagle_topk: expected 1, running <not reported> (s)"
    ]
    assert not sa.values_equal("model_path", "/m/", "/m")
    assert not sa.values_equal("trust_remote_code", True, "yes")


LABELS = {"config_hash": "3f2a9c0d41be"}


@pytest.mark.parametrize(
    ("running", "equal"),
    [
        (LABELS, True),  # /server_info, the dict-form server_args= line (ast)
        ('{"config_hash":"3f2a9c0d41be"}', True),  # /proc/<pid>/cmdline: the JSON text SGLang parses
        ('{"config_hash": "3f2a9c0d41be"}', True),
        ('{"config_hash":"000000000000"}', False),
        ({"config_hash": "3f2a9c0d41be", "team": "x"}, False),
        ("config_hash=3f2a9c0d41be", False),
        (None, False),
    ],
)
def test_a_mapping_equals_its_json_text_as_sglang_parses_it(running, equal):
    """--extra-metric-labels: argv holds JSON text (json.loads), /server_info and the log line the object."""
    assert sa.values_equal("extra_metric_labels", LABELS, running) is equal


def test_read_argv_reads_flags_like_argparse():
    argv = [
        "/opt/sglang/venv/bin/sglang",
        "serve",
        "--model",
        "/m",
        "--tensor-parallel-size",
        "8",
        "--speculative-draft-window-size=2048",
        "--trust-remote-code",
        "--no-enable-tf32-matmul",
        "--cuda-graph-bs",
        "1",
        "2",
        "4",
        "--speculative-dflash-draft-window-size",
        "1024",
    ]
    assert so.read_argv(argv) == {
        "model_path": "/m",
        "tp_size": "8",
        "speculative_draft_window_size": "1024",
        "trust_remote_code": True,
        "enable_tf32_matmul": False,
        "cuda_graph_bs": ["1", "2", "4"],
    }
    assert so.read_argv(["x", "--tp", "8"], flag_dests={"--tp": "tp_size"}) == {"tp_size": "8"}


def test_dflash_runner_line():
    line = (
        "[2026-12-02 16:27:55 TP0] Initialized DFLASH draft runner. attention_backend=triton, "
        "model=DFlashDraftModel, block_size=16, draft_window_size=None, compact_cache=False"
    )
    assert so.parse_draft_runner(line) == {
        "runner": "DFLASH draft runner",
        "algorithm": "DFLASH",
        "attention_backend": "triton",
        "model": "DFlashDraftModel",
        "block_size": 16,
        "draft_window_size": None,
        "compact_cache": False,
    }
    assert so.parse_draft_runner("The server is fired up and ready to roll!") is None


def test_canonical_key_and_find_line():
    assert so.canonical_key("tree_budget") == "speculative_ddtree_budget"
    assert so.canonical_key("tp_size") == "tp_size"
    assert sa.find_server_args_line(["a", "server_args={1: 2}", "server_args={}", "b"]) == "server_args={}"
