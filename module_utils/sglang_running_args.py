# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The running-arguments assertion of one invocation (property P3): read the arguments from /server_info, the
invocation's own journal line and /proc/<MainPID>/cmdline, compare every managed key, the whole command line,
the environment knobs, the release and the draft runner's window evidence. Shared by sglang_running_args (its
own task: check mode, the plan) and sglang_verified_restart (the same check in the call that proved the
invocation: one round trip less per deploy and per no-change run)."""

from __future__ import annotations

import json

from ansible.module_utils.sglang_http import HttpError, base_url, get_json, server_info
from ansible.module_utils.sglang_journal import (
    READY_MESSAGE,
    JournalError,
    message_text,
    read_invocation,
    select_invocation,
)
from ansible.module_utils.sglang_options import (
    BUDGET_KEY,
    WINDOW_IGNORED_MESSAGES,
    WINDOW_KEY,
    canonical_key,
    lookup,
    parse_draft_runner,
    read_argv,
    window_support,
)
from ansible.module_utils.sglang_redact import REDACTED, SECRET_FLAGS, is_secret_key, redact
from ansible.module_utils.sglang_release import inside
from ansible.module_utils.sglang_serverargs import (
    MARKER,
    ServerArgsParseError,
    compare,
    parse_server_args,
    values_equal,
)
from ansible.module_utils.sglang_systemd import SystemctlError, as_int, show

# The options of sglang_running_args (its DOCUMENTATION); sglang_verified_restart takes the same ones, but the
# server's address and the invocation, as its running_args option (RUNNING_ARGS_SUBOPTIONS).
RUNNING_ARGS_SUBOPTIONS = dict(
    expected=dict(type="dict", required=True),
    require_window=dict(type="bool", default=False),
    secret_values=dict(type="list", elements="str", default=[], no_log=True),
    flag_dests=dict(type="dict"),
    expected_env=dict(type="dict", default={}),
    runner_lines=dict(type="dict", default={}),
    timeout=dict(type="float", default=10),
    full_server_info=dict(type="bool", default=False),
    expected_argv=dict(type="list", elements="str"),
    expected_release=dict(
        type="dict",
        options=dict(path=dict(type="path", required=True), version=dict(type="str", required=True)),
    ),
)
ARGUMENT_SPEC = dict(
    host=dict(type="str", default="127.0.0.1"),
    port=dict(type="int", required=True),
    api_key=dict(type="str", no_log=True),
    unit=dict(type="str", default="sglang.service"),
    invocation_id=dict(type="str"),
    observed=dict(type="dict"),
    **RUNNING_ARGS_SUBOPTIONS,
)


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


def run(module, p):
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
                result["server_info"] = body  # returned as server_info_json (check)
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
            # From the invocation's first line to SGLang's ready line, not the days of lines after it.
            else read_invocation(
                module, wanted, pids=[main_pid], since_monotonic_us=start_us, until=READY_MESSAGE
            )
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


def check(module, p):
    """The assertion with the parameters ``p`` (sglang_running_args' options): (result, problems). The result
    is redacted (the API key, the secret values given and any the sources revealed) and carries ``msg``:
    the agreement, or the readable diff when ``problems`` is not empty."""
    result, failures, raw_sources = run(module, p)
    secrets = set(p["secret_values"] or [])
    if p["api_key"]:
        secrets.add(p["api_key"])
    secrets |= secret_values_of(raw_sources)
    problems = failures + result["diff"]
    if problems:
        result["msg"] = "running SGLang arguments do not match the intended ones:\n" + "\n".join(problems)
        result["failures"] = failures
    else:
        result["msg"] = (
            f"{len(p['expected'] or {})} managed key(s) agree in "
            f"{', '.join(sorted(result['reported']))} "
            f"for invocation {result['evidence'].get('invocation_id')}"
        )
    result = redact(result, secrets)
    if "server_info" in result:
        # Redacted as an object (secret-named keys masked), then one string through Ansible's variables, not
        # ~550 values each walked wherever it is templated (the role keeps it; the deploy report writes it
        # back as an object).
        result["server_info_json"] = json.dumps(result.pop("server_info"))
    return result, problems
