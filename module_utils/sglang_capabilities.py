# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The flags the INSTALLED SGLang parser accepts: the dump script run in the venv's python, and its
cache keyed by the installed distribution (shared by the sglang_capabilities and sglang_argv modules)."""

from __future__ import annotations

import hashlib
import json
import os
import re

from ansible.module_utils.sglang_venv import PROBE_SCRIPT, parse_marked, run_python, write_json_atomic

# Runs in the venv's python: builds the real parser like `sglang serve` and dumps it.
DUMP_SCRIPT = r"""
import argparse, contextlib, importlib.metadata, json, sys

def jsonable(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else repr(value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((jsonable(v) for v in value), key=repr)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if value is argparse.SUPPRESS:
        return None
    return repr(value)

def is_deprecated(action):
    if type(action).__name__.startswith("Deprecated"):
        return True
    text = action.help if isinstance(action.help, str) else ""
    return text.lstrip("([ ").lower().startswith("deprecated")

warnings = []
with contextlib.redirect_stdout(sys.stderr):
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        try:
            load_plugins()
        except Exception as exc:
            warnings.append("load_plugins() failed: %s: %s" % (type(exc).__name__, exc))
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)

options = {}
for action in parser._actions:
    if not action.option_strings or isinstance(action, argparse._HelpAction):
        continue
    negative = []
    if isinstance(action, argparse.BooleanOptionalAction):
        negative = [f for f in action.option_strings if f.startswith("--no-")]
    entry = {
        "flags": list(action.option_strings),
        "hidden": action.help == argparse.SUPPRESS,
        "deprecated": is_deprecated(action),
        "action": type(action).__name__,
        "choices": None if action.choices is None else jsonable(
            action.choices if isinstance(action.choices, (set, frozenset)) else list(action.choices)),
        "nargs": jsonable(action.nargs),
        "takes_value": action.nargs != 0,
        "default": jsonable(action.default),
        "const": jsonable(action.const),
        "type": getattr(action.type, "__name__", repr(action.type)) if action.type is not None else None,
        "negative_flags": negative,
        "new_flag": getattr(action, "new_flag", None),
    }
    options.setdefault(action.dest, []).append(entry)

merged = {}
for dest, actions in options.items():
    visible = [a for a in actions if not a["hidden"] and not a["deprecated"]]
    primary = (visible or actions)[0]
    flags = []
    for a in visible:
        flags.extend(f for f in a["flags"] if f not in a["negative_flags"] and f not in flags)
    merged[dest] = {
        "flags": flags,
        "hidden": not any(not a["hidden"] for a in actions),
        "deprecated": not visible,
        "choices": primary["choices"],
        "nargs": primary["nargs"],
        "takes_value": primary["takes_value"],
        "default": primary["default"],
        "actions": actions,
    }

algorithms, source = [], ""
algo_option = merged.get("speculative_algorithm")
if algo_option and algo_option["choices"]:
    algorithms = [str(c).upper() for c in algo_option["choices"]]
    source = "parser choices"
else:
    with contextlib.redirect_stdout(sys.stderr):
        try:
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            algorithms = [m.name for m in SpeculativeAlgorithm if m.name != "NONE"]
            source = "SpeculativeAlgorithm enum"
        except Exception as exc:
            warnings.append("SpeculativeAlgorithm not importable: %s: %s" % (type(exc).__name__, exc))
        try:
            from sglang.srt.speculative import spec_registry
            extra = sorted(getattr(spec_registry, "_RESERVED_ALIASES", ()))
            extra += sorted(getattr(spec_registry, "_REGISTRY", {}))
            algorithms += [name for name in extra if name not in algorithms]
            source += " + registry"
        except ImportError:
            pass

result = {
    "version": importlib.metadata.version("sglang"),
    "options": merged,
    "algorithms": algorithms,
    "algorithm_source": source,
    "warnings": warnings,
}
print("SGLANG_DEPLOY_RESULT " + json.dumps(result, sort_keys=True))
"""

SCRIPT_SHA256 = hashlib.sha256(DUMP_SCRIPT.encode()).hexdigest()
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def last_line(text):
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def probe(module, python, timeout):
    rc, out, err = run_python(module, python, PROBE_SCRIPT, timeout)
    data = parse_marked(out)
    if rc != 0 or not data or "version" not in data:
        reason = (data or {}).get("error") or last_line(err) or f"rc={rc}"
        module.fail_json(
            msg=f"python {python}: cannot read the installed sglang metadata: {reason}", rc=rc, stderr=err
        )
    return data


def cache_path(cache_dir, meta):
    version = _SAFE.sub("_", meta["version"])
    name = f"{version}-{meta['record_sha256'][:16]}-{SCRIPT_SHA256[:8]}.json"
    return os.path.join(cache_dir, name)


def read_cache(path, meta):
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return valid_cache(data, meta)


def valid_cache(data, meta):
    """``data`` when it is the dump of the installation ``meta`` describes, else None."""
    if (
        not isinstance(data, dict)
        or data.get("version") != meta["version"]
        or data.get("record_sha256") != meta["record_sha256"]
        or not data.get("options")
    ):
        return None
    return data


def write_cache(module, path, data):
    write_json_atomic(module, path, data, 0o644, "capabilities cache")


def discover(module, python, cache_dir, timeout, cache_files=None):
    """(data, cached, cache_file, meta) for the SGLang installed behind ``python``; fails the module
    naming the option when ``python`` or ``timeout`` is unusable. ``cache_files`` (file name -> content:
    the cache directory as root's plan probe read it, for a caller that may not read it) is looked up
    instead of ``cache_dir``, with the same checks."""
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        module.fail_json(msg=f"python: {python} is not an executable file (is the SGLang venv installed?)")
    if timeout < 1:
        module.fail_json(msg="timeout: must be at least 1 second")
    meta = probe(module, python, timeout)
    path = cache_path(cache_dir, meta)
    if cache_files is not None:
        cached = valid_cache(cache_files.get(os.path.basename(path)), meta)
    else:
        cached = read_cache(path, meta)
    if cached is not None:
        return cached, True, path, meta
    rc, out, err = run_python(module, python, DUMP_SCRIPT, timeout)
    data = parse_marked(out)
    if rc != 0 or not data:
        reason = f"timed out after {timeout} s" if rc in (-14, 142) else last_line(err) or f"rc={rc}"
        module.fail_json(
            msg=f"python {python}: building SGLang's parser failed: {reason}", rc=rc, stderr=err[-4000:]
        )
    if data.get("version") != meta["version"]:
        module.fail_json(
            msg=f"python {python}: sglang version changed during discovery "
            f"({meta['version']} -> {data.get('version')}); run again"
        )
    data["record_sha256"] = meta["record_sha256"]
    data["script_sha256"] = SCRIPT_SHA256
    if not module.check_mode:
        write_cache(module, path, data)
    return data, False, path, meta
