# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse each module_utils file once per ansible-playbook run, not once per module; ship each file's bytecode
with its source, so the host does not compile them again for every module it runs.

ansible-core builds the payload of every module a run uses (AnsiballZ: the module and the module_utils it
imports) in a worker process forked for the task; finding those imports parses each file with
``compile(..., ast.PyCF_ONLY_AST)``, and ``ansible.module_utils.basic`` with its ~40 dependencies is parsed
again for every module (a quarter of the controller's CPU in a one-host no-change deploy of this
repository, measured with py-spy: ~2.5 s of ~9.5 s). Before the first worker forks, this callback parses,
in the ansible-playbook process itself, ansible.module_utils.basic and every file of this repository's
module_utils/ with what they import; the forked workers inherit those syntax trees (copy-on-write) and
reuse them by the exact source text. The payloads built are the same bytes: only the parse is shared.

The host then imports that payload from a zip file (zipimport), which compiles every ``.py`` again: for
each module run, ``ansible.module_utils.basic`` and its dependencies, ~0.15-0.2 s of the host's CPU (a
no-change proof on a lab host: 0.35-0.48 s of CPU from the payload, 0.20-0.27 s with the bytecode cached).
So each ``.py`` written into a payload is followed by its bytecode (``.pyc``, compiled here once per run
and source): zipimport tries ``x.pyc`` before ``x.py``. The ``.pyc`` is hash-based and CHECKED (PEP 552):
the host verifies it against the ``.py`` beside it before using it, and a host whose Python has another
bytecode version (magic number) rejects it and compiles the ``.py`` as before - never different, at worst
as slow as before. ``__file__`` of a module then names its ``.pyc``; tracebacks name the files by their
path in the payload (``ansible/module_utils/basic.py``). The price is the payload's size: ~2.9x (the proof's
248 KB of base64 -> 727 KB, sent over SSH for every module run). Over a datacenter network that is a few
milliseconds; over a slow link to the hosts it can cost more than the compile it saves: the option
``bytecode`` (ansible.cfg ``[callback_sglang_ansiballz_cache] bytecode = false``, or the environment
variable ``SGLANG_PAYLOAD_BYTECODE=false``) turns it off, the shared parses stay.

ansible-core keeps ``_compile_module_ast``, ``recursive_finder`` and ``_add_module_to_zip`` private. Pinned
ansible-core (requirements.txt) is what this was measured with; with another one where they are missing or
differ, the callback does nothing and says so once (at -v): runs are then as fast as before, never different.
"""

from __future__ import annotations

import datetime
import importlib.util
import io
import marshal
import os
import zipfile

from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: sglang_ansiballz_cache
type: aggregate
short_description: Parse each module_utils file once per run, and ship its bytecode with the module payloads
description:
  - Shares the syntax trees ansible-core parses while building module payloads (AnsiballZ) between the
    modules of one ansible-playbook run, and writes each Python file's checked hash-based bytecode beside it
    in the payload, so the host imports it instead of compiling it again; enabled in ansible.cfg
    (callbacks_enabled).
requirements:
  - ansible-core 2.19 (private module_common._compile_module_ast, recursive_finder and _add_module_to_zip)
options:
  bytecode:
    description:
      - Write each Python file's bytecode (.pyc) beside it in the module payloads. The payloads grow ~2.9x;
        turn it off when the link to the hosts is slow.
    type: bool
    default: true
    ini:
      - section: callback_sglang_ansiballz_cache
        key: bytecode
    env:
      - name: SGLANG_PAYLOAD_BYTECODE
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


def _bytecode(name: str, source: bytes, memo: dict) -> bytes:
    """``source`` compiled as zipimport would compile the file ``name``, as a checked hash-based .pyc
    (PEP 552: magic number, flags 0b11, the source's hash, the marshalled code)."""
    key = (name, source)
    pyc = memo.get(key)
    if pyc is None:
        code = compile(source.replace(b"\r\n", b"\n").replace(b"\r", b"\n"), name, "exec", dont_inherit=True)
        pyc = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
        pyc += importlib.util.source_hash(source) + marshal.dumps(code)
        memo[key] = pyc
    return pyc


class _WithBytecode:
    """A payload's ZipFile that writes each Python file's .pyc right after it (its other methods are the
    ZipFile's)."""

    def __init__(self, zf: zipfile.ZipFile, memo: dict) -> None:
        self._zf, self._memo = zf, memo

    def __getattr__(self, name):
        return getattr(self._zf, name)

    def writestr(self, zinfo_or_arcname, data, *args, **kwargs):
        self._zf.writestr(zinfo_or_arcname, data, *args, **kwargs)
        name = getattr(zinfo_or_arcname, "filename", zinfo_or_arcname)
        if not name.endswith(".py"):
            return
        # The bytes the .py entry holds (writestr encodes text as UTF-8), which the host hashes.
        source = bytes(data) if isinstance(data, (bytes, bytearray)) else str(data).encode("utf-8")
        when = getattr(zinfo_or_arcname, "date_time", (1980, 1, 1, 0, 0, 0))
        info = zipfile.ZipInfo(name + "c", date_time=when)
        info.compress_type = getattr(zinfo_or_arcname, "compress_type", self._zf.compression)
        self._zf.writestr(info, _bytecode(name, source, self._memo))


def _install_bytecode():
    """Wrap module_common.recursive_finder and _add_module_to_zip so every Python file they write into a
    payload gets its .pyc; the answer: why not, or None."""
    from ansible.executor import module_common

    finder = getattr(module_common, "recursive_finder", None)
    add_module = getattr(module_common, "_add_module_to_zip", None)
    if finder is None or add_module is None:
        return "this ansible-core has no module_common.recursive_finder / _add_module_to_zip"
    if getattr(finder, "sglang_bytecode", None) is not None:
        return None
    memo = {}

    def recursive_finder(name, module_fqn, module_data, zf, *args, **kwargs):
        return finder(name, module_fqn, module_data, _WithBytecode(zf, memo), *args, **kwargs)

    def add_module_to_zip(zf, *args, **kwargs):
        return add_module(_WithBytecode(zf, memo), *args, **kwargs)

    recursive_finder.sglang_bytecode = add_module_to_zip.sglang_bytecode = memo
    module_common.recursive_finder, module_common._add_module_to_zip = recursive_finder, add_module_to_zip
    return None


def _prewarm():
    """Parse and compile, in this process (before any worker forks), what every module of library/ imports:
    one walk of a payload importing ansible.module_utils.basic and each module_utils file of this
    repository."""
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
        answers = [_install()]
        if self.get_option("bytecode"):
            answers.append(_install_bytecode())
        why = [reason for reason in answers if reason]
        if len(why) < len(answers):  # something installed: parse (and compile) before the workers fork
            try:
                _prewarm()
            except Exception as exc:  # noqa: BLE001 - an optimisation never fails a run
                why.append(f"prewarming failed ({type(exc).__name__}: {exc})")
        if why:
            display.vvv(f"sglang_ansiballz_cache: not sharing parses or bytecode: {'; '.join(why)}")
