# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compile each Jinja template once, not once per worker and run.

ansible-core forks one worker process per task and host, and each worker compiles every template it
renders from scratch: ``AnsibleEnvironment.compile`` (Jinja's ``Environment.compile``: lex, parse, generate
Python source, ``compile()`` it) keeps no cache in ansible-core 2.19. In a no-change deploy of this
repository that compile was ~34% of the workers' CPU (py-spy). This callback memoizes the code objects
compile returns, by a hash of everything code generation reads, and keeps them between runs in one file per
(ansible-core, Jinja, Python bytecode) version under ANSIBLE_HOME (``~/.ansible/sglang-jinja-cache/``):
the ansible-playbook process loads the file before the first worker forks and every worker inherits it
(copy-on-write); a worker appends what it had to compile to a file of its own, and at the end of the run
ansible-playbook merges those into the file. A 4-host no-change run of playbooks/sglang.yml went from 5.95 s
to 5.28 s (fastest of 4 runs each); a 1-host run did not change.

What code generation reads, and so the key: the template text, its name and file name, ``defer_init``, the
environment's class, its lexer settings (``#jinja2:`` overrides), ``optimized``, ``finalize``,
``autoescape``, ``is_async``, the extensions, ansible-core's ALLOW_EMBEDDED_TEMPLATES (its code generator
reads it) and whether the compile escapes backslashes (its lexer reads it). Jinja's code generator also
looks up each filter and test the template names, and the code it writes depends on whether it exists and
on how it is called (``pass_context``...): those are stored with the code and checked again before it is
reused, so a plugin added, removed or changed since compiles the template again. Errors are never cached:
anything the memo does not cover, and every exception, is compiled by ansible-core as without it.

The file is read only from a directory and a file this user owns that nobody else can write: what it holds
is executed, as are the plugins ansible loads from the same ~/.ansible. ansible-core keeps
``_jinja_bits`` private; with another ansible-core where what this relies on is missing or differs, the
callback does nothing and says why (at -vvv): runs are then as fast as before, never different. An
optimisation never fails a run: a file it cannot read or write is said at -vvv and skipped.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import io
import marshal
import os
import re
import stat
import tempfile
import time

from ansible.plugins.callback import CallbackBase
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: sglang_jinja_cache
type: aggregate
short_description: Compile each Jinja template once, shared by the workers and kept between runs
description:
  - Memoizes the code objects Jinja compiles templates to, shares them with the forked workers of an
    ansible-playbook run and keeps them in ANSIBLE_HOME/sglang-jinja-cache/ for the next run; enabled in
    ansible.cfg (callbacks_enabled).
  - Loads the file only from a directory and a file the current user owns and no one else can write.
requirements:
  - ansible-core 2.19 (private ansible._internal._templating._jinja_bits)
"""

display = Display()

DIRNAME = "sglang-jinja-cache"
# A file past either cap is not loaded (the run starts empty); a merge past them keeps this run's entries
# only. A template compiles to a few KiB: this project's runs need a few thousand entries at most.
MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 50_000
# Pending files of runs that ended without their stats (interrupted, --syntax-check) are removed this late.
STALE_SECONDS = 24 * 3600
PARAMETERS = ["self", "source", "name", "filename", "raw", "defer_init"]


class _Memo:
    """The memo of one process tree: key -> marshal of (filters and tests looked up, code)."""

    def __init__(self, original):
        self.original = original
        self.entries = {}  # key -> bytes, what the file holds
        self.codes = {}  # key -> (deps, code object): the unmarshalled entries this process used
        self.new = set()  # keys compiled or merged in this run, by the parent
        self.parent = os.getpid()
        self.directory = None  # set when the cache directory is trusted
        self.path = None
        self.tag = None
        self.pending = None  # (pid, fd) of this worker's pending file
        self.loaded = False


def _internals():
    """ansible-core's templating internals this relies on; the answer: (module, None) or (None, why)."""
    try:
        from ansible._internal._templating import _jinja_bits as bits
        from jinja2 import nodes
        from jinja2.utils import _PassArg
    except ImportError as exc:
        return None, f"no ansible._internal._templating._jinja_bits ({exc})"
    needed = (
        "AnsibleEnvironment",
        "_TEMPLATE_OVERRIDE_FIELD_NAMES",
        "_TemplateConfig",
        "_TemplateCompileContext",
    )
    missing = [n for n in needed if not hasattr(bits, n)]
    if missing:
        return None, f"this ansible-core's _jinja_bits has no {', '.join(missing)}"
    env = bits.AnsibleEnvironment
    if not hasattr(env, "_debuggable_template_source") or not hasattr(
        bits._TemplateConfig, "allow_embedded_templates"
    ):
        why = "this ansible-core has no _debuggable_template_source or ALLOW_EMBEDDED_TEMPLATES setting"
        return None, why
    if not (hasattr(nodes, "Filter") and hasattr(nodes, "Test") and hasattr(_PassArg, "from_obj")):
        return None, "this Jinja has no nodes.Filter / nodes.Test / _PassArg.from_obj"
    try:
        parameters = list(inspect.signature(env.compile).parameters)
    except (TypeError, ValueError) as exc:
        return None, f"AnsibleEnvironment.compile has no signature ({exc})"
    if parameters != PARAMETERS:
        why = f"AnsibleEnvironment.compile takes ({', '.join(parameters)}), not ({', '.join(PARAMETERS)})"
        return None, why
    return bits, None


