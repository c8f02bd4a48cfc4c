# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Quote values for systemd unit files and EnvironmentFile= files.

``systemd_exec_quote``: a list of argv elements -> one ``ExecStart=`` command line.
Every element is double-quoted and escaped so that systemd hands the process
exactly that element (systemd.service(5) "Command lines", systemd.unit(5)
"Specifiers"):

* ``\\`` -> ``\\\\`` and ``"`` -> ``\\"`` (C-style unescaping inside quotes),
* ``%`` -> ``%%`` (specifier expansion),
* ``$`` -> ``$$`` (environment variable substitution), EXCEPT an element at one of
  ``secret_positions`` (indexes into argv) that is exactly ``${NAME}`` for NAME in
  ``allow_env`` (default ``SGLANG_API_KEY``): that one is left for systemd to substitute
  from the EnvironmentFile, as one word. Nowhere else: a user value that happens to
  contain ``${SGLANG_API_KEY}`` reaches the process literally, never as the key.

``systemd_env_quote``: one value -> a double-quoted EnvironmentFile= value
(``\\``, ``"``, `````` ` `````` and ``$`` backslash-escaped, which systemd's
env-file parser undoes; the same text is also safe to ``source`` from sh).

Both reject newline, NUL and every other control character (U+0000-U+001F,
U+007F-U+009F) with an error that names the element, never its value (an
element may be a secret).
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_DEFAULT_ALLOW_ENV = ("SGLANG_API_KEY",)


def _control_char(value):
    """Return the first control character in ``value``, or None."""
    for char in value:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            return char
    return None


def _as_text(value, what):
    """Accept str and numbers (not bool, not None, not containers)."""
    if isinstance(value, bool) or value is None:
        raise AnsibleFilterError(f"{what} must be a string, got {type(value).__name__}")
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise AnsibleFilterError(f"{what} must be a string, got {type(value).__name__}")
    return value


def _check_controls(value, what):
    char = _control_char(value)
    if char is not None:
        raise AnsibleFilterError(
            f"{what} contains the control character U+{ord(char):04X}; "
            "systemd unit and environment files cannot carry it"
        )


def _check_utf8(value, what):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise AnsibleFilterError(
            f"{what} is not valid UTF-8 text (unit and environment files must be UTF-8)"
        ) from exc


def _describe(argv, index):
    """Name argv[index] without printing it: position and the flag it belongs to."""
    what = f"ExecStart argv element {index}"
    if index > 0:
        previous = argv[index - 1]
        if isinstance(previous, str) and previous.startswith("--"):
            what += f" (value of {previous})"
    current = argv[index]
    if isinstance(current, str) and current.startswith("--") and _control_char(current) is None:
        what += f" ({current.split('=', 1)[0]})"
    return what


def _escape_exec_word(word, secret_ref):
    """One quoted word; ``secret_ref``: the element is a secret reference systemd must substitute."""
    if secret_ref:
        return '"' + word + '"'
    return '"' + _escape_exec_plain(word) + '"'


def _escape_exec_plain(text):
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")


def systemd_exec_quote(argv, allow_env=_DEFAULT_ALLOW_ENV, separator=" ", secret_positions=()):
    """Quote ``argv`` (a list) as one systemd ``ExecStart=`` command line.

    ``separator`` joins the words; pass ``" \\\\\\n    "`` style values to
    break lines (systemd joins a line ending in a backslash with the next).
    ``secret_positions``: indexes of the elements that are secret references (``${NAME}``,
    NAME in ``allow_env``), e.g. the value after ``--api-key`` (``secret_positions`` of
    library/sglang_argv.py, shifted by the launcher); every other ``$`` is escaped.
    """
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        raise AnsibleFilterError(
            f"systemd_exec_quote expects a list of argv elements, got {type(argv).__name__}"
        )
    if not argv:
        raise AnsibleFilterError("systemd_exec_quote: argv is empty; ExecStart needs a command")
    if isinstance(allow_env, str):
        allow_env = (allow_env,)
    allow_env = frozenset(allow_env)
    positions = _positions(secret_positions, len(argv))
    words = []
    for index, element in enumerate(argv):
        what = _describe(argv, index)
        text = _as_text(element, what)
        _check_controls(text, what)
        _check_utf8(text, what)
        match = _ENV_REF.fullmatch(text)
        secret_ref = index in positions and match is not None and match.group(1) in allow_env
        if index in positions and not secret_ref:
            raise AnsibleFilterError(
                f"{what}: a secret position must hold exactly ${{NAME}} for NAME in {sorted(allow_env)}"
            )
        words.append(_escape_exec_word(text, secret_ref))
    first = _as_text(argv[0], "ExecStart argv element 0")
    if not first.startswith("/"):
        raise AnsibleFilterError(
            "ExecStart argv element 0 (the launcher, sglang_launcher[0]) must be an absolute path"
        )
    return separator.join(words)


def _positions(secret_positions, length):
    if secret_positions is None:
        return frozenset()
    if not isinstance(secret_positions, (list, tuple, set, frozenset)):
        raise AnsibleFilterError("secret_positions must be a list of argv indexes")
    out = set()
    for position in secret_positions:
        if isinstance(position, bool) or not isinstance(position, int) or not 0 < position < length:
            raise AnsibleFilterError(f"secret_positions: {position!r} is not an index of an argv element")
        out.add(position)
    return frozenset(out)


def systemd_exec_lines(argv, allow_env=_DEFAULT_ALLOW_ENV, indent="    ", secret_positions=()):
    """Like systemd_exec_quote, one line per flag: a line break before every ``--`` element.

    The lines end in a backslash, which systemd's unit parser joins with the next line
    (replacing backslash + newline by a space), so ``"--flag" "value"`` pairs stay on one
    line and a changed flag shows as a one-line diff.
    """
    words = systemd_exec_quote(
        argv, allow_env=allow_env, separator="\n", secret_positions=secret_positions
    ).split("\n")
    lines = []
    for element, word in zip(argv, words):
        if lines and not str(element).startswith("--"):
            lines[-1] += " " + word
        else:
            lines.append(word)
    return (" \\\n" + indent).join(lines)


def systemd_env_quote(value, name="value"):
    """Quote one value for a systemd ``EnvironmentFile=`` line."""
    what = f"environment variable {name}"
    text = _as_text(value, what)
    _check_controls(text, what)
    _check_utf8(text, what)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$", "\\$")
    return '"' + escaped + '"'


def systemd_env_lines(environment):
    """Render a dict as sorted ``NAME="value"`` lines for an EnvironmentFile=."""
    if not isinstance(environment, dict):
        raise AnsibleFilterError(f"systemd_env_lines expects a dict, got {type(environment).__name__}")
    lines = []
    for name in sorted(environment):
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise AnsibleFilterError(f"environment variable name {name!r} does not match ^[A-Z_][A-Z0-9_]*$")
        lines.append(f"{name}={systemd_env_quote(environment[name], name)}")
    return lines


class FilterModule:
    """systemd quoting filters for the sglang role."""

    def filters(self):
        return {
            "systemd_exec_quote": systemd_exec_quote,
            "systemd_exec_lines": systemd_exec_lines,
            "systemd_env_quote": systemd_env_quote,
            "systemd_env_lines": systemd_env_lines,
        }
