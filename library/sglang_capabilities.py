#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_capabilities
short_description: Discover what the installed SGLang's own argument parser accepts
description:
  - Runs a small script in the SGLang virtualenv's python that builds SGLang's real parser exactly
    as C(sglang serve) does (general plugins loaded, then C(argparse.ArgumentParser(prog="sglang serve"))
    and C(ServerArgs.add_cli_args(parser))) and dumps every option with its flags, whether it is hidden
    or deprecated, its choices, nargs, whether it takes a value and its default.
  - Also returns the speculative algorithms the build accepts (the parser's choices when it has them,
    else the C(SpeculativeAlgorithm) enum, the reserved aliases such as NEXTN, and plugin-registered names).
  - The result is cached under O(cache_dir), keyed by the SGLang version, a hash of the installed
    distribution's RECORD (and direct_url.json), and a hash of the dump script. A reinstall from a fork
    or another ref changes RECORD and invalidates the cache. A cache hit only runs a tiny metadata probe
    in the venv (no torch import).
  - Read-only with respect to the deployment; C(changed) is always false.
    The cache is not written in check mode.
version_added: "0.1.0"
options:
  python:
    description: Path of the SGLang virtualenv's python (for example C(/opt/sglang/venv/bin/python)).
    type: path
    required: true
  cache_dir:
    description: Directory for cached dumps (created if missing, outside check mode).
    type: path
    default: /var/lib/sglang-deploy/capabilities
  timeout:
    description: Seconds the dump may take (importing SGLang imports torch; 10 s on a lab host).
    type: int
    default: 300
attributes:
  check_mode:
    support: full
    details: The dump is read-only; in check mode it runs but the cache is not written.
  diff_mode:
    support: none
author:
  - contributors to this repository
"""

EXAMPLES = r"""
- name: Discover the installed SGLang's parser
  sglang_capabilities:
    python: /opt/sglang/venv/bin/python
  register: __sglang_capabilities

- name: Show the version and the algorithms it accepts
  ansible.builtin.debug:
    msg: "{{ __sglang_capabilities.version }}: {{ __sglang_capabilities.algorithms | join(', ') }}"
"""

RETURN = r"""
version:
  description: Installed SGLang version (C(importlib.metadata.version("sglang")) in the venv).
  returned: success
  type: str
  sample: 0.5.23
options:
  description:
    - Parser options keyed by argparse dest. C(flags) are the visible flags (best first), C(hidden)
      is true when the dest has no visible flag, C(actions) lists every argparse action of the dest
      with its own flags, C(hidden) (help suppressed), C(deprecated), C(action) class, C(choices),
      C(nargs), C(takes_value), C(default), C(const), C(type), C(negative_flags) (C(--no-x) of a
      BooleanOptionalAction) and C(new_flag) (the replacement a deprecated action names).
  returned: success
  type: dict
  sample:
    speculative_draft_window_size:
      flags: ["--speculative-draft-window-size"]
      hidden: false
      deprecated: false
      choices: null
      nargs: null
      takes_value: true
      default: null
      actions:
        - flags: ["--speculative-draft-window-size"]
          hidden: false
          deprecated: false
          action: _StoreAction
          choices: null
          nargs: null
          takes_value: true
          default: null
          const: null
          type: int
          negative_flags: []
          new_flag: null
algorithms:
  description: Speculative algorithm names the build accepts (upper case as SGLang compares them).
  returned: success
  type: list
  elements: str
  sample: [DFLASH, UNO, DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP, STANDALONE, NGRAM, NEXTN]
algorithm_source:
  description: Where C(algorithms) came from (C(parser choices) or C(SpeculativeAlgorithm enum + registry)).
  returned: success
  type: str
  sample: SpeculativeAlgorithm enum + registry
cached:
  description: True when the dump came from O(cache_dir) without importing SGLang.
  returned: success
  type: bool
  sample: true
cache_file:
  description: Cache file for this installation (written only outside check mode).
  returned: success
  type: str
  sample: /var/lib/sglang-deploy/capabilities/0.5.23-3f1c2a9b0d4e5f60-5b7e1c2d.json
record_sha256:
  description: sha256 of the installed distribution's RECORD (+ direct_url.json).
  returned: success
  type: str
  sample: 3f1c2a9b0d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8
warnings_during_dump:
  description: Problems the dump script noticed but survived (for example a plugin that failed to load).
  returned: success
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_capabilities import discover


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            cache_dir=dict(type="path", default="/var/lib/sglang-deploy/capabilities"),
            timeout=dict(type="int", default=300),
        ),
        supports_check_mode=True,
    )
    data, cached, path, meta = discover(
        module, module.params["python"], module.params["cache_dir"], module.params["timeout"]
    )
    module.exit_json(
        changed=False,
        version=data["version"],
        options=data["options"],
        algorithms=data.get("algorithms", []),
        algorithm_source=data.get("algorithm_source", ""),
        cached=cached,
        cache_file=path,
        record_sha256=meta["record_sha256"],
        warnings_during_dump=data.get("warnings", []),
    )


if __name__ == "__main__":
    main()