def _qualname(value):
    return f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', type(value).__qualname__)}"


def _key(bits, env, source, name, filename, defer_init):
    """sha256 of everything code generation reads but the filters and tests (_deps)."""
    tcc = bits._TemplateCompileContext.current(optional=True)
    autoescape = env.autoescape if isinstance(env.autoescape, bool) else _qualname(env.autoescape)
    settings = (
        _qualname(type(env)),
        _qualname(env.code_generator_class),
        tuple(getattr(env, n) for n in bits._TEMPLATE_OVERRIDE_FIELD_NAMES),
        env.optimized,
        _qualname(env.finalize) if env.finalize else None,
        autoescape,
        env.is_async,
        env.sandboxed,
        tuple(sorted(getattr(env, "intercepted_binops", ()))),
        tuple(sorted(getattr(env, "intercepted_unops", ()))),
        tuple(sorted(env.extensions)),
        bool(bits._TemplateConfig.allow_embedded_templates),
        bool(tcc is not None and tcc.escape_backslashes),
        name,
        filename,
        bool(defer_init),
    )
    digest = hashlib.sha256(repr(settings).encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(str(source).encode("utf-8", "surrogatepass"))
    return digest.digest()


def _how_called(env, kind, name):
    """How the generated code calls filter or test `name`: what Jinja's code generator decides by it."""
    from jinja2.utils import _PassArg

    func = (env.filters if kind == "filter" else env.tests).get(name)
    if func is None:
        return "missing"
    pass_arg = _PassArg.from_obj(func)
    return "plain" if pass_arg is None else str(getattr(pass_arg, "name", pass_arg))


def _deps(env, tree):
    """Each filter and test the template names, and how the generated code calls it."""
    from jinja2 import nodes

    names = {("filter", n.name) for n in tree.find_all(nodes.Filter)}
    names |= {("test", n.name) for n in tree.find_all(nodes.Test)}
    return tuple((kind, name, _how_called(env, kind, name)) for kind, name in sorted(names))


def _cached(memo, env, key):
    """The code object for key, when the filters and tests it was generated for are still the same."""
    found = memo.codes.get(key)
    if found is None:
        data = memo.entries.get(key)
        if data is None:
            return None
        deps, code = marshal.loads(data)
        found = memo.codes[key] = (deps, code)
    deps, code = found
    if all(_how_called(env, kind, name) == how for kind, name, how in deps):
        return code
    return None


def _remember(memo, key, deps, code):
    data = marshal.dumps((deps, code))
    memo.entries[key] = data
    memo.codes[key] = (deps, code)
    if os.getpid() == memo.parent:
        memo.new.add(key)
    elif memo.directory is not None:
        _append_pending(memo, key, data)


def _append_pending(memo, key, data):
    """A worker's new entry, for the parent to merge at the end of the run: one write of one record."""
    try:
        pid = os.getpid()
        if memo.pending is None or memo.pending[0] != pid:
            name = f"{memo.tag}.{memo.parent}.{pid}.pending"
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
            memo.pending = (pid, os.open(os.path.join(memo.directory, name), flags, 0o600))
        os.write(memo.pending[1], marshal.dumps((key, data)))
    except (OSError, ValueError) as exc:
        memo.directory = None  # once: the rest of this worker's entries stay in the worker
        display.vvv(f"sglang_jinja_cache: not keeping this worker's compiled templates: {exc}")


def _install():
    """Memoize AnsibleEnvironment.compile; the answer: why not, or None."""
    bits, why = _internals()
    if why:
        return why
    cls = bits.AnsibleEnvironment
    if getattr(cls.compile, "sglang_memo", None) is not None:
        return None
    original = cls.compile
    memo = _Memo(original)

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):
        if raw or not isinstance(source, str) or self._debuggable_template_source:
            return original(self, source, name, filename, raw, defer_init)
        try:
            key = _key(bits, self, source, name, filename, defer_init)
        except Exception:  # noqa: BLE001 - an optimisation never fails a run: compile it as without
            return original(self, source, name, filename, raw, defer_init)
        try:
            code = _cached(memo, self, key)
        except Exception:  # noqa: BLE001 - an entry that does not load is compiled again, and replaced
            memo.entries.pop(key, None)
            memo.codes.pop(key, None)
            code = None
        if code is not None:
            return code
        try:
            # What Environment.compile does with a str, in two steps: the tree tells the filters and tests.
            tree = self._parse(source, name, filename)
            code = original(self, tree, name, filename, False, defer_init)
            deps = _deps(self, tree)
        except Exception:  # noqa: BLE001
            # Every error is ansible-core's own: compiled again from the text as without the memo, it raises
            # what it raises (with its source hint); nothing is cached.
            return original(self, source, name, filename, raw, defer_init)
        try:
            _remember(memo, key, deps, code)
        except Exception as exc:  # noqa: BLE001
            display.vvv(f"sglang_jinja_cache: not keeping a compiled template: {type(exc).__name__}: {exc}")
        return code

    compile.sglang_memo = memo
    cls.compile = compile
    return None


