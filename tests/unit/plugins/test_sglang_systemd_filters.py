"""The sglang role's systemd quoting filters (roles/sglang/filter_plugins/sglang_systemd.py).

1. Table-driven: awkward argv elements and environment values -> the exact text written into
   the unit / EnvironmentFile, and every rejected input with the element it names.
2. ``systemd-analyze verify`` (systemd 252 here) accepts a unit carrying all of them.
3. On a lab host, systemd runs what they render: tests/integration/test_systemd_escape.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess

import pytest
from ansible.errors import AnsibleFilterError

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "roles" / "sglang" / "filter_plugins" / "sglang_systemd.py"

_spec = importlib.util.spec_from_file_location("sglang_systemd_filters", PLUGIN)
filters = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(filters)
FILTERS = filters.FilterModule().filters()

# (id, argv element, its ExecStart word). Derived from systemd.service(5) "Command lines":
# inside double quotes \\ and \" are unescaped, %% is a literal %, $$ a literal $, and
# ${NAME} is substituted as ONE word.
EXEC_CASES = [
    ("plain", "--model-path", '"--model-path"'),
    ("space", "/srv/models/Kimi K2.6", '"/srv/models/Kimi K2.6"'),
    ("percent", "100%", '"100%%"'),
    ("specifier", "%n-%i-%h", '"%%n-%%i-%%h"'),
    ("dollar_word", "$HOME", '"$$HOME"'),
    ("dollar_braced_other", "${HOME}", '"$${HOME}"'),
    ("double_dollar", "a$$b", '"a$$$$b"'),
    ("double_quote", 'say "hi"', '"say \\"hi\\""'),
    ("backslash", "C:\\path\\n", '"C:\\\\path\\\\n"'),
    ("trailing_backslash", "end\\", '"end\\\\"'),
    ("single_quote", "it's", '"it\'s"'),
    ("semicolon", ";", '";"'),
    ("hash", "#not-a-comment", '"#not-a-comment"'),
    ("equals", "--flag=value", '"--flag=value"'),
    ("empty", "", '""'),
    ("non_ascii", "Grüße 日本語 🚀", '"Grüße 日本語 🚀"'),
    ("json", '{"a": [1, "x y"], "b": "%$\\\\"}', '"{\\"a\\": [1, \\"x y\\"], \\"b\\": \\"%%$$\\\\\\\\\\"}"'),
    # A user value is never substituted, not even the key's own reference: only the element the
    # argv builder put after --api-key is (secret_positions, test_secret_reference_only_at_its_position).
    ("secret_ref", "${SGLANG_API_KEY}", '"$${SGLANG_API_KEY}"'),
    ("secret_ref_in_text", "Bearer ${SGLANG_API_KEY}!", '"Bearer $${SGLANG_API_KEY}!"'),
    ("secret_ref_twice", "${SGLANG_API_KEY}%${SGLANG_API_KEY}", '"$${SGLANG_API_KEY}%%$${SGLANG_API_KEY}"'),
    ("secret_ref_unclosed", "${SGLANG_API_KEY", '"$${SGLANG_API_KEY"'),
    ("integer", 2048, '"2048"'),
    ("float", 0.88, '"0.88"'),
]

# (id, value, its EnvironmentFile value): double-quoted, \ " ` $ backslash-escaped.
ENV_CASES = [
    ("plain", "0,1,2,3", '"0,1,2,3"'),
    ("space", "two words", '"two words"'),
    ("edge_spaces", "  padded  ", '"  padded  "'),
    ("dollar", "$HOME ${HOME} $$", '"\\$HOME \\${HOME} \\$\\$"'),
    ("quotes", "a\"b'c", '"a\\"b\'c"'),
    ("backslash", "a\\b\\", '"a\\\\b\\\\"'),
    ("backtick", "`id`", '"\\`id\\`"'),
    ("hash", "#x", '"#x"'),
    ("percent", "50%", '"50%"'),
    ("equals", "a=b", '"a=b"'),
    ("empty", "", '""'),
    ("non_ascii", "Grüße 🚀", '"Grüße 🚀"'),
    ("number", 1, '"1"'),
]

CONTROL_CHARS = ["\n", "\r", "\x00", "\t", "\x1b", "\x7f", "\x85"]

LAUNCHER = ["/usr/bin/python3", "-c", "import time; time.sleep(600)"]


@pytest.mark.parametrize(("value", "word"), [c[1:] for c in EXEC_CASES], ids=[c[0] for c in EXEC_CASES])
def test_exec_quote_word(value, word):
    assert FILTERS["systemd_exec_quote"](["/bin/x", value]) == '"/bin/x" ' + word


def test_exec_quote_joins_all_words_in_order():
    argv = ["/opt/sglang/venv/bin/sglang", "serve"] + [c[1] for c in EXEC_CASES]
    expected = " ".join(['"/opt/sglang/venv/bin/sglang"', '"serve"'] + [c[2] for c in EXEC_CASES])
    assert FILTERS["systemd_exec_quote"](argv) == expected


def test_exec_lines_keeps_flag_and_value_on_one_line():
    argv = [
        "/opt/v/bin/sglang",
        "serve",
        "--model-path",
        "/m",
        "--speculative-draft-window-size",
        "2048",
        "--trust-remote-code",
        "--api-key",
        "${SGLANG_API_KEY}",
    ]
    assert FILTERS["systemd_exec_lines"](argv, secret_positions=[8]) == (
        '"/opt/v/bin/sglang" "serve" \\\n'
        '    "--model-path" "/m" \\\n'
        '    "--speculative-draft-window-size" "2048" \\\n'
        '    "--trust-remote-code" \\\n'
        '    "--api-key" "${SGLANG_API_KEY}"'
    )


def test_exec_quote_allow_env_is_an_explicit_list():
    assert FILTERS["systemd_exec_quote"](["/bin/x", "${HF_TOKEN}"]) == '"/bin/x" "$${HF_TOKEN}"'
    allowed = FILTERS["systemd_exec_quote"](
        ["/bin/x", "${HF_TOKEN}"], allow_env=["HF_TOKEN"], secret_positions=[1]
    )
    assert allowed == '"/bin/x" "${HF_TOKEN}"'
    with pytest.raises(AnsibleFilterError, match=r"element 1: a secret position must hold exactly"):
        FILTERS["systemd_exec_quote"](["/bin/x", "${SGLANG_API_KEY}"], allow_env=[], secret_positions=[1])


def test_secret_reference_only_at_its_position():
    """Issue 18: a user value holding ${SGLANG_API_KEY} (or any ${...}) was substituted by systemd,
    so the served name (or any other value) became the API key. Only the element the argv builder
    put after --api-key is a reference now; the same text anywhere else reaches SGLang literally."""
    argv = [
        "/v/bin/sglang",
        "serve",
        "--served-model-name",
        "${SGLANG_API_KEY}",
        "--api-key",
        "${SGLANG_API_KEY}",
        "--chat-template",
        "a${SGLANG_API_KEY}b${HOME}",
    ]
    assert FILTERS["systemd_exec_quote"](argv, secret_positions=[5]) == (
        '"/v/bin/sglang" "serve" "--served-model-name" "$${SGLANG_API_KEY}" '
        '"--api-key" "${SGLANG_API_KEY}" "--chat-template" "a$${SGLANG_API_KEY}b$${HOME}"'
    )
    # ... and without positions nothing is substituted at all.
    assert "${SGLANG_API_KEY}" not in FILTERS["systemd_exec_quote"](argv).replace("$${", "")


def test_the_role_chain_substitutes_only_the_api_key():
    """sglang_argv's build (secret_positions) + the role's shift by the launcher + the filter: a served
    name and an extra arg holding ${SGLANG_API_KEY} reach the process as typed (before issue 18 both
    became the API key, and the verifier then reported the key as the running served name)."""
    from ansible.module_utils.sglang_argv import build_command
    from ansible.module_utils.sglang_options import select_profile

    caps = json.loads((ROOT / "tests" / "fixtures" / "capabilities" / "sglang-0.5.23.json").read_text())
    profile, errors = select_profile("upstream", {})
    assert not errors
    settings = {"model_path": "/srv/m", "served_model_name": "${SGLANG_API_KEY}", "api_key": True}
    extra = [{"arg": "--chat-template", "value": "x${SGLANG_API_KEY}"}]
    built = build_command(settings, caps, profile, extra, {"api_key": "SGLANG_API_KEY"})
    assert [built["argv"][i - 1] for i in built["secret_positions"]] == ["--api-key"]
    launcher = ["/opt/sglang/venv/bin/sglang", "serve"]
    shifted = [i + len(launcher) for i in built["secret_positions"]]
    line = FILTERS["systemd_exec_lines"](launcher + built["argv"], secret_positions=shifted)
    assert '"--api-key" "${SGLANG_API_KEY}"' in line
    assert '"--served-model-name" "$${SGLANG_API_KEY}"' in line
    assert '"--chat-template" "x$${SGLANG_API_KEY}"' in line
    assert line.replace("$${", "").count("${SGLANG_API_KEY}") == 1


@pytest.mark.parametrize(
    "positions", [[0], [9], ["3"], [True], "5"], ids=["launcher", "past", "str", "bool", "not-a-list"]
)
def test_secret_positions_must_be_argv_indexes(positions):
    argv = ["/bin/x", "--api-key", "${SGLANG_API_KEY}"]
    with pytest.raises(AnsibleFilterError, match="secret_positions"):
        FILTERS["systemd_exec_quote"](argv, secret_positions=positions)


@pytest.mark.parametrize("char", CONTROL_CHARS, ids=[f"U+{ord(c):04X}" for c in CONTROL_CHARS])
def test_exec_quote_rejects_control_characters_naming_the_element(char):
    argv = ["/bin/x", "--served-model-name", f"secret{char}value"]
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["systemd_exec_quote"](argv)
    text = str(err.value)
    assert "ExecStart argv element 2 (value of --served-model-name)" in text
    assert f"U+{ord(char):04X}" in text
    assert "secret" not in text  # the value itself is never echoed


def test_exec_quote_rejects_control_character_in_a_flag():
    message = r"ExecStart argv element 1 contains the control character U\+000A"
    with pytest.raises(AnsibleFilterError, match=message):
        FILTERS["systemd_exec_quote"](["/bin/x", "--bad\nflag"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("not a list", "expects a list"),
        ([], "argv is empty"),
        (["relative/bin", "x"], r"element 0 \(the launcher, sglang_launcher\[0\]\) must be an absolute path"),
        (["/bin/x", None], "element 1 must be a string, got NoneType"),
        (["/bin/x", True], "element 1 must be a string, got bool"),
        (["/bin/x", ["nested"]], "element 1 must be a string, got list"),
        (["/bin/x", "--k", "\udcff"], r"element 2 \(value of --k\) is not valid UTF-8"),
    ],
    ids=["string", "empty", "relative", "none", "bool", "list", "surrogate"],
)
def test_exec_quote_rejects(argv, message):
    with pytest.raises(AnsibleFilterError, match=message):
        FILTERS["systemd_exec_quote"](argv)


@pytest.mark.parametrize(("value", "quoted"), [c[1:] for c in ENV_CASES], ids=[c[0] for c in ENV_CASES])
def test_env_quote(value, quoted):
    assert FILTERS["systemd_env_quote"](value, "X") == quoted


def test_env_lines_sorted_and_named():
    assert FILTERS["systemd_env_lines"]({"B_2": "y", "A": 1}) == ['A="1"', 'B_2="y"']


@pytest.mark.parametrize("char", CONTROL_CHARS, ids=[f"U+{ord(c):04X}" for c in CONTROL_CHARS])
def test_env_rejects_control_characters_without_echoing(char):
    with pytest.raises(AnsibleFilterError) as err:
        FILTERS["systemd_env_lines"]({"SGLANG_API_KEY": f"hunter2{char}"})
    assert "environment variable SGLANG_API_KEY contains the control character" in str(err.value)
    assert "hunter2" not in str(err.value)


@pytest.mark.parametrize("name", ["lower", "1ABC", "A-B", "A B", "", "A=B"])
def test_env_rejects_bad_names(name):
    with pytest.raises(AnsibleFilterError, match="does not match"):
        FILTERS["systemd_env_lines"]({name: "x"})


@pytest.mark.parametrize("value", [None, True, ["a"], {"a": 1}], ids=["none", "bool", "list", "dict"])
def test_env_rejects_non_scalars(value):
    with pytest.raises(AnsibleFilterError, match="environment variable X must be a string"):
        FILTERS["systemd_env_lines"]({"X": value})


# ---- systemd itself -------------------------------------------------------------------------

AWKWARD_ARGV = [c[1] for c in EXEC_CASES if c[0] not in ("integer", "float")]
SECRET = 'k3y with spaces $HOME "q" \\ `x` %n ü'
AWKWARD_ENV = {f"ESC_{c[0].upper()}": c[1] for c in ENV_CASES if isinstance(c[1], str)}


def _unit_text(argv, env_path, secret_positions=()):
    return (
        "[Unit]\nDescription=escape probe\n\n[Service]\nType=simple\n"
        f"EnvironmentFile={env_path}\n"
        f"ExecStart={FILTERS['systemd_exec_lines'](argv, secret_positions=secret_positions)}\n"
    )


def _env_text(env):
    return "# probe\n" + "\n".join(FILTERS["systemd_env_lines"](env)) + "\n"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_the_quoted_unit(tmp_path):
    env = tmp_path / "probe.env"
    env.write_text(_env_text(AWKWARD_ENV), encoding="utf-8")
    unit = tmp_path / "probe.service"
    argv = LAUNCHER + AWKWARD_ARGV + ["--api-key", "${SGLANG_API_KEY}"]
    unit.write_text(_unit_text(argv, env, [len(argv) - 1]), encoding="utf-8")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--recursive-errors=no", f"{unit}:escape-probe.service"],
        capture_output=True,
        text=True,
        env={**os.environ, "LANG": "C", "SYSTEMD_LOG_LEVEL": "info"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "escape-probe.service" not in proc.stderr, proc.stderr
