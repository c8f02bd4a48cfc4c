# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Redaction of secrets in SGLang settings, argv, journal excerpts and HTTP bodies.

SGLang does not redact ``api_key`` / ``admin_api_key``: they appear in the startup
``server_args=`` line, in ``/server_info`` (top level and ``launch_command``) and in
``/proc/<pid>/cmdline``. Every value a module returns goes through this file first (P13).
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"

# Exact key names that hold secrets (SGLang dests and our own settings).
SECRET_KEYS = frozenset(
    {
        "api_key",
        "admin_api_key",
        "hf_token",
        "token",
        "password",
        "secret",
        "ssl_keyfile_password",
        "watermark_key",
        "watermark_key_b",
        "sglang_api_key",
        "authorization",
    }
)
SECRET_SUFFIXES = ("_token", "_secret", "_password", "_api_key")

# argv flags whose VALUE is a secret (``--flag VALUE`` and ``--flag=VALUE``).
SECRET_FLAGS = frozenset(
    {
        "--api-key",
        "--admin-api-key",
        "--hf-token",
        "--ssl-keyfile-password",
    }
)

# An unexpanded systemd/shell reference such as ``${SGLANG_API_KEY}`` or ``$SGLANG_API_KEY``
# is not a secret itself and stays readable: it says where the secret comes from.
_VAR_REF = re.compile(r"^\$\{?[A-Za-z_][A-Za-z0-9_]*\}?$")

# Secrets shorter than this are not replaced inside free text: replacing "1" or "ab" everywhere
# would destroy the text and hide nothing (keys are still masked by name).
MIN_TEXT_SECRET_LEN = 4


def is_secret_key(key):
    """True when a settings/JSON key names a secret (case-insensitive, ``-`` == ``_``)."""
    if not isinstance(key, str):
        return False
    k = key.lower().replace("-", "_").lstrip("_")
    return k in SECRET_KEYS or k.endswith(SECRET_SUFFIXES)


def _is_var_ref(value):
    return isinstance(value, str) and bool(_VAR_REF.match(value))


def _mask(value):
    if value is None or value == "" or _is_var_ref(value):
        return value
    return REDACTED


def redact(obj, secret_values=()):
    """Return a copy of ``obj`` with secret keys masked, recursively through dicts/lists/tuples.

    Strings anywhere in the structure also get ``redact_text`` with ``secret_values``, so a secret
    embedded in e.g. ``launch_command`` or a log excerpt is removed as well.
    """
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if is_secret_key(key) and not isinstance(value, (dict, list, tuple)):
                out[key] = _mask(value)
            else:
                out[key] = redact(value, secret_values)
        return out
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, secret_values) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj, secret_values)
    return obj


def redact_argv(argv, secret_values=()):
    """Mask the value of ``--api-key X`` / ``--api-key=X`` (and the other SECRET_FLAGS).

    ``${VAR}`` references are kept as they are. Other elements get ``redact_text``.
    """
    out = []
    mask_next = False
    for arg in argv:
        arg = str(arg)
        if mask_next:
            out.append(_mask(arg))
            mask_next = False
            continue
        flag, eq, value = arg.partition("=")
        if arg in SECRET_FLAGS:
            out.append(arg)
            mask_next = True
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}={_mask(value)}")
        else:
            out.append(redact_text(arg, secret_values))
    return out


def redact_text(text, secret_values=()):
    """Replace every literal occurrence of each secret value in ``text`` with ``<redacted>``.

    Also masks the value after ``--api-key``-style flags and ``Bearer`` tokens in free text
    (a ``launch_command`` is argv joined by spaces, so the value follows the flag).
    """
    if not isinstance(text, str) or not text:
        return text
    for secret in sorted({str(s) for s in secret_values if s is not None}, key=len, reverse=True):
        if len(secret) >= MIN_TEXT_SECRET_LEN and not _is_var_ref(secret):
            text = text.replace(secret, REDACTED)
    text = _FLAG_IN_TEXT.sub(_flag_sub, text)
    text = _BEARER.sub(r"\1" + REDACTED, text)
    text = _KEY_IN_REPR.sub(_repr_sub, text)
    text = _KEY_UNQUOTED.sub(_unquoted_sub, text)
    return text


_FLAG_IN_TEXT = re.compile(
    r"(?P<flag>"
    + "|".join(re.escape(f) for f in sorted(SECRET_FLAGS, key=len, reverse=True))
    + r')(?P<sep>=|\s+)(?P<value>[^\s\'",)]+)'
)
_BEARER = re.compile(r'(Bearer\s+)[^\s\'",]+')
# 'api_key': 'X' (dict repr) and api_key='X' (dataclass repr) inside a log line.
_KEY_IN_REPR = re.compile(
    r"""(?P<prefix>['"]?(?P<key>[A-Za-z_]*(?:api_key|_token|_secret|_password|hf_token))['"]?\s*[:=]\s*)"""
    r"""(?P<q>['"])(?P<value>[^'"]*)(?P=q)"""
)

# api_key=X, hf-token: X, password=X without quotes (an env line, a log's key=value pairs). Quoted
# values are _KEY_IN_REPR's; a value that starts with a quote does not match here.
_KEY_UNQUOTED = re.compile(
    r"""(?P<prefix>(?P<key>[A-Za-z_-]*(?:api[_-]?key|token|secret|password))\s*[:=]\s*)"""
    r"""(?P<value>[^\s'",)}\]]+)""",
    re.IGNORECASE,
)


def _flag_sub(match):
    value = match.group("value")
    if _is_var_ref(value) or value == REDACTED:
        return match.group(0)
    return f"{match.group('flag')}{match.group('sep')}{REDACTED}"


def _repr_sub(match):
    if not is_secret_key(match.group("key")):
        return match.group(0)
    value = match.group("value")
    if value == "" or _is_var_ref(value) or value == REDACTED:
        return match.group(0)
    return f"{match.group('prefix')}{match.group('q')}{REDACTED}{match.group('q')}"


def _unquoted_sub(match):
    value = match.group("value")
    if not is_secret_key(match.group("key")) or value in (REDACTED, "None") or _is_var_ref(value):
        return match.group(0)
    return f"{match.group('prefix')}{REDACTED}"
