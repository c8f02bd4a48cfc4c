"""What a pull request may bring into a plan: data, checked before it is used (issue 16, item 1).

The plan runs the BASE revision's code; from the pull request it takes only inventory and variable
files (YAML under inventory/). Each such file the pull request changes is checked here, against the
base's own role argument specs, before it is written into the base tree:

- plain YAML only: no inventory plugin (`plugin:` runs code), no tag but `!vault` and `!unsafe`, no
  executable file (ansible would run it as an inventory script);
- every host it adds or changes has a plain name (tools/gitops/names.py: never a path, an option or a
  pattern), whether it comes from an inventory's `hosts:` or a `host_vars/<host>.yml` file name;
- every variable the pull request adds or changes (a variable whose value is the base's is the
  base's) must be data: no Jinja (`{{`, `{%`, `{#`: a template is code that runs on the
  controller), and no connection or privilege setting but the allowlist of names.CONNECTION
  (`ansible_host`, `ansible_port`, `ansible_user`, `ansible_become`, each with its value checked: a
  `ProxyCommand`, an interpreter or `ansible_connection: local` run commands);
- any other variable must be an option of a role's argument spec (the base's
  `roles/<role>/meta/argument_specs.yml`) or one of playbooks/gpu.yml's documented settings, with its type
  and choices (ansible-core's ArgumentSpecValidator, as the role's own validation); anything else - an
  unprefixed name, an internal `_`/`__` value such as `__sglang_rolling` that would skip a role's checks
  in an apply - is refused naming the variable and the file (the closest option when it has a role's prefix);
- `sglang_environment` may not add or change an entry that would make the plan's parse (the host's
  SGLang, run with that environment) load other code or go online (OFFLINE_ENV, CODE_ENV).

Every file is classified as data, inert (docs, tests, lab tooling: the plan never runs them) or
code (everything else: playbooks, roles, library, module_utils, action_plugins, callback_plugins,
ansible.cfg, tools, templates, requirements, ...).

Needs PyYAML and ansible-core (the controller virtualenv, `make venv`).
"""

from __future__ import annotations

import difflib
import re
from pathlib import PurePosixPath

import names
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

DATA_SUFFIXES = (".yml", ".yaml")
INERT_PREFIXES = ("docs/", "tests/", "lab/", "bench/", "molecule/", "out/")
INERT_NAMES = (".gitignore", "LICENSE", ".yamllint", ".ansible-lint")
CONNECTION_OK = names.CONNECTION
# playbooks/gpu.yml's inventory settings (its header), typed as an argument spec would: no role's options, but
# what every site copied from inventory/sample sets. Not nvidia_gpu_check_nvidia_smi: a program root runs.
PLAYBOOK_OPTIONS = {
    "nvidia_gpu_check_enabled": {"type": "bool"},
    "nvidia_gpu_check_expected_count": {"type": "int"},
    "nvidia_gpu_check_expected_model": {"type": "str"},
    "nvidia_gpu_check_min_driver": {"type": "str"},
    "nvidia_gpu_check_expected_compute_cap": {"type": "str"},
    "nvidia_nccl_p2p_disable": {"type": "bool"},
    "nvidia_nccl_p2p_reason": {"type": "str"},
}
# The plan's inspection runs with these set to 1 (playbooks/plan.yml): the host's SGLang parses the pull
# request's command line with the Hugging Face libraries offline.
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
# Entries of sglang_environment that would make that parse run other code or fetch from elsewhere.
CODE_ENV = (
    *OFFLINE_ENV,
    "HF_ENDPOINT",
    "HF_MODULES_CACHE",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "PYTHONHOME",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
)
JINJA = re.compile(r"\{\{|\{%|\{#")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INVENTORY_KEYS = {"hosts", "vars", "children"}


class DataError(Exception):
    """A pull request's data file that cannot be used; the message names the file and the setting."""


def classify(path: str, mode: str = "100644") -> str:
    """'data', 'inert' or 'code' for a path of the repository (git mode of the new file)."""
    p = PurePosixPath(path)
    if path.startswith("inventory/") and p.suffix in DATA_SUFFIXES and mode == "100644":
        return "data"
    if path.startswith(INERT_PREFIXES) or p.name in INERT_NAMES or (p.suffix == ".md" and "/" not in path):
        return "inert"
    return "code"


class _Opaque(str):
    """A `!vault` or `!unsafe` value: data the plan never templates."""


class _Loader(yaml.SafeLoader):
    pass


def _opaque(loader, node):
    return _Opaque(loader.construct_scalar(node))


_Loader.add_constructor("!vault", _opaque)
_Loader.add_constructor("!unsafe", _opaque)


def load(text: str, path: str):
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader with two opaque tags
    except yaml.YAMLError as exc:
        raise DataError(f"{path}: not plain YAML data ({str(exc).splitlines()[0]})") from None


