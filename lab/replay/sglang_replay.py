# Lab tooling of the sglang deployment project; never installed on GPU hosts.
"""LAB REPLAY of a recorded SGLang build that CI cannot download (a DDTree fork or branch).

Installed on lab hosts as ``sglang/lab_replay.py`` of a wheel named ``sglang`` whose version says
``+labreplay`` (lab/replay/build-wheel). It is NOT SGLang: it replays, from recordings of the real
build (each with a SOURCE.md naming repository and commit), exactly what the deployment asks a
build for:

* the parser: ``ServerArgs.add_cli_args(parser)`` adds every option of the recorded parser dump
  (flags, dest, action, type, choices, nargs, default, hidden) -- argparse errors are argparse's own
  (usage, ``sglang serve: error: ...``, exit 2);
* the resolution: ``prepare_server_args(argv)`` builds a ``ServerArgs`` dataclass whose
  ``__post_init__`` applies the recorded rules in order (the build's own error texts as
  ``ValueError``, its warnings logged, its forced values and defaults);
* the startup line form (``server_args=ServerArgs(...)``, the dataclass repr, for builds of that era)
  and the draft runner's line format, which the lab server reads from ``RECORDING``.

Rules (``RECORDING['rules']``, applied in order). ``when``: every entry must hold -- ``dest: value``
(case-insensitive), ``dest: [values]``, ``dest: {"not": [values]}``, ``dest: {"set": true|false}``,
``dest: {"gt": {"dest": other, "plus": n}}``. Then, in this order:
``{"when": {dest: value}, "upper": [dest]}``            upper-case a value (the algorithm)
``{"when": ..., "choices": {dest: [..]}, "error": t}``  value must be one of them
``{"when": ..., "fail": true, "error": t}``              refuse whenever it applies
``{"when": ..., "require": {dest: value}, "error": t}``  refuse another value (unset passes, unless
                                                         ``"unset_fails": true``)
``{"when": ..., "force": {dest: value}, "warning": t}``  set it, warn when the user gave another one
``{"when": ..., "default": {dest: value}}``              set when unset; value ``{"dest": d, "plus": n}``
                                                         or ``{"draft_config": key, "else": v}``
``{"when": ..., "min": {dest: n}, "error": t}``          refuse a set value below n
``{"when": ..., "ge_dest": {dest: other}, "error": t}``  refuse dest < other (both set)
``{"when": ..., "env_int": {name: [default, min, max]}, "error": t}``  an integer environment knob
``{"when": ..., "info": t}`` / ``{"when": ..., "warn": t}``  log a line (INFO / WARNING) when it applies
Texts are ``str.format``-ed with the settings, ``name``/``value`` and the rule's ``derive``
({field: {"dest": d, "plus": n}}).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "lab_replay_recording.json"), encoding="utf-8") as _fh:
    RECORDING = json.load(_fh)

logger = logging.getLogger("sglang.srt.server_args")


def _human_readable_int(text):
    units = {"k": 10**3, "K": 10**3, "m": 10**6, "M": 10**6, "g": 10**9, "G": 10**9}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "loads": json.loads,
    "json_list_type": json.loads,
    "human_readable_int": _human_readable_int,
    "nullable_str": lambda text: None if text.lower() in ("none", "null") else text,
}


class DeprecatedAliasStoreAction(argparse._StoreAction):
    """A hidden old spelling stored onto the new dest, with a warning (as the recorded build)."""

    def __init__(self, *args, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(*args, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        logger.warning(f"{option_string} is deprecated; use {self.new_flag} instead.")
        super().__call__(parser, namespace, values, option_string)


ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "_AppendAction": "append",
    "BooleanOptionalAction": argparse.BooleanOptionalAction,
    "DeprecatedAliasStoreAction": DeprecatedAliasStoreAction,
    "DeprecatedStoreTrueAction": "store_true",
    "DeprecatedStoreConstAction": "store_const",
}


def _add_option(parser, dest, entry):
    kind = ACTIONS.get(entry["action"], "store" if entry["takes_value"] else "store_true")
    flags = [f for f in entry["flags"] if f not in entry.get("negative_flags", [])]
    kwargs = {"dest": dest, "action": kind, "default": entry["default"]}
    if entry["hidden"]:
        kwargs["help"] = argparse.SUPPRESS
    if kind in ("store", "append") or kind is DeprecatedAliasStoreAction:
        if entry["type"]:
            kwargs["type"] = TYPES.get(entry["type"], str)
        if entry["choices"] is not None:
            kwargs["choices"] = entry["choices"]
        if entry["nargs"] is not None:
            kwargs["nargs"] = entry["nargs"]
        if entry["nargs"] == "?":
            kwargs["const"] = entry["const"]
    elif kind == "store_const":
        kwargs["const"] = entry["const"]
    if kind is DeprecatedAliasStoreAction:
        kwargs["new_flag"] = entry.get("new_flag")
    # one dest registered by several actions of the dump: the first spelling wins
    with contextlib.suppress(argparse.ArgumentError):
        parser.add_argument(*flags, **kwargs)


def _holds(have, want, values):
    if isinstance(want, list):
        return any(_same(have, w) for w in want)
    if isinstance(want, dict) and "not" in want:
        return not any(_same(have, w) for w in want["not"])
    if isinstance(want, dict) and "set" in want:
        return (have is not None and have is not False) == want["set"]
    if isinstance(want, dict) and "gt" in want:
        other = values.get(want["gt"]["dest"])
        return have is not None and other is not None and have > other + want["gt"].get("plus", 0)
    return _same(have, want)


def _matches(rule, values):
    return all(_holds(values.get(dest), want, values) for dest, want in rule.get("when", {}).items())


def _same(a, b):
    if isinstance(a, str) and isinstance(b, str):
        return a.upper() == b.upper()
    return a == b


def _draft_config(values, key):
    path = values.get("speculative_draft_model_path")
    try:
        with open(os.path.join(str(path), "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    except (OSError, ValueError, TypeError):
        return None
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    return nested.get(key, config.get(key))


def _text(template, values, rule=None, **extra):
    fields = dict(values, **extra)
    for name, spec in (rule or {}).get("derive", {}).items():
        base = values.get(spec["dest"])
        fields[name] = None if base is None else base + spec.get("plus", 0)
    return template.format(**fields)


def apply_rules(values):
    """Apply the recorded resolution rules to ``values`` (a dict of dest -> value) in place."""
    for rule in RECORDING.get("rules", []):
        if not _matches(rule, values):
            continue
        if rule.get("fail"):
            raise ValueError(_text(rule["error"], values, rule))
        for dest in rule.get("upper", []):
            if isinstance(values.get(dest), str):
                values[dest] = values[dest].upper()
        for dest, allowed in rule.get("choices", {}).items():
            if values.get(dest) is not None and values[dest] not in allowed:
                raise ValueError(_text(rule["error"], values, rule, name=dest, value=values[dest]))
        for dest, want in rule.get("require", {}).items():
            unset = values.get(dest) is None
            if (unset and rule.get("unset_fails")) or (not unset and not _same(values[dest], want)):
                raise ValueError(_text(rule["error"], values, rule, name=dest, value=values[dest]))
        for dest, low in rule.get("min", {}).items():
            if values.get(dest) is not None and values[dest] < low:
                raise ValueError(_text(rule["error"], values, rule, name=dest, value=values[dest]))
        for dest, other in rule.get("ge_dest", {}).items():
            both = values.get(dest) is not None and values.get(other) is not None
            if both and values[dest] < values[other]:
                raise ValueError(_text(rule["error"], values, rule, name=dest, value=values[dest]))
        for name, (default, low, high) in rule.get("env_int", {}).items():
            raw = os.environ.get(name)
            try:
                value = default if raw is None else int(raw)
            except ValueError:
                raise ValueError(_text(rule["error"], values, rule, name=name, value=raw)) from None
            if not low <= value <= high:
                raise ValueError(_text(rule["error"], values, rule, name=name, value=value))
        for dest, value in rule.get("default", {}).items():
            if values.get(dest) is not None:
                continue
            if isinstance(value, dict) and "dest" in value:
                base = values.get(value["dest"])
                value = base if base is None or "plus" not in value else base + value["plus"]
            elif isinstance(value, dict) and "draft_config" in value:
                found = _draft_config(values, value["draft_config"])
                value = value.get("else") if found is None else found
            values[dest] = value
        for dest, value in rule.get("force", {}).items():
            if values.get(dest) is not None and not _same(values[dest], value) and rule.get("warning"):
                logger.warning(_text(rule["warning"], values, rule, name=dest, value=values[dest]))
            values[dest] = value
        if rule.get("info"):
            logger.info(_text(rule["info"], values, rule))
        if rule.get("warn"):
            logger.warning(_text(rule["warn"], values, rule))


def add_cli_args(parser):
    for dest, option in RECORDING["options"].items():
        for entry in option["actions"]:
            _add_option(parser, dest, entry)


def _post_init(self):
    values = dataclasses.asdict(self)
    apply_rules(values)
    for dest, value in values.items():
        setattr(self, dest, value)


ServerArgs = dataclasses.make_dataclass(
    "ServerArgs",
    [(dest, object, dataclasses.field(default=None)) for dest in RECORDING["options"]],
    namespace={
        "__post_init__": _post_init,
        "add_cli_args": staticmethod(add_cli_args),
        "__module__": "sglang.srt.server_args",
    },
)


def prepare_server_args(argv):
    """As the recorded build: parse (argparse errors exit 2), then resolve in ``__post_init__``."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    add_cli_args(parser)
    raw = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(getattr(raw, "log_level", None) or "info").upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    known = {f.name for f in dataclasses.fields(ServerArgs)}
    server_args = ServerArgs(**{k: v for k, v in vars(raw).items() if k in known})
    server_args.launch_command = " ".join(["sglang", "serve"] + list(argv))
    return server_args
