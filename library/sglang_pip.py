#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation of the action plugin action_plugins/sglang_pip.py."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_pip
short_description: Run a pip install on the host, printing what pip is doing while it runs
description:
  - "An action plugin (action_plugins/sglang_pip.py). Starts O(argv) on the host in its own session,
    its output to the root-only file O(log), and polls the host every O(poll) seconds. While pip runs it
    prints C(<host>: <label> [<elapsed>]: <the last step pip named>), for example
    C(Processing torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl) or
    C(Installing 111 collected packages: ...), at once when pip moves on and at least every 20 seconds."
  - C(changed) is true only when pip reported C(Successfully installed ...); a run that finds every
    requirement already satisfied reports no change.
  - Fails with pip's C(ERROR:) lines (or its last lines) and the exit status when pip fails, when it
    ends without an exit status, and after O(timeout) seconds (pip is then stopped).
  - Check mode is not supported (nothing is installed; the task is reported skipped).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  argv:
    description:
      - The pip command, for example C([/opt/sglang/venv/bin/python, -m, pip, install, sglang==0.5.23]).
    type: list
    elements: str
    required: true
  log:
    description:
      - Absolute path on the host of the file that receives pip's output (mode 0600; replaced by each run).
    type: path
    required: true
  poll:
    description: Seconds between two looks at the host (1 to 15).
    type: int
    default: 10
  timeout:
    description: Seconds after which a pip still running is stopped and the task fails.
    type: int
    default: 7200
  label:
    description: What the install is, at the start of each progress line.
    type: str
    default: pip install
  lock:
    description:
      - The deploy lock this run holds (C(sglang_lock)'s C(dir), C(name) and C(token)). pip starts only while
        it is this run's (else the task fails naming its holder and installs nothing); while pip runs, its
        lease is renewed (its own length, at a quarter of it) and it says what is installed, so an install
        longer than the lease keeps the lock. A lock taken over meanwhile stops pip and fails the task.
    type: dict
    suboptions:
      dir:
        description: The lock directory.
        type: path
        required: true
      name:
        description: The service the lock is for.
        type: str
        required: true
      token:
        description: The token C(sglang_lock) returned.
        type: str
        required: true
attributes:
  check_mode:
    support: none
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Install SGLang from the package index
  sglang_pip:
    argv: [/opt/sglang/venv/bin/python, -m, pip, install, --no-input, sglang==0.5.23]
    log: /opt/sglang/venv/sglang-deploy-pip.log
    label: SGLang 0.5.23
    lock: {dir: /run/sglang-deploy, name: sglang, token: "{{ __sglang_lock.token }}"}
"""

RETURN = r"""
rc:
  description: pip's exit status (null when it ended without one).
  returned: when pip ended
  type: int
  sample: 0
installed:
  description: The name-version pairs pip reported as installed.
  returned: when pip ended
  type: list
  elements: str
  sample: ["sglang-0.5.23"]
stdout:
  description: pip's output (standard output and error), as in O(log).
  returned: when pip ended
  type: str
log:
  description: The log file on the host.
  returned: when pip ended
  type: str
elapsed:
  description: How long pip ran, as C(<minutes>m<seconds>s).
  returned: when pip ended
  type: str
  sample: 2m41s
"""
