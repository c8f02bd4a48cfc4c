#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Over 500 lines with its documentation (DOCUMENTATION, EXAMPLES and RETURN are 191 of them): the
# code that reads the three sources, compares them and the whole command line is 501 lines (one
# assertion of one invocation; its process and journal reading live in module_utils).
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
      - Also return the whole C(/server_info) body the assertion read (RV(server_info), secrets redacted),
        e.g. for a report file; large (about 550 keys), so off by default.
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
server_info:
  description: The whole C(/server_info) body the assertion read, secrets redacted.
  returned: when O(full_server_info) and the server answered
  type: dict
  sample: {"speculative_draft_window_size": 2048, "api_key": "<redacted>", "version": "0.5.23"}
msg:
  description: Summary; on failure the readable multi-line diff.
  returned: always
  type: str
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_http import HttpError, base_url, get_json, server_info  # noqa: E402
from ansible.module_utils.sglang_journal import (  # noqa: E402
    JournalError,
    message_text,
    read_invocation,
    select_invocation,
)
from ansible.module_utils.sglang_options import (  # noqa: E402
    BUDGET_KEY,
    WINDOW_IGNORED_MESSAGES,
    WINDOW_KEY,
    canonical_key,
    lookup,
    parse_draft_runner,
    read_argv,
    window_support,
)
from ansible.module_utils.sglang_redact import REDACTED, SECRET_FLAGS, is_secret_key, redact  # noqa: E402
from ansible.module_utils.sglang_release import inside  # noqa: E402
from ansible.module_utils.sglang_serverargs import (  # noqa: E402
    MARKER,
    ServerArgsParseError,
    compare,
    parse_server_args,
    values_equal,
)
from ansible.module_utils.sglang_systemd import SystemctlError, as_int, show  # noqa: E402


def _proc_parts(pid, name):
    with open(f"/proc/{int(pid)}/{name}", "rb") as fh:
        raw = fh.read()
    return [part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part]


def read_cmdline(pid):
    return _proc_parts(pid, "cmdline")


def read_environ(pid):
    """The process's environment as it started (``/proc/<pid>/environ``; root only)."""
    return dict(part.split("=", 1) for part in _proc_parts(pid, "environ") if "=" in part)