def _memo():
    bits, _ = _internals()
    return getattr(bits.AnsibleEnvironment.compile, "sglang_memo", None) if bits else None


def _cache_dir():
    from ansible import constants as C

    return os.path.join(os.path.expanduser(getattr(C, "ANSIBLE_HOME", None) or "~/.ansible"), DIRNAME)


def _tag():
    """The file's name: the versions whose code objects it holds (marshal's format and the bytecode are
    Python's, the generated code Jinja's and ansible-core's)."""
    import jinja2
    from ansible.release import __version__ as ansible_version

    magic = importlib.util.MAGIC_NUMBER.hex()
    tag = f"ansible-core-{ansible_version}_jinja-{jinja2.__version__}_py-{magic}"
    return re.sub(r"[^A-Za-z0-9._-]", "_", tag)


def _untrusted(st, what):
    """Why a file or directory of the cache is not to be read, or None."""
    if st.st_uid != os.geteuid():
        return f"{what} is owned by uid {st.st_uid}, not by this user ({os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{what} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _open_dir(directory):
    """A descriptor of the cache directory, created 0700, when it is this user's alone; else (None, why)."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    why = _untrusted(os.fstat(fd), f"the directory {directory}")
    if why:
        os.close(fd)
        return None, why
    return fd, None


def _read_trusted(dir_fd, name, what):
    """The bytes of file `name` of the cache directory, or (None, why): owned by this user, written by no
    one else, a regular file, at most MAX_BYTES."""
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None, None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None, f"{what} is not a regular file"
        why = _untrusted(st, what)
        if why:
            return None, why
        if st.st_size > MAX_BYTES:
            return None, f"{what} is larger than {MAX_BYTES} bytes"
        return f.read(MAX_BYTES + 1), None


def _load(memo):
    """Point the memo at its file and load it; the answer: what happened, for -vvv."""
    memo.tag = _tag()
    directory = _cache_dir()
    memo.path = os.path.join(directory, memo.tag)
    try:
        dir_fd, why = _open_dir(directory)
    except OSError as exc:
        return f"not keeping compiled templates: cannot use {directory}: {exc}"
    if why:
        return f"not keeping compiled templates: {why} (ANSIBLE_HOME; it should be this user's, mode 0700)"
    memo.directory = directory
    try:
        data, why = _read_trusted(dir_fd, memo.tag, f"the file {memo.path}")
    except OSError as exc:
        data, why = None, f"cannot read {memo.path}: {exc}"
    finally:
        os.close(dir_fd)
    if why:
        return f"not loading compiled templates: {why}"
    if data is None:
        return f"no compiled templates yet in {memo.path}"
    try:
        entries = marshal.loads(data)
    except (EOFError, ValueError, TypeError) as exc:
        return f"not loading {memo.path}: corrupt ({exc}); starting empty"
    if not isinstance(entries, dict) or not all(
        type(k) is bytes and type(v) is bytes for k, v in entries.items()
    ):
        return f"not loading {memo.path}: not a dict of bytes; starting empty"
    if len(entries) > MAX_ENTRIES:
        return f"not loading {memo.path}: {len(entries)} entries, more than {MAX_ENTRIES}; starting empty"
    memo.entries.update(entries)
    return f"loaded {len(entries)} compiled templates from {memo.path}"


def _records(data):
    """The (key, entry) records of a pending file; a truncated last record (a worker killed) ends it."""
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        try:
            record = marshal.load(stream)
        except (EOFError, ValueError, TypeError):
            return
        if not (isinstance(record, tuple) and len(record) == 2 and all(type(x) is bytes for x in record)):
            return
        yield record


def _merge_and_save(memo):
    """At the end of the run: merge this run's pending files, write the file atomically, tidy; the answer
    for -vvv."""
    directory = memo.directory
    mine = f"{memo.tag}.{memo.parent}."
    merged = workers = 0
    dir_fd, why = _open_dir(directory)
    if why:
        return f"not saving compiled templates: {why}"
    try:
        now = time.time()
        for name in sorted(os.listdir(dir_fd)):
            if not name.endswith((".pending", ".tmp")):
                continue
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    continue  # not one this callback writes: left alone
                if name.startswith(mine) and name.endswith(".pending"):
                    data, why = _read_trusted(dir_fd, name, f"the file {name}")
                    if why:
                        display.vvv(f"sglang_jinja_cache: not merging {name}: {why}")
                    elif data:
                        workers += 1
                        for key, entry in _records(data):
                            memo.entries[key] = entry
                            memo.new.add(key)
                            merged += 1
                elif now - st.st_mtime < STALE_SECONDS:
                    continue  # another run's, still going
                os.unlink(name, dir_fd=dir_fd)
            except OSError as exc:  # one file in the way does not stop the save
                display.vvv(f"sglang_jinja_cache: {name}: {exc}")
    finally:
        os.close(dir_fd)
    entries = memo.entries
    data = marshal.dumps(entries)
    if len(entries) > MAX_ENTRIES or len(data) > MAX_BYTES:
        entries = {k: v for k, v in memo.entries.items() if k in memo.new}
        data = marshal.dumps(entries)
        if len(entries) > MAX_ENTRIES or len(data) > MAX_BYTES:
            return f"not saving: this run's templates alone pass {MAX_ENTRIES} entries or {MAX_BYTES} bytes"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=memo.tag + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, memo.path)  # atomic: a run reading meanwhile reads the old file or this one
    except BaseException:
        os.unlink(tmp)
        raise
    return (
        f"saved {len(entries)} compiled templates to {memo.path} "
        f"({merged} from {workers} workers' pending files, {len(memo.new)} new in this run)"
    )


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sglang_jinja_cache"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        try:
            why = _install()
            if why:
                display.vvv(f"sglang_jinja_cache: not sharing compiled templates: {why}")
                return
            memo = _memo()
            if memo.loaded:  # the next playbook of the same ansible-playbook run
                return
            memo.loaded = True
            display.vvv(f"sglang_jinja_cache: {_load(memo)}")
        except Exception as exc:  # noqa: BLE001 - an optimisation never fails a run
            display.vvv(f"sglang_jinja_cache: not loading compiled templates: {type(exc).__name__}: {exc}")

    def v2_playbook_on_stats(self, stats):
        try:
            memo = _memo()
            if memo is None or memo.directory is None or os.getpid() != memo.parent:
                return
            display.vvv(f"sglang_jinja_cache: {_merge_and_save(memo)}")
        except Exception as exc:  # noqa: BLE001 - an optimisation never fails a run
            display.vvv(f"sglang_jinja_cache: not saving compiled templates: {type(exc).__name__}: {exc}")
