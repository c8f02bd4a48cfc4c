# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ONE owner of what this project knows about SGLang's options, per build.

Everything else (knob checks, the controller's settings check, the argv builder, the preflight
rules, the running-arguments assertion, plan and drift) reads these tables; none keeps a copy.

* canonical keys: the argparse ``dest`` of SGLang 0.5.23; ``ACCEPTED_DESTS`` lists the dests other
  builds use for the same setting (renames, fork spellings);
* which algorithms honour the draft window (``WINDOW_HONOURED``), sometimes honour it, ignore it;
* the knobs an operator types and their ONE set of bounds (``KNOBS``);
* build profiles (``PROFILES``): what a parser dump cannot show -- knobs a build takes from the
  environment, values it forces, its limits, the form of its startup line. Each cites its source;
* the draft-runner line (``parse_draft_runner``) and the one argv reader (``read_argv``).

Over 500 lines on purpose: it is the one owner of this knowledge, and the tables (keys, knobs,
profiles) refer to each other; split across files, they would again be read from several places.

Pure standard library (the controller's action plugins load this file by path; modules import it
as ``ansible.module_utils.sglang_options``). Errors are ``ValueError`` naming the setting.
"""

from __future__ import annotations

import difflib
import re

# ------------------------------------------------------------------------------ canonical keys

# canonical key -> accepted dests, preferred first. A key not listed here accepts only itself.
ACCEPTED_DESTS = {
    # [#24664] added --speculative-draft-window-size; [#25424] made the old DFLASH-only name a
    # hidden deprecated alias; [#38375] removed it (0.5.23 rejects it with exit 2).
    # SGLang 0.5.11 has only the old dest, 0.5.12 both names on one action.
    "speculative_draft_window_size": (
        "speculative_draft_window_size",
        "speculative_dflash_draft_window_size",
    ),
    # Not upstream. Rancy-Wang/sglang (ddtree-v2) and open PR #29907: --speculative-ddtree-budget
    # (dest speculative_ddtree_budget). The reference code liranringel/ddtree spells it --tree-budget.
    "speculative_ddtree_budget": (
        "speculative_ddtree_budget",
        "tree_budget",
        "speculative_dflash_ddtree_budget",
    ),
    # SGLang 0.5.11 stored the parallel sizes under the long flag's dest and copied them in
    # ServerArgs.from_cli_args (args.tp_size = args.tensor_parallel_size, ...).
    "tp_size": ("tp_size", "tensor_parallel_size"),
    "pp_size": ("pp_size", "pipeline_parallel_size"),
    "dp_size": ("dp_size", "data_parallel_size"),
    "ep_size": ("ep_size", "expert_parallel_size"),
    "attn_cp_size": ("attn_cp_size", "attention_context_parallel_size"),
    "moe_dp_size": ("moe_dp_size", "moe_data_parallel_size"),
}

# canonical key -> the OTHER spellings a build may use or report.
KEY_ALIASES = {key: dests[1:] for key, dests in ACCEPTED_DESTS.items() if len(dests) > 1}
_DEST_TO_CANONICAL = {dest: key for key, dests in ACCEPTED_DESTS.items() for dest in dests}

# Settings whose value SGLang upper-cases before looking it up (and which compare case-insensitively).
CASE_INSENSITIVE_KEYS = frozenset({"speculative_algorithm"})

# Flags whose value is a secret: passed only through the environment, never shown.
SECRET_KEYS = frozenset({"api_key", "admin_api_key", "hf_token", "ssl_keyfile_password"})

# What to tell the operator when a setting has no flag in the installed build.
MISSING_HINTS = {
    "speculative_ddtree_budget": "install a DDTree build and select its sglang_build_profile",
    "speculative_draft_window_size": "install SGLang with DFLASH support (0.5.11 or later)",
    "extra_metric_labels": "set sglang_config_hash_label to '' for a build without it",
    "enable_metrics": "set sglang_enable_metrics to false for a build without it",
}

# The option that labels every metric of the server (a JSON object of label -> value, SGLang 0.5.23
# srt/arg_groups/fields/observability.py); the role puts the configuration's hash there.
METRIC_LABELS_KEY = "extra_metric_labels"
# Where the server listens, not what it serves: left out of the configuration's hash.
LISTENER_KEYS = frozenset({"host", "port"})

# argparse option strings of SGLang 0.5.23 whose dest is not the flag spelled with ``_`` (read from
# ServerArgs.add_cli_args). Only a fallback: the deploy passes the installed parser's own map.
FLAG_DESTS_0523 = {
    "--model": "model_path",
    "--tensor-parallel-size": "tp_size",
    "--pipeline-parallel-size": "pp_size",
    "--data-parallel-size": "dp_size",
    "--expert-parallel-size": "ep_size",
    "--ep": "ep_size",
    "--speculative-draft-model": "speculative_draft_model_path",
    "--nccl-init-addr": "dist_init_addr",
    "--enable-hicache": "enable_hierarchical_cache",
}


def accepted_dests(key):
    """Dests that can carry canonical setting ``key``, preferred first."""
    return ACCEPTED_DESTS.get(key, (key,))


def canonical_key(dest):
    """Canonical key of a parser dest or reported name (itself when it has no alias)."""
    return _DEST_TO_CANONICAL.get(dest, dest)


def spellings(key):
    """``key`` first, then every other spelling of its canonical key."""
    canon = canonical_key(key)
    names = [canon] + list(KEY_ALIASES.get(canon, ()))
    if key not in names:
        names.insert(0, key)
    return names


def lookup(reported, key):
    """``(found, value, name_used)`` for canonical ``key`` in ``reported``, alias-aware."""
    for name in spellings(key):
        if name in reported:
            return True, reported[name], name
    return False, None, None


def flag_spelling(dest):
    """The conventional flag of a dest (``a_b`` -> ``--a-b``), for messages."""
    return "--" + dest.replace("_", "-")


# ------------------------------------------------------------------------------ the draft window

WINDOW_KEY = "speculative_draft_window_size"
BUDGET_KEY = "speculative_ddtree_budget"
# SGLang 0.5.23 srt/arg_groups/fields/spec.py + speculative_hook.py: DFLASH honours the window; DDTREE
# is DFlash-based (its draft worker is the DFLASH one with tree verify: PR #29907, Rancy-Wang ddtree-v2)
# and honours it too. EAGLE/EAGLE3 (and MTP/NEXTN, which resolve to EAGLE) only for Llama EAGLE-3
# drafts and the triton/flashinfer draft backends. The others log a warning and run WITHOUT it.
WINDOW_HONOURED = frozenset({"DFLASH", "DDTREE"})
# Algorithms that run SGLang's DFLASH handling (draft model required, block size = draft tokens, window >=
# block size, steps and top-k forced to 1): DFLASH itself and DDTREE (its handler calls the DFLASH one).
DFLASH_BASED = frozenset({"DFLASH", "DDTREE"})
WINDOW_SOMETIMES = frozenset({"EAGLE", "EAGLE3", "NEXTN", "MTP"})
WINDOW_IGNORED = frozenset({"NGRAM", "STANDALONE", "DSPARK", "UNO"})
# SGLang 0.5.23's warnings that the window is not applied (exact text, speculative_hook.py and
# speculative/spec_utils.py).
WINDOW_IGNORED_MESSAGES = (
    "--speculative-draft-window-size has no effect with",
    "Ignoring --speculative-draft-window-size=",
)


def window_support(algorithm):
    """'honoured' | 'sometimes' | 'ignored' | 'unknown' (a plugin or fork algorithm) | 'none'."""
    if not algorithm:
        return "none"
    algo = str(algorithm).upper()
    if algo in WINDOW_HONOURED:
        return "honoured"
    if algo in WINDOW_SOMETIMES:
        return "sometimes"
    if algo in WINDOW_IGNORED:
        return "ignored"
    return "unknown"


# The draft workers' start-up lines, one each per start (file:line in tests/fixtures/ddtree/SOURCE.md):
#   "Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s,
#    draft_window_size=%s, compact_cache=%s"  (dflash_worker_v2.py; the DDTree workers of PR #29907
#    and Rancy-Wang extend that worker and log it too)
#   "Initialized DDTree worker. block_size=%s, tree_budget=%s, max_tree_nodes=%s"  (PR #29907)
#   "Initialized DDTREE v2 worker. block_size=%s, tree_budget=%s, ..."  (Rancy-Wang ddtree_worker_v2.py)
#   "Initialized DDTREE draft runner ... draft_window_size=%s, compact_cache=%s"  (the operator's build)
_RUNNER = re.compile(
    r"Initialized (?P<name>(?P<algorithm>[A-Za-z][A-Za-z0-9_]*)(?: v\d+)?) "
    r"(?P<kind>draft runner|worker)\b[.:]?(?P<rest>.*)$"
)
_RUNNER_FIELD = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>[^,\s]*)")


def _scalar(raw):
    raw = raw.strip()
    if raw == "None":
        return None
    if raw in ("True", "False"):
        return raw == "True"
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    return raw


def parse_draft_runner(message):
    """``{'runner': 'DFLASH draft runner', 'algorithm': 'DFLASH', <field>: value, ...}`` of a draft
    worker's start-up line (``runner``: its name as logged, ``algorithm``: the first word upper-cased),
    or None."""
    m = _RUNNER.search(message or "")
    if not m:
        return None
    out = {"runner": f"{m.group('name')} {m.group('kind')}", "algorithm": m.group("algorithm").upper()}
    for field in _RUNNER_FIELD.finditer(m.group("rest")):
        out[field.group("key")] = _scalar(field.group("value"))
    return out


# ------------------------------------------------------------------------------ knobs and bounds

# knob -> (canonical key, role variable, min, max, what it is, example). The ONE set of bounds:
# the knob check, the role's settings check and the builder all read it.
KNOBS = {
    "window": (
        "speculative_draft_window_size",
        "sglang_speculative_draft_window_size",
        1,
        1048576,
        "speculative draft window in tokens",
        2048,
    ),
    "budget": (
        "speculative_ddtree_budget",
        "sglang_speculative_tree_budget",
        1,
        4096,
        "DDTree tree budget in tokens",
        64,
    ),
    "topk": ("speculative_eagle_topk", "sglang_speculative_topk", 1, 64, "speculative top-k", 8),
    "steps": ("speculative_num_steps", "sglang_speculative_num_steps", 1, 64, "speculative steps", 1),
    "draft_tokens": (
        "speculative_num_draft_tokens",
        "sglang_speculative_num_draft_tokens",
        1,
        1024,
        "speculative draft tokens / block size",
        16,
    ),
}
ROLE_VARIABLE = {key: var for key, var, *_ in KNOBS.values()}
ROLE_VARIABLE.update(
    {
        "speculative_dflash_block_size": "sglang_speculative_block_size",
        "speculative_algorithm": "sglang_speculative_algorithm",
        "page_size": "sglang_extra_args --page-size",
    }
)
BOUNDS = {key: (low, high) for key, _var, low, high, *_ in KNOBS.values()}
BOUNDS["speculative_dflash_block_size"] = (1, 1024)


def knob_error(knob, raw):
    """None when ``raw`` (an extra-var string) is a valid value of ``knob``, else the message."""
    key, _var, low, high, what, example = KNOBS[knob]
    text = str(raw)
    if re.fullmatch(r"[1-9][0-9]*", text) and low <= int(text) <= high:
        return None
    shown = text if len(text) <= 40 else text[:37] + "..."
    return f"{knob}={shown!r}: must be an integer from {low} to {high} ({what}), e.g. -e {knob}={example}"


# Every short name an operator types with -e (the integer knobs and the algorithm).
KNOB_NAMES = (*KNOBS, "algorithm")


def misspelt_knob(name):
    """The knob that the variable ``name`` (not itself a knob) most likely misspells, else None.

    Close spellings (``windw``, ``top_k``, ``Window``), abbreviations of at least three letters
    (``algo``, ``win``) and names holding a knob as a word (``window_size``, ``num_steps``,
    ``tree_budget``) count; anything else is not taken for a knob.
    """
    text = str(name).strip().lower().replace("-", "_")
    if not text or name in KNOB_NAMES:
        return None
    if text in KNOB_NAMES:
        return text
    close = difflib.get_close_matches(text, KNOB_NAMES, n=1, cutoff=0.75)
    if close:
        return close[0]
    for knob in KNOB_NAMES:
        if len(text) >= 3 and knob.startswith(text):
            return knob
    parts = [p for p in text.split("_") if p]
    for knob in KNOB_NAMES:
        words = knob.split("_")
        if any(parts[i : i + len(words)] == words for i in range(len(parts) - len(words) + 1)):
            return knob
    return None


# ------------------------------------------------------------------------------ build profiles

# What a parser dump cannot show, per build. ``env_knobs``: algorithm -> {canonical key: environment
# variable the build reads instead of a flag}; ``forced``: algorithm -> {key: value the build forces
# (a different value is refused before the host is touched)}; ``requires``: algorithm -> {key: value
# the build refuses to run without}; ``limits``: key -> [min, max] of this build; ``server_args_form``:
# 'dict' | 'dataclass' (the startup line); ``dests``: canonical keys the parser must have for the
# profile to apply (checked against the installed parser on the host); ``runner_lines``: algorithm ->
# {'window': name, 'budget': name} of the start-up lines that prove them (default '<ALGO> draft runner').
PROFILES = {
    # SGLang releases from PyPI, read from the 0.5.23 wheel (srt/arg_groups/speculative_hook.py):
    # DFLASH forces --speculative-num-steps and --speculative-eagle-topk to 1 (warning), logs the
    # startup line as a dict since the raw-input ServerArgs refactor (late 2026-08).
    "upstream": {
        "description": "an SGLang release (0.5.12 and later)",
        "source": "sgl-project/sglang v0.5.23",
        "env_knobs": {},
        "forced": {"DFLASH": {"speculative_num_steps": 1, "speculative_eagle_topk": 1}},
        "requires": {},
        "limits": {},
        "server_args_form": "dict",
        "dests": ["speculative_draft_window_size"],
    },
    # The seed's spelling: SGLang 0.5.11 (PyPI) has only --speculative-dflash-draft-window-size (dest
    # speculative_dflash_draft_window_size, #22077) and logs server_args=ServerArgs(...).
    "dflash-old-window": {
        "description": "an SGLang build with the old window flag --speculative-dflash-draft-window-size",
        "source": "sgl-project/sglang v0.5.11 (PyPI wheel, tests/fixtures/capabilities/sglang-0.5.11.json)",
        "env_knobs": {},
        "forced": {"DFLASH": {"speculative_num_steps": 1, "speculative_eagle_topk": 1}},
        "requires": {},
        "limits": {},
        "server_args_form": "dataclass",
        "dests": ["speculative_dflash_draft_window_size"],
    },
    # Open upstream PR #29907 (DDTREE over DFlash): --speculative-algorithm DDTREE,
    # --speculative-ddtree-budget; the tree top-k is the environment variable SGLANG_DDTREE_MAX_TOPK;
    # requires page_size 1 (tests/fixtures/ddtree/SOURCE.md has file:line of each rule).
    "ddtree-pr29907": {
        "description": "the DDTree build of open PR sgl-project/sglang#29907",
        "source": "sgl-project/sglang PR #29907",
        "env_knobs": {"DDTREE": {"speculative_eagle_topk": "SGLANG_DDTREE_MAX_TOPK"}},
        "forced": {
            "DFLASH": {"speculative_num_steps": 1, "speculative_eagle_topk": 1},
            "DDTREE": {"speculative_num_steps": 1},
        },
        "requires": {"DDTREE": {"page_size": 1}},
        "limits": {},
        "server_args_form": "dataclass",
        "dests": ["speculative_ddtree_budget"],
        # DDTreeWorker extends DFlashWorkerV2: the window is in ITS "DFLASH draft runner" line.
        "runner_lines": {"DDTREE": {"window": "DFLASH draft runner", "budget": "DDTree worker"}},
        # ddtree_utils.py: width = min(max(budget // (block_size - 1) + 1, 2), vocab, SGLANG_DDTREE_MAX_TOPK)
        # in full-tree mode only (budget > block_size - 1); a chain otherwise.
        "notes": {
            "DDTREE": {
                "speculative_eagle_topk": "SGLANG_DDTREE_MAX_TOPK caps the tree width only in full-tree mode "
                "(budget > block size - 1, e.g. > 15 with the 16-token DFlash block); below that the "
                "tree is a chain and the cap has no effect"
            }
        },
    },
    # Rancy-Wang/sglang ddtree-v2 @ 433c58ed70cd1dabe5a07a83da12f1513cd599ae: --speculative-ddtree-budget
    # (default num_draft_tokens - 1, >= 1); DDTREE forces --speculative-num-steps and
    # --speculative-eagle-topk to 1, so a tree top-k cannot be set on this build.
    "ddtree-rancy-wang": {
        "description": "the Rancy-Wang/sglang ddtree-v2 fork",
        "source": "Rancy-Wang/sglang ddtree-v2 433c58ed70cd1dabe5a07a83da12f1513cd599ae",
        "env_knobs": {},
        "forced": {
            "DFLASH": {"speculative_num_steps": 1, "speculative_eagle_topk": 1},
            "DDTREE": {"speculative_num_steps": 1, "speculative_eagle_topk": 1},
        },
        "requires": {},
        "limits": {},
        "server_args_form": "dataclass",
        "dests": ["speculative_ddtree_budget"],
        "runner_lines": {"DDTREE": {"window": "DFLASH draft runner", "budget": "DDTREE v2 worker"}},
        # server_args.py: --speculative-ddtree-block-size sets the DDTREE draft block (it wins over
        # --speculative-dflash-block-size, with a warning): the block-size setting goes there.
        "dest_for": {"DDTREE": {"speculative_dflash_block_size": "speculative_ddtree_block_size"}},
    },
    # DB-Guo/sglang-ddtree-dev feature/ddtree-dev @ 514ea1f3ec39e006b2556bfed6c0c77c8fa0c531: DDTree is a
    # switch of DFLASH (--speculative-dflash-enable-ddtree); budget = num_draft_tokens - 1 and no top-k
    # option (tests/fixtures/ddtree/db-guo-ddtree-dev.rules.json).
    "ddtree-db-guo": {
        "description": "the DB-Guo/sglang-ddtree-dev fork (DDTree as a DFLASH switch)",
        "source": "DB-Guo/sglang-ddtree-dev feature/ddtree-dev 514ea1f3ec39e006b2556bfed6c0c77c8fa0c531",
        "env_knobs": {},
        "forced": {"DFLASH": {"speculative_num_steps": 1, "speculative_eagle_topk": 1}},
        "requires": {},
        "limits": {},
        "server_args_form": "dataclass",
        "dests": ["speculative_dflash_enable_ddtree"],
        "adds": {"DFLASH": {"speculative_dflash_enable_ddtree": True}},
    },
}
PROFILE_KEYS = frozenset(
    {
        "description",
        "source",
        "env_knobs",
        "forced",
        "requires",
        "limits",
        "server_args_form",
        "dests",
        "runner_lines",
        "notes",
        "dest_for",
        "adds",
    }
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ALGO = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
_KEY = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_LINE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_ ]{0,63}$")


def _profile_errors(name, profile, where):
    """Every problem of one declared profile, each naming the setting path."""
    if not isinstance(profile, dict):
        return [f"{where}: must be a mapping, got {type(profile).__name__}"]
    errors = []
    unknown = sorted(set(profile) - PROFILE_KEYS)
    if unknown:
        errors.append(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))} "
            f"(known: {', '.join(sorted(PROFILE_KEYS))})"
        )
    for field in ("env_knobs", "forced", "requires", "notes", "dest_for", "adds"):
        table = profile.get(field, {})
        if not isinstance(table, dict):
            errors.append(f"{where}.{field}: must be a mapping of algorithm -> mapping")
            continue
        for algo, entries in table.items():
            path = f"{where}.{field}.{algo}"
            if not isinstance(algo, str) or not _ALGO.match(algo):
                errors.append(f"{path}: the algorithm must be an upper-case name such as DDTREE")
            if not isinstance(entries, dict):
                errors.append(f"{path}: must be a mapping of setting -> value")
                continue
            for key, value in entries.items():
                if not isinstance(key, str) or not _KEY.match(key):
                    errors.append(
                        f"{path}: {key!r} is not a setting name (an SGLang dest such as "
                        "speculative_eagle_topk)"
                    )
                    continue
                if field == "env_knobs" and not (isinstance(value, str) and _ENV_NAME.match(value)):
                    errors.append(
                        f"{path}.{key}: {value!r} is not an environment variable name "
                        "(letters, digits and _, no newline)"
                    )
                elif field == "dest_for" and not (isinstance(value, str) and _KEY.match(value)):
                    errors.append(f"{path}.{key}: {value!r} is not an SGLang dest")
                elif field == "notes" and not (isinstance(value, str) and "\n" not in value):
                    errors.append(f"{path}.{key}: must be one line of text")
                elif field != "env_knobs" and not (
                    isinstance(value, (int, str, bool)) and "\n" not in str(value)
                ):
                    errors.append(f"{path}.{key}: must be a number, string or boolean without a newline")
    lines = profile.get("runner_lines", {})
    if not isinstance(lines, dict) or not all(
        isinstance(algo, str)
        and _ALGO.match(algo)
        and isinstance(names, dict)
        and set(names) <= {"window", "budget"}
        and all(isinstance(n, str) and _LINE_NAME.match(n) for n in names.values())
        for algo, names in lines.items()
    ):
        errors.append(
            f"{where}.runner_lines: must map an upper-case algorithm to {{window: <line name>, "
            f"budget: <line name>}}, e.g. {{DDTREE: {{window: DFLASH draft runner}}}}"
        )
    limits = profile.get("limits", {})
    if not isinstance(limits, dict):
        errors.append(f"{where}.limits: must be a mapping of setting -> [min, max]")
    else:
        for key, pair in limits.items():
            if not (
                isinstance(pair, (list, tuple))
                and len(pair) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
                and pair[0] <= pair[1]
            ):
                errors.append(f"{where}.limits.{key}: must be [min, max] integers with min <= max")
    if profile.get("server_args_form", "dict") not in ("dict", "dataclass"):
        errors.append(
            f"{where}.server_args_form: must be dict or dataclass, got {profile.get('server_args_form')!r}"
        )
    dests = profile.get("dests", [])
    if not (isinstance(dests, list) and all(isinstance(d, str) and _KEY.match(d) for d in dests)):
        errors.append(f"{where}.dests: must be a list of SGLang dests")
    for field in ("description", "source"):
        if field in profile and not (isinstance(profile[field], str) and "\n" not in profile[field]):
            errors.append(f"{where}.{field}: must be one line of text")
    return errors


def select_profile(name, declared=None):
    """(profile dict with its ``name``, errors). ``declared``: the operator's own profiles, by name."""
    declared = declared or {}
    if not isinstance(declared, dict):
        return None, [
            f"sglang_build_profiles: must be a mapping of name -> profile, got {type(declared).__name__}"
        ]
    errors = []
    for other, profile in declared.items():
        errors += _profile_errors(other, profile, f"sglang_build_profiles.{other}")
    known = dict(PROFILES)
    known.update(declared)
    if not isinstance(name, str) or name not in known:
        shown = name if isinstance(name, str) and len(name) <= 40 and "\n" not in name else repr(name)[:40]
        errors.append(
            f"sglang_build_profile={shown!r}: not a known build profile "
            f"(known: {', '.join(sorted(known))}; declare your own in sglang_build_profiles)"
        )
        return None, errors
    if errors:
        return None, errors
    profile = {
        field: known[name].get(field, default)
        for field, default in (
            ("description", ""),
            ("source", ""),
            ("env_knobs", {}),
            ("forced", {}),
            ("requires", {}),
            ("limits", {}),
            ("server_args_form", "dict"),
            ("dests", []),
            ("runner_lines", {}),
            ("notes", {}),
            ("dest_for", {}),
            ("adds", {}),
        )
    }
    profile["name"] = name
    return profile, []