def shebang_prefix(path):
    """The interpreter (and its one optional argument) the kernel runs ``path`` with, [] for a binary."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return []
    if not first.startswith(b"#!"):
        return []
    return first[2:].decode("utf-8", errors="replace").strip().split(None, 1)


def _flags(argv):
    """flag -> its value(s) as the argv holds them (``--flag value`` and ``--flag=value``)."""
    out = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            values = [value] if eq else []
            while not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                i += 1
                values.append(argv[i])
            out.setdefault(name, []).append(values)
        i += 1
    return out


def _same_element(want, got):
    return want == got or (want.startswith("${") and want.endswith("}"))


def compare_argv(expected, running, where):
    """Lines on how ``running`` (/proc cmdline) differs from the rendered ``expected`` argv; [] = same."""
    candidates = [expected]
    prefix = shebang_prefix(expected[0]) if expected else []
    if prefix:
        candidates.append(prefix + expected)
    for want in candidates:
        if len(want) == len(running) and all(_same_element(w, g) for w, g in zip(want, running)):
            return []
    want = candidates[-1] if prefix and running[: len(prefix)] == prefix else expected
    lines = []
    first = next((i for i, a in enumerate(want) if a.startswith("--")), len(want))
    got_first = next((i for i, a in enumerate(running) if a.startswith("--")), len(running))
    if want[:first] != running[:got_first]:
        lines.append(
            f"launcher: expected {' '.join(want[:first])}, running {' '.join(running[:got_first])} ({where})"
        )
    want_flags, got_flags = _flags(want[first:]), _flags(running[got_first:])
    for flag in sorted(set(got_flags) - set(want_flags)):
        values = REDACTED if flag in SECRET_FLAGS else " ".join(" ".join(v) for v in got_flags[flag]).strip()
        lines.append(
            f"{flag}: a flag the role did not render is in {where} (unmanaged"
            + (f", value {values})" if values else ")")
        )
    for flag in sorted(set(want_flags) - set(got_flags)):
        lines.append(f"{flag}: rendered by the role, missing from {where}")
    for flag in sorted(set(want_flags) & set(got_flags)):
        w, g = want_flags[flag], got_flags[flag]
        same = len(w) == len(g) and all(
            len(a) == len(b) and all(map(_same_element, a, b)) for a, b in zip(w, g)
        )
        if not same:
            if flag in SECRET_FLAGS:
                lines.append(f"the value of {flag}, a secret, is not the rendered one ({where})")
            else:
                lines.append(
                    f"{flag}: expected {' '.join(' '.join(v) for v in w)}, running "
                    f"{' '.join(' '.join(v) for v in g)} ({where})"
                )
    if not lines:
        lines.append(f"the command line differs from the rendered ExecStart in its order ({where})")
    return lines


def secret_values_of(sources):
    """Values of secret keys found in any source (SGLang does not redact api_key)."""
    found = set()
    for data in sources:
        if isinstance(data, dict):
            for key, value in data.items():
                if is_secret_key(key) and isinstance(value, str) and value:
                    found.add(value)
    return found


def managed_view(data, expected):
    out = {}
    for key in expected:
        ok, value, name = lookup(data, key)
        if ok:
            out[key if name == key else f"{key} (as {name})"] = value
    return out


def check_window(expected, running_algo, messages, runner, require_window, evidence, line_name=None):
    """Diff lines about the draft window; appends softer findings to evidence['warnings']."""
    problems = []
    want = expected.get(WINDOW_KEY)
    if want is None:
        if require_window:
            problems.append(f"require_window is set but expected has no {WINDOW_KEY}")
        return problems
    # The draft runner's line is what the running worker uses; a resolution-time warning that the
    # window "has no effect" is contradicted by it (PR #29907 warns so for DDTREE, whose DFlash-based
    # worker does use the window: tests/fixtures/ddtree/SOURCE.md).
    proven = (
        runner is not None
        and _same_int(runner.get("draft_window_size"), want)
        and runner.get("compact_cache") is True
    )
    for text in messages:
        if any(marker in text for marker in WINDOW_IGNORED_MESSAGES):
            if proven:
                evidence["warnings"].append(
                    f"SGLang warned '{text.strip()}', but this invocation's {runner['runner']} reports "
                    f"draft_window_size={want}, compact_cache=True: the running worker uses the window"
                )
            else:
                problems.append(
                    f"{WINDOW_KEY}: SGLang reports it ignores the window in this invocation: {text.strip()}"
                )
    algo = str(running_algo).upper() if running_algo else running_algo
    support = window_support(algo)
    if support == "sometimes":
        msg = (
            f"{WINDOW_KEY}={want} with speculative_algorithm={algo}: honoured only by Llama EAGLE-3 and the "
            "triton/flashinfer draft backends; SGLang may ignore it silently"
        )
        if require_window:
            problems.append(msg + " (require_window is set)")
        else:
            evidence["warnings"].append(msg)
    elif support != "honoured":
        problems.append(
            f"{WINDOW_KEY}={want} has no effect with speculative_algorithm={algo} "
            "(SGLang honours the window for DFLASH and DDTREE, and EAGLE/EAGLE3 on some draft backends)"
        )
    if runner is not None:
        name = runner["runner"]
        if not _same_int(runner.get("draft_window_size"), want):
            problems.append(
                f"{WINDOW_KEY}: expected {want}, {name} reports "
                f"draft_window_size={runner.get('draft_window_size')} (journal runner line)"
            )
        elif runner.get("compact_cache") is not True:
            problems.append(
                f"{WINDOW_KEY}: {name} reports compact_cache={runner.get('compact_cache')} "
                "with a window set (journal runner line)"
            )
    elif require_window and support == "honoured":
        problems.append(
            f'{WINDOW_KEY}: no "Initialized {line_name}" line in this invocation\'s journal; '
            "the window cannot be shown to be in effect (require_window is set)"
        )
    return problems


def check_key_required(base, path, timeout, evidence):
    """With the intended key the server answered; without any key it must refuse (401/403): then it runs
    with THAT key (SGLang compares the Bearer key exactly), proven without the key ever being shown."""
    try:
        status, _ = get_json(base.rstrip("/") + path, api_key=None, timeout=timeout)
    except HttpError as exc:
        return [f"GET {path} without the API key: {exc}"]
    evidence["key_required"] = (
        f"required: GET {path} answered 200 with the intended key, {status} without a key"
    )
    if status in (401, 403):
        return []
    return [
        f"GET {path} without the API key returned {status}, not 401: the running server does not "
        "require the intended API key (it was started without --api-key, or its --config file lacks it)"
    ]


class Observed:
    """The reads of run() from the plan probe's document (``observed``) instead of the host itself."""

    def __init__(self, doc):
        self.doc = doc or {}
        self.info = self.doc.get("server_info") or {}

    def props(self):
        return self.doc.get("props") or {}

    def server_info(self):
        if self.info.get("error"):
            raise HttpError(self.info["error"])
        if "status" not in self.info:
            raise HttpError("the plan probe did not ask /server_info (no running main process?)")
        attempts = [tuple(a) for a in self.info.get("attempts") or []]
        return self.info["status"], self.info.get("body"), self.info.get("path"), attempts

    def key_required(self, path, evidence):
        status = self.info.get("status_without_key")
        if status is None:
            return [f"GET {path} without the API key: not asked by the plan probe"]
        evidence["key_required"] = (
            f"required: GET {path} answered 200 with the intended key, {status} without a key (plan probe)"
        )
        if status in (401, 403):
            return []
        return [
            f"GET {path} without the API key returned {status}, not 401: the running server does not "
            "require the intended API key (it was started without --api-key, or its --config file lacks it)"
        ]

    def journal(self, wanted, main_pid, start_us):
        entries = self.doc.get("journal")
        if entries is None:
            raise JournalError(self.doc.get("journal_error") or "the plan probe read no journal")
        return select_invocation(entries, wanted, [main_pid], start_us), ["journal read by the plan probe"]

    def part(self, name, main_pid):
        if name not in self.doc:
            raise OSError(
                1, self.doc.get(f"{name}_error") or f"/proc/{main_pid}/{name} not read by the plan probe"
            )
        return self.doc[name]


