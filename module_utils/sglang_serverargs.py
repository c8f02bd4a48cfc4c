# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's own report of its arguments: the ``server_args=`` log line, argv, alias-aware compare.

Two forms of the startup line exist (see docs/ARCHITECTURE.md, reference sglang.md):

* 0.5.23: ``[2026-12-02 16:23:25] server_args={'model_path': '/m', ...}`` -- the repr of
  ``redact_watermark_secrets(server_args.resolved_dict())`` (engine.py ``_server_args_for_logging``).
* older builds: ``server_args=ServerArgs(model_path='/m', tp_size=8, ...)`` -- a dataclass repr.

Both are parsed with ``ast`` (never ``eval``). Values that are not Python literals are kept as their
source text. A line that is cut short (pasted, or split by journald above ``LineMax=``) is parsed
item by item up to the cut and reported as ``partial``.

Comparison rules (``values_equal``), chosen to match what SGLang itself does to a value:

* argv values are strings: ``'2048'`` equals ``2048``, ``'0.85'`` equals ``0.85``;
* a bare store_true flag is ``True``; ``'true'``/``'false'`` strings equal the booleans;
* ``speculative_algorithm`` and other CASE_INSENSITIVE_KEYS compare case-insensitively
  (SGLang upper-cases the algorithm during resolution);
* ``None`` equals a key that is absent (both mean "not set");
* lists compare element-wise with the same rules;
* a mapping equals the JSON text of the same mapping (an option SGLang parses with ``json.loads``, such as
  ``--extra-metric-labels``: argv holds the text, ``/server_info`` and the log line the object).

