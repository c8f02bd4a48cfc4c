"""The lab server's fault switch SGLANG_LAB_ACCEPT_LENGTH (lab/sglang_lab_server.py, in this interpreter: the
server imports only the standard library at the top): a speculative server's /generate answers then carry
completion_tokens / spec_verify_ct of about that length, which the deploy's speculation probe reads
(module_utils/sglang_speculation.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SERVER = Path(__file__).resolve().parents[3] / "lab" / "sglang_lab_server.py"


def load_server():
    spec = importlib.util.spec_from_file_location("sglang_lab_server_accept_length", SERVER)
    module = importlib.util.module_from_spec(spec)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


lab = load_server()
DFLASH = {
    "speculative_algorithm": "DFLASH",
    "speculative_num_draft_tokens": 16,
    "speculative_dflash_draft_window_size": 2048,
}


def final_meta(monkeypatch, resolved, env=None):
    """The meta_info of the last answer of a 64-token /generate, as the server's Lab computes it."""
    monkeypatch.delenv("SGLANG_LAB_ACCEPT_LENGTH", raising=False)
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    server = lab.Lab()
    server.spec = lab.spec_profile(resolved, server.accept_length)
    monkeypatch.setattr(lab.time, "sleep", lambda _s: None)
    *_, (_text, meta) = server.generate("the prompt", 2100, 64, "rid", False)
    return meta


@pytest.mark.parametrize("length, verify_ct", [("1.5", 43), ("1", 64), ("3.2", 20)])
def test_the_switch_sets_the_verify_forwards_to_the_length_asked(monkeypatch, length, verify_ct):
    meta = final_meta(monkeypatch, DFLASH, {"SGLANG_LAB_ACCEPT_LENGTH": length})
    assert (meta["completion_tokens"], meta["spec_verify_ct"]) == (64, verify_ct)
    assert abs(meta["completion_tokens"] / meta["spec_verify_ct"] - float(length)) < 0.05
    assert meta["spec_accept_length"] == 64 / verify_ct and meta["lab_server"] is True


def test_without_the_switch_the_servers_model_decides(monkeypatch):
    meta = final_meta(monkeypatch, DFLASH)
    assert meta["completion_tokens"] / meta["spec_verify_ct"] > 3


def test_without_speculation_the_switch_changes_nothing(monkeypatch):
    meta = final_meta(monkeypatch, {}, {"SGLANG_LAB_ACCEPT_LENGTH": "1.5"})
    assert meta["completion_tokens"] == 64 and "spec_verify_ct" not in meta


@pytest.mark.parametrize("raw", ["0.5", "x", "-2"])
def test_a_bad_length_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("SGLANG_LAB_ACCEPT_LENGTH", raw)
    with pytest.raises(lab.LabConfigError, match="SGLANG_LAB_ACCEPT_LENGTH"):
        lab.Lab()
