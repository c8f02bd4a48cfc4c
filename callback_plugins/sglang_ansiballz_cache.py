# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse each module_utils file once per ansible-playbook run, not once per module.

ansible-core builds the payload of every module a run uses (AnsiballZ: the module and the module_utils it
imports) in a worker process forked for the task; finding those imports parses each file with
``compile(..., ast.PyCF_ONLY_AST)``, and ``ansible.module_utils.basic`` with its ~40 dependencies is parsed
again for every module (a quarter of the controller's CPU in a one-host no-change deploy of this
repository, measured with py-spy: ~2.5 s of ~9.5 s). Before the first worker forks, this callback parses,
in the ansible-playbook process itself, ansible.module_utils.basic and every file of this repository's
module_utils/ with what they import; the forked workers inherit those syntax trees (copy-on-write) and
reuse them by the exact source text. The payloads built are the same bytes: only the parse is shared.

ansible-core keeps ``_compile_module_ast`` and ``recursive_finder`` private. Pinned ansible-core
(requirements.txt) is what this was measured with; with another one where they are missing or differ, the
callback does nothing and says so once (at -v): runs are then as fast as before, never different.
"""

from __future__ import annotations

import datetime
import io
import os
import zipfile

from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: sglang_ansiballz_cache
type: aggregate
short_description: Parse each module_utils file once per run instead of once per module
description:
  - Shares the syntax trees ansible-core parses while building module payloads (AnsiballZ) between the
    modules of one ansible-playbook run; enabled in ansible.cfg (callbacks_enabled).
requirements:
  - ansible-core 2.19 (private module_common._compile_module_ast and recursive_finder)
"""

display = Display()
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")


def _install():
    """Memoize module_common._compile_module_ast by (name, source); the answer: why not, or None."""
    try:
        from ansible.executor import module_common
    except ImportError as exc:  # pragma: no cover - ansible-core always has it
        return f"no ansible.executor.module_common ({exc})"
    original = getattr(module_common, "_compile_module_ast", None)
    if original is None or not hasattr(module_common, "recursive_finder"):
        return "this ansible-core has no module_common._compile_module_ast / recursive_finder"
    if getattr(original, "sglang_memo", None) is not None:
        return None
    memo = {}

    def compile_module_ast(module_name, source_code):
        key = (module_name, bytes(source_code) if isinstance(source_code, bytes) else str(source_code))
        tree = memo.get(key)
        if tree is None:
            tree = memo[key] = original(module_name, source_code)
        return tree

    compile_module_ast.sglang_memo = memo
    module_common._compile_module_ast = compile_module_ast
    return None


def _prewarm():
    """Parse, in this process (before any worker forks), what every module of library/ imports: one walk of
    a payload importing ansible.module_utils.basic and each module_utils file of this repository."""
    from ansible._internal._ansiballz import _builder
    from ansible.executor import module_common

    names = sorted(n[:-3] for n in os.listdir(MODULE_UTILS) if n.endswith(".py") and not n.startswith("_"))
    source = "from ansible.module_utils.basic import AnsibleModule\n" + "".join(
        f"import ansible.module_utils.{name}\n" for name in names
    )
    extension_manager = _builder.ExtensionManager.create(task_vars={})
    when = datetime.datetime.now(datetime.timezone.utc)
    with zipfile.ZipFile(io.BytesIO(), mode="w") as zf:
        module_common.recursive_finder(
            "sglang_prewarm", "ansible.legacy.sglang_prewarm", source.encode(), zf, when, extension_manager
        )


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_ansiballz_cache"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        why = _install()
        if why is None:
            try:
                _prewarm()
            except Exception as exc:  # noqa: BLE001 - an optimisation never fails a run
                why = f"prewarming failed ({type(exc).__name__}: {exc})"
        if why:
            display.vvv(f"sglang_ansiballz_cache: not sharing module_utils parses: {why}")
