#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_argv
short_description: Build the SGLang argv from structured settings and the installed parser's capabilities
description:
  - Turns structured settings (canonical keys = SGLang 0.5.23 argparse dests) into the argument list of
    C(sglang serve), using the flags the INSTALLED build's parser has (see M(sglang_capabilities)).
    Renamed options map to whatever spelling the build has (for example the draft window is
    C(--speculative-draft-window-size) on 0.5.23 and C(--speculative-dflash-draft-window-size) on 0.5.11).
  - Fails, naming the setting and the SGLang version, when the build cannot express a setting, when a
    value is not one of the parser's choices, and when an extra arg is unknown to the parser, deprecated,
    or duplicates a managed setting.
  - Secrets never appear in the argv. With O(config_path) (the role's way) a secret setting is left out
    of the argv, which ends with C(--config <config_path>) instead, and RV(config_keys) names the keys
    the YAML file must hold (SGLang merges that file into its argv itself, so no process's
    C(/proc/<pid>/cmdline) ever holds the secret). Without it, a setting listed in O(secret_env)
    becomes C(${ENVVAR}), which systemd expands from the unit's EnvironmentFile (then the expanded
    secret IS on the running process's command line).
  - With O(python) (the role's way) the module asks the SGLang installed behind that interpreter for its
    parser's flags itself (M(sglang_capabilities)'s dump and cache, shared code), so the ~250 KB of
    options never travel to the controller and back; the result then carries RV(version) and
    RV(algorithms). With O(capabilities) it is pure computation.
version_added: "0.1.0"
options:
  settings:
    description: Canonical key -> value. None values are omitted; booleans become switches.
    type: dict
    default: {}
  extra_args:
    description:
      - Additional flags, each a mapping with C(arg) (the flag, for example C(--max-running-requests))
        and C(value); omit C(value) for a switch.
    type: list
    elements: dict
    default: []
  capabilities:
    description:
      - The registered result of M(sglang_capabilities) (needs C(version), C(options), C(algorithms)).
      - Exactly one of O(capabilities) and O(python) is required.
    type: dict
  python:
    description: Path of the SGLang virtualenv's python, whose parser's flags are discovered (and cached).
    type: path
  cache_dir:
    description: With O(python), the capabilities cache directory (as M(sglang_capabilities)'s).
    type: path
    default: /var/lib/sglang-deploy/capabilities
  cache_files:
    description:
      - With O(python), the capabilities cache as file name -> content, looked up instead of O(cache_dir)
        (with the same version and RECORD checks); the plan account may not read the cache directory, so the
        plan probe (root) hands it over.
    type: dict
  timeout:
    description: With O(python), seconds the parser dump may take on a cache miss.
    type: int
    default: 300
  secret_env:
    description:
      - Canonical key -> environment variable that holds its value
        (for example C(api_key) -> C(SGLANG_API_KEY)).
    type: dict
    default: {}
  config_path:
    description:
      - Path (C(.yaml)/C(.yml)) of the file the unit passes with C(--config), which holds the secret
        settings (C(0640) root:service group, written by M(sglang_unit)). Takes precedence over
        O(secret_env).
    type: path
  config_hash_label:
    description:
      - A label every metric of the server carries, with RV(config_hash) as its value (the role's
        C(config_hash)) - the argv gets C(--extra-metric-labels) with the JSON object of this label and
        RV(config_hash), the labels of an C(--extra-metric-labels) of O(extra_args) merged in. The hash is of
        the command line without this label. Fails, naming C(extra_metric_labels), when the installed parser
        has no such flag.
      - Not set, no label is added (RV(config_hash) is returned all the same).
    type: str
  profile:
    description:
      - The build profile (module_utils/sglang_options.py C(PROFILES), or one the operator declared),
        as the role's settings check resolved it. Decides which knobs go into the environment
        instead of a flag, which values the build forces, its limits. Default C(upstream).
    type: str
    default: upstream
  profiles:
    description: Profiles the operator declared (C(sglang_build_profiles)), by name.
    type: dict
    default: {}
  environment:
    description: Names of the service environment variables set by hand, to refuse a knob set twice.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
author:
  - contributors to this repository
"""

EXAMPLES = r"""
- name: Build the SGLang argv
  sglang_argv:
    settings:
      model_path: /srv/models/kimi-k2.6
      tp_size: 8
      speculative_algorithm: DFLASH
      speculative_draft_model_path: /srv/models/kimi-k2.6-dflash
      speculative_draft_window_size: 2048
      api_key: "{{ sglang_api_key is defined }}"
    secret_env:
      api_key: SGLANG_API_KEY
    extra_args:
      - arg: --max-running-requests
        value: 32
    capabilities: "{{ __sglang_capabilities }}"
  register: __sglang_argv
"""

RETURN = r"""
argv:
  description: Arguments after C(sglang serve), secrets as C(${ENVVAR}).
  returned: success
  type: list
  elements: str
  sample:
    ["--model-path", "/srv/models/kimi-k2.6", "--speculative-draft-window-size", "2048", "--tp-size", "8"]
secret_positions:
  description:
    - Indexes into RV(argv) of the secret references (C(${ENVVAR}) of O(secret_env)), the only elements
      systemd may substitute; a user value containing C(${...}) is passed literally.
  returned: success
  type: list
  elements: int
  sample: [3]
config_keys:
  description:
    - With O(config_path), canonical key -> key of the C(--config) YAML file for each secret setting (the
      flag without C(--), as SGLang's C(ConfigArgumentMerger) reads it); empty when RV(argv) has no
      C(--config).
  returned: success
  type: dict
  sample: {"api_key": "api-key"}
managed:
  description: Canonical key -> value SGLang will parse (extra args keyed by their canonical dest; the
    secrets of RV(config_keys) left out).
  returned: success
  type: dict
  sample: {"model_path": "/srv/models/kimi-k2.6", "speculative_draft_window_size": 2048, "tp_size": 8}
display_argv:
  description: The argv as one shell-quoted line, redacted, for logs and messages.
  returned: success
  type: str
  sample: --model-path /srv/models/kimi-k2.6 --api-key '${SGLANG_API_KEY}'
version:
  description: Version of the SGLang whose parser was used.
  returned: success
  type: str
  sample: 0.5.23
algorithms:
  description: With O(python), the speculative algorithms the build accepts (as M(sglang_capabilities)).
  returned: with O(python)
  type: list
  elements: str
env:
  description:
    - Knobs the build reads from the environment (for example C(SGLANG_DDTREE_MAX_TOPK)), for the env file.
  returned: success
  type: dict
  sample: {"SGLANG_DDTREE_MAX_TOPK": "4"}
env_managed:
  description: Canonical key -> environment variable of each knob in RV(env).
  returned: success
  type: dict
  sample: {"speculative_eagle_topk": "SGLANG_DDTREE_MAX_TOPK"}
require_window:
  description:
    - Whether the algorithm honours the draft window and one is set (the assertion then requires the
      draft runner's proof).
  returned: success
  type: bool
notes:
  description: What the build profile says about a setting in use (also shown as warnings).
  returned: success
  type: list
  elements: str
runner_lines:
  description: Names of the start-up lines that prove the window and the tree budget on this build.
  returned: success
  type: dict
  sample: {"window": "DFLASH draft runner", "budget": "DDTree worker"}
config_hash:
  description:
    - The configuration's name - 12 hex digits of the sha256 of RV(managed) (without the listener, C(host)
      and C(port), and without the O(config_hash_label) label), of RV(env) and of the names of the secrets
      of RV(config_keys) (never a value). The same settings give the same hash on every run and every host,
      whatever the build spells the flags.
  returned: success
  type: str
  sample: 3f2a9c0d41be
flag_dests:
  description:
    - The installed parser's flags whose dest is not the flag spelled with C(_), for reading a cmdline.
  returned: success
  type: dict
  sample: {"--tp": "tp_size", "--model": "model_path"}
profile:
  description: Name of the build profile used.
  returned: success
  type: str
  sample: ddtree-pr29907
capabilities_cached:
  description: With O(python), true when the flags came from the cache without importing SGLang.
  returned: with O(python)
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_argv_run import BUILD_OPTIONS, command_line


def main():
    module = AnsibleModule(
        argument_spec=dict(
            BUILD_OPTIONS,
            capabilities=dict(type="dict"),
            python=dict(type="path"),
        ),
        mutually_exclusive=[("capabilities", "python")],
        required_one_of=[("capabilities", "python")],
        supports_check_mode=True,
    )
    params = module.params
    module.exit_json(changed=False, **command_line(module, params, params["python"], params["capabilities"]))


if __name__ == "__main__":
    main()
