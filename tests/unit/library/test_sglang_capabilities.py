"""library/sglang_capabilities.py: real main(), run_command patched with recorded real outputs.

probe-0.5.23.json is the real metadata probe of /tmp/w/venv; the dump's stdout is rebuilt from
sglang-0.5.23.json, which is that module's recorded result (see SOURCE.md).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "capabilities"
PROBE = json.loads((FIXTURES / "probe-0.5.23.json").read_text())
DUMP = json.loads((FIXTURES / "sglang-0.5.23.json").read_text())
# The controller's SGLang 0.5.23 environment (make sglang-venv); the Makefile sets the variable,
# and then a missing or broken environment FAILS these tests instead of skipping them.
VENV_PYTHON = os.environ.get("SGLANG_LAB_PYTHON", "/tmp/w/venv/bin/python")


def dump_stdout():
    payload = {k: DUMP[k] for k in ("version", "options", "algorithms", "algorithm_source")}
    payload["warnings"] = DUMP["warnings_during_dump"]
    return "SGLANG_DEPLOY_RESULT " + json.dumps(payload) + "\n"


@pytest.fixture
def calls(monkeypatch):
    class Calls(list):
        pass

    seen = Calls()
    outputs = {"probe": (PROBE["rc"], PROBE["stdout"], PROBE["stderr"]), "dump": (0, dump_stdout(), "")}

    def fake(self, args, **kwargs):
        kind = "dump" if "add_cli_args" in args[-1] else "probe"
        seen.append({"kind": kind, "args": args, "kwargs": kwargs})
        return outputs[kind]

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    seen.outputs = outputs
    return seen


def test_miss_then_hit(run_module, fake_python, tmp_path, calls):
    args = {"python": fake_python, "cache_dir": str(tmp_path / "cache")}
    result, failed = run_module("sglang_capabilities", args)
    assert not failed, result
    assert [c["kind"] for c in calls] == ["probe", "dump"]
    assert result["cached"] is False and result["changed"] is False
    assert result["version"] == "0.5.23"
    assert result["options"]["speculative_draft_window_size"]["flags"] == ["--speculative-draft-window-size"]
    assert "speculative_dflash_draft_window_size" not in result["options"]
    assert "DFLASH" in result["algorithms"] and "NEXTN" in result["algorithms"]
    assert os.path.basename(result["cache_file"]).startswith("0.5.23-")
    assert oct(os.stat(result["cache_file"]).st_mode & 0o777) == "0o644"
    # list-form, LANG=C, no $-expansion (argv values may carry ${SGLANG_API_KEY})
    for call in calls:
        assert isinstance(call["args"], list) and call["args"][0] == fake_python
        assert call["kwargs"]["environ_update"]["LANG"] == "C"
        assert call["kwargs"]["expand_user_and_vars"] is False

    calls.clear()
    again, failed = run_module("sglang_capabilities", args)
    assert not failed
    assert [c["kind"] for c in calls] == ["probe"]
    assert again["cached"] is True
    assert again["options"] == result["options"]


def test_check_mode_does_not_write_the_cache(run_module, fake_python, tmp_path, calls):
    cache = tmp_path / "cache"
    args = {"python": fake_python, "cache_dir": str(cache), "_ansible_check_mode": True}
    result, failed = run_module("sglang_capabilities", args)
    assert not failed and result["cached"] is False
    assert not cache.exists()


def test_reinstall_changes_record_hash_and_invalidates(run_module, fake_python, tmp_path, calls):
    args = {"python": fake_python, "cache_dir": str(tmp_path / "cache")}
    first, _ = run_module("sglang_capabilities", args)
    probe = json.loads(PROBE["stdout"].split(" ", 1)[1])
    probe["record_sha256"] = "f" * 64  # same version, different RECORD: e.g. a fork build
    calls.outputs["probe"] = (0, "SGLANG_DEPLOY_RESULT " + json.dumps(probe) + "\n", "")
    calls.clear()
    second, failed = run_module("sglang_capabilities", args)
    assert not failed
    assert [c["kind"] for c in calls] == ["probe", "dump"]
    assert second["cached"] is False and second["cache_file"] != first["cache_file"]


def test_dump_failure_names_the_python(run_module, fake_python, tmp_path, calls):
    traceback = "Traceback (most recent call last):\nModuleNotFoundError: No module named torch\n"
    calls.outputs["dump"] = (1, "", traceback)
    result, failed = run_module("sglang_capabilities", {"python": fake_python, "cache_dir": str(tmp_path)})
    assert failed
    assert result["msg"] == (
        f"python {fake_python}: building SGLang's parser failed: ModuleNotFoundError: No module named torch"
    )


def test_missing_sglang(run_module, fake_python, tmp_path, calls):
    calls.outputs["probe"] = (3, 'SGLANG_DEPLOY_RESULT {"error": "sglang is not installed in /opt/x"}\n', "")
    result, failed = run_module("sglang_capabilities", {"python": fake_python, "cache_dir": str(tmp_path)})
    assert failed
    assert result["msg"].endswith(
        "cannot read the installed sglang metadata: sglang is not installed in /opt/x"
    )


def test_python_must_exist(run_module, tmp_path):
    result, failed = run_module("sglang_capabilities", {"python": str(tmp_path / "nope")})
    assert failed and result["msg"].startswith("python: ")


@pytest.mark.slow
@pytest.mark.skipif(
    "SGLANG_LAB_PYTHON" not in os.environ and not os.access(VENV_PYTHON, os.X_OK),
    reason="needs an SGLang 0.5.23 environment: make sglang-venv",
)
def test_real_venv_dump_and_fast_cache_hit(run_module, tmp_path):
    args = {"python": VENV_PYTHON, "cache_dir": str(tmp_path)}
    result, failed = run_module("sglang_capabilities", args)
    assert not failed, result.get("msg")
    assert result["version"] == "0.5.23" and result["cached"] is False
    assert result["options"] == DUMP["options"]
    start = time.monotonic()
    again, _ = run_module("sglang_capabilities", args)
    elapsed = time.monotonic() - start
    assert again["cached"] is True
    # a miss imports torch + SGLang (~10 s here); a hit reads one JSON file (0.1-0.5 s under load)
    assert elapsed < 2.0, f"cache hit took {elapsed:.2f} s"


def test_argv_module_discovers_the_flags_on_the_host(run_module, fake_python, tmp_path, calls):
    """sglang_argv with ``python``: the same dump and cache, the options never leave the host."""
    args = {
        "python": fake_python,
        "cache_dir": str(tmp_path / "cache"),
        "settings": {
            "model_path": "/srv/models/target",
            "speculative_algorithm": "DFLASH",
            "speculative_draft_window_size": 2048,
        },
    }
    result, failed = run_module("sglang_argv", args)
    assert not failed, result
    assert [c["kind"] for c in calls] == ["probe", "dump"]
    assert result["version"] == "0.5.23" and result["capabilities_cached"] is False
    assert "DFLASH" in result["algorithms"] and "options" not in result
    assert result["argv"][result["argv"].index("--speculative-draft-window-size") + 1] == "2048"
    calls.clear()
    again, _ = run_module("sglang_argv", args)
    assert [c["kind"] for c in calls] == ["probe"] and again["capabilities_cached"] is True
    assert again["argv"] == result["argv"]
    both, failed = run_module("sglang_argv", dict(args, capabilities={"version": "0.5.23"}))
    assert failed and "mutually exclusive" in both["msg"]
    missing, failed = run_module("sglang_argv", dict(args, python=str(tmp_path / "nope")))
    assert failed and missing["msg"].startswith("python: ")


def test_argv_module_takes_the_cache_the_plan_probe_handed_over(run_module, fake_python, tmp_path, calls):
    """The plan account cannot read the cache directory: ``cache_files`` (what root's plan probe read) is
    looked up with the same checks; a dump of another installation is not used."""
    settings = {"model_path": "/srv/models/target", "speculative_algorithm": "DFLASH"}
    root_run = {"python": fake_python, "cache_dir": str(tmp_path / "cache"), "settings": settings}
    first, failed = run_module("sglang_argv", root_run)
    assert not failed and first["capabilities_cached"] is False
    cache = {p.name: json.loads(p.read_text()) for p in (tmp_path / "cache").iterdir()}
    unreadable = dict(root_run, cache_dir=str(tmp_path / "not-readable"), _ansible_check_mode=True)
    calls.clear()
    hit, failed = run_module("sglang_argv", dict(unreadable, cache_files=cache))
    assert not failed and hit["capabilities_cached"] is True and hit["argv"] == first["argv"]
    assert [c["kind"] for c in calls] == ["probe"]
    other = {name: dict(data, record_sha256="0" * 64) for name, data in cache.items()}
    calls.clear()
    miss, failed = run_module("sglang_argv", dict(unreadable, cache_files=other))
    assert not failed and miss["capabilities_cached"] is False
    assert [c["kind"] for c in calls] == ["probe", "dump"]
