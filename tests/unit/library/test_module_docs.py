"""Every module's documentation loads the way ``ansible-doc`` loads it (issue 15).

``ansible-doc -M library -t module <m>`` must work for every module in ``library/``, including the
doc stubs that document the action plugins of ``action_plugins/`` (an action plugin is documented
by a module file of the same name). Two ways, both with ansible-core's own code:

- per module, in this process: ``ansible.utils.plugin_docs.get_docstring`` (what ansible-doc calls:
  DOCUMENTATION and RETURN parsed by Ansible's YAML loader, doc fragments added), EXAMPLES parsed as
  YAML tasks, and the fields ansible-doc renders present;
- once for all modules, the real ``ansible-doc`` command (JSON and text output), which fails on
  the first module whose documentation does not load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.plugins.loader import fragment_loader
from ansible.utils.plugin_docs import get_docstring

REPO = Path(__file__).resolve().parents[3]
LIBRARY = REPO / "library"
ACTION_PLUGINS = REPO / "action_plugins"
ANSIBLE_DOC = Path(sys.executable).with_name("ansible-doc")

MODULES = sorted(p.stem for p in LIBRARY.glob("*.py") if not p.name.startswith("_"))
ACTIONS = sorted(p.stem for p in ACTION_PLUGINS.glob("*.py") if not p.name.startswith("_"))
# Action plugins without a doc stub in library/ yet. Strict: adding the stub makes the xfail pass and
# the test fail, so the name must then be removed here.
NO_DOC_STUB_YET: set[str] = set()


def load(name: str) -> tuple[dict, str, dict]:
    doc, examples, returndocs, _ = get_docstring(
        str(LIBRARY / f"{name}.py"), fragment_loader, verbose=False, ignore_errors=False, plugin_type="module"
    )
    return doc, examples, returndocs


def check_options(options: dict, where: str) -> None:
    assert isinstance(options, dict), f"{where}: options must be a mapping"
    for option, spec in options.items():
        assert isinstance(spec, dict), f"{where}.{option}: must be a mapping"
        assert spec.get("description"), f"{where}.{option}: no description"
        if "suboptions" in spec:
            check_options(spec["suboptions"], f"{where}.{option}")


def check_returns(returns: dict, where: str) -> None:
    assert isinstance(returns, dict), f"{where}: must be a mapping"
    for key, spec in returns.items():
        assert isinstance(spec, dict), f"{where}.{key}: must be a mapping"
        assert spec.get("description"), f"{where}.{key}: no description"
        assert spec.get("returned"), f"{where}.{key}: no 'returned'"
        assert spec.get("type"), f"{where}.{key}: no 'type'"
        if "contains" in spec:
            check_returns(spec["contains"], f"{where}.{key}")


@pytest.mark.parametrize("name", MODULES)
def test_documentation_examples_and_return_load(name):
    doc, examples, returndocs = load(name)
    assert isinstance(doc, dict), f"{name}: DOCUMENTATION missing or not a mapping"
    assert doc.get("module") == name, f"{name}: DOCUMENTATION says module: {doc.get('module')!r}"
    assert doc.get("short_description"), f"{name}: no short_description"
    assert doc.get("description"), f"{name}: no description"
    check_options(doc.get("options") or {}, f"{name} option")

    assert examples and examples.strip(), f"{name}: no EXAMPLES"
    tasks = yaml.safe_load(examples)
    assert isinstance(tasks, list) and tasks, f"{name}: EXAMPLES is not a list of tasks"
    for task in tasks:
        assert isinstance(task, dict) and task.get("name"), f"{name}: EXAMPLES task without a name: {task!r}"
    assert any(name in task or any(k.endswith(f".{name}") for k in task) for task in tasks), (
        f"{name}: no EXAMPLES task uses the module"
    )

    assert isinstance(returndocs, dict), f"{name}: RETURN missing or not a mapping"
    check_returns(returndocs, f"{name} return")


def _action_param(name: str):
    if name not in NO_DOC_STUB_YET:
        return name
    missing = pytest.mark.xfail(strict=True, reason=f"no library/{name}.py doc stub yet")
    return pytest.param(name, marks=missing)


@pytest.mark.parametrize("name", [_action_param(a) for a in ACTIONS])
def test_action_plugin_has_a_doc_stub(name):
    assert name in MODULES, f"action_plugins/{name}.py has no documentation: write the stub library/{name}.py"
    doc, _, _ = load(name)
    assert doc["module"] == name


def ansible_doc(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(ANSIBLE_DOC), "-M", str(LIBRARY), "-t", "module", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ansible_doc_json_of_every_module():
    r = ansible_doc("--json", *MODULES)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    docs = json.loads(r.stdout)
    assert sorted(docs) == MODULES
    for name, entry in docs.items():
        assert entry["doc"]["module"] == name
        assert entry["doc"]["filename"] == str(LIBRARY / f"{name}.py"), entry["doc"]["filename"]
        assert entry["examples"].strip() and entry["return"], name


def test_ansible_doc_text_of_every_module():
    r = ansible_doc(*MODULES)
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    for name in MODULES:
        assert f"> MODULE {name} (" in r.stdout, f"ansible-doc printed no page for {name}"
