#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_preflight
short_description: Let the host's own SGLang parse and resolve an argv before it goes into the unit
description:
  - Checks the speculative-decoding rules SGLang enforces only late (after a model load or as a bare
    warning), before running anything; each failure names the setting.
  - Then runs, in the SGLang venv's python, what C(sglang serve) does first
    (C(load_plugins()), C(prepare_server_args(argv))) followed by C(resolve_once()) and
    C(resolved_dict()), and returns the resolved values of the speculative settings and of every option
    the argv sets, plus every WARNING SGLang logged while resolving.
  - An argv SGLang's argparse rejects fails with SGLang's own text (C(sglang serve error unrecognized
    arguments ...)) and rc 2; a semantic error fails with the exception's last line and rc 1.
  - A successful result is cached under O(cache_dir), keyed by sha256 of the argv, O(device), O(env), the
    SGLang version, the installed distribution's RECORD hash and the target/draft C(config.json)
    fingerprints, so an unchanged deployment costs one metadata probe (no torch import).
  - Read-only; C(changed) is always false; the cache is not written in check mode.
version_added: "0.1.0"
options:
  python:
    description: Path of the SGLang virtualenv's python.
    type: path
    required: true
  argv:
    description:
      - The arguments after C(sglang serve), exactly as the unit will pass them (output of M(sglang_argv)).
      - Whole-element references such as C(${SGLANG_API_KEY}) are replaced by a placeholder for the check;
        the secret itself is never needed.
    type: list
    elements: str
    required: true
  run_as:
    description:
      - Run SGLang's parse as this account (the service's, through C(setpriv)) instead of root, because
        resolving a command line reads the model's configuration, and with C(--trust-remote-code) imports the
        model's own Python. Its C(HOME) is that account's home unless O(env) sets one.
    type: str
  config_keys:
    description:
      - Keys of the C(--config) YAML file the argv names (the secrets), the values of the C(config_keys)
        that M(sglang_argv) returns.
      - The file is written only after this check, and with the real secret; so the check writes its own
        copy with a placeholder for each key to a private temporary directory and lets SGLang merge it
        (its C(ConfigArgumentMerger), as C(sglang serve) does), so SGLang's parser sees the whole
        effective configuration, argv and file.
    type: list
    elements: str
    default: []
  device:
    description:
      - Device appended as C(--device DEVICE) for resolution only, never to the unit. SGLang's C(get_device())
        raises "No accelerator ... is available" on a host where no GPU is visible (a lab host, or a GPU host
        whose driver is not loaded yet), so C(cuda) lets it resolve as the GPU host will. Ignored when the
        argv already has C(--device).
    type: str
  env:
    description: Environment for the check (the unit's environment, e.g. C(CUDA_VISIBLE_DEVICES), C(HF_HOME)).
    type: dict
    default: {}
  cache_dir:
    description: Directory for cached successful results.
    type: path
    default: /var/lib/sglang-deploy/preflight
  timeout:
    description: Seconds the resolution may take.
    type: int
    default: 300
attributes:
  check_mode:
    support: full
    details: Runs the same read-only check; does not write the cache.
  diff_mode:
    support: none
author:
  - contributors to this repository
"""

EXAMPLES = r"""
- name: Let the host's SGLang resolve the argv
  sglang_preflight:
    python: /opt/sglang/venv/bin/python
    argv: "{{ __sglang_argv.argv }}"
    device: "{{ 'cuda' if sglang_preflight_device_override | default(false) else omit }}"
    env: "{{ sglang_environment }}"
  register: __sglang_preflight
"""

RETURN = r"""
resolved:
  description:
    - Resolved values (redacted) of the speculative settings, max_running_requests and every dest
      the argv sets.
  returned: success
  type: dict
  sample: {"speculative_algorithm": "DFLASH", "speculative_draft_window_size": 2048,
           "speculative_num_draft_tokens": 16, "max_running_requests": 48}
sglang_warnings:
  description:
    - WARNING lines SGLang logged while parsing and resolving, then this module's own rule warnings.
    - Each is also raised as an Ansible warning (shown in the play output).
  returned: always
  type: list
  elements: str
  sample: ["Max running requests is reset to 48 for speculative decoding. You can override this by ..."]
version:
  description: SGLang version that resolved the argv.
  returned: success
  type: str
  sample: 0.5.23
cached:
  description: True when the result came from O(cache_dir).
  returned: success
  type: bool
  sample: false
rc:
  description: 2 when SGLang's argparse rejected the argv, 1 for a semantic error.
  returned: failure
  type: int
  sample: 2
stderr:
  description: Tail of SGLang's stderr (redacted) on failure.
  returned: failure
  type: str
  sample: "sglang serve: error: unrecognized arguments: --speculative-dflash-draft-window-size 2048"
"""

import hashlib
import json
import os
import pwd
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
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


def preflight(module, params):
    argv = list(params["argv"])
    env = params["env"] or {}
    secrets = secret_env_values(env)
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
    rc, out, err = run_python(module, python, PROBE_SCRIPT, params["timeout"], env)
    meta = parse_marked(out)
    if rc != 0 or not meta or "version" not in meta:
        reason = (meta or {}).get("error") or error_line(err) or f"rc={rc}"
        module.fail_json(msg=f"python {python}: cannot read the installed sglang metadata: {reason}", rc=rc)
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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            argv=dict(type="list", elements="str", required=True),
            device=dict(type="str"),
            config_keys=dict(type="list", elements="str", default=[], no_log=False),
            run_as=dict(type="str"),
            # Not no_log: Ansible would then mask every value of the environment in all the output,
            # so each "1" and "0" (NCCL_P2P_DISABLE=1, CUDA_VISIBLE_DEVICES=0) in SGLang's error text
            # became "********". Only the values of secret-named variables are masked (below).
            env=dict(type="dict", default={}),
            cache_dir=dict(type="path", default="/var/lib/sglang-deploy/preflight"),
            timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    # Short values ("1", "yes" of HF_HUB_DISABLE_IMPLICIT_TOKEN) would mask every such word of the
    # output and hide no secret; module_utils/sglang_redact.py draws the same line.
    module.no_log_values.update(
        v for v in secret_env_values(module.params["env"] or {}) if len(v) >= MIN_TEXT_SECRET_LEN
    )
    python = module.params["python"]
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        module.fail_json(msg=f"python: {python} is not an executable file (is the SGLang venv installed?)")
    if module.params["timeout"] < 1:
        module.fail_json(msg="timeout: must be at least 1 second")
    data, cached, rule_warnings = preflight(module, module.params)
    for line in data["warnings"] + rule_warnings:
        module.warn(f"SGLang {data['version']}: {line}")
    module.exit_json(
        changed=False,
        version=data["version"],
        resolved=data["resolved"],
        sglang_warnings=data["warnings"] + rule_warnings,
        cached=cached,
    )


if __name__ == "__main__":
    main()
