#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the controller-side action plugin action_plugins/sglang_deploy_report.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_deploy_report
short_description: Write one host's deploy report (JSON) on the controller
description:
  - An action plugin (action_plugins/sglang_deploy_report.py) that never reaches a host. It makes the
    report's directory (0755) and writes the report as indented JSON (0644), atomically, with a
    C(written) UTC timestamp after C(host); a controller file, not a host change, so it is never C(changed).
  - Check mode writes nothing.
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
"""

RETURN = r"""
path:
  description: The report file written.
  returned: always
  type: str
"""
