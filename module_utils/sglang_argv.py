# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Structured settings <-> SGLang argv, driven by the INSTALLED parser's capabilities.

The canonical keys and their accepted dests per build come from module_utils/sglang_options.py.
``capabilities`` is the return value of the
``sglang_capabilities`` module: ``{'version', 'options': {dest: {...}}, 'algorithms': [...]}``.

Over 500 lines since ruff format put one argument per line: one builder (settings, flag names, build
profile, secrets, extra arguments -> argv), every step of it reading the same capabilities.

Pure functions, standard library only. Every error is a ``ValueError`` whose text starts with
the setting or flag concerned.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import numbers

from ansible.module_utils.sglang_options import (  # noqa: E402
    ACCEPTED_DESTS,
    DFLASH_BASED,
    LISTENER_KEYS,
    METRIC_LABELS_KEY,
    MISSING_HINTS,
    SECRET_KEYS,
    WINDOW_KEY,
    accepted_dests,
    canonical_key,
    env_knob_sources,
    flag_spelling,
    plan_settings,
    runner_lines,
    window_support,
)
from ansible.module_utils.sglang_options import (
    CASE_INSENSITIVE_KEYS as UPPERCASE_KEYS,
)


def _version(capabilities):
    return "SGLang {}".format(capabilities.get("version", "(unknown version)"))


def _options(capabilities):
    options = capabilities.get("options")
    if not isinstance(options, dict) or not options:
        raise ValueError("capabilities: no parser options (run sglang_capabilities first)")
    return options


def _visible_flags(option):
    """Non-hidden, non-deprecated positive flags of a dest, best first."""
    flags = []
    for action in option.get("actions", ()):
        if action.get("hidden") or action.get("deprecated"):
            continue
        for flag in action.get("flags", ()):
            if flag not in action.get("negative_flags", ()) and flag not in flags:
                flags.append(flag)
    return flags


def _preferred_action(option):
    for action in option.get("actions", ()):
        if not action.get("hidden") and not action.get("deprecated"):
            return action
    actions = option.get("actions") or [{}]
    return actions[0]


def flag_index(capabilities):
    """{flag: (dest, action)} for every option string the parser knows."""
    index = {}
    for dest, option in _options(capabilities).items():
        for action in option.get("actions", ()):
            for flag in action.get("flags", ()):
                index[flag] = (dest, action)
    return index


def resolve_setting(key, capabilities):
    """(dest, flag, action) the installed parser uses for canonical ``key``.

    Prefers the first accepted dest that has a visible flag; a dest reachable only through a
    hidden/deprecated flag is used only when no accepted dest has a visible one.
    Raises ValueError naming the setting, the version and the flags looked for.
    """
    options = _options(capabilities)
    dests = accepted_dests(key)
    fallback = None
    for dest in dests:
        option = options.get(dest)
        if not option:
            continue
        visible = _visible_flags(option)
        if visible:
            return dest, visible[0], _preferred_action(option)
        if fallback is None:
            action = _preferred_action(option)
            flags = [f for f in action.get("flags", ()) if f not in action.get("negative_flags", ())]
            if flags:
                fallback = (dest, flags[0], action)
    if fallback is not None:
        return fallback
    looked = ", ".join(flag_spelling(d) for d in dests)
    kind = "tree-budget" if key == "speculative_ddtree_budget" else "matching"
    hint = MISSING_HINTS.get(key)
    raise ValueError(
        "{}: {} has no {} flag (looked for {}){}".format(
            key, _version(capabilities), kind, looked, "; " + hint if hint else ""
        )
    )


def _check_text(name, text):
    if "\n" in text or "\r" in text or "\x00" in text:
        raise ValueError(f"{name}: value must not contain a newline or NUL character")
    return text


def _scalar_text(name, value):
    if isinstance(value, bool):
        raise ValueError(f"{name}: a boolean is not a valid value here (the flag takes a value)")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))
    if isinstance(value, str):
        return _check_text(name, value)
    raise ValueError(f"{name}: value must be a string or a number, got {type(value).__name__}")


