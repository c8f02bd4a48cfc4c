"""callback_plugins/sglang_jinja_cache.py: templates rendered with compiled code shared between workers and
runs render exactly as ansible-core renders them alone; what changes the generated code changes the key; the
file is read only when it is this user's alone, whole and small enough; a worker's entries reach the next
run through the parent; errors are ansible-core's and never cached; without the internals it does nothing.

Each "run" is what ansible-playbook does: the callback's v2_playbook_on_start in a process whose
AnsibleEnvironment.compile is ansible-core's own (a new process), rendering, then v2_playbook_on_stats.
ANSIBLE_HOME is a directory of tmp_path.
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import stat
import time

import jinja2
import pytest
from ansible import constants as C
from ansible._internal._templating import _jinja_bits as bits
from ansible._internal._templating._engine import TemplateEngine, TemplateOptions
from ansible.errors import AnsibleTemplateError
from ansible.parsing.dataloader import DataLoader
from ansible.template import trust_as_template
from conftest import REPO

spec = importlib.util.spec_from_file_location(
    "sglang_jinja_cache", REPO / "callback_plugins" / "sglang_jinja_cache.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)

ORIGINAL = jinja2.Environment.compile
VARIABLES = {
    "items": ["a", "b", "c"],
    "n": 3,
    "data": {"k": [1, 2], "s": "x"},
    "x": "the x",
    "which": "x",
}
# Filters, tests, loops, conditionals, a macro, a #jinja2: header, backslashes in expressions (one and two in
# the text), embedded templates in constants (ALLOW_EMBEDDED_TEMPLATES), and a template lookup of a file.
TEMPLATES = [
    "{{ items | map('upper') | join(',') }}",
    "{{ n | int + 1 }} {{ data | to_json }} {{ data.k | sum }}",
    "{% for i in items %}{{ loop.index }}={{ i }};{% endfor %}",
    "{% if n > 2 %}big{% else %}small{% endif %} {{ 'yes' if x is defined else 'no' }}",
    "{% macro twice(v) %}{{ v }}{{ v }}{% endmacro %}{{ twice(n) }} {{ items | select('ne', 'b') | list }}",
    "#jinja2:variable_start_string:'[%', variable_end_string:'%]'\n[% n %] {{ n }}",
    "[% n %] {{ n }}",  # the same text as the one above after its header: another entry
    '{{ "a\\b" }}|{{ "a\\\\b" }}|{{ "c:\\newfile" | length }}',
    '{{ lookup("vars", "x") }}',
    '{{ lookup("vars", "{{ which }}") }}',
    "{{ lookup('ansible.builtin.template', template_file) }}",
]
# Compiled besides TEMPLATES: the file of the template lookup, and the embedded "{{ which }}".
COMPILED = len(TEMPLATES) + 2
FILE_TEMPLATE = "{% for i in items %}- {{ i | upper }}\n{% endfor %}{{ n * 2 }} {{ 'ok' if data.s == 'x' }}\n"


@pytest.fixture(autouse=True)
def _plugins(ansible_plugins):
    """Ansible's filters and lookups found by name, as in a playbook run."""


@pytest.fixture
def home(tmp_path, monkeypatch):
    """ANSIBLE_HOME in tmp_path (never the real home); AnsibleEnvironment restored after the test."""
    path = tmp_path / "ansible-home"
    monkeypatch.setattr(C, "ANSIBLE_HOME", str(path))
    monkeypatch.setattr(bits.AnsibleEnvironment, "compile", ORIGINAL)
    return path


@pytest.fixture
def template_file(tmp_path):
    path = tmp_path / "t.j2"
    path.write_text(FILE_TEMPLATE)
    return str(path)


def start():
    """A new ansible-playbook process: ansible-core's compile, then the callback's playbook start."""
    bits.AnsibleEnvironment.compile = ORIGINAL
    plugin.CallbackModule().v2_playbook_on_start(None)
    return plugin._memo()


def stats():
    plugin.CallbackModule().v2_playbook_on_stats(None)


