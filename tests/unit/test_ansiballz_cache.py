"""callback_plugins/sglang_ansiballz_cache.py: the module payloads are built from shared parses, byte for
byte what ansible-core builds without it, and a changed source is parsed again; with the bytecode, each
Python file of a payload is followed by its checked .pyc, which a module run on the host imports, and which
a Python of another bytecode version, or a changed source, never uses."""

from __future__ import annotations

import datetime
import importlib.util
import io
import json
import marshal
import subprocess
import sys
import zipfile

import pytest
from ansible._internal._ansiballz import _builder
from ansible.executor import module_common
from conftest import REPO, run_playbook

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
    for name in ("recursive_finder", "_add_module_to_zip"):
        monkeypatch.setattr(module_common, name, getattr(module_common, name))
    monkeypatch.setattr(module_common, "_compile_module_ast", module_common._compile_module_ast)
    return module_common._compile_module_ast


def payload(name: str) -> dict[str, bytes]:
    source = (REPO / "library" / f"{name}.py").read_bytes()
    buffer = io.BytesIO()
    extensions = _builder.ExtensionManager.create(task_vars={})
    with zipfile.ZipFile(buffer, mode="w", compression=zipfile.ZIP_DEFLATED) as zf:
        module_common.recursive_finder(name, f"ansible.legacy.{name}", source, zf, WHEN, extensions)
        module_common._add_module_to_zip(zf, WHEN, f"ansible.legacy.{name}", source, name, extensions)
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


def test_each_python_file_is_followed_by_its_checked_bytecode(original):
    without = payload("sglang_running_args")
    assert plugin._install_bytecode() is None
    memo = module_common.recursive_finder.sglang_bytecode
    plugin._prewarm()
    warmed = len(memo)
    assert any(name == "ansible/module_utils/basic.py" for name, _ in memo) and warmed > 20
    with_bytecode = payload("sglang_running_args")
    # The sources are the same bytes; the only other entries are one .pyc per .py.
    assert {n: b for n, b in with_bytecode.items() if not n.endswith(".pyc")} == without
    assert sorted(n for n in with_bytecode if n.endswith(".pyc")) == sorted(n + "c" for n in without)
    for name, source in without.items():
        pyc = with_bytecode[name + "c"]
        # PEP 552: this Python's magic number, flags 0b11 (hash-based, checked), the source's hash.
        assert pyc[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(pyc[4:8], "little") == 0b11
        assert pyc[8:16] == importlib.util.source_hash(source)
        assert marshal.loads(pyc[16:]) == compile(source, name, "exec", dont_inherit=True)
    # The module's own file and the ones the prewarm had not seen were compiled; nothing twice.
    assert "ansible/legacy/sglang_running_args.pyc" in with_bytecode
    assert len(memo) < warmed + len(without)
    assert plugin._install_bytecode() is None and module_common.recursive_finder.sglang_bytecode is memo


def test_without_the_private_functions_no_bytecode_and_says_why(monkeypatch):
    monkeypatch.delattr(module_common, "_add_module_to_zip")
    assert "_add_module_to_zip" in plugin._install_bytecode()


def importing(tmp_path, pyc: bytes) -> str:
    """The __file__ of module m imported (zipimport) from a zip holding m.py (x = 1) and the given m.pyc,
    in a fresh Python."""
    archive = tmp_path / "payload.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("m.py", b"x = 1\n")
        zf.writestr("m.pyc", pyc)
    code = f"import sys; sys.path.insert(0, {str(archive)!r}); import m; assert m.x == 1; print(m.__file__)"
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_the_bytecode_is_used_only_by_the_same_python_for_the_same_source(tmp_path):
    good = plugin._bytecode("m.py", b"x = 1\n", {})
    assert importing(tmp_path, good).endswith("m.pyc")
    # Another Python's bytecode version (magic number): the source is compiled, as without the callback.
    assert importing(tmp_path, b"\x00\x00\r\n" + good[4:]).endswith("m.py")
    # A .pyc of another source beside this one (its hash differs): the source is compiled.
    assert importing(tmp_path, plugin._bytecode("m.py", b"x = 2\n", {})).endswith("m.py")


# A test-only module: where the host imported ansible.module_utils.basic from.
MODULE = """
from ansible.module_utils import basic


def main():
    module = basic.AnsibleModule(argument_spec={})
    module.exit_json(changed=False, basic_file=basic.__file__)


if __name__ == "__main__":
    main()
"""


def basic_file_in_a_module_run(tmp_path, **env):
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "where_is_basic.py").write_text(MODULE)
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n    - where_is_basic:\n"
    )
    env["ANSIBLE_LIBRARY"] = f"{tmp_path / 'library'}:{REPO / 'library'}"
    env["ANSIBLE_LOCAL_TEMP"] = str(tmp_path / "local-tmp")  # this run's own payload cache
    done = run_playbook(
        "-i",
        "localhost,",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        tmp_path / "play.yml",
        json_output=True,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]["basic_file"]


def test_a_module_run_imports_the_bytecode(tmp_path):
    assert "sglang_ansiballz_cache" in (REPO / "ansible.cfg").read_text()
    assert basic_file_in_a_module_run(tmp_path).endswith("/ansible/module_utils/basic.pyc")


def test_without_the_callback_a_module_run_compiles_the_source(tmp_path):
    found = basic_file_in_a_module_run(tmp_path, ANSIBLE_CALLBACKS_ENABLED="sglang_prefork")
    assert found.endswith("/ansible/module_utils/basic.py")


def test_with_the_bytecode_option_off_a_module_run_compiles_the_source(tmp_path):
    assert "bytecode = true" in (REPO / "ansible.cfg").read_text()
    found = basic_file_in_a_module_run(tmp_path, SGLANG_PAYLOAD_BYTECODE="false")
    assert found.endswith("/ansible/module_utils/basic.py")