def _same(a, b):
    if isinstance(a, str) or isinstance(b, str):
        return str(a).upper() == str(b).upper()
    return a == b


def plan_settings(settings, profile, environment=None, extra=None):
    """Split canonical settings into (flag settings, {ENV: value}, errors) for ``profile``.

    Refuses, naming the role variable and the build, a value the build forces otherwise, a value
    outside the build's (or the project's) bounds, a requirement the settings (or ``extra``: the
    values of extra arguments, by canonical key) do not meet, and an environment knob also set by
    hand in ``environment``.
    """
    settings = {k: v for k, v in (settings or {}).items() if v is not None}
    given = dict(extra or {}, **settings)
    algo = settings.get("speculative_algorithm")
    algo = str(algo).upper() if algo else None
    build = f"sglang_build_profile {profile['name']} ({profile.get('description') or profile['name']})"
    errors, env = [], {}
    limits = dict(BOUNDS)
    limits.update({k: tuple(v) for k, v in profile.get("limits", {}).items()})
    for key, value in settings.items():
        if key in limits and isinstance(value, int) and not isinstance(value, bool):
            low, high = limits[key]
            if not low <= value <= high:
                errors.append(
                    f"{ROLE_VARIABLE.get(key, key)}={value}: must be from {low} to {high} with {build}"
                )
    if algo:
        for key, forced in profile.get("forced", {}).get(algo, {}).items():
            if key in settings and not _same(settings[key], forced):
                errors.append(
                    f"{ROLE_VARIABLE.get(key, key)}={settings[key]}: {build} forces {key} to {forced} "
                    f"with speculative_algorithm {algo}; remove it or set {forced}"
                )
        # A requirement is checked on the value as given: a build may check it before its own
        # default applies (PR #29907 refuses page_size=None), so "not given" does not meet it.
        for key, required in profile.get("requires", {}).get(algo, {}).items():
            if not _same(given.get(key), required):
                errors.append(
                    f"{ROLE_VARIABLE.get(key, key)}={given.get(key)}: {build} requires {key} {required} "
                    f"with speculative_algorithm {algo} (set it explicitly: the build checks it before "
                    "applying its default)"
                )
        for key, name in profile.get("env_knobs", {}).get(algo, {}).items():
            if key not in settings:
                continue
            if environment and name in environment:
                errors.append(
                    f"sglang_environment.{name}: set by hand, but {ROLE_VARIABLE.get(key, key)} "
                    f"also sets it for {build}; set one of them"
                )
            value = settings.pop(key)
            env[name] = (
                str(int(value)) if isinstance(value, int) and not isinstance(value, bool) else str(value)
            )
        for key, dest in profile.get("dest_for", {}).get(algo, {}).items():
            if key in settings:
                settings[dest] = settings.pop(key)
        for key, value in profile.get("adds", {}).get(algo, {}).items():
            settings.setdefault(key, value)
    return settings, env, errors