def render(source, template_file="", escape_backslashes=True):
    engine = TemplateEngine(loader=DataLoader(), variables={**VARIABLES, "template_file": template_file})
    return engine.template(
        trust_as_template(source), options=TemplateOptions(escape_backslashes=escape_backslashes)
    )


def render_all(template_file):
    return [render(source, template_file) for source in TEMPLATES]


def cache_file(home):
    return home / plugin.DIRNAME / plugin._tag()


def test_renders_the_same_without_cold_and_warm(home, template_file):
    expected = render_all(template_file)
    assert expected[5:7] == ["3 {{ n }}", "[% n %] 3"] and expected[7].startswith("a\\b|a\\\\b|")
    assert expected[8] == expected[9] == "the x" and expected[10].startswith("- A\n- B\n- C\n6 ok")

    memo = start()
    assert bits.AnsibleEnvironment.compile.sglang_memo is memo and not memo.entries
    assert render_all(template_file) == expected
    cold = len(memo.new)
    assert cold == COMPILED
    stats()
    path = cache_file(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    memo = start()
    assert len(memo.entries) == cold
    assert render_all(template_file) == expected
    assert not memo.new  # every template came from the file


def test_escaping_backslashes_or_not_is_a_different_entry(home, monkeypatch):
    source = '{{ "a\\nb" }}'  # in the text: one backslash, then n
    escaped, unescaped = render(source), render(source, escape_backslashes=False)
    assert (escaped, unescaped) == ("a\\nb", "a\nb")
    memo = start()
    assert render(source) == escaped
    assert render(source, escape_backslashes=False) == unescaped
    assert len(memo.new) == 2
    assert render(source) == escaped and render(source, escape_backslashes=False) == unescaped
    assert len(memo.new) == 2


def test_allow_embedded_templates_or_not_is_a_different_entry(home, monkeypatch):
    # ALLOW_EMBEDDED_TEMPLATES changes what the code generator writes for the constant "{{ which }}": without
    # it, the lookup gets the name "{{ which }}", a variable no one defined; with it, "x".
    source = '{{ lookup("vars", "{{ which }}") }}'
    memo = start()
    monkeypatch.setattr(bits._TemplateConfig, "allow_embedded_templates", False)
    with pytest.raises(AnsibleTemplateError, match="No variable named '{{ which }}'"):
        render(source)
    monkeypatch.setattr(bits._TemplateConfig, "allow_embedded_templates", True)
    assert render(source) == "the x"
    assert len(memo.new) == 3  # the source twice, and "{{ which }}"


def test_a_filter_that_changed_since_compiles_again(home):
    memo = start()
    assert render("{{ items | map('upper') | list }}") == ["A", "B", "C"]
    (key,) = memo.new
    deps, code = memo.codes[key]
    assert ("filter", "map", "context") in deps
    # As if compiled when `map` was a plain function: the code would call it without the context.
    memo.codes[key] = (tuple((k, n, "plain") for k, n, _ in deps), code)
    assert render("{{ items | map('upper') | list }}") == ["A", "B", "C"]
    assert memo.codes[key][0] == deps and memo.codes[key][1] is not code


@pytest.mark.parametrize("what", ["another uid", "file 0o666", "directory 0o777"])
def test_a_file_someone_else_could_write_is_not_loaded(home, template_file, what, monkeypatch):
    start()
    render_all(template_file)
    stats()
    path = cache_file(home)
    if what == "another uid":
        if os.geteuid() == 0:
            os.chown(path, 4242, -1)
        else:  # only root gives files away: this user is someone else then
            monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 4242)
    elif what == "file 0o666":
        path.chmod(0o666)
    else:
        path.parent.chmod(0o777)
    memo = start()
    assert not memo.entries
    assert render_all(template_file) == [render(s, template_file) for s in TEMPLATES]
    memo.loaded = False
    bits.AnsibleEnvironment.compile.sglang_memo.entries.clear()
    why = plugin._load(memo)
    assert ("owned by uid" if what == "another uid" else "writable by group or others") in why
    assert not memo.entries


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not a dict", "too many"])
def test_a_corrupt_or_oversized_file_is_ignored(home, template_file, damage, monkeypatch):
    start()
    expected = render_all(template_file)
    stats()
    path = cache_file(home)
    data = path.read_bytes()
    path.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "garbage": b"\xff\x00not marshal",
            "not a dict": marshal.dumps([b"k", b"v"]),
            "too many": data,
        }[damage]
    )
    if damage == "too many":
        monkeypatch.setattr(plugin, "MAX_ENTRIES", 3)
    memo = start()
    assert not memo.entries
    assert render_all(template_file) == expected
    stats()  # a whole file again
    monkeypatch.setattr(plugin, "MAX_ENTRIES", 50_000)
    assert len(start().entries) == COMPILED


