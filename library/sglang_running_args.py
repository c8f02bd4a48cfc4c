#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# The assertion itself lives in module_utils/sglang_running_args.py: sglang_verified_restart runs the same one
# in the call that proved the invocation (its running_args option).
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_running_args
short_description: Assert that the running SGLang server uses the intended arguments
description:
  - Reads the arguments of the CURRENT invocation of the SGLang unit from three sources and
    compares every managed key with O(expected) (property P3), alias-aware
    (C(speculative_dflash_draft_window_size) satisfies C(speculative_draft_window_size)).
  - "Sources: C(GET /server_info) (falls back to C(/get_server_info) on 404, older servers);
    the C(server_args=) startup line of THIS invocation in the journal
    (C(journalctl -o json --all _SYSTEMD_INVOCATION_ID=<id> + _PID=<MainPID>); C(-u UNIT) is never
    used, lines of older runs are ignored, property P2); and C(/proc/<MainPID>/cmdline)."
  - Only a C(server_args=) line logged by the unit's MainPID counts. A process left over from an
    older run (C(KillMode=process)) logs with the NEW invocation's id (recorded on systemd 252).
  - Window evidence when O(expected) sets C(speculative_draft_window_size) - fails when SGLang
    logged that it ignores the window (C(--speculative-draft-window-size has no effect with ...),
    C(Ignoring --speculative-draft-window-size=...)), when the algorithm never honours a window
    (DFLASH and DDTREE, C(WINDOW_HONOURED) in module_utils/sglang_options.py), and when this
    invocation's C(Initialized DFLASH draft runner) or C(Initialized DDTREE draft runner) line reports
    another C(draft_window_size) or no C(compact_cache).
  - Knobs the build reads from the environment (O(expected_env), e.g. C(SGLANG_DDTREE_MAX_TOPK)) and the
    variables the role sets for the host (C(NCCL_P2P_DISABLE=1) by the NCCL decision) are read from the
    RUNNING process, C(/proc/<MainPID>/environ) (root only), not from the env file.
  - Read-only; runs fully in check mode. Secrets (O(api_key), O(secret_values), and every value
    of a secret key found in any source) never appear in the result (P13).
  - The property codes (P2, P3, P13) are defined in C(docs/properties.md).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  host:
    description: Address the server listens on, as used by the HTTP client.
    type: str
    default: 127.0.0.1
  port:
    description: HTTP port of the server.
    type: int
    required: true
  api_key:
    description:
      - Bearer key when the server runs with C(--api-key) (on the command line or from its C(--config)
        file). Given, the module also proves the server uses THAT key, as the C(/server_info) request with
        it succeeds and the same request without any key is refused (401 or 403), else it fails. The
        key is never shown.
    type: str
  unit:
    description: systemd unit of the server.
    type: str
    default: sglang.service
  observed:
    description:
      - What the host's plan probe (M(sglang_plan_probe), RV(observed.running)) read as root - C(props) of the
        unit, C(server_info) (C(status), C(body), C(path), C(attempts), C(status_without_key) or C(error)),
        C(journal) entries of the current invocation, C(cmdline) and C(environ) of MainPID - compared instead
        of reading them here. The plan account connects without root and without the API key; the probe
        redacted every secret on the host. The comparison is the same.
    type: dict
  invocation_id:
    description:
      - InvocationID the caller verified (e.g. from M(sglang_verified_restart)). When given and
        the unit now runs another invocation, the module fails (the server restarted meanwhile).
      - Default is the unit's current C(InvocationID) read with C(systemctl show).
    type: str
  expected:
    description:
      - Canonical key (SGLang 0.5.23 argparse dest) -> intended value, i.e. the C(managed) return
        of M(sglang_argv). Values may be strings as in argv (C("2048") equals C(2048)).
    type: dict
    required: true
  require_window:
    description:
      - Fail unless the draft window is demonstrably in effect - an algorithm that honours it and the
        C(Initialized <ALGORITHM> draft runner) line of this invocation reports the expected window.
    type: bool
    default: false
  runner_lines:
    description:
      - "Which start-up line of the build proves the window (C(window)) and the tree budget (C(budget)),
        e.g. C({window: DFLASH draft runner, budget: DDTree worker}) (the C(runner_lines) return of
        M(sglang_argv)). Default C(<ALGORITHM> draft runner) for the window, no budget line."
    type: dict
    default: {}
  expected_env:
    description:
      - Environment variable -> intended value, for knobs the build reads from the environment
        (the C(env) return of M(sglang_argv)) and the host's NCCL decision; compared with
        C(/proc/<MainPID>/environ).
    type: dict
    default: {}
  secret_values:
    description: Literal secret values to scrub from every returned string.
    type: list
    elements: str
    default: []
  flag_dests:
    description:
      - argparse flag -> dest map of the installed SGLang (the C(flag_dests) return of M(sglang_argv)),
        to read C(/proc/<pid>/cmdline) exactly. Without it C(--foo-bar) is read as C(foo_bar) plus the
        0.5.23 exceptions of module_utils/sglang_options.py.
    type: dict
  timeout:
    description: Seconds for each HTTP request.
    type: float
    default: 10
  expected_release:
    description:
      - The SGLang release the server must run (issue 14 item 1). C(version) must be the C(version) that
        C(/server_info) reports, and C(/proc/<MainPID>/cmdline)'s first element (the release's python, or the
        interpreter of its script) must lie in C(path). A mismatch is a failure naming both.
    type: dict
    suboptions:
      path:
        description: The release directory.
        type: path
        required: true
      version:
        description: The SGLang version the release holds.
        type: str
        required: true
  expected_argv:
    description:
      - The whole command line the unit's C(ExecStart=) gives the process as the role rendered it (launcher
        included, after systemd's unquoting, i.e. the list the role quoted). C(/proc/<MainPID>/cmdline) must
        be exactly this list; a flag the role did not render (a drop-in's C(ExecStart=), a hand restart) is a
        finding that names the flag (RV(argv_diff)). When the launcher is a script with a C(#!) line, the
        kernel puts the interpreter in front (C(bin/python3 bin/sglang serve ...)), and that form is accepted.
        An element that is exactly C(${NAME}) (systemd substitutes it) matches any value.
    type: list
    elements: str
  full_server_info:
    description:
      - Also return the whole C(/server_info) body the assertion read (RV(server_info_json), secrets
        redacted), e.g. for a report file; large (about 550 keys), so off by default.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    support: none
notes:
  - Needs root (or the systemd-journal group) to read the unit's journal and C(journalctl --sync).
"""

EXAMPLES = r"""
- name: Assert the running server uses the deployed arguments
  sglang_running_args:
    port: "{{ sglang_port }}"
    api_key: "{{ sglang_api_key | default(omit) }}"
    unit: sglang.service
    invocation_id: "{{ __sglang_restart.invocation_id }}"
    expected: "{{ __sglang_argv.managed }}"
    require_window: "{{ sglang_speculative_draft_window_size is not none }}"
    secret_values: "{{ [sglang_api_key] if sglang_api_key else [] }}"
  no_log: false
"""

RETURN = r"""
reported:
  description: Managed keys as each source reports them (secrets redacted); sources absent on failure to read.
  returned: always
  type: dict
  sample:
    server_info: {"speculative_draft_window_size": 2048}
    journal: {"speculative_draft_window_size": 2048}
    cmdline: {"speculative_draft_window_size": "2048"}
    environ: {"SGLANG_DDTREE_MAX_TOPK": "4"}
diff:
  description: "One line per disagreement: C(key: expected X, running Y (source))."
  returned: always
  type: list
  elements: str
  sample:
    - "speculative_draft_window_size: expected 2048, running None (journal server_args, invocation 5f67...)"
source:
  description: HTTP endpoint that answered.
  returned: always
  type: str
  sample: /server_info
evidence:
  description: What was read - invocation, MainPID, journal lines used and ignored, runner line, warnings.
  returned: always
  type: dict
  sample: {"invocation_id": "5f67eaa332b14ce095abdbeeeb5c0407", "main_pid": 98, "server_args_form": "dict",
           "runner": {"draft_window_size": 2048, "compact_cache": true}, "ignored": [], "warnings": []}
read_from:
  description: Managed key (or environment variable) -> the sources that reported the intended value.
  returned: always
  type: dict
  sample: {"speculative_ddtree_budget": ["/server_info", "journal", "cmdline"],
           "SGLANG_DDTREE_MAX_TOPK": ["/proc/1234/environ"],
           "speculative_draft_window_size": ["/server_info", "journal", "cmdline", "DDTREE draft runner"]}
summary:
  description: The speculative settings and environment knobs, each with its value and where it was read.
  returned: always
  type: dict
  sample: {"speculative_ddtree_budget": "8 (from /server_info, journal server_args, /proc/1234/cmdline)",
           "SGLANG_DDTREE_MAX_TOPK": "4 (from /proc/1234/environ)"}
argv_diff:
  description:
    - How C(/proc/<MainPID>/cmdline) differs from O(expected_argv) (secrets redacted) - flags the role did not
      render, rendered flags that are missing, a value or launcher that differs; also in RV(diff).
  returned: always
  type: list
  elements: str
  sample: ["--enable-metrics: a flag the role did not render is in /proc/98/cmdline (unmanaged)"]
server_info_json:
  description:
    - The whole C(/server_info) body the assertion read, secrets redacted, as JSON text.
    - One string, so that Ansible carries it as one value instead of walking its ~550 keys wherever a
      variable holding it is templated; C(sglang_deploy_report) (O(server_info_json)) writes it into the
      report file as an object.
  returned: when O(full_server_info) and the server answered
  type: str
  sample: '{"speculative_draft_window_size": 2048, "api_key": "<redacted>", "version": "0.5.23"}'
msg:
  description: Summary; on failure the readable multi-line diff.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_running_args import ARGUMENT_SPEC, check  # noqa: E402


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result, problems = check(module, module.params)
    if problems:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
