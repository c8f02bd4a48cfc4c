#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the controller-side action plugin action_plugins/sglang_deploy_report.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_deploy_report
short_description: Write one host's deploy report (JSON) on the controller and show its summary
description:
  - An action plugin (action_plugins/sglang_deploy_report.py) that never reaches a host. It makes the
    report's directory (0700) when missing and writes the report as indented JSON (0600, for it holds the
    whole C(/server_info) with its secrets redacted), atomically, with a
    C(written) UTC timestamp after C(host); a controller file, not a host change, so it is never C(changed).
  - With O(summary_template), it then renders that template in the controller process with the variables
    of O(summary_vars) only (no task variable), as the C(ansible.builtin.template) lookup renders a file
    (trim_blocks, backslashes not escaped), and returns the result stripped and split at each newline as
    RV(msg) - the lines an C(ansible.builtin.debug) task printed from that lookup, C(| trim | split) - which
    the default stdout callback prints without C(-v), as it prints a debug task's C(msg).
  - Check mode writes nothing and renders nothing.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  path:
    description: The report file on the controller; its directory is made when missing.
    type: path
    required: true
  report:
    description: The report, written as JSON in the order given (C(written) after C(host)).
    type: dict
    required: true
  server_info_json:
    description:
      - The whole C(/server_info) as JSON text (C(server_info_json), returned by C(sglang_running_args)),
        written into the report as its C(server_info) object, after the keys of O(report); C(null) when
        this is null. Not JSON text fails the task, as does a O(report) that has a C(server_info) too.
    type: str
  summary_template:
    description:
      - Absolute path of a Jinja template on the controller, rendered after the report is written.
      - Without it nothing is rendered and no RV(msg) is returned.
    type: path
  summary_vars:
    description:
      - The variables of O(summary_template), its only ones (a variable it reads that is not here fails
        the task).
      - Requires O(summary_template).
    type: dict
    default: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Write the deploy report of a host
  sglang_deploy_report:
    path: "out/deploy/20261205T120000Z/lab1.json"
    report:
      host: lab1

- name: Show the verified running arguments and write the full report
  sglang_deploy_report:
    path: "{{ __deploy_report_file }}"
    report:
      host: "{{ inventory_hostname }}"
      unit: "{{ __sglang_verified.unit }}"
    summary_template: "{{ playbook_dir | dirname }}/templates/deploy_summary.j2"
    summary_vars:
      host: "{{ inventory_hostname }}"
      verified: "{{ __sglang_verified }}"
      report_file: "{{ __deploy_report_file }}"
"""

RETURN = r"""
path:
  description: The report file written.
  returned: always
  type: str
msg:
  description: The lines of the rendered O(summary_template), stripped at both ends and split at each newline.
  returned: when O(summary_template) is given, not in check mode
  type: list
  elements: str
"""