def runner_lines(profile, algorithm):
    """Which start-up line proves the window and which the tree budget, for ``algorithm`` on this build."""
    algo = str(algorithm or "").upper()
    lines = {"window": f"{algo} draft runner" if algo else None, "budget": None}
    lines.update(profile.get("runner_lines", {}).get(algo, {}))
    return lines


def env_knob_sources(profile, algorithm):
    """{canonical key: environment variable} the build reads for ``algorithm``."""
    return dict(profile.get("env_knobs", {}).get(str(algorithm or "").upper(), {}))


# ------------------------------------------------------------------------------ the argv reader


def read_argv(argv, flag_dests=None):
    """Settings an SGLang argv sets: ``{canonical key: value}`` (strings as given; bare flag -> bool).

    ``flag_dests``: the installed parser's flag -> dest map (the deploy passes it); without it the
    0.5.23 exceptions above and ``--a-b`` -> ``a_b`` apply. Everything before the first ``--option``
    (launcher, ``serve``) is skipped; ``--k=v`` and ``--k v [v ...]`` are understood, several values
    become a list, a later occurrence wins (as in argparse); ``--no-x`` is ``x = False``.
    """
    table = dict(FLAG_DESTS_0523)
    table.update(flag_dests or {})
    settings = {}
    i, n = 0, len(argv)
    argv = [str(a) for a in argv]
    while i < n and not argv[i].startswith("--"):
        i += 1
    while i < n:
        arg = argv[i]
        if not arg.startswith("--") or arg == "--":
            i += 1
            continue
        flag, eq, inline = arg.partition("=")
        negative_of = flag[5:].replace("-", "_") if flag.startswith("--no-") else None
        if negative_of and table.get("--" + flag[5:], flag) == table.get(flag, negative_of):
            # the negative flag of a BooleanOptionalAction (same dest as its positive flag)
            key, bare = canonical_key(table.get(flag, negative_of)), False
        elif flag in table:
            key, bare = canonical_key(table[flag]), True
        elif flag.startswith("--no-"):
            key, bare = canonical_key(table.get("--" + flag[5:], flag[5:].replace("-", "_"))), False
        else:
            key, bare = canonical_key(flag[2:].replace("-", "_")), True
        if eq:
            settings[key] = inline
            i += 1
            continue
        j = i + 1
        while j < n and not argv[j].startswith("--"):
            j += 1
        values = argv[i + 1 : j]
        settings[key] = bare if not values else values[0] if len(values) == 1 else values
        i = j
    return settings