def _same_int(a, b):
    try:
        return a is not None and int(a) == int(b)
    except (TypeError, ValueError):
        return False


def run(module):
    p = module.params
    expected = {canonical_key(k): v for k, v in (p["expected"] or {}).items()}
    diff, evidence = [], {"warnings": [], "ignored": [], "notes": []}
    reported, raw_sources = {}, []
    result = {
        "changed": False,
        "reported": reported,
        "diff": diff,
        "source": "",
        "evidence": evidence,
        "argv_diff": [],
    }
    failures = []
    observed = Observed(p["observed"]) if p.get("observed") is not None else None

    try:
        props = (
            observed.props()
            if observed
            else show(
                module,
                p["unit"],
                ("InvocationID", "MainPID", "ExecMainStartTimestampMonotonic", "ActiveState"),
            )
        )
    except SystemctlError as exc:
        return result, [str(exc)], raw_sources
    current = (props.get("InvocationID") or "").replace("-", "").lower()
    main_pid = as_int(props.get("MainPID"))
    start_us = as_int(props.get("ExecMainStartTimestampMonotonic")) or None
    wanted = (p["invocation_id"] or current).replace("-", "").lower()
    evidence.update(
        {
            "invocation_id": wanted,
            "main_pid": main_pid,
            "unit": p["unit"],
            "active_state": props.get("ActiveState", ""),
        }
    )
    if not current or main_pid <= 0:
        return (
            result,
            [
                f"unit {p['unit']} has no running main process (InvocationID={current or 'none'}, "
                f"MainPID={main_pid}, ActiveState={props.get('ActiveState')})"
            ],
            raw_sources,
        )
    if wanted != current:
        return (
            result,
            [
                f"unit {p['unit']} now runs invocation {current}, not {wanted} (invocation_id): "
                "the server restarted after it was verified"
            ],
            raw_sources,
        )

    # 1. HTTP
    try:
        status, body, path, attempts = (
            observed.server_info()
            if observed
            else server_info(base_url(p["host"], p["port"]), p["api_key"], p["timeout"])
        )
        result["source"] = path
        evidence["http_attempts"] = [f"{a} -> {s}" for a, s in attempts]
        if status in (401, 403):
            hint = (
                "no api_key was given but the server requires one (--api-key)"
                if not p["api_key"]
                else "the server rejected the api_key"
            )
            failures.append(f"GET {path} returned {status}: {hint}")
        elif status != 200 or not isinstance(body, dict):
            failures.append(f"GET {path} returned {status}, not a JSON object: {str(body)[:200]}")
        else:
            if observed and "status_without_key" in observed.info:
                failures += observed.key_required(path, evidence)
            elif p["api_key"] and not observed:
                failures += check_key_required(base_url(p["host"], p["port"]), path, p["timeout"], evidence)
            raw_sources.append(body)
            reported["server_info"] = managed_view(body, expected)
            if p["full_server_info"]:
                result["server_info"] = body
            diff += compare(expected, body, f"{path}")
            release = p["expected_release"]
            if release:
                reported["release"] = {"version": body.get("version")}
                if str(body.get("version")) != str(release["version"]):
                    diff.append(
                        f"version: expected SGLang {release['version']} (release {release['path']}), "
                        f"{path} reports {body.get('version')!r}"
                    )
    except HttpError as exc:
        failures.append(str(exc))

    # 2. journal of THIS invocation
    messages_text, runners, journal_args = [], {}, None
    try:
        entries, notes = (
            observed.journal(wanted, main_pid, start_us)
            if observed
            else read_invocation(module, wanted, pids=[main_pid], since_monotonic_us=start_us)
        )
        evidence["notes"] += notes
        evidence["journal_entries"] = len(entries)
        accepted = []
        for entry in entries:
            text = message_text(entry.get("MESSAGE"))
            messages_text.append(text)
            if MARKER in text:
                pid = as_int(entry.get("_PID"))
                if pid != main_pid:
                    evidence["ignored"].append(
                        f"server_args line from PID {pid} ignored: not MainPID {main_pid} "
                        "(left over from an older run?)"
                    )
                    continue
                accepted.append(text)
            found = parse_draft_runner(text)
            if found is not None:
                runners[found["runner"]] = found
        evidence["runners"] = runners
        if not accepted:
            failures.append(
                f"no server_args= line from MainPID {main_pid} in the journal of invocation {wanted} "
                f"(journalctl _SYSTEMD_INVOCATION_ID={wanted}); is --log-level above info?"
            )
        else:
            parsed = [parse_server_args(t) for t in accepted]
            if len({json.dumps(x["args"], sort_keys=True, default=str) for x in parsed}) > 1:
                failures.append(f"{len(parsed)} different server_args= lines in invocation {wanted}")
            journal_args = parsed[-1]["args"]
            evidence["server_args_form"] = parsed[-1]["form"]
            evidence["server_args_partial"] = parsed[-1]["partial"]
            raw_sources.append(journal_args)
            reported["journal"] = managed_view(journal_args, expected)
            diff += compare(expected, journal_args, f"journal server_args, invocation {wanted}")
    except (JournalError, ServerArgsParseError) as exc:
        failures.append(str(exc))

    # 3. /proc/<MainPID>/cmdline
    try:
        argv = observed.part("cmdline", main_pid) if observed else read_cmdline(main_pid)
        release = p["expected_release"]
        if release:
            reported.setdefault("release", {})["argv0"] = argv[0] if argv else None
            if not argv or not inside(argv[0], release["path"]):
                diff.append(
                    f"release: expected a process of the release {release['path']}, /proc/{main_pid}/cmdline "
                    f"starts with {argv[0] if argv else '(nothing)'!r}"
                )
        settings = read_argv(argv, p["flag_dests"])
        raw_sources.append(settings)
        reported["cmdline"] = managed_view(settings, expected)
        present = {k: v for k, v in expected.items() if lookup(settings, k)[0]}
        diff += compare(present, settings, f"/proc/{main_pid}/cmdline")
        if p["expected_argv"]:
            result["argv_diff"] = compare_argv(p["expected_argv"], argv, f"/proc/{main_pid}/cmdline")
            diff += result["argv_diff"]
    except OSError as exc:
        failures.append(f"cannot read /proc/{main_pid}/cmdline: {exc.strerror}")

    # 4. knobs the build reads from the environment: the RUNNING process's, not the env file's
    if p["expected_env"]:
        try:
            environ = observed.part("environ", main_pid) if observed else read_environ(main_pid)
            reported["environ"] = {name: environ.get(name) for name in p["expected_env"]}
            for name, want in sorted(p["expected_env"].items()):
                if name not in environ:
                    diff.append(
                        f"{name}: expected {want}, not in the environment of MainPID {main_pid} "
                        f"(/proc/{main_pid}/environ)"
                    )
                elif not values_equal(name, want, environ[name]):
                    diff.append(
                        f"{name}: expected {want}, running {environ[name]} (/proc/{main_pid}/environ)"
                    )
        except OSError as exc:
            failures.append(f"cannot read /proc/{main_pid}/environ: {exc.strerror} (needs root)")

    # window evidence
    algo_source = journal_args if journal_args is not None else reported.get("server_info") or {}
    running_algo = lookup(algo_source, "speculative_algorithm")[1]
    lines = dict({"window": f"{str(running_algo).upper()} draft runner", "budget": None}, **p["runner_lines"])
    runner = runners.get(lines["window"] or "")
    evidence["runner"] = runner
    diff += check_window(
        expected, running_algo, messages_text, runner, p["require_window"], evidence, lines["window"]
    )
    budget_line = runners.get(lines["budget"] or "")
    if budget_line is not None and BUDGET_KEY in expected:
        if _same_int(budget_line.get("tree_budget"), expected[BUDGET_KEY]):
            evidence["budget_runner"] = budget_line
        else:
            diff.append(
                f"{BUDGET_KEY}: expected {expected[BUDGET_KEY]}, {lines['budget']} reports "
                f"tree_budget={budget_line.get('tree_budget')} (journal runner line)"
            )
    evidence["window_messages"] = [t for t in messages_text if any(m in t for m in WINDOW_IGNORED_MESSAGES)]
    result["read_from"] = read_from(
        expected,
        p["expected_env"],
        reported,
        runner,
        result["source"],
        main_pid,
        evidence.get("budget_runner"),
    )
    wanted_values = dict(expected, **p["expected_env"])
    result["summary"] = {
        key: f"{wanted_values[key]} (from {', '.join(sources) or 'no source'})"
        for key, sources in sorted(result["read_from"].items())
        if key.startswith("speculative_") or key in p["expected_env"]
    }
    return result, failures, raw_sources


