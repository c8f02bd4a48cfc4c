# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's own parser judging a command line before it goes into the unit: the late speculative rules checked
up front, then ``prepare_server_args`` + ``resolve_once`` run in the SGLang venv's python (as the service
account), a successful verdict cached per argv and installation. For library/sglang_preflight.py and for
library/sglang_host_probe.py, which judges the command line it built in its own call."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import tempfile

from ansible.module_utils.sglang_options import DFLASH_BASED, read_argv, window_support
from ansible.module_utils.sglang_redact import MIN_TEXT_SECRET_LEN, redact, redact_text
from ansible.module_utils.sglang_venv import PROBE_SCRIPT, parse_marked, run_python, write_json_atomic

PLACEHOLDER = "sglang-preflight-placeholder"
_VAR_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# Runs in the venv's python; the request (argv) arrives on stdin so it is not in the process list.
RESOLVE_SCRIPT = r"""
import argparse, contextlib, dataclasses, json, logging, re, sys, traceback
MARKER = "SGLANG_DEPLOY_RESULT "
ANSI = re.compile(r"\x1b\[[0-9;]*m")
request = json.loads(sys.stdin.read())
argv = request["argv"]
real_stdout = sys.stdout
warnings = []

class Capture(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            try:
                warnings.append(ANSI.sub("", record.getMessage()))
            except Exception:
                pass

def plain(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)

def finish(payload, code):
    payload["warnings"] = warnings
    print(MARKER + json.dumps(payload, sort_keys=True), file=real_stdout)
    real_stdout.flush()
    sys.exit(code)

capture = Capture()
sglang_logger = logging.getLogger("sglang")
sglang_logger.addHandler(capture)
with contextlib.redirect_stdout(sys.stderr):
    try:
        from sglang.srt.plugins import load_plugins
    except ImportError:
        load_plugins = None
    if load_plugins is not None:
        load_plugins()
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    given = set()
    for token in argv:
        action = parser._option_string_actions.get(token.split("=", 1)[0])
        if action is not None:
            given.add(action.dest)
    try:
        server_args = prepare_server_args(argv)
        if logging.getLogger().getEffectiveLevel() > logging.WARNING:
            sglang_logger.setLevel(logging.WARNING)
        if hasattr(server_args, "resolve_once"):
            server_args.resolve_once()
            resolved = server_args.resolved_dict()
        else:
            resolved = dataclasses.asdict(server_args)
    except SystemExit:
        raise
    except BaseException as exc:
        traceback.print_exc()
        lines = [ln for ln in traceback.format_exception_only(type(exc), exc) if ln.strip()]
        finish({"error": lines[-1].strip() if lines else type(exc).__name__}, 1)
keys = {k for k in resolved if k.startswith("speculative_")}
keys |= {"max_running_requests", "attention_backend", "device"}
keys |= {d for d in given if d in resolved}
finish({"resolved": {k: plain(resolved[k]) for k in sorted(keys) if k in resolved},
        "keys": len(resolved)}, 0)
"""

SCRIPT_SHA256 = hashlib.sha256(RESOLVE_SCRIPT.encode()).hexdigest()


def _int(values, key):
    if key not in values:
        return None
    try:
        return int(values[key])
    except ValueError as exc:
        raise ValueError(f"{key}: {values[key]!r} is not an integer") from exc