def test_a_workers_entries_reach_the_next_run(home, template_file):
    directory = home / plugin.DIRNAME
    memo = start()
    assert render(TEMPLATES[0]) == "A,B,C"
    stale = directory / f"{plugin._tag()}.1.2.pending"  # a run that ended without its stats, 2 days ago
    other = directory / f"{plugin._tag()}.3.4.pending"  # another run, still going
    foreign = directory / "old.pending"  # not a file this callback writes: left alone
    foreign.mkdir()
    for path in (stale, other):
        path.write_bytes(b"")
    for path in (stale, foreign):
        os.utime(path, (time.time() - 2 * 86400,) * 2)
    pid = os.fork()
    if pid == 0:  # the worker of a task: compiles what the parent never saw
        code = 1
        try:
            code = 0 if render_all(template_file)[1].startswith("4 ") else 2
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    pending = list(directory.glob(f"*.{os.getpid()}.{pid}.pending"))
    assert len(pending) == 1 and stat.S_IMODE(pending[0].stat().st_mode) == 0o600
    assert len(memo.new) == 1  # the parent's own: the worker's are in its pending file
    stats()
    assert not pending[0].exists() and not stale.exists() and other.exists() and foreign.is_dir()

    memo = start()
    assert len(memo.entries) == COMPILED
    render_all(template_file)
    assert not memo.new


def test_an_error_is_ansible_cores_own_and_never_cached(home):
    def error(source):
        with pytest.raises(AnsibleTemplateError) as info:
            render(source)
        return type(info.value), str(info.value)

    sources = ["{{ x | }}", "{% for %}", "{{ x | no_such_filter }}", "#jinja2:nonsense:1\n{{ x }}"]
    expected = [error(s) for s in sources]
    assert "Syntax error" in expected[0][1] and "no_such_filter" in str(expected[2])
    memo = start()
    assert [error(s) for s in sources] == expected
    assert [error(s) for s in sources] == expected
    assert not memo.new and not memo.entries


def test_without_the_private_internals_it_does_nothing(home, template_file, monkeypatch):
    expected = render_all(template_file)
    with monkeypatch.context() as m:
        m.delattr(bits, "_TemplateCompileContext")
        assert "has no _TemplateCompileContext" in plugin._install()
        assert start() is None and bits.AnsibleEnvironment.compile is ORIGINAL
    assert render_all(template_file) == expected
    stats()
    assert not home.exists()


def test_with_another_compile_it_does_nothing(home, template_file, monkeypatch):
    def compile(self, source, name=None, filename=None, raw=False, defer_init=False, debug=False):
        return ORIGINAL(self, source, name, filename, raw, defer_init)

    expected = render_all(template_file)
    monkeypatch.setattr(bits.AnsibleEnvironment, "compile", compile)
    assert "AnsibleEnvironment.compile takes (self, source, name, filename, raw, defer_init, debug)" in (
        plugin._install()
    )
    plugin.CallbackModule().v2_playbook_on_start(None)
    assert bits.AnsibleEnvironment.compile is compile and plugin._memo() is None
    assert render_all(template_file) == expected
    stats()
    assert not home.exists()