def read_from(expected, expected_env, reported, runner, http_path, main_pid, budget_runner=None):
    """Which sources reported the intended value of each managed key (for the operator's summary)."""
    names = {
        "server_info": http_path or "/server_info",
        "journal": "journal server_args",
        "cmdline": f"/proc/{main_pid}/cmdline",
    }
    out = {}
    for key, want in expected.items():
        out[key] = [
            label
            for source, label in names.items()
            if any(
                canonical_key(k.split(" (as ")[0]) == key and values_equal(key, want, v)
                for k, v in (reported.get(source) or {}).items()
            )
        ]
    if (
        runner is not None
        and WINDOW_KEY in expected
        and _same_int(runner.get("draft_window_size"), expected[WINDOW_KEY])
    ):
        out[WINDOW_KEY].append(runner["runner"])
    if budget_runner is not None:
        out[BUDGET_KEY].append(budget_runner["runner"])
    for name, want in expected_env.items():
        running = (reported.get("environ") or {}).get(name)
        out[name] = [f"/proc/{main_pid}/environ"] if values_equal(name, want, running) else []
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            api_key=dict(type="str", no_log=True),
            unit=dict(type="str", default="sglang.service"),
            invocation_id=dict(type="str"),
            expected=dict(type="dict", required=True),
            require_window=dict(type="bool", default=False),
            secret_values=dict(type="list", elements="str", default=[], no_log=True),
            flag_dests=dict(type="dict"),
            expected_env=dict(type="dict", default={}),
            runner_lines=dict(type="dict", default={}),
            timeout=dict(type="float", default=10),
            full_server_info=dict(type="bool", default=False),
            expected_argv=dict(type="list", elements="str"),
            observed=dict(type="dict"),
            expected_release=dict(
                type="dict",
                options=dict(path=dict(type="path", required=True), version=dict(type="str", required=True)),
            ),
        ),
        supports_check_mode=True,
    )
    result, failures, raw_sources = run(module)
    secrets = set(module.params["secret_values"] or [])
    if module.params["api_key"]:
        secrets.add(module.params["api_key"])
    secrets |= secret_values_of(raw_sources)
    problems = failures + result["diff"]
    if problems:
        result["msg"] = "running SGLang arguments do not match the intended ones:\n" + "\n".join(problems)
        result["failures"] = failures
    else:
        result["msg"] = (
            f"{len(module.params['expected'] or {})} managed key(s) agree in "
            f"{', '.join(sorted(result['reported']))} "
            f"for invocation {result['evidence'].get('invocation_id')}"
        )
    result = redact(result, secrets)
    if problems:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