def draft_block_size(draft_path):
    """block_size from a local DFlash draft's config.json (top level or dflash_config), else None."""
    if not draft_path or not os.path.isdir(draft_path):
        return None
    try:
        with open(os.path.join(draft_path, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return None
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    value = nested.get("block_size", config.get("block_size"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_rules(argv):
    """Late SGLang rules, checked up front. Returns warnings; raises ValueError naming the setting."""
    values = read_argv(argv)
    warnings = []
    algo = values.get("speculative_algorithm")
    algo = algo.upper() if algo else None
    window = _int(values, "speculative_draft_window_size")
    if window is not None:
        if window <= 0:
            raise ValueError(f"speculative_draft_window_size: must be > 0, got {window}")
        support = window_support(algo)
        if support == "none":
            raise ValueError(
                "speculative_draft_window_size: set without a speculative algorithm; "
                "SGLang would ignore it (use speculative_algorithm DFLASH or DDTREE)"
            )
        if support == "ignored":
            raise ValueError(
                f"speculative_draft_window_size: speculative_algorithm {algo} does not honour "
                "the draft window; SGLang only logs a warning and runs without it (use DFLASH)"
            )
        if support == "sometimes":
            warnings.append(
                f"speculative_draft_window_size: with {algo} the window is honoured only by "
                "Llama EAGLE-3 drafts and the EAGLE/MTP draft on the triton/flashinfer "
                "draft backends"
            )
        elif support == "unknown":
            warnings.append(
                f"speculative_draft_window_size: {algo} is not a built-in algorithm; whether it "
                "honours the draft window depends on that build"
            )
    if algo not in DFLASH_BASED:
        return warnings
    if not values.get("speculative_draft_model_path"):
        raise ValueError(f"speculative_draft_model_path: {algo} needs a draft model path")
    pp_size = _int(values, "pp_size")
    if pp_size is not None and pp_size != 1:
        raise ValueError(f"pp_size: DFLASH requires pp_size 1, got {pp_size}")
    for key in ("speculative_num_steps", "speculative_eagle_topk"):
        value = _int(values, key)
        if value is not None and value != 1:
            raise ValueError(f"{key}: DFLASH forces it to 1; got {value} (remove it or set 1)")
    block = _int(values, "speculative_dflash_block_size")
    tokens = _int(values, "speculative_num_draft_tokens")
    if block is not None and tokens is not None and block != tokens:
        raise ValueError(
            f"speculative_dflash_block_size: {block} differs from speculative_num_draft_tokens "
            f"{tokens}; for DFLASH they are aliases and must match"
        )
    effective = block if block is not None else tokens
    source = "the configured block size"
    if effective is None:
        effective = draft_block_size(values.get("speculative_draft_model_path"))
        source = "the draft model's config.json block_size"
    if window is not None and effective is not None and window < effective:
        raise ValueError(
            f"speculative_draft_window_size: {window} is smaller than {source} ({effective}); "
            "DFLASH needs window >= block size"
        )
    return warnings


def substitute(argv):
    """Replace whole-element ${VAR} references by a placeholder (the secret is not needed to resolve)."""
    return [PLACEHOLDER if _VAR_REF.match(a) else a for a in argv]


def fingerprint(path):
    config = os.path.join(path, "config.json") if path else ""
    try:
        st = os.stat(config)
    except OSError:
        return None
    return [config, st.st_size, st.st_mtime_ns]


def with_config_copy(argv, config_keys, directory):
    """``argv`` with the path after ``--config`` replaced by a copy in ``directory`` holding a placeholder
    for each of ``config_keys`` (JSON is YAML; the keys are flag names). Unchanged without ``--config``."""
    if "--config" not in argv:
        return argv
    position = argv.index("--config") + 1
    if position >= len(argv):
        return argv  # SGLang's own error: "No config file specified after --config flag!"
    path = os.path.join(directory, os.path.basename(argv[position]))
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({key: PLACEHOLDER for key in config_keys}, handle)
    return argv[:position] + [path] + argv[position + 1 :]


def as_account(module, name, scratch, env):
    """(command prefix, environment) that run the parse as the account ``name`` (none: as it is): its
    scratch directory (the placeholder --config copy, no secret) handed to it."""
    if not name:
        return (), env
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        module.fail_json(msg=f"run_as: no account {name!r} on the host")
    os.chown(scratch, account.pw_uid, account.pw_gid)
    for entry in os.listdir(scratch):
        os.chown(os.path.join(scratch, entry), account.pw_uid, account.pw_gid)
    setpriv = module.get_bin_path("setpriv", required=True)
    prefix = (setpriv, f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--")
    return prefix, dict({"HOME": account.pw_dir}, **env)


def cache_key(argv, device, env, meta, values, config_keys=()):
    material = {
        "argv": argv,
        "device": device,
        "config_keys": sorted(config_keys),
        "env": sorted((str(k), str(v)) for k, v in env.items()),
        "version": meta["version"],
        "record": meta["record_sha256"],
        "script": SCRIPT_SHA256,
        "model": fingerprint(values.get("model_path")),
        "draft": fingerprint(values.get("speculative_draft_model_path")),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def write_cache(module, path, data):
    write_json_atomic(module, path, data, 0o600, "preflight cache")


def error_line(stderr):
    """SGLang's argparse message (`sglang serve: error: ...`), else the last stderr line."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    for line in reversed(lines):
        if ": error: " in line:
            return line
    return lines[-1] if lines else ""


# Environment names whose values are secrets (as playbooks/plan.yml masks them in the env diff).
SECRET_ENV_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def secret_env_values(env):
    """The values of the secret-named variables of ``env`` (HF_TOKEN, SGLANG_API_KEY, ...)."""
    return [str(v) for k, v in env.items() if v and SECRET_ENV_NAME.search(str(k))]


# What sglang_host_probe's O(preflight) takes; the argv, its config keys, the python and the environment the
# command line adds come from the command line it built.
OPTIONS = dict(
    device=dict(type="str"),
    run_as=dict(type="str"),
    env=dict(type="dict", default={}),
    cache_dir=dict(type="path", default="/var/lib/sglang-deploy/preflight"),
    timeout=dict(type="int", default=300),
)


def preflight(module, params, meta=None):
    """(verdict, cached, rule warnings) for ``params`` (python, argv, config_keys, device, run_as, env,
    cache_dir, timeout); a refusal fails the module. ``meta``: the installation's metadata probe when the
    caller already ran it (sglang_capabilities' ``discover``)."""
    argv = list(params["argv"])
    env = params["env"] or {}
    secrets = secret_env_values(env)
    # Short values ("1", "yes" of HF_HUB_DISABLE_IMPLICIT_TOKEN) would mask every such word of the
    # output and hide no secret; module_utils/sglang_redact.py draws the same line.
    module.no_log_values.update(v for v in secrets if len(v) >= MIN_TEXT_SECRET_LEN)
    for bad in argv:
        if "\n" in bad or "\x00" in bad:
            module.fail_json(msg=f"argv: element {bad[:40]!r} contains a newline or NUL")
    try:
        rule_warnings = check_rules(argv)
    except ValueError as exc:
        module.fail_json(msg=str(exc), rc=1, sglang_warnings=[])
    run_argv = substitute(argv)
    if params["device"] and not any(a == "--device" or a.startswith("--device=") for a in argv):
        run_argv += ["--device", params["device"]]
    python = params["python"]
    if meta is None:
        rc, out, err = run_python(module, python, PROBE_SCRIPT, params["timeout"], env)
        meta = parse_marked(out)
        if rc != 0 or not meta or "version" not in meta:
            reason = (meta or {}).get("error") or error_line(err) or f"rc={rc}"
            msg = f"python {python}: cannot read the installed sglang metadata: {reason}"
            module.fail_json(msg=msg, rc=rc)
    key = cache_key(argv, params["device"], env, meta, read_argv(argv), params["config_keys"])
    path = os.path.join(params["cache_dir"], key + ".json")
    try:
        with open(path, encoding="utf-8") as handle:
            cached = json.load(handle)
        if cached.get("version") == meta["version"] and "resolved" in cached:
            return cached, True, rule_warnings
    except (OSError, ValueError):
        pass
    scratch = tempfile.mkdtemp(prefix="sglang-preflight.")  # 0700
    try:
        run_argv = with_config_copy(run_argv, params["config_keys"], scratch)
        prefix, env = as_account(module, params["run_as"], scratch, env)
        rc, out, err = run_python(
            module,
            python,
            RESOLVE_SCRIPT,
            params["timeout"],
            env,
            data=json.dumps({"argv": run_argv}),
            prefix=prefix,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = parse_marked(out) or {}
    tail = redact_text(err[-3000:], secrets)
    if rc in (-14, 142):
        module.fail_json(
            msg=f"SGLang {meta['version']} did not finish resolving within {params['timeout']} s",
            rc=rc,
            stderr=tail,
        )
    if rc == 2:
        # argparse prints the whole usage (tens of KB) before the one line that matters.
        line = redact_text(error_line(err), secrets)
        module.fail_json(msg=f"SGLang {meta['version']} rejected the argv: {line}", rc=2, stderr=line)
    if rc != 0 or "resolved" not in result:
        reason = result.get("error") or error_line(err) or f"rc={rc}"
        module.fail_json(
            msg=f"SGLang {meta['version']} refused the settings: {redact_text(reason, secrets)}",
            rc=1 if rc == 0 else rc,
            stderr=tail,
            sglang_warnings=[redact_text(w, secrets) for w in result.get("warnings", [])],
        )
    data = {
        "version": meta["version"],
        "resolved": redact(result["resolved"], secrets),
        "warnings": [redact_text(w, secrets) for w in result.get("warnings", [])],
    }
    if not module.check_mode:
        write_cache(module, path, data)
    return data, False, rule_warnings