Nothing else is normalised: a path with a trailing slash, ``8`` vs ``'8x'`` etc. are differences.
"""

from __future__ import annotations

import ast
import json
import re

from ansible.module_utils.sglang_options import CASE_INSENSITIVE_KEYS, canonical_key, lookup
from ansible.module_utils.sglang_redact import REDACTED, is_secret_key

MARKER = "server_args="


class ServerArgsParseError(ValueError):
    """The text after ``server_args=`` is neither a dict repr nor a ``ServerArgs(...)`` repr."""


def find_server_args_line(messages):
    """The LAST message containing ``server_args=`` (callers pass one invocation only), or None."""
    found = None
    for message in messages:
        if isinstance(message, str) and MARKER in message:
            found = message
    return found


# ---------------------------------------------------------------------------------------------
# parsing


def _value_of(node, source):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        text = ast.get_source_segment(source, node)
        return text if text is not None else ast.unparse(node)


def _split_top_level(text, start):
    """Split ``text[start:]`` at top-level commas until the bracket opened before ``start`` closes.

    Returns ``(items, end)``; ``end`` is the index of that closing bracket, None when the text ends
    first (a cut line). Quotes (with backslash escapes) and nested ()[]{} are respected.
    """
    depth, quote, i, begin, items = 0, None, start, start, []
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                items.append(text[begin:i])
                return [s for s in items if s.strip()], i
            depth -= 1
        elif c == "," and depth == 0:
            items.append(text[begin:i])
            begin = i + 1
        i += 1
    items.append(text[begin:])
    return [s for s in items if s.strip()], None


def _parse_items(text, start, form):
    """Item-by-item parse used when the whole repr does not parse (cut or odd line)."""
    items, end = _split_top_level(text, start)
    result = {}
    complete = end is not None
    for raw in items:
        item = raw.strip()
        try:
            if form == "dataclass":
                key, eq, value_src = item.partition("=")
                if not eq or not key.strip().isidentifier():
                    raise ValueError(item)
                node = ast.parse(value_src.strip(), mode="eval").body
                result[key.strip()] = _value_of(node, value_src.strip())
            else:
                node = ast.parse("{" + item + "}", mode="eval").body
                if not isinstance(node, ast.Dict) or len(node.keys) != 1:
                    raise ValueError(item)
                key = ast.literal_eval(node.keys[0])
                result[key] = _value_of(node.values[0], "{" + item + "}")
        except (ValueError, SyntaxError, TypeError):
            complete = False
            break
    return result, complete


def parse_server_args(text):
    """Parse one log message containing ``server_args=``.

    Returns ``{'form': 'dict'|'dataclass', 'args': {...}, 'partial': bool}``.
    Raises ServerArgsParseError when there is no ``server_args=`` or the form is unknown.
    """
    if not isinstance(text, str) or MARKER not in text:
        raise ServerArgsParseError('no "server_args=" in the message')
    body = text[text.index(MARKER) + len(MARKER) :].strip()
    if body.startswith("{"):
        form, open_at = "dict", 1
    elif body.startswith("ServerArgs("):
        form, open_at = "dataclass", len("ServerArgs(")
    else:
        raise ServerArgsParseError(
            f'server_args= is followed by neither "{{" nor "ServerArgs(": {body[:40]!r}'
        )
    _, end = _split_top_level(body, open_at)
    whole = body[: end + 1] if end is not None else body
    try:
        tree = ast.parse(whole, mode="eval").body
    except SyntaxError:
        tree = None
    if form == "dict" and isinstance(tree, ast.Dict):
        args = {}
        ok = True
        for k, v in zip(tree.keys, tree.values):
            try:
                key = ast.literal_eval(k) if k is not None else None
            except ValueError:
                ok = False
                break
            if not isinstance(key, str):
                ok = False
                break
            args[key] = _value_of(v, whole)
        if ok:
            return {"form": form, "args": args, "partial": False}
    if form == "dataclass" and isinstance(tree, ast.Call) and not tree.args:
        args = {kw.arg: _value_of(kw.value, whole) for kw in tree.keywords if kw.arg}
        return {"form": form, "args": args, "partial": False}
    args, complete = _parse_items(body, open_at, form)
    if not args:
        raise ServerArgsParseError(f"could not parse the {form} form after server_args=")
    return {"form": form, "args": args, "partial": not complete}


# ---------------------------------------------------------------------------------------------
# comparison

_INT = re.compile(r"^[+-]?\d+$")
_FLOAT = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


def _scalar_equal(key, a, b):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, dict) or isinstance(b, dict):
        return _as_mapping(a) is not None and _as_mapping(a) == _as_mapping(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return _as_bool(a) is not None and _as_bool(a) == _as_bool(b)
    if isinstance(a, (int, float)) or isinstance(b, (int, float)):
        fa, fb = _as_number(a), _as_number(b)
        return fa is not None and fb is not None and fa == fb
    if isinstance(a, str) and isinstance(b, str):
        if canonical_key(key) in CASE_INSENSITIVE_KEYS:
            return a.upper() == b.upper()
        return a == b
    return a == b


def _as_mapping(v):
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    return v if isinstance(v, dict) else None


def _as_bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


def _as_number(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        s = v.strip()
        if _INT.match(s):
            return int(s)
        if _FLOAT.match(s):
            return float(s)
    return None


def values_equal(key, expected, running):
    """Type-tolerant equality for one setting (rules in the module docstring)."""
    if isinstance(expected, (list, tuple)) or isinstance(running, (list, tuple)):
        ev = list(expected) if isinstance(expected, (list, tuple)) else [expected]
        rv = list(running) if isinstance(running, (list, tuple)) else [running]
        return len(ev) == len(rv) and all(_scalar_equal(key, a, b) for a, b in zip(ev, rv))
    return _scalar_equal(key, expected, running)


def show_value(key, value):
    """Readable value for a diff line; secrets never shown."""
    if is_secret_key(key) and value not in (None, ""):
        return REDACTED
    if value is None:
        return "None"
    if isinstance(value, str) and not (_INT.match(value) or _FLOAT.match(value)):
        return repr(value)
    return str(value)


def compare(expected, reported, source="", absent_is_none=True):
    """Diff lines ``key: expected X, running Y (source)`` for every expected key that differs.

    ``reported`` may use alias spellings (``speculative_dflash_draft_window_size`` satisfies
    ``speculative_draft_window_size``). With ``absent_is_none`` a key the source does not report
    counts as None (the server_args line and /server_info report every key; argv only the keys
    it sets, so for argv an absent key means "left at SGLang's default" = expected None).
    """
    diffs = []
    suffix = f" ({source})" if source else ""
    for key in sorted(expected):
        want = expected[key]
        found, got, name = lookup(reported, key)
        if not found:
            if absent_is_none and want is None:
                continue
            diffs.append(f"{key}: expected {show_value(key, want)}, running <not reported>{suffix}")
            continue
        if not values_equal(key, want, got):
            label = key if name == key else f"{key} (as {name})"
            diffs.append(f"{label}: expected {show_value(key, want)}, running {show_value(key, got)}{suffix}")
    return diffs
