# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Quote values for SGLang's ``--config`` YAML file (the secrets kept off its command line).

``sglang_yaml_quote``: one string -> a YAML double-quoted scalar that PyYAML's ``safe_load`` (what
SGLang's ConfigArgumentMerger uses) reads back as exactly that string. ``\\`` and ``"`` are escaped,
every character outside printable ASCII becomes ``\\uXXXX`` / ``\\UXXXXXXXX``, so the file is plain
ASCII whatever the service's locale, and a value such as ``yes``, ``123`` or ``null`` stays a string
(unquoted, YAML would hand SGLang ``true``, an int, or nothing). Control characters are refused with an
error that names the setting, never its value (the value is a secret).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def sglang_yaml_quote(value, what="value"):
    if not isinstance(value, str):
        raise AnsibleFilterError(f"{what} must be a string, got {type(value).__name__}")
    out = ['"']
    for char in value:
        code = ord(char)
        if code < 0x20 or 0x7F <= code <= 0x9F:
            raise AnsibleFilterError(f"{what} contains the control character U+{code:04X}")
        if 0xD800 <= code <= 0xDFFF:
            raise AnsibleFilterError(f"{what} is not valid text (a lone surrogate U+{code:04X})")
        if char in '\\"':
            out.append("\\" + char)
        elif code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04X}")
        else:
            out.append(f"\\U{code:08X}")
    out.append('"')
    return "".join(out)


class FilterModule:
    """YAML quoting filter for the sglang role's --config file."""

    def filters(self):
        return {"sglang_yaml_quote": sglang_yaml_quote}