def _algorithm_value(name, value, capabilities, action):
    text = _scalar_text(name, value)
    choices = action.get("choices")
    if choices:
        for choice in choices:
            if str(choice).upper() == text.upper():
                return str(choice)
        raise ValueError(
            "{}: {!r} is not accepted by {} (choices: {})".format(
                name, text, _version(capabilities), ", ".join(str(c) for c in choices)
            )
        )
    algorithms = capabilities.get("algorithms") or []
    if algorithms:
        for algo in algorithms:
            if algo.upper() == text.upper():
                return algo
        raise ValueError(
            "{}: {!r} is not a speculative algorithm of {} (known: {})".format(
                name, text, _version(capabilities), ", ".join(algorithms)
            )
        )
    return text.upper()


def _value_tokens(name, dest, value, action, capabilities):
    """argv tokens after the flag for ``value`` (validated against the parser's action)."""
    if dest in UPPERCASE_KEYS or canonical_key(dest) in UPPERCASE_KEYS:
        return [_algorithm_value(name, value, capabilities, action)]
    nargs = action.get("nargs")
    multi = nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1)
    if isinstance(value, dict):
        tokens = [_check_text(name, json.dumps(value, sort_keys=True, separators=(",", ":")))]
    elif isinstance(value, (list, tuple)):
        if not multi:
            raise ValueError("{}: {} takes one value, got a list".format(name, action.get("flags", ["?"])[0]))
        if nargs == "+" and not value:
            raise ValueError(f"{name}: needs at least one value")
        tokens = [_scalar_text(name, v) for v in value]
    else:
        tokens = [_scalar_text(name, value)]
    if isinstance(nargs, int) and nargs > 0 and len(tokens) != nargs:
        raise ValueError(f"{name}: needs exactly {nargs} values, got {len(tokens)}")
    choices = action.get("choices")
    if choices:
        allowed = [str(c) for c in choices]
        for token in tokens:
            if token not in allowed:
                raise ValueError(
                    "{}: {!r} is not accepted by {} (choices: {})".format(
                        name, token, _version(capabilities), ", ".join(allowed)
                    )
                )
    for token in tokens:
        if token.startswith("-") and not _looks_numeric(token):
            raise ValueError(f'{name}: value {token!r} starts with "-" and would be read as a flag')
    return tokens


