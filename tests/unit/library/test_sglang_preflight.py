"""library/sglang_preflight.py: rules, caching, and SGLang's own verdicts.

Fast tests patch run_command with the recorded REAL runs in
tests/fixtures/capabilities/preflight-runs/ (see SOURCE.md); the ``slow`` ones run the real
SGLang 0.5.23 environment (make sglang-venv) against the tiny lab checkpoints in .lab/models.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "capabilities" / "preflight-runs"
# The controller's SGLang 0.5.23 environment (make sglang-venv); the Makefile sets the variable,
# and then a missing or broken environment FAILS these tests instead of skipping them.
VENV_PYTHON = os.environ.get("SGLANG_LAB_PYTHON", "/tmp/w/venv/bin/python")
# Tiny real checkpoints written by lab/make_checkpoint.py (make sglang-venv writes them).
MODELS = Path(__file__).resolve().parents[3] / ".lab" / "models"
TARGET, DRAFT = str(MODELS / "target"), str(MODELS / "draft")
BASE = ["--model-path", TARGET, "--speculative-algorithm", "DFLASH"]
GOOD = (
    BASE[:2]
    + ["--api-key", "${SGLANG_API_KEY}"]
    + BASE[2:]
    + ["--speculative-draft-model-path", DRAFT, "--speculative-draft-window-size", "2048"]
)
WINDOW_8 = BASE + ["--speculative-draft-model-path", "/tmp/d-noblock", "--speculative-draft-window-size", "8"]
OLD_FLAG = BASE + ["--speculative-draft-model-path", DRAFT, "--speculative-dflash-draft-window-size", "2048"]


def recorded(name):
    return json.loads((RUNS / f"{name}.json").read_text())


@pytest.fixture
def replay(monkeypatch):
    """Patch run_command to answer with a recorded run; returns the list of calls made."""

    class Calls(list):
        run = None

    calls = Calls()

    def fake(self, args, **kwargs):
        kind = "resolve" if "prepare_server_args" in args[-1] else "probe"
        calls.append({"kind": kind, "args": args, "kwargs": kwargs})
        answer = next(c for c in recorded(calls.run) if c["script"] == kind)
        return answer["rc"], answer["stdout"], answer["stderr"]

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    return calls


def args_for(python, argv, cache, **extra):
    return dict(
        {
            "python": python,
            "argv": argv,
            "device": "cuda",
            "cache_dir": str(cache),
            "env": {"SGLANG_API_KEY": "real-secret-value", "HF_HOME": "/srv/hf"},
        },
        **extra,
    )


def test_good_argv_resolves_then_hits_the_cache(run_module, fake_python, tmp_path, replay):
    replay.run = "good-window-2048"
    result, failed = run_module("sglang_preflight", args_for(fake_python, GOOD, tmp_path / "c"))
    assert not failed, result
    assert [c["kind"] for c in replay] == ["probe", "resolve"]
    resolved = result["resolved"]
    assert resolved["speculative_draft_window_size"] == 2048
    assert resolved["speculative_num_draft_tokens"] == 16  # from the draft's config.json
    assert resolved["max_running_requests"] == 48
    assert resolved["api_key"] == "<redacted>"
    assert any("Max running requests is reset to 48" in w for w in result["sglang_warnings"])
    assert result["cached"] is False and result["changed"] is False
    sent = json.loads(replay[1]["kwargs"]["data"])["argv"]
    assert "${SGLANG_API_KEY}" not in sent and "real-secret-value" not in sent
    assert sent[-2:] == ["--device", "cuda"]  # for resolution only
    assert replay[1]["kwargs"]["environ_update"]["HF_HOME"] == "/srv/hf"
    assert replay[1]["kwargs"]["expand_user_and_vars"] is False
    assert "real-secret-value" not in json.dumps({k: v for k, v in result.items() if k != "invocation"})
    [cache_file] = (tmp_path / "c").glob("*.json")
    assert cache_file.stat().st_mode & 0o777 == 0o600

    replay.clear()
    again, failed = run_module("sglang_preflight", args_for(fake_python, GOOD, tmp_path / "c"))
    assert not failed
    assert [c["kind"] for c in replay] == ["probe"]
    assert again["cached"] is True and again["resolved"] == resolved

    replay.clear()
    changed_argv = GOOD[:-1] + ["4096"]
    replay.run = "good-window-2048"
    third, _ = run_module("sglang_preflight", args_for(fake_python, changed_argv, tmp_path / "c"))
    assert third["cached"] is False  # another argv is another key


def test_the_parse_runs_as_the_service_account_never_root(
    run_module, fake_python, tmp_path, replay, monkeypatch
):
    """Issue 37 item 3: resolving reads the model's configuration and, with trust_remote_code, imports its
    Python: it runs as the account given (setpriv), with its home, its --config copy handed to it."""
    nobody = pwd.getpwnam("nobody")
    answer = AnsibleModule.run_command
    owners = []

    def run_command(self, args, **kwargs):
        if kwargs.get("data"):
            argv = json.loads(kwargs["data"])["argv"]
            owners.append(os.stat(argv[argv.index("--config") + 1]).st_uid)
        return answer(self, args, **kwargs)

    monkeypatch.setattr(AnsibleModule, "run_command", run_command)
    replay.run = "good-window-2048"
    argv = GOOD + ["--config", "/etc/sglang/sglang.yaml"]
    args = dict(args_for(fake_python, argv, tmp_path / "c", run_as="nobody"), config_keys=["api-key"])
    result, failed = run_module("sglang_preflight", args)
    assert not failed, result
    probe, resolve = replay
    assert not probe["args"][0].endswith("/setpriv")
    assert resolve["args"][0].endswith("/setpriv") and resolve["args"][1:5] == [
        f"--reuid={nobody.pw_uid}",
        f"--regid={nobody.pw_gid}",
        "--init-groups",
        "--",
    ], resolve["args"][:6]
    assert resolve["kwargs"]["environ_update"]["HOME"] == nobody.pw_dir
    assert owners == [nobody.pw_uid]


def test_check_mode_writes_no_cache(run_module, fake_python, tmp_path, replay):
    replay.run = "good-window-2048"
    result, failed = run_module(
        "sglang_preflight", args_for(fake_python, GOOD, tmp_path / "c", _ansible_check_mode=True)
    )
    assert not failed and not (tmp_path / "c").exists()


def test_sglang_semantic_error_is_reported_in_its_own_words(run_module, fake_python, tmp_path, replay):
    replay.run = "window-8-below-block-size"
    result, failed = run_module("sglang_preflight", args_for(fake_python, WINDOW_8, tmp_path / "c"))
    assert failed and result["rc"] == 1
    assert result["msg"] == (
        "SGLang 0.5.23 refused the settings: ValueError: --speculative-draft-window-size must be >= "
        "--speculative-num-draft-tokens (block_size). window_size=8, block_size=16."
    )
    assert not (tmp_path / "c").exists()  # failures are never cached


def test_environment_values_do_not_mask_the_error_text(run_module, fake_python, tmp_path, replay):
    """Issue 18: with ``no_log`` on the whole environment, Ansible masked every value of it in the
    output, so NCCL_P2P_DISABLE=1 turned each "1" of SGLang's error into "********". Only the values
    of secret-named variables are masked now."""
    replay.run = "window-8-below-block-size"
    env = {
        "NCCL_P2P_DISABLE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "SGLANG_API_KEY": "real-secret-value",
        "HF_TOKEN": "hf_sentinel_token_42",
        "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    }
    result, failed = run_module("sglang_preflight", args_for(fake_python, WINDOW_8, tmp_path / "c", env=env))
    assert failed and result["rc"] == 1
    assert result["msg"] == (
        "SGLang 0.5.23 refused the settings: ValueError: --speculative-draft-window-size must be >= "
        "--speculative-num-draft-tokens (block_size). window_size=8, block_size=16."
    )
    assert result["invocation"]["module_args"]["env"]["NCCL_P2P_DISABLE"] == "1"
    out = run_module.last_output
    assert "real-secret-value" not in out and "hf_sentinel_token_42" not in out


def test_argparse_rejection_keeps_sglang_text_and_rc_2(run_module, fake_python, tmp_path, replay):
    replay.run = "old-window-flag-rejected"
    result, failed = run_module("sglang_preflight", args_for(fake_python, OLD_FLAG, tmp_path / "c"))
    assert failed and result["rc"] == 2
    assert result["msg"] == (
        "SGLang 0.5.23 rejected the argv: sglang serve: error: unrecognized arguments: "
        "--speculative-dflash-draft-window-size 2048"
    )


def draft_dir(tmp_path, config):
    path = tmp_path / "draft"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "extra, expect",
    [
        (["--speculative-draft-window-size", "0"], "speculative_draft_window_size: must be > 0, got 0"),
        (["--speculative-draft-window-size=-5"], "speculative_draft_window_size: must be > 0, got -5"),
        (["--speculative-num-steps", "3"], "speculative_num_steps: DFLASH forces it to 1; got 3"),
        (["--speculative-eagle-topk", "4"], "speculative_eagle_topk: DFLASH forces it to 1; got 4"),
        (["--pp-size", "2"], "pp_size: DFLASH requires pp_size 1, got 2"),
        (
            ["--speculative-dflash-block-size", "8", "--speculative-num-draft-tokens", "16"],
            "speculative_dflash_block_size: 8 differs from speculative_num_draft_tokens 16",
        ),
        (
            ["--speculative-num-draft-tokens", "32", "--speculative-draft-window-size", "16"],
            "speculative_draft_window_size: 16 is smaller than the configured block size (32)",
        ),
        (
            ["--speculative-draft-window-size", "big"],
            "speculative_draft_window_size: 'big' is not an integer",
        ),
    ],
)
def test_dflash_rules_fail_before_running_python(run_module, fake_python, tmp_path, replay, extra, expect):
    argv = BASE + ["--speculative-draft-model-path", "/nonexistent/draft"] + extra
    result, failed = run_module("sglang_preflight", args_for(fake_python, argv, tmp_path / "c"))
    assert failed
    assert result["msg"].startswith(expect), result["msg"]
    assert replay == []


@pytest.mark.parametrize("config", [{"block_size": 16}, {"dflash_config": {"block_size": 16}}])
def test_window_below_the_draft_config_block_size(run_module, fake_python, tmp_path, replay, config):
    argv = BASE + [
        "--speculative-draft-model-path",
        draft_dir(tmp_path, config),
        "--speculative-draft-window-size",
        "8",
    ]
    result, failed = run_module("sglang_preflight", args_for(fake_python, argv, tmp_path / "c"))
    assert failed
    assert result["msg"] == (
        "speculative_draft_window_size: 8 is smaller than the draft model's config.json "
        "block_size (16); DFLASH needs window >= block size"
    )
    assert replay == []


@pytest.mark.parametrize(
    "argv, expect",
    [
        (
            ["--model-path", "/m", "--speculative-algorithm", "DFLASH"],
            "speculative_draft_model_path: DFLASH needs",
        ),
        (
            ["--model-path", "/m", "--speculative-draft-window-size", "2048"],
            "speculative_draft_window_size: set without a speculative algorithm",
        ),
        (
            [
                "--model-path",
                "/m",
                "--speculative-algorithm",
                "ngram",
                "--speculative-draft-window-size",
                "2048",
            ],
            "speculative_draft_window_size: speculative_algorithm NGRAM does not honour the draft window",
        ),
    ],
)
def test_window_and_algorithm_rules(run_module, fake_python, tmp_path, replay, argv, expect):
    result, failed = run_module("sglang_preflight", args_for(fake_python, argv, tmp_path / "c"))
    assert failed and result["msg"].startswith(expect), result["msg"]
    assert replay == []


def test_window_with_eagle_only_warns(run_module, fake_python, tmp_path, replay):
    replay.run = "good-window-2048"  # the recorded resolution answer is reused; the rule is what is checked
    argv = [
        "--model-path",
        "/m",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-window-size",
        "2048",
    ]
    result, failed = run_module("sglang_preflight", args_for(fake_python, argv, tmp_path / "c"))
    assert not failed
    assert any(
        w.startswith("speculative_draft_window_size: with EAGLE3 the window is honoured only by")
        for w in result["sglang_warnings"]
    )


def test_python_must_exist(run_module, tmp_path):
    result, failed = run_module("sglang_preflight", {"python": str(tmp_path / "nope"), "argv": []})
    assert failed and result["msg"].startswith("python: ")


needs_venv = pytest.mark.skipif(
    "SGLANG_LAB_PYTHON" not in os.environ
    and not (
        os.access(VENV_PYTHON, os.X_OK)
        and os.path.isfile(f"{TARGET}/config.json")
        and os.path.isfile(f"{DRAFT}/config.json")
    ),
    reason="needs an SGLang 0.5.23 environment and the tiny lab checkpoints: make sglang-venv",
)


@pytest.mark.slow
@needs_venv
def test_real_good_argv_resolves_2048(run_module, tmp_path):
    result, failed = run_module("sglang_preflight", args_for(VENV_PYTHON, GOOD, tmp_path / "c"))
    assert not failed, result.get("msg")
    assert result["resolved"]["speculative_draft_window_size"] == 2048
    assert result["resolved"]["speculative_num_draft_tokens"] == 16


@pytest.mark.slow
@needs_venv
def test_real_window_8_fails_with_sglang_text(run_module, tmp_path):
    # A draft config without block_size: the module's own rule cannot know the block size,
    # so SGLang itself must refuse (it defaults the DFLASH block size to 16).
    config = json.loads(Path(DRAFT, "config.json").read_text())
    config.pop("block_size")
    draft = draft_dir(tmp_path, config)
    argv = BASE + ["--speculative-draft-model-path", draft, "--speculative-draft-window-size", "8"]
    result, failed = run_module("sglang_preflight", args_for(VENV_PYTHON, argv, tmp_path / "c"))
    assert failed and result["rc"] == 1
    assert (
        "ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens"
        in result["msg"]
    )
    shutil.rmtree(draft)


@pytest.mark.slow
@needs_venv
def test_real_old_flag_is_unrecognized_rc_2(run_module, tmp_path):
    result, failed = run_module("sglang_preflight", args_for(VENV_PYTHON, OLD_FLAG, tmp_path / "c"))
    assert failed and result["rc"] == 2
    assert result["msg"].endswith(
        "sglang serve: error: unrecognized arguments: --speculative-dflash-draft-window-size 2048"
    )
