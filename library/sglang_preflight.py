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

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_preflight import preflight


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