def variables(doc, path: str) -> dict[tuple, object]:
    """{(scope, name): value} of one inventory or variable file."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise DataError(f"{path}: a variable or inventory file must be a mapping, got {type(doc).__name__}")
    parts = PurePosixPath(path).parts
    if "group_vars" in parts or "host_vars" in parts:
        kind = "group" if "group_vars" in parts else "host"
        i = parts.index(f"{kind}_vars")
        scope = (kind, parts[i + 1].rsplit(".", 1)[0] if i + 1 < len(parts) else "")
        return {(scope, str(k)): v for k, v in doc.items()}
    if "plugin" in doc:
        raise DataError(f"{path}: `plugin: {doc['plugin']}` makes it an inventory plugin (code), not data")
    out: dict[tuple, object] = {}

    def group(name, body, where):
        if body is None:
            return
        if not isinstance(body, dict) or set(body) - INVENTORY_KEYS:
            extra = sorted(set(body) - INVENTORY_KEYS) if isinstance(body, dict) else body
            raise DataError(f"{path}: group {where} may hold only hosts, vars and children (got {extra})")
        for k, v in (body.get("vars") or {}).items():
            out[(("group", name), str(k))] = v
        for host, hvars in (body.get("hosts") or {}).items():
            if hvars is not None and not isinstance(hvars, dict):
                raise DataError(f"{path}: host {host} in {where} must map to its variables")
            out[(("host", str(host)), "")] = None  # the host itself is data too
            for k, v in (hvars or {}).items():
                out[(("host", str(host)), str(k))] = v
        for child, cbody in (body.get("children") or {}).items():
            group(str(child), cbody, f"{where}.children.{child}")

    for name, body in doc.items():
        group(str(name), body, str(name))
    return out


def _strings(value):
    if isinstance(value, _Opaque):
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def role_specs(role_spec_texts: dict[str, str]) -> dict[str, dict]:
    """{role: {option: spec}} from the base's roles/<role>/meta/argument_specs.yml texts."""
    out = {}
    for role, text in role_spec_texts.items():
        doc = yaml.safe_load(text) or {}
        out[role] = ((doc.get("argument_specs") or {}).get("main") or {}).get("options") or {}
    return out


def _check_option(path: str, where: str, name: str, value, specs: dict[str, dict]) -> None:
    """`name` must be an option of a role (or PLAYBOOK_OPTIONS), and `value` of its type and choices."""
    owner = next((r for r in sorted(specs) if name in specs[r]), None)
    options = specs[owner] if owner else PLAYBOOK_OPTIONS if name in PLAYBOOK_OPTIONS else None
    if options is None:
        prefixes = sorted(specs, key=len, reverse=True)
        role = next((r for r in prefixes if name.startswith(r + "_")), None)
        if role is not None:
            close = difflib.get_close_matches(name, list(specs[role]), n=1, cutoff=0.7)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise DataError(
                f"{path}: {where}{name} is not an option of the role {role} "
                f"(roles/{role}/meta/argument_specs.yml){hint}"
            )
        raise DataError(
            f"{path}: {where}{name} is not an option of any role (roles/*/meta/argument_specs.yml) nor a "
            f"connection variable ({', '.join(sorted(CONNECTION_OK))}): a pull request's data may set only "
            "those; anything else (an internal _ or __ value included) needs review and an apply"
        )
    if isinstance(value, _Opaque) or value is None:
        return
    spec = {k: v for k, v in options[name].items() if k not in ("required", "default")}
    result = ArgumentSpecValidator({name: spec}).validate({name: value})
    if result.error_messages:
        raise DataError(f"{path}: {where}{name}: {'; '.join(result.error_messages)}")


def _check_environment(path: str, where: str, value, base) -> None:
    """sglang_environment: no added or changed entry of CODE_ENV (the plan parses with this environment)."""
    if not isinstance(value, dict):
        return
    base = base if isinstance(base, dict) else {}
    for key in sorted(str(k) for k in value):
        if key in CODE_ENV and (key not in base or base[key] != value[key]):
            raise DataError(
                f"{path}: {where}sglang_environment: {key} would change what the plan's parse of the "
                "command line runs or fetches (the plan runs the host's SGLang with this environment, "
                "offline and with no code but its own): it needs review and an apply"
            )


def _check_connection(path: str, where: str, name: str, value) -> None:
    if name not in CONNECTION_OK:
        raise DataError(
            f"{path}: {where}{name} is a connection or privilege setting: a pull request cannot change "
            f"it in a plan (only {', '.join(sorted(CONNECTION_OK))}); it needs review and an apply"
        )
    problem = None if isinstance(value, _Opaque) else CONNECTION_OK[name](value)
    if problem:
        raise DataError(f"{path}: {where}{name}: {problem}")


def check_file(path: str, head_text: str, base_text: str | None, specs: dict[str, dict]) -> list[str]:
    """Refuse (DataError) or accept one changed data file; returns what it changes, in words."""
    head_vars = variables(load(head_text, path), path)
    base_vars = variables(load(base_text, path), path) if base_text is not None else {}
    changed = []
    for (scope, name), value in sorted(head_vars.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        key = (scope, name)
        if key in base_vars and base_vars[key] == value and type(base_vars[key]) is type(value):
            continue
        if scope[0] == "host":
            problem = names.host_name_problem(scope[1])
            if problem:
                raise DataError(f"{path}: {problem}")
        where = f"{scope[0]} {scope[1]}: " if scope[1] else ""
        if name == "":
            changed.append(f"{scope[0]} {scope[1]} added")
            continue
        if not NAME.match(name):
            raise DataError(f"{path}: {where}{name!r} is not a variable name")
        for text in _strings(value):
            if JINJA.search(text):
                raise DataError(
                    f"{path}: {where}{name} holds a Jinja template ({text[:60]!r}): templates in data are "
                    "code that runs on the controller; a pull request's data must be literal values"
                )
        if name.startswith("ansible_"):
            _check_connection(path, where, name, value)
        else:
            _check_option(path, where, name, value, specs)
            if name == "sglang_environment":
                _check_environment(path, where, value, base_vars.get(key))
        changed.append(f"{where}{name}")
    return changed
