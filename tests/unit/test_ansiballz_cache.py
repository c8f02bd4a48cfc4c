"""callback_plugins/sglang_ansiballz_cache.py: the module payloads are built from shared parses, byte for
byte what ansible-core builds without it, and a changed source is parsed again."""

from __future__ import annotations

import datetime
import importlib.util
import io
import zipfile

import pytest
from ansible._internal._ansiballz import _builder
from ansible.executor import module_common
from conftest import REPO

spec = importlib.util.spec_from_file_location(
    "sglang_ansiballz_cache", REPO / "callback_plugins" / "sglang_ansiballz_cache.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

WHEN = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.timezone.utc)


@pytest.fixture(scope="module")
def loader(ansible_plugins):
    """The collection loader as ansible-playbook installs it, and module_utils/ on the search path."""
    from ansible.plugins.loader import module_utils_loader

    module_utils_loader.add_directory(str(REPO / "module_utils"))


@pytest.fixture
def original(loader, monkeypatch):
    """module_common as ansible-core ships it, restored after the test."""
    monkeypatch.setattr(module_common, "_compile_module_ast", module_common._compile_module_ast)
    return module_common._compile_module_ast


def payload(name: str) -> dict[str, bytes]:
    source = (REPO / "library" / f"{name}.py").read_bytes()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, mode="w") as zf:
        module_common.recursive_finder(
            name, f"ansible.legacy.{name}", source, zf, WHEN, _builder.ExtensionManager.create(task_vars={})
        )
    with zipfile.ZipFile(buffer) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def test_payloads_are_the_same_bytes_and_the_shared_parses_are_used(original):
    without = {name: payload(name) for name in ("sglang_host_probe", "sglang_running_args")}
    assert plugin._install() is None
    memo = module_common._compile_module_ast.sglang_memo
    plugin._prewarm()
    warmed = len(memo)
    assert any(name == "ansible.module_utils.basic" for name, _ in memo) and warmed > 20
    assert {name: payload(name) for name in without} == without
    # The two modules' own sources were parsed; everything they import came from the prewarm.
    assert len(memo) == warmed + 2
    assert plugin._install() is None and module_common._compile_module_ast.sglang_memo is memo


def test_a_changed_source_is_parsed_again(original):
    assert plugin._install() is None
    compile_ast = module_common._compile_module_ast
    first = compile_ast("m", b"import os\n")
    assert compile_ast("m", b"import os\n") is first
    assert compile_ast("m", b"import sys\n") is not first


def test_without_the_private_functions_it_does_nothing_and_says_why(monkeypatch):
    monkeypatch.delattr(module_common, "_compile_module_ast")
    assert "has no module_common._compile_module_ast" in plugin._install()