def _looks_numeric(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _typed(value, action):
    """Value as the parser's type would store it (int/float), for ``managed``."""
    kind = action.get("type")
    if isinstance(value, (list, tuple)):
        return [_typed(v, action) for v in value]
    if isinstance(value, str) and kind in ("int", "float"):
        try:
            return int(value) if kind == "int" else float(value)
        except ValueError:
            return value
    return value


def _bool_tokens(name, flag, value, action, capabilities):
    if not isinstance(value, bool):
        raise ValueError(f"{name}: {flag} is a switch; the value must be true or false, got {value!r}")
    if value:
        if action.get("action") in ("_StoreFalseAction",):
            raise ValueError(f"{name}: {flag} turns the setting off; cannot set it to true")
        return [flag]
    default = action.get("default")
    negative = action.get("negative_flags") or []
    if default is False or (default is None and not negative):
        return []
    if negative:
        return [negative[0]]
    raise ValueError(
        f"{name}: must be false, but {_version(capabilities)} defaults it to {default!r} "
        f"and has no flag to turn it off (only {flag})"
    )


def _check_dflash_aliases(settings):
    algo = settings.get("speculative_algorithm")
    if not isinstance(algo, str) or algo.upper() not in DFLASH_BASED:
        return
    block = settings.get("speculative_dflash_block_size")
    tokens = settings.get("speculative_num_draft_tokens")
    if block is not None and tokens is not None and int(block) != int(tokens):
        raise ValueError(
            f"speculative_dflash_block_size: {block} differs from speculative_num_draft_tokens {tokens}; "
            "for DFLASH "
            "they are aliases and SGLang refuses different values"
        )


def _replacement_for(flag, capabilities, index):
    """For an unknown/deprecated flag: the flag the installed parser wants instead, or None."""
    entry = index.get(flag)
    if entry is not None:
        replacement = entry[1].get("new_flag")
        if replacement:
            return replacement
        dest = entry[0]
    else:
        dest = flag.lstrip("-").replace("-", "_")
    key = canonical_key(dest)
    if key == dest and dest not in ACCEPTED_DESTS:
        return None
    try:
        return resolve_setting(key, capabilities)[1]
    except ValueError:
        return None


def _unknown_flag_error(name, flag, capabilities, index):
    replacement = _replacement_for(flag, capabilities, index)
    if replacement and replacement != flag:
        return ValueError(
            f"{name}: {_version(capabilities)} does not accept {flag} "
            f"(renamed: use {replacement}, or the matching role setting)"
        )
    close = difflib.get_close_matches(flag, list(index), n=3, cutoff=0.75)
    suggestion = " (did you mean {}?)".format(", ".join(close)) if close else ""
    return ValueError(f"{name}: {_version(capabilities)} does not accept {flag}{suggestion}")


def build_argv(
    settings,
    capabilities,
    extra_args=None,
    secret_env=None,
    secret_positions=None,
    config_path=None,
    config_keys=None,
):
    """Settings (canonical key -> value) -> (argv, managed).

    ``argv`` holds only SGLang's arguments (no launcher). ``managed`` maps canonical keys (and
    the dests of extra args) to the value SGLang will parse; secrets appear only as
    ``${ENVVAR}``. None values are omitted. Raises ValueError naming the setting.
    ``secret_positions`` (a list, optional) receives the argv index of each ``${ENVVAR}`` this
    function put there: the only elements systemd may substitute (a user value that contains
    ``${...}`` is passed literally).
    With ``config_path`` a secret never reaches argv at all (``/proc/<pid>/cmdline`` is readable by
    every local user): ``config_keys`` (a dict, optional) receives canonical key -> the key of
    SGLang's ``--config`` YAML file (the flag without ``--``: SGLang's ConfigArgumentMerger turns
    ``api-key: X`` into ``--api-key X``), and argv ends with ``--config <config_path>``.
    """
    settings = dict(settings or {})
    secret_env = dict(secret_env or {})
    in_config = {} if config_keys is None else config_keys
    if config_path and not str(config_path).lower().endswith((".yaml", ".yml")):
        # SGLang's ConfigArgumentMerger refuses any other suffix ("Config file must be YAML format").
        raise ValueError(f"config_path: {config_path!r} must end in .yaml or .yml (SGLang reads no other)")
    extra_args = list(extra_args or [])
    _options(capabilities)
    _check_dflash_aliases(settings)
    index = flag_index(capabilities)

    argv = []
    managed = {}
    used_dests = {}
    algo = settings.get("speculative_algorithm")
    for key in sorted(settings, key=_setting_order):
        value = settings[key]
        if value is None:
            continue
        if key in SECRET_KEYS and key not in secret_env and not config_path:
            raise ValueError(
                f"{key}: a secret must be passed through secret_env or the "
                "--config file (config_path), never as a plain value in ExecStart"
            )
        if key == "speculative_dflash_block_size":
            dest, flag, action = _resolve_block_size(key, algo, capabilities)
        else:
            dest, flag, action = resolve_setting(key, capabilities)
        if dest in used_dests:
            raise ValueError(f"{key}: maps to the same SGLang option ({flag}) as {used_dests[dest]}")
        used_dests[dest] = key
        if key in SECRET_KEYS and config_path:
            if not flag.startswith("--") or not action.get("takes_value", True):
                raise ValueError(
                    f"{key}: {flag} cannot be set from a --config file (no long flag with a value)"
                )
            in_config[key] = flag[2:]
            continue
        if key in secret_env:
            env = secret_env[key]
            if not isinstance(env, str) or not env.replace("_", "A").isalnum() or env[0].isdigit():
                raise ValueError(f"{key}: secret_env name {env!r} is not a valid environment variable name")
            placeholder = f"${{{env}}}"
            argv.extend([flag, placeholder])
            if secret_positions is not None:
                secret_positions.append(len(argv) - 1)
            managed[key] = placeholder
            continue
        if not action.get("takes_value", True):
            tokens = _bool_tokens(key, flag, value, action, capabilities)
            argv.extend(tokens)
            if tokens or value is False:
                managed[key] = value
            continue
        tokens = _value_tokens(key, dest, value, action, capabilities)
        argv.append(flag)
        argv.extend(tokens)
        if dest in UPPERCASE_KEYS or key in UPPERCASE_KEYS:
            managed[key] = tokens[0]
        else:
            managed[key] = _typed(value, action)

    for position, item in enumerate(extra_args):
        _add_extra(position, item, capabilities, index, used_dests, argv, managed)
    if in_config:
        if "config" not in _options(capabilities):
            raise ValueError(
                "{}: {} has no --config option to read the secret from a file".format(
                    ", ".join(sorted(in_config)), _version(capabilities)
                )
            )
        argv.extend(["--config", _check_text("config_path", config_path)])
    return argv, managed


def _setting_order(key):
    # model first (readable ExecStart), then the rest alphabetically: a stable argv is what
    # makes the unit, the preflight cache and the verifier idempotent.
    return (key != "model_path", key)


def _resolve_block_size(key, algo, capabilities):
    try:
        return resolve_setting(key, capabilities)
    except ValueError:
        if isinstance(algo, str) and algo.upper() in DFLASH_BASED:
            # --speculative-dflash-block-size is an alias of --speculative-num-draft-tokens for DFLASH.
            return resolve_setting("speculative_num_draft_tokens", capabilities)
        raise


def _add_extra(position, item, capabilities, index, used_dests, argv, managed):
    name = f"extra_args[{position}]"
    if not isinstance(item, dict) or "arg" not in item:
        raise ValueError(f'{name}: must be a mapping with "arg" (and "value" unless it is a switch)')
    unknown = set(item) - {"arg", "value"}
    if unknown:
        raise ValueError("{}: unknown keys {} (only arg and value)".format(name, ", ".join(sorted(unknown))))
    flag = item["arg"]
    if not isinstance(flag, str) or not flag.startswith("--") or "=" in flag:
        raise ValueError(f'{name}: arg must be a long flag like "--max-running-requests", got {flag!r}')
    _check_text(name, flag)
    name = f"{name} ({flag})"
    entry = index.get(flag)
    if entry is None:
        raise _unknown_flag_error(name, flag, capabilities, index)
    dest, action = entry
    if action.get("hidden") or action.get("deprecated"):
        replacement = _replacement_for(flag, capabilities, index)
        raise ValueError(
            "{}: {} marks {} as deprecated/hidden{}".format(
                name,
                _version(capabilities),
                flag,
                f"; use {replacement}" if replacement and replacement != flag else "",
            )
        )
    key = canonical_key(dest)
    if dest == "config":
        raise ValueError(
            f"{name}: the role passes its own --config file (the secrets); set the options "
            "as role settings or extra args instead"
        )
    if key in SECRET_KEYS:
        raise ValueError(
            f"{name}: secrets cannot be extra args (they would be readable in the unit); "
            f"use the role setting for {key}"
        )
    if dest in used_dests:
        raise ValueError(
            f"{name}: duplicates the managed setting {used_dests[dest]}; set it there, not as an extra arg"
        )
    for other in accepted_dests(key):
        if other in used_dests:
            raise ValueError(f"{name}: duplicates the managed setting {used_dests[other]}")
    used_dests[dest] = name
    value = item.get("value")
    if not action.get("takes_value", True):
        if value not in (None, True):
            raise ValueError(f"{name}: is a switch and takes no value (got {value!r})")
        argv.append(flag)
        negative = flag in (action.get("negative_flags") or ())
        if action.get("action") == "_StoreFalseAction" or negative:
            managed[key] = False
        elif action.get("action") == "_StoreConstAction":
            managed[key] = action.get("const")
        else:
            managed[key] = True
        return
    if value is None:
        raise ValueError(f"{name}: needs a value")
    tokens = _value_tokens(name, dest, value, action, capabilities)
    argv.append(flag)
    argv.extend(tokens)
    managed[key] = _typed(value if isinstance(value, (list, tuple)) else tokens[0], action)


def flag_dests(capabilities):
    """{flag: dest} of every option string the installed parser knows (for reading a cmdline)."""
    return {flag: dest for flag, (dest, _action) in flag_index(capabilities).items()}


def config_hash(managed, env, secrets=(), label=None):
    """The configuration's name: 12 hex digits of the sha256 of the managed arguments (canonical key ->
    value, the listener left out so that hosts serving the same configuration share it, the metric labels
    as an object without ``label``, the hash's own), of the knobs the build reads from the environment and
    of the names of the ``secrets`` set (never a value). Stable for the same settings whatever the flag
    spellings of the build."""
    args = {key: value for key, value in managed.items() if key not in LISTENER_KEYS}
    labels = args.pop(METRIC_LABELS_KEY, None)
    if isinstance(labels, str):
        with contextlib.suppress(ValueError):
            labels = json.loads(labels)
    if isinstance(labels, dict):
        labels = {name: value for name, value in labels.items() if name != label}
    if labels:
        args[METRIC_LABELS_KEY] = labels
    named = {"args": args, "env": env, "secrets": sorted(secrets)}
    text = json.dumps(named, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _operator_labels(extra_args, index, label):
    """(the labels of an ``--extra-metric-labels`` in ``extra_args``, the other extra args)."""
    labels, rest = {}, []
    for position, item in enumerate(extra_args or []):
        flag = item.get("arg") if isinstance(item, dict) else None
        if flag not in index or index[flag][0] != METRIC_LABELS_KEY:
            rest.append(item)
            continue
        name = f"extra_args[{position}] ({flag})"
        value = item.get("value")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                value = None
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ValueError(f'{name}: must be a mapping of label -> string, e.g. {{"team": "inference"}}')
        if label in value:
            raise ValueError(f"{name}: the role sets the label {label} itself (the configuration's hash)")
        labels.update(value)
    return labels, rest


def build_command(
    settings,
    capabilities,
    profile,
    extra_args=None,
    secret_env=None,
    environment=None,
    config_path=None,
    config_hash_label=None,
):
    """Settings + the installed parser + the build profile -> what the unit and env file need.

    Returns ``{'argv', 'secret_positions', 'config_keys', 'managed', 'env', 'env_managed', 'require_window',
    'runner_lines', 'config_hash'}`` (``secret_positions``: the argv indexes of the secret references;
    ``config_keys``: the secrets the ``--config`` file at ``config_path`` must hold, canonical key -> YAML
    key): ``env`` holds the knobs the build reads from the environment (``{VAR: value}``), ``env_managed``
    maps their canonical keys to the variable, ``runner_lines`` names the start-up lines that prove the window
    and the tree budget, ``config_hash`` names the configuration (``config_hash()`` of the command line
    without its own label). With ``config_hash_label``, every metric of the server carries it: argv gets
    ``--extra-metric-labels {"<label>": "<config_hash>"}`` (an ``--extra-metric-labels`` of ``extra_args``
    merged in). Raises ValueError naming the setting (the build's refusals first).
    """
    index = flag_index(capabilities)
    extra = {}
    for item in extra_args or []:
        if isinstance(item, dict) and item.get("arg") in index:
            dest, action = index[item["arg"]]
            extra[canonical_key(dest)] = _typed(item.get("value", True), action)
    flags, env, errors = plan_settings(settings, profile, environment, extra)
    if errors:
        raise ValueError("; ".join(errors))
    options = _options(capabilities)
    missing = [d for d in profile.get("dests", []) if not any(a in options for a in accepted_dests(d))]
    if missing:
        raise ValueError(
            "sglang_build_profile: {} ({}) expects the option(s) {}, which {} does not have; "
            "select the profile of the installed build".format(
                profile["name"],
                profile.get("source") or profile.get("description"),
                ", ".join(flag_spelling(d) for d in missing),
                _version(capabilities),
            )
        )
    secret_positions, config_keys = [], {}
    argv, managed = build_argv(
        flags, capabilities, extra_args, secret_env, secret_positions, config_path, config_keys
    )
    # The hash of the command line without its own label: putting it there changes nothing it names.
    named = config_hash(managed, env, config_keys, config_hash_label)
    if config_hash_label:
        labels, extra_args = _operator_labels(extra_args, index, config_hash_label)
        flags = dict(flags, **{METRIC_LABELS_KEY: dict(labels, **{config_hash_label: named})})
        secret_positions, config_keys = [], {}
        argv, managed = build_argv(
            flags, capabilities, extra_args, secret_env, secret_positions, config_path, config_keys
        )
    algo = managed.get("speculative_algorithm")
    env_managed = {key: var for key, var in env_knob_sources(profile, algo).items() if var in env}
    return {
        "argv": argv,
        "secret_positions": secret_positions,
        "config_keys": config_keys,
        "managed": managed,
        "env": env,
        "env_managed": env_managed,
        "require_window": window_support(algo) == "honoured" and managed.get(WINDOW_KEY) is not None,
        "runner_lines": runner_lines(profile, algo),
        "config_hash": named,
        "notes": [
            f"{key}: {text}"
            for key, text in sorted(profile.get("notes", {}).get(str(algo or "").upper(), {}).items())
            if key in env_managed or key in managed
        ],
    }
