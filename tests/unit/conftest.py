"""Shared helpers: run a module's REAL ``main()`` from ``library/`` with ansible-core's
``patch_module_args`` and return its JSON result.

Usage in a test::

    def test_x(run_module, monkeypatch):
        monkeypatch.setattr(AnsibleModule, 'run_command', fake)   # patch what the module calls
        result, failed = run_module('sglang_history', {'path': str(tmp_path / 'h.jsonl')})

``args`` may carry ``_ansible_check_mode: True`` etc. ``result`` is the dict the module printed
(``exit_json``/``fail_json``), ``failed`` is ``result.get('failed', False)``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "library"
MODULE_UTILS = REPO / "module_utils"
FIXTURES = REPO / "tests" / "fixtures"
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"

# ansible.cfg sets module_utils = module_utils: make ``ansible.module_utils.sglang_*`` importable
# here the same way Ansible does when it ships the module.
import ansible.module_utils  # noqa: E402

if str(MODULE_UTILS) not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(MODULE_UTILS))

import contextlib

from ansible.module_utils.common import warnings as module_warnings  # noqa: E402
from ansible.module_utils.testing import patch_module_args  # noqa: E402


class FakeResponse:
    """What urllib.request.urlopen returns, for a recorded HTTP answer (status, JSON body)."""

    def __init__(self, status, body):
        self.status, self._body = status, body
        self.headers = {"Content-Type": "application/json"}

    def read(self):
        return self._body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def load_module(name):
    """Import ``library/<name>.py`` afresh (module-level state never leaks between tests)."""
    path = LIBRARY / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_library_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def call_main(module, args):
    """Run ``module.main()`` with ``args``; return the parsed JSON it printed.

    As in its own process on a host, the run starts with no warning or deprecation recorded: ansible-core
    keeps them in module globals, and one left by an earlier run in this test process would be returned
    again."""
    module_warnings._global_warnings.clear()
    module_warnings._global_deprecations.clear()
    out = io.StringIO()
    old_stdout = sys.stdout
    sys.stdout = out
    try:
        with patch_module_args(args), contextlib.suppress(SystemExit):
            module.main()
    finally:
        sys.stdout = old_stdout
    text = out.getvalue().strip()
    if not text:
        raise AssertionError(f"{module.__name__}.main() printed nothing")
    # The module prints exactly one JSON document (the last line when warnings print before).
    return json.loads(text.splitlines()[-1]), text


@pytest.fixture
def run_module():
    """``run_module(name, args) -> (result_dict, failed)``; ``run_module.last_output`` is the raw text."""

    def _run(name, args=None):
        module = load_module(name)
        result, text = call_main(module, dict(args or {}))
        _run.last_output = text
        return result, bool(result.get("failed", False))

    _run.last_output = ""
    return _run


@pytest.fixture
def fake_python(tmp_path):
    """An executable standing for the SGLang venv's python where run_command is patched (exits 99)."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\nexit 99\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def fixture_path():
    """``fixture_path('journal', 'inv-2.json') -> Path`` under tests/fixtures."""

    def _path(*parts):
        path = FIXTURES.joinpath(*parts)
        if not path.exists():
            raise AssertionError(f"missing fixture {path}")
        return path

    return _path


@pytest.fixture(scope="session", autouse=True)
def _ansible_home(tmp_path_factory):
    """The ansible-playbook runs of these tests keep what they write under ANSIBLE_HOME (collections caches,
    ControlPath sockets) in a directory of their own, not in the real home."""
    before = os.environ.get("ANSIBLE_HOME")
    os.environ["ANSIBLE_HOME"] = str(tmp_path_factory.mktemp("ansible-home"))
    yield
    if before is None:
        os.environ.pop("ANSIBLE_HOME", None)
    else:
        os.environ["ANSIBLE_HOME"] = before


@pytest.fixture(scope="session")
def ansible_plugins():
    """The collection loader as ansible-playbook installs it (``ansible.builtin.*`` lookups and filters
    found by name), once per session: a second install only warns."""
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader([])


def run_playbook(*args, json_output=False, timeout=300, env=None) -> subprocess.CompletedProcess:
    """ansible-playbook of this repository's toolchain with its ansible.cfg, run from the repository root; the
    finished process (text). ``json_output``: ansible.posix.json prints the results as one JSON document.
    ``env``: more environment variables."""
    environ = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1", **(env or {}))
    if json_output:
        environ["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    return subprocess.run(
        [str(PLAYBOOK), *map(str, args)],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
