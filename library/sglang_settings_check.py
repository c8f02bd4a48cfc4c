#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the controller-side action plugin action_plugins/sglang_settings_check.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_settings_check
short_description: Check the sglang role's settings, the command-line knobs or sweep points on the controller
description:
  - An action plugin (action_plugins/sglang_settings_check.py) that never reaches a host. Every rule is
    evaluated and the task fails with all broken ones, each sentence naming the setting; secret values
    are never shown.
  - "Three modes, by option: O(settings) (the role's rules that meta/argument_specs.yml cannot express:
    ranges, newlines, cross-field rules and what the selected build profile refuses; with
    O(argument_specs), first the role variables that are no setting of the role), O(knobs) (the
    short command-line knobs against the one set of bounds of module_utils/sglang_options.py, and the
    names given with -e on the command line - a name that is no variable of this repository but close
    to a knob is refused, e.g. C(windw: not a knob; did you mean window?)) and O(points) (which sweep
    points the host's build cannot honour)."
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  settings:
    description:
      - The role's variables by name (sglang_*), plus C(environment), C(cache_paths) and the NCCL decision
        C(nvidia_nccl_p2p_disable) (C(sglang_environment) may not contradict it).
    type: dict
  int_settings:
    description:
      - With O(settings), the integer variables as C({name, min, max, nullable}); the speculative ones
        take their bounds from module_utils/sglang_options.py.
    type: list
    elements: dict
  string_settings:
    description:
      - With O(settings), the string variables that end up in the unit, the env file or a pip command line.
    type: list
    elements: str
  argument_specs:
    description:
      - "With O(settings), the role's C(meta/argument_specs.yml); the options of its C(main) entry point are
        the role's variables. Every variable of the task that matches O(var_pattern) and is neither such an
        option nor in O(accept_vars) is refused, all of them in one sentence before the broken rules, e.g.
        C(sglang_tp: not a variable of the sglang role ...). The variables of the task are the ones the
        C(ansible.builtin.varnames) lookup searches: inventory, extra vars, play, include and role variables,
        role defaults, facts."
      - Parsed once per process and version of the file; the role's own spec when the plugin is imported,
        in ansible-playbook's process, so that the worker of each host inherits it.
    type: path
  var_pattern:
    description:
      - With O(argument_specs), the regular expression (searched, as the C(ansible.builtin.varnames)
        lookup does) of the variables that must be settings of the role; the role gives
        V(^sglang_(?!pull_|router_\)).
    type: str
  accept_vars:
    description:
      - With O(argument_specs), other variables that match O(var_pattern) and are accepted (playbook
        variables).
    type: list
    elements: str
    default: []
  knobs:
    description:
      - The command-line knobs given (C(window), C(budget), C(topk), C(steps), C(draft_tokens),
        C(algorithm)) -> value.
    type: dict
  points:
    description: Sweep points (C({name, settings})) to judge against the build profile.
    type: list
    elements: dict
  variables:
    description: With O(points), the host's own values of what a build profile judges.
    type: dict
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Check the command-line knobs
  sglang_settings_check:
    knobs:
      window: "4096"
"""

RETURN = r"""
errors:
  description: Every broken rule, one sentence each, naming the setting.
  returned: always
  type: list
  elements: str
  sample: ["budget='0': must be an integer from 1 to 4096 (DDTree tree budget in tokens), e.g. -e budget=64"]
unknown_vars:
  description: With O(argument_specs), the variables matching O(var_pattern) that are no setting of the role.
  returned: with argument_specs
  type: list
  elements: str
  sample: [sglang_speculative_draft_windw_size]
rejected:
  description: With O(points), point name -> why the build cannot honour it.
  returned: with points
  type: dict
"""
