# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-only check of the sglang role's settings: what meta/argument_specs.yml cannot express.

Every rule is evaluated (not only up to the first failure) and each failure is one sentence that
names the variable; the task fails with all of them. Nothing reaches the host. One task instead
of one assert per rule: a no-change deploy pays ~40 ms of Ansible overhead per task. The same task
finds the sglang_* variables that are no setting of the role (misspelt: the argument spec never
sees them), from the task's own variables, as ``lookup('ansible.builtin.varnames')`` would.
Over 500 lines on purpose: one short check_* function per group of rules (types, key, paths,
speculative settings, profile, points, knobs, environment, NCCL, extra args, service, install); they are
the one place these rules live, and this one task runs them all.

Values that are secret never appear in a message: sglang_api_key is described, never shown, and an
extra argument that carries a secret flag is refused without its value (and without the per-item
message that would show the item).
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import re

import yaml
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_options():
    """module_utils/sglang_options.py (standard library only), the ONE owner of SGLang option knowledge."""
    path = os.path.join(REPO_DIR, "module_utils", "sglang_options.py")
    spec = importlib.util.spec_from_file_location("sglang_options", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OPTIONS = _load_options()
# Role variable -> (min, max) from the one set of bounds (the knobs' and the role's are the same).
ROLE_BOUNDS = {
    var: OPTIONS.BOUNDS[key] for key, var in OPTIONS.ROLE_VARIABLE.items() if key in OPTIONS.BOUNDS
}

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
SECRET_FLAGS = ("--api-key", "--admin-api-key", "--hf-token", "--ssl-keyfile-password")
API_KEY_ENV = "SGLANG_API_KEY"
# An empty string would still be passed (--served-model-name "", --host ""): SGLang takes it and the
# server runs with it. null is the way to leave a flag to SGLang.
NON_EMPTY = (
    "sglang_model_path",
    "sglang_served_model_name",
    "sglang_host",
    "sglang_reasoning_parser",
    "sglang_tool_call_parser",
    "sglang_speculative_algorithm",
    "sglang_speculative_draft_model_path",
)


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def type_name(value):
    """What Ansible's type_debug says for the plain types a variable can hold."""
    for kind, name in (
        (bool, "bool"),
        (int, "int"),
        (float, "float"),
        (str, "str"),
        (list, "list"),
        (dict, "dict"),
    ):
        if isinstance(value, kind):
            return name
    return "NoneType" if value is None else type(value).__name__


def shown(value, length):
    """``value | to_json | truncate(length)`` as the assert messages showed it (Jinja's truncate:
    5 characters of leeway, cut at a word boundary, '...')."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = json.dumps(str(value))
    if len(text) <= length + 5:
        return text
    return text[: length - 3].rsplit(" ", 1)[0] + "..."


def has_control(value):
    return CONTROL_CHARS.search(str(value)) is not None


def check_types(s, int_settings, string_settings):
    errors = []
    for item in int_settings:
        if item["name"] in ROLE_BOUNDS:
            item = dict(item, min=ROLE_BOUNDS[item["name"]][0], max=ROLE_BOUNDS[item["name"]][1])
        value = s.get(item["name"])
        ok = (item["nullable"] and value is None) or (is_int(value) and item["min"] <= value <= item["max"])
        if not ok:
            errors.append(
                f"{item['name']}={shown(value, 40)} ({type_name(value)}): must be an integer"
                f" from {item['min']} to {item['max']}{' or null' if item['nullable'] else ''}"
                ' (a quoted "2048" is a string: use | int or an unquoted number)'
            )
    if s["sglang_tp_size"] not in (1, 2, 4, 8) or isinstance(s["sglang_tp_size"], bool):
        errors.append(f"sglang_tp_size={s['sglang_tp_size']}: must be 1, 2, 4 or 8")
    frac = s["sglang_mem_fraction_static"]
    if not (frac is None or (is_number(frac) and 0 < frac < 1)):
        errors.append(
            f"sglang_mem_fraction_static={shown(frac, 40)}: must be a number with 0 < x < 1, or null"
        )
    minimum = s["sglang_min_accept_length"]
    if not (minimum is None or (is_number(minimum) and minimum > 0)):
        errors.append(f"sglang_min_accept_length={shown(minimum, 40)}: must be a number > 0, or null")
    for name in string_settings:
        value = s.get(name)
        if not (value is None or (isinstance(value, str) and not has_control(value))):
            errors.append(f"{name}: must be a string without newline, NUL or other control characters")
    for name in NON_EMPTY:
        value = s.get(name)
        if isinstance(value, str) and value == "":
            errors.append(f"{name}: must not be an empty string (null leaves the flag to SGLang's default)")
    return errors


def check_api_key(s):
    key = s["sglang_api_key"]
    if not (isinstance(key, str) and not has_control(key) and key == key.strip()):
        return [
            "sglang_api_key: must be a string without control characters or leading/trailing spaces"
            " (value not shown)"
        ]
    if key.startswith("-"):
        # `--api-key -x...`: SGLang's argparse takes the value for an option and exits 2 at start
        # (the preflight checks the argv with a placeholder, so only this rule sees the value).
        return [
            "sglang_api_key: must not start with '-' (SGLang's argparse would read it as an option"
            " and exit 2 at start; value not shown)"
        ]
    return []


def check_paths(s):
    errors = []
    launcher = s["sglang_launcher"]
    first = launcher[0] if isinstance(launcher, list) and launcher else ""
    for name, path in (
        ("sglang_model_path", s["sglang_model_path"]),
        ("sglang_venv", s["sglang_venv"]),
        ("sglang_releases_dir", s["sglang_releases_dir"]),
        ("sglang_home", s["sglang_home"]),
        ("sglang_launcher[0]", first),
    ):
        if not (isinstance(path, str) and path.startswith("/")):
            errors.append(f"{name}={shown(path, 60)}: must be an absolute path")
    if not (
        isinstance(launcher, list)
        and launcher
        and all(isinstance(a, str) for a in launcher)
        and not any(has_control(a) for a in launcher)
    ):
        errors.append(
            "sglang_launcher: must be a non-empty list of strings without control characters,"
            " first an absolute path"
        )
    for path in s["sglang_read_write_paths"]:
        if not (
            isinstance(path, str)
            and path.startswith("/")
            and not has_control(path)
            and not re.search(r"\s", path)
        ):
            errors.append(
                f"sglang_read_write_paths: {shown(path, 60)} must be an absolute path without spaces"
                " or control characters"
            )
    for path in s["cache_paths"]:
        if re.search(r"\s", path):
            errors.append(
                f"sglang_environment: the cache directory {shown(path, 60)} contains whitespace; it"
                " must be a plain absolute path (it becomes a ReadWritePaths= entry of the unit)"
            )
    return errors


def check_speculative(s):
    errors = []
    algo = s["sglang_speculative_algorithm"]
    if not (
        algo is None
        or (isinstance(algo, str) and re.match(r"^[A-Za-z][A-Za-z0-9_]{0,31}$", algo) and "\n" not in algo)
    ):
        errors.append(
            f"sglang_speculative_algorithm={shown(algo, 40)}: must be an algorithm name such as"
            " DFLASH, EAGLE3 or NGRAM (letters, digits, _), or null for none"
        )
    draft = s["sglang_speculative_draft_model_path"]
    dflash = isinstance(algo, str) and algo.upper() in OPTIONS.DFLASH_BASED
    if not ((draft is None or (isinstance(draft, str) and draft.startswith("/"))) and (not dflash or draft)):
        errors.append(
            f"sglang_speculative_draft_model_path={shown(draft, 60)}: must be an absolute path, and is"
            " required with sglang_speculative_algorithm=DFLASH or DDTREE"
        )
    window, block = s["sglang_speculative_draft_window_size"], s["sglang_speculative_block_size"]
    tokens = s["sglang_speculative_num_draft_tokens"]
    if all(is_int(v) or v is None for v in (window, block, tokens)):
        if (window is not None and block is not None and window < block) or (
            window is not None and tokens is not None and window < tokens
        ):
            errors.append(
                f"sglang_speculative_draft_window_size={window} must be >= the block size"
                f" (sglang_speculative_block_size={json.dumps(block)},"
                f" sglang_speculative_num_draft_tokens={json.dumps(tokens)}); SGLang refuses it at start"
            )
        if block is not None and tokens is not None and block != tokens:
            errors.append(
                f"sglang_speculative_block_size={block} and sglang_speculative_num_draft_tokens={tokens}:"
                " for DFLASH the block size IS the number of draft tokens; set one of them (SGLang fails"
                " when both are set and differ)"
            )
    return errors


# Role variable -> canonical key, for the settings a build profile can refuse.
PROFILE_SETTINGS = {
    "sglang_speculative_algorithm": "speculative_algorithm",
    "sglang_speculative_draft_window_size": "speculative_draft_window_size",
    "sglang_speculative_tree_budget": "speculative_ddtree_budget",
    "sglang_speculative_topk": "speculative_eagle_topk",
    "sglang_speculative_num_steps": "speculative_num_steps",
    "sglang_speculative_num_draft_tokens": "speculative_num_draft_tokens",
    "sglang_speculative_block_size": "speculative_dflash_block_size",
}


def check_profile(s, env):
    """The build profile exists and is well formed, and the settings ask nothing the build refuses."""
    profile, errors = OPTIONS.select_profile(s.get("sglang_build_profile"), s.get("sglang_build_profiles"))
    if errors:
        return errors
    settings = {
        key: s.get(var)
        for var, key in PROFILE_SETTINGS.items()
        if is_int(s.get(var)) or (key == "speculative_algorithm" and isinstance(s.get(var), str))
    }
    if s.get("sglang_speculative_algorithm") is None:
        settings = {}
    page = [
        item.get("value")
        for item in s.get("sglang_extra_args") or []
        if isinstance(item, dict) and item.get("arg") == "--page-size"
    ]
    if page and str(page[-1]).isdigit():
        settings["page_size"] = int(page[-1])
    return OPTIONS.plan_settings(settings, profile, env)[2]


def check_points(points, variables):
    """{point name: reason} of the sweep points the build cannot honour (playbooks/sweep.yml).

    Each point's ``settings`` are laid over ``variables``, the host's own values of what a build
    profile judges (sglang_build_profile, sglang_build_profiles, the speculative settings,
    sglang_environment, sglang_extra_args); the reason is every refusal of check_profile, each
    naming the build and the setting. What the controller cannot judge (a flag the installed
    parser lacks) is left to the role, on the host, before anything changes.
    """
    rejected = {}
    for point in points:
        settings = point.get("settings") if isinstance(point, dict) else None
        s = dict(variables)
        s.update(settings if isinstance(settings, dict) else {})
        env = s.get("sglang_environment")
        errors = check_profile(s, env if isinstance(env, dict) else {})
        if errors:
            rejected[str(point.get("name") if isinstance(point, dict) else point)] = " | ".join(errors)
    return rejected


# Prefixes of this repository's variables (roles sglang, sglang_pull, model_weights, nvidia_driver,
# cuda_toolkit; the GPU play's nvidia_*, the sweep's and gitops' playbook variables) and Ansible's own:
# extra vars with them are never taken for a misspelt knob.
KNOWN_VAR_PREFIXES = ("sglang_", "sweep_", "gitops_", "nvidia_", "cuda_", "model_weights_", "ansible_", "_")


def extra_var_names(loader):
    """The names given with -e/--extra-vars on THIS command line (key=value, JSON, YAML, @file), as
    ansible-playbook parsed them (Ansible cannot tell an extra var from other variables afterwards)."""
    from ansible.utils.vars import load_extra_vars

    try:
        return [str(name) for name in load_extra_vars(loader)]
    except Exception:  # ansible-playbook itself has already refused a broken -e
        return []


def check_extra_var_names(names):
    """An extra var that is no known variable but close to a knob (``windw``, ``window_size``) is a
    misspelt knob: Ansible would ignore it and deploy without the change."""
    errors = []
    for name in names:
        if name in OPTIONS.KNOB_NAMES or name.startswith(KNOWN_VAR_PREFIXES):
            continue
        knob = OPTIONS.misspelt_knob(name)
        if knob:
            errors.append(
                f"{name}: not a knob; did you mean {knob}? (the knobs: {', '.join(OPTIONS.KNOB_NAMES)};"
                " nothing was deployed)"
            )
    return errors


def check_knobs(knobs, extra_names=()):
    """Every knob given (extra vars are strings) is an integer within the ONE set of bounds, and no
    extra var is a misspelt knob (``extra_names``: the names given with -e)."""
    errors = check_extra_var_names(extra_names)
    errors += [
        OPTIONS.knob_error(name, value)
        for name, value in knobs.items()
        if name in OPTIONS.KNOBS and value is not None
    ]
    algo = knobs.get("algorithm")
    if algo is not None and not re.match(r"^[A-Za-z][A-Za-z0-9_]{0,31}$", str(algo)):
        errors.append(
            f"algorithm={shown(str(algo), 40)}: must be a speculative algorithm name such as DFLASH or DDTREE"
        )
    return [e for e in errors if e]


def check_environment(env):
    errors = []
    for name, value in env.items():
        if not (isinstance(name, str) and re.match(r"^[A-Z_][A-Z0-9_]*$", name) and name != API_KEY_ENV):
            errors.append(
                f"sglang_environment: the name {shown(str(name), 40)} must match ^[A-Z_][A-Z0-9_]*$"
                f" ({API_KEY_ENV} is not allowed here: set sglang_api_key)"
            )
        if not ((isinstance(value, str) or is_number(value)) and not has_control(value)):
            errors.append(
                f"sglang_environment.{name}: must be a string or number without newline, NUL or other"
                f" control characters (got {type_name(value)})"
            )
    if "CUDA_VISIBLE_DEVICES" in env and not re.match(
        r"^[0-9]+(,[0-9]+)*$", str(env["CUDA_VISIBLE_DEVICES"])
    ):
        errors.append(
            f"sglang_environment.CUDA_VISIBLE_DEVICES={shown(str(env['CUDA_VISIBLE_DEVICES']), 60)}:"
            ' must list numeric device ids like "0,1,2,3,4,5,6,7" (GPU UUIDs break SGLang\'s'
            " all-reduce set-up)"
        )
    return errors


def check_nccl(s):
    """The GPU play's NCCL decision (nvidia_nccl_p2p_disable) owns NCCL_P2P_DISABLE in the service
    environment (roles/sglang/vars/main.yml __sglang_nccl_environment); sglang_environment may not
    contradict it."""
    decision = s.get("nvidia_nccl_p2p_disable")
    if decision is None:
        return []
    if isinstance(decision, str) and decision.lower() in ("true", "false"):
        decision = decision.lower() == "true"
    if not isinstance(decision, bool):
        return [
            f"nvidia_nccl_p2p_disable={shown(decision, 40)}: must be true or false (the NCCL peer-to-peer"
            " decision, docs/gpu-hosts.md)"
        ]
    user = s.get("sglang_environment")
    value = user.get("NCCL_P2P_DISABLE") if isinstance(user, dict) else None
    if value is None or (str(value) == "1") == decision:
        return []
    return [
        f"sglang_environment.NCCL_P2P_DISABLE={shown(str(value), 20)} contradicts nvidia_nccl_p2p_disable:"
        f" {str(decision).lower()}, which {'sets NCCL_P2P_DISABLE=1' if decision else 'keeps NCCL P2P on'}"
        " in the service environment; remove it from sglang_environment (docs/gpu-hosts.md)"
    ]


def check_extra_args(extra):
    secret = [
        arg.split("=", 1)[0]
        for arg in (i.get("arg") for i in extra if isinstance(i, dict))
        if isinstance(arg, str) and arg.split("=", 1)[0] in SECRET_FLAGS
    ]
    if secret:
        # Nothing else about the extra arguments: the per-item message would show the secret.
        return [
            f"sglang_extra_args: {', '.join(secret)} takes a secret (value not shown); extra arguments"
            " are written into the unit in clear text: set sglang_api_key instead"
        ]
    errors = []
    for index, item in enumerate(extra):
        value = item.get("value") if isinstance(item, dict) else None
        ok = (
            isinstance(item, dict)
            and not set(item) - {"arg", "value"}
            and isinstance(item.get("arg"), str)
            and re.match(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$", item["arg"]) is not None
            and (
                "value" not in item or (isinstance(value, str) and not has_control(value)) or is_number(value)
            )
        )
        if not ok:
            errors.append(
                f'sglang_extra_args[{index}] {shown(item, 80)}: each item has exactly "arg" (a long flag'
                ' such as --chunked-prefill-size, no "=value") and optionally "value" (a string or number'
                " without control characters; leave it out for a store_true flag)"
            )
    return errors


def check_service(s):
    errors = []
    posix = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
    name = s["sglang_service_name"]
    if not (
        isinstance(s["sglang_user"], str)
        and posix.match(s["sglang_user"])
        and isinstance(s["sglang_group"], str)
        and posix.match(s["sglang_group"])
        and isinstance(name, str)
        and re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name)
        and not name.endswith(".service")
    ):
        errors.append(
            f"sglang_user={json.dumps(s['sglang_user'])}, sglang_group={json.dumps(s['sglang_group'])}:"
            f" must be POSIX user/group names; sglang_service_name={json.dumps(name)}: letters, digits,"
            " _ . - without the .service suffix"
        )
    # The service account runs network-facing code (and any trust_remote_code model code); the plan account
    # reads what root's probe hands it. Neither may be root, nor the other.
    accounts = {"sglang_user": s["sglang_user"], "sglang_plan_user": s.get("sglang_plan_user")}
    for key, value in accounts.items():
        if value in ("root", 0, "0"):
            errors.append(f"{key}={json.dumps(value)}: must not be root (the role runs it with no privilege)")
    if accounts["sglang_plan_user"] is not None and accounts["sglang_plan_user"] == accounts["sglang_user"]:
        errors.append(
            f"sglang_plan_user={json.dumps(accounts['sglang_plan_user'])}: must differ from sglang_user (the"
            " plan account may read what the service account cannot, and must not read what it can)"
        )
    interval, burst, restart = (
        s["sglang_start_limit_interval_sec"],
        s["sglang_start_limit_burst"],
        s["sglang_restart_sec"],
    )
    if all(is_int(v) for v in (interval, burst, restart)) and not interval > burst * restart:
        errors.append(
            f"sglang_start_limit_interval_sec={interval} must exceed sglang_start_limit_burst x"
            f" sglang_restart_sec ({burst * restart} s), otherwise a crash loop never reaches the start limit"
            ' and never ends in "failed"'
        )
    return errors


def check_metrics(s):
    """The metrics label and the node_exporter textfile: checked here, so a bad one fails before the host is
    touched (the textfile is written by the record, after the restart)."""
    errors = []
    label = s["sglang_config_hash_label"]
    # A Prometheus label name; names starting with __ are reserved for Prometheus itself.
    if not (
        isinstance(label, str) and (label == "" or re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", label))
    ) or (isinstance(label, str) and label.startswith("__")):
        errors.append(
            f"sglang_config_hash_label={shown(label, 40)}: must be a Prometheus label name (letters, digits"
            " and _, not starting with a digit or __), or '' for no label"
        )
    path = s["sglang_metrics_textfile"]
    if not (
        isinstance(path, str)
        and (path == "" or (path.startswith("/") and path.endswith(".prom") and not has_control(path)))
    ):
        errors.append(
            f"sglang_metrics_textfile={shown(path, 60)}: must be an absolute path ending in .prom"
            " (node_exporter's textfile collector reads only those), without control characters, or ''"
            " for none"
        )
    return errors


def check_install(s):
    errors = []
    source = s["sglang_install_source"]
    version = s["sglang_version"]
    if source in ("pypi", "wheelhouse") and not (
        isinstance(version, str) and re.match(r"^[0-9]+(\.[0-9]+)*([a-z0-9.+!-]*)$", version)
    ):
        errors.append(f"sglang_version={shown(version, 40)}: must be a release version such as 0.5.23")
    src = s["sglang_wheelhouse_src"]
    if source == "wheelhouse" and not (
        isinstance(src, str)
        and src.startswith("/")
        and os.path.isdir(src)
        and glob.glob(os.path.join(glob.escape(src), "sglang-*.whl"))
    ):
        errors.append(
            f"sglang_wheelhouse_src={json.dumps(src)}: must be an absolute directory on the controller"
            " holding an sglang-*.whl (build it with `make wheelhouse`)"
        )
    repo, ref = s["sglang_git_repo"], s["sglang_git_ref"]
    if source == "git" and not (
        isinstance(repo, str)
        and re.match(r"^(https|ssh|file)://[^\s#]+$", repo)
        and isinstance(ref, str)
        and re.match(r"^[A-Za-z0-9][A-Za-z0-9._/-]*$", ref)
    ):
        errors.append(
            "sglang_install_source=git needs sglang_git_repo (an https://, ssh:// or file:// URL, now"
            f" {shown(repo, 80)}) and sglang_git_ref (a commit, tag or branch without spaces, @ or #, now"
            f" {shown(ref, 60)})"
        )
    reqs = s["sglang_dependency_requirements"]
    if not s["sglang_install_dependencies"] and not (
        isinstance(reqs, list)
        and reqs
        and all(isinstance(r, str) for r in reqs)
        and not any(has_control(r) or r.startswith("-") for r in reqs)
    ):
        errors.append(
            "sglang_install_dependencies=false: sglang_dependency_requirements must list the requirement"
            ' specifiers SGLang needs (strings such as "torch==2.14.1", no pip options), otherwise SGLang is'
            " installed with --no-deps and nothing to import"
        )
    return errors


def check_settings(settings, int_settings, string_settings):
    """Every failed rule, as one sentence naming the setting (empty: all good)."""
    s = settings
    env = s["environment"] if isinstance(s["environment"], dict) else {}
    extra = s["sglang_extra_args"] if isinstance(s["sglang_extra_args"], list) else []
    s = dict(
        s, sglang_read_write_paths=s["sglang_read_write_paths"] or [], cache_paths=s["cache_paths"] or []
    )
    return (
        check_types(s, int_settings, string_settings)
        + check_api_key(s)
        + check_paths(s)
        + check_speculative(s)
        + check_environment(env)
        + check_nccl(s)
        + check_extra_args(extra)
        + check_service(s)
        + check_metrics(s)
        + check_install(s)
        + check_profile(s, env)
    )


# The role's variables: the options of its argument spec, parsed once per process and version of the file
# (C YAML parser: ~2 ms). Warmed when the plugin is imported, which ansible-playbook does in its own process
# (the strategy looks the action up before it queues the task): the workers it forks for each host inherit
# the parsed names and only stat the file.
_SPEC_NAMES: dict = {}
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ROLE_ARGUMENT_SPECS = os.path.join(REPO_DIR, "roles", "sglang", "meta", "argument_specs.yml")


def spec_names(path):
    """The option names of the ``main`` entry point of a role's meta/argument_specs.yml."""
    real = os.path.realpath(path)
    stat = os.stat(real)
    key = (real, stat.st_mtime_ns, stat.st_size)
    names = _SPEC_NAMES.get(key)
    if names is None:
        with open(real, encoding="utf-8") as handle:
            spec = yaml.load(handle, Loader=SAFE_LOADER)
        names = _SPEC_NAMES[key] = frozenset(spec["argument_specs"]["main"]["options"])
    return names


# A file that cannot be read here is reported by the task that names it (option argument_specs).
with contextlib.suppress(OSError, yaml.YAMLError, KeyError, TypeError):
    spec_names(ROLE_ARGUMENT_SPECS)


def unknown_vars(variable_names, known, pattern):
    """The variables matching ``pattern`` (re.search, as lookup('ansible.builtin.varnames') matches) that are
    not in ``known``, sorted."""
    match = re.compile(pattern).search
    return sorted({name for name in variable_names if isinstance(name, str) and match(name)} - set(known))


def check_unknown_vars(unknown):
    """The assert the role had before this check moved here, and its message, word for word."""
    if not unknown:
        return []
    return [
        f"{', '.join(unknown)}: not a variable of the sglang role (misspelt?);"
        " the settings are listed in roles/sglang/meta/argument_specs.yml"
    ]


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars or {})
        args = self._task.args
        if "knobs" in args:  # the command-line knobs (-e window=2048), bounds from sglang_options.KNOBS
            errors = check_knobs(args["knobs"] or {}, extra_var_names(self._loader))
            result.update(
                changed=False,
                failed=bool(errors),
                errors=errors,
                msg=" | ".join(errors) if errors else "all knobs are valid",
            )
            return result
        if "points" in args:  # playbooks/sweep.yml: the points the build cannot honour (never fails)
            points, variables = args["points"] or [], args.get("variables") or {}
            if not isinstance(points, list) or not isinstance(variables, dict):
                raise AnsibleActionFail("sglang_settings_check: points must be a list, variables a mapping")
            rejected = check_points(points, variables)
            result.update(
                changed=False,
                failed=False,
                rejected=rejected,
                msg=f"{len(rejected)} of {len(points)} points rejected by the build profile",
            )
            return result
        missing = [k for k in ("settings", "int_settings", "string_settings") if k not in args]
        if "argument_specs" in args and "var_pattern" not in args:
            missing.append("var_pattern (with argument_specs)")
        if missing:
            raise AnsibleActionFail(f"sglang_settings_check: missing option(s) {', '.join(missing)}")
        errors = []
        if "argument_specs" in args:
            # The variables the task sees are the ones lookup('ansible.builtin.varnames') searches: host and
            # group vars, extra vars, play and role vars, role defaults, facts. First in the message: a
            # misspelt name is the likelier cause of what follows (its setting kept the role default).
            try:
                known = spec_names(args["argument_specs"]) | set(args.get("accept_vars") or [])
            except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
                raise AnsibleActionFail(
                    "sglang_settings_check: cannot read the role's variables from"
                    f" {args['argument_specs']}: {exc}"
                ) from exc
            result["unknown_vars"] = unknown_vars(task_vars or {}, known, args["var_pattern"])
            errors += check_unknown_vars(result["unknown_vars"])
        errors += check_settings(args["settings"], args["int_settings"], args["string_settings"])
        result["changed"] = False
        if errors:
            result["failed"] = True
            result["msg"] = " | ".join(errors)
            result["errors"] = errors
        else:
            result["msg"] = "all settings are valid"
        return result
