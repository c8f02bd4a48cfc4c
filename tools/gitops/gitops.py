"""Shared code of tools/gitops/{plan,apply,drift,publish} (controller side, standard library only).

A git ref is materialised with `git archive` into a temporary directory (the repository and its
work tree are never touched), the inventory is taken from that tree (or, when it is not tracked -
the lab inventories are gitignored - copied in from the work tree, which the report says), and
the playbook runs from there with that tree's ansible.cfg.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import fcntl
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import names

# The canary's own words for its limits (module_utils is standard library only).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "module_utils"))
import sglang_canary  # noqa: E402

PLAN_MARKER = "<!-- sglang-gitops-plan -->"
DRIFT_MARKER = "<!-- sglang-gitops-drift -->"
APPLY_MARKER = "<!-- sglang-gitops-apply -->"
# GitHub refuses comment and issue bodies over 65536 characters.
BODY_LIMIT = 60000
EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


class GitopsError(Exception):
    """An error the user can act on; the message names the ref, file or flag concerned."""


class LockHeld(GitopsError):
    """Another deploy of the same inventory holds the lock."""


def log(tool: str, msg: str) -> None:
    print(f"{tool}: {msg}", file=sys.stderr, flush=True)


def git(repo: Path, *args: str, binary: bool = False) -> str | bytes:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, env=dict(os.environ, LANG="C")
    )
    if proc.returncode != 0:
        raise GitopsError(f"git {' '.join(args)}: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout if binary else proc.stdout.decode()


def repo_root(path: str | None) -> Path:
    start = Path(path or ".").resolve()
    try:
        return Path(str(git(start, "rev-parse", "--show-toplevel")).strip())
    except GitopsError as exc:
        raise GitopsError(f"--repo {start}: not a git work tree ({exc})") from None


def resolve(repo: Path, ref: str, flag: str) -> str:
    try:
        return str(git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")).strip()
    except GitopsError:
        raise GitopsError(f"{flag} {ref}: no such commit in {repo}") from None


def materialise(repo: Path, sha: str, dest: Path) -> None:
    """The tree of commit `sha` into `dest` (git archive: no worktree metadata in the repository)."""
    data = git(repo, "archive", "--format=tar", sha, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="tar")  # the fixtures hold absolute symlinks
        else:  # Python < 3.11.4
            tar.extractall(dest)  # noqa: S202 - our own repository's archive


def tracked(repo: Path, sha: str, relpath: str) -> bool:
    try:
        git(repo, "cat-file", "-e", f"{sha}:{relpath}")
        return True
    except GitopsError:
        return False


def inventory_relpath(repo: Path, inventory: str) -> str:
    path = Path(inventory)
    absolute = (path if path.is_absolute() else Path.cwd() / path).resolve()
    if not path.is_absolute() and not absolute.exists() and (repo / path).exists():
        absolute = (repo / path).resolve()
    try:
        return str(absolute.relative_to(repo))
    except ValueError:
        raise GitopsError(
            f"--inventory {inventory}: must be inside the repository {repo} (its group_vars live beside it)"
        ) from None


def place_inventory(repo: Path, sha: str, relpath: str, tree: Path) -> str | None:
    """Make sure the inventory exists in `tree`; return a note when it was not taken from git."""
    if tracked(repo, sha, relpath):
        return None
    source = repo / relpath
    if not source.is_file():
        raise GitopsError(f"--inventory {relpath}: neither tracked at {sha[:12]} nor present in {repo}")
    target = tree / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)
    return f"inventory {relpath} is not tracked in git: taken from the work tree of {repo}"


SECRET_ENV = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|VAULT)")
# Paths, not secrets: the SSH key the plan connects with and the agent socket.
SECRET_ENV_KEEP = {"ANSIBLE_PRIVATE_KEY_FILE", "SSH_AUTH_SOCK"}


def ansible_env(repo: Path, tree: Path, scrub: bool = False) -> dict[str, str]:
    """The environment of ansible-playbook; `scrub` (the plan) drops every variable named like a
    secret (CI tokens, vault settings, keys), so that no production secret reaches the plan."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (scrub and SECRET_ENV.search(k) and k not in SECRET_ENV_KEEP)
    }
    env.update(
        ANSIBLE_CONFIG=str(tree / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_RETRY_FILES_ENABLED="0",
        LANG="C.UTF-8",
    )
    # The collections installed by `make venv` live in the repository, not in git.
    collections = repo / ".ansible" / "collections"
    if collections.is_dir() and "ANSIBLE_COLLECTIONS_PATH" not in os.environ:
        env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    return env


def find_tool(repo: Path, name: str, given: str | None) -> str:
    if given:
        return given
    local = repo / ".venv" / "bin" / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise GitopsError(f"{name} not found in {repo}/.venv/bin or PATH (make venv, or pass --{name})")
    return found


def run_logged(
    argv: list[str], env: dict[str, str], cwd: Path, logfile: Path, echo: bool, timeout: float
) -> int:
    """Run, tee output to `logfile` (and stderr when echo); return the exit status."""
    with open(logfile, "w", encoding="utf-8") as out:
        out.write("$ " + " ".join(argv) + "\n")
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + timeout
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if echo:
                sys.stderr.write(line)
            if time.monotonic() > deadline:
                proc.kill()
                out.write(f"\n[gitops] killed after {timeout:.0f} s\n")
                break
        return proc.wait()


def inventory_hosts(
    ansible_inventory: str, env: dict[str, str], tree: Path, inventory: str, limit: str | None
) -> list[str]:
    argv = [ansible_inventory, "-i", inventory, "--list"]
    if limit:
        argv += ["--limit", limit]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise GitopsError(f"ansible-inventory -i {inventory}: {proc.stderr.strip()[-2000:]}")
    data = json.loads(proc.stdout)
    hosts: list[str] = []
    todo = ["gpu_nodes"]
    while todo:
        group = data.get(todo.pop(), {})
        hosts += group.get("hosts", [])
        todo += group.get("children", [])
    for host in hosts:
        valid_host(host, f"ansible-inventory -i {inventory}")
    return sorted(set(hosts))


def valid_host(host, where: str) -> str:
    """`host` when it is a plain host name (tools/gitops/names.py), before any path is built from it."""
    problem = names.host_name_problem(host)
    if problem:
        raise GitopsError(f"{where}: {problem}")
    return host


def failure_lines(logtext: str, host: str) -> str:
    """The 'fatal:'/'UNREACHABLE' lines ansible printed for `host` (no_log results are censored)."""
    pat = re.compile(rf"^(fatal|failed): \[{re.escape(host)}\].*$", re.M)
    lines = [m.group(0) for m in pat.finditer(logtext)]
    return "\n".join(lines[-3:])[-1500:]


# ---- comparing values -------------------------------------------------------------------------


def norm(value):
    """Compare '2048' with 2048, 'true' with True, '0.85' with 0.85 (argv strings vs JSON values)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        try:
            return float(low)
        except ValueError:
            return value
    return value


def running_rows(report: dict) -> list[dict]:
    """Managed settings whose running value (what the server reports) differs from the intended one."""
    intended = report.get("intended") or {}
    running_all = report.get("running") or {}
    source = next((s for s in ("server_info", "journal", "cmdline") if running_all.get(s)), None)
    running = running_all.get(source, {}) if source else {}
    rows = []
    for key in sorted(intended):
        now = running.get(key)
        if norm(now) != norm(intended[key]):
            rows.append({"key": key, "running": now, "intended": intended[key], "source": source})
    return rows


def unit_diff_text(report: dict) -> str:
    chunks = []
    diffs = (report.get("unit") or {}).get("diff") or []
    # Ansible returns one diff as a dict, several as a list.
    for d in [diffs] if isinstance(diffs, dict) else diffs:
        if not isinstance(d, dict):
            continue
        before = d.get("before", "") or ""
        after = d.get("after", "") or ""
        if before == after:
            continue
        chunks += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=(d.get("before_header") or "on the host") + " (on the host)",
            tofile="rendered from git",
        )
    return "".join(chunks)


def host_changes(report: dict) -> list[str]:
    """What would change on the host, in words; [] = nothing."""
    if report.get("status") != "ok":
        return []
    out = []
    if report.get("install_needed"):
        out.append("SGLang install")
    if report["unit"]["changed"]:
        out.append("unit")
    if report["env"]["changed"]:
        out.append("environment file")
    if (report.get("config") or {}).get("changed"):
        out.append("--config file (secrets)")
    if report.get("need_daemon_reload"):
        out.append("daemon-reload")
    if report.get("foreign_dropins"):
        out.append("foreign drop-ins (a deploy fails, or removes them with sglang_remove_foreign_dropins)")
    if running_rows(report):
        out.append("running arguments")
    if report.get("restart"):
        out.append("restart")
    return out


# ExecMainCode of `systemctl show`: a CLD_* code of waitid(2), as a number.
CLD_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


def invocation_id(value) -> str:
    return str(value or "").replace("-", "").lower()


def ended_text(end: dict | None) -> str:
    """How the last verified invocation ended, in words, from the plan probe's ``verified_end``
    (module_utils/sglang_journal.py invocation_end, read on the host)."""
    if not end:
        return "how it ended is not in the journal (rotated, or an earlier boot's journal was not kept)"
    parts = []
    if end.get("code") in ("killed", "dumped"):
        parts.append(f"its main process was {end['code']} by signal {end.get('status')}/{end.get('signal')}")
    elif end.get("code"):
        parts.append(f"its main process {end['code']} with status {end.get('status')}")
    if end.get("result") and end["result"] != "success":
        parts.append(f"result '{end['result']}'")
    if end.get("restart_counter") is not None:
        parts.append(
            f"systemd restarted the unit by itself (Restart=, restart counter {end['restart_counter']})"
        )
    elif end.get("job"):
        clean = "exited cleanly, " if end.get("result") == "success" else ""
        parts.append(f"{clean}stopped by a `systemctl {end['job']}` job (by hand or a tool, not Restart=)")
    elif end.get("result") == "success":
        parts.append("exited cleanly")
    when = f"ended {end['ended']}" if end.get("ended") else "ended"
    return f"it {when}: " + (", ".join(parts) if parts else "systemd logged no exit, result or job for it")


def invocation_drift(report: dict) -> str | None:
    """The finding of a running invocation that is not the last verified deploy's (a crash-restart by systemd,
    a restart by hand, a reboot); None when it is, or when either is unknown."""
    verified = invocation_id((report.get("known_good") or {}).get("invocation_id"))
    running = invocation_id(report.get("invocation_id"))
    if not verified or not running or verified == running:
        return None
    started = report.get("invocation_started") or "at an unknown time"
    restarts = report.get("n_restarts")
    counter = (
        f"; NRestarts={restarts} now (systemd's own restarts since the unit was last started by a job)"
        if str(restarts or "") != ""
        else ""
    )
    return (
        f"running invocation {running} (started {started}) is not the last verified deploy's {verified}: "
        + ended_text(report.get("verified_end"))
        + counter
    )


def drift_findings(report: dict) -> list[str]:
    """How the host differs from git (and from its last verified deploy); [] = no drift."""
    if report.get("status") != "ok":
        return []
    out = []
    if report.get("install_needed"):
        out.append(f"SGLang {report.get('sglang_version')} is not what is installed")
    if report["unit"]["changed"]:
        out.append(f"{report['unit']['path']} differs from what git renders")
    if report["env"]["changed"]:
        out.append(f"{report['env']['path']} differs from what git renders")
    if (report.get("config") or {}).get("changed"):
        out.append(f"{report['config']['path']} (the secrets) differs from what git renders (by sha256)")
    kg = report.get("known_good") or {}
    unit_sha, env_sha = report["unit"].get("sha256"), report["env"].get("sha256")
    if kg.get("unit_sha256") and unit_sha and kg["unit_sha256"] != unit_sha:
        out.append(f"unit sha256 {unit_sha[:12]} is not the last verified deploy's {kg['unit_sha256'][:12]}")
    if kg.get("env_sha256") and env_sha and kg["env_sha256"] != env_sha:
        out.append(
            f"environment file sha256 {report['env']['sha256'][:12]} is not the last verified "
            f"deploy's {kg['env_sha256'][:12]}"
        )
    if report.get("need_daemon_reload"):
        out.append("systemd holds an older unit definition (NeedDaemonReload=yes)")
    if report.get("active_state") and report["active_state"] != "active":
        main = report.get("main_exit") or {}
        code = CLD_CODES.get(str(main.get("code") or ""))
        how = (
            f" (main process {code}, status {main.get('status')}, result '{main.get('result')}')"
            if code
            else ""
        )
        out.append(f"the service is {report['active_state']}{how}")
    restarted = invocation_drift(report)
    if restarted:
        out.append(restarted)
    for d in report.get("foreign_dropins") or []:
        state = "loaded" if d.get("loaded") else "on disk, not loaded yet"
        lines = " | ".join(d["lines"]) if d.get("lines") is not None else "(unreadable)"
        out.append(f"drop-in {d['path']} ({state}) is not rendered by git: {lines}")
    for line in report.get("running_argv_diff") or []:
        out.append(f"running command line: {line}")
    rows = running_rows(report)
    if rows:
        out.append(
            "running arguments differ from git: "
            + ", ".join(f"{r['key']} {fmt(r['running'])} (git: {fmt(r['intended'])})" for r in rows)
        )
    return out


# ---- reports ----------------------------------------------------------------------------------


def fmt(value) -> str:
    if value is None:
        return "(not set)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def collect(report_dir: Path, hosts: list[str], logtext: str, rc: int) -> dict[str, dict]:
    reports = {}
    for host in hosts:
        path = report_dir / f"{valid_host(host, 'report')}.json"
        if path.exists():
            reports[host] = json.loads(path.read_text())
        else:
            why = failure_lines(logtext, host) or (
                f"ansible-playbook exited {rc} before the host's report was written"
            )
            reports[host] = {"host": host, "status": "error", "error": why}
    return reports


def md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


def host_section(name: str, report: dict, mode: str) -> str:
    out = []
    if report.get("status") != "ok":
        out.append(f"### {name}: ERROR\n\n")
        out.append(fence(report.get("error") or "unknown error"))
        return "".join(out) + "\n"
    findings = host_changes(report) if mode == "plan" else drift_findings(report)
    if mode == "plan":
        title = "WILL RESTART" if report.get("restart") else "changes without restart"
        title = title if findings else "no change"
    else:
        title = "in sync with git" if not findings else "DRIFT"
    out.append(f"### {name}: {title}\n\n")
    invocation, state = report.get("invocation_id") or "-", report.get("active_state") or "unknown"
    out.append(f"InvocationID `{invocation}`, service {state}.\n\n")
    if not report.get("inspectable", True):
        out.append(
            f"SGLang {report.get('sglang_version')} is not installed yet: the command line, unit and "
            "environment file cannot be rendered before it is (the apply installs it first).\n\n"
        )
    if mode == "drift" and findings:
        out += [f"- {f}\n" for f in findings]
        out.append("\n")
        end = report.get("verified_end") or {}
        if invocation_drift(report) and end.get("last_lines"):
            verified = end.get("invocation_id")
            out.append(f"Last lines of the verified invocation `{verified}` (redacted on the host):\n\n")
            out.append(fence("\n".join(end["last_lines"])))
            out.append("\n")
    if report.get("restart_reasons"):
        verb = "Restart" if mode == "plan" else "An apply would restart"
        out.append(f"{verb}: {', '.join(report['restart_reasons'])}.\n\n")
    rows = running_rows(report)
    if rows:
        source = rows[0]["source"] or "no source answered"
        out.append(f"**Running arguments** (running now, from `{source}` -> from git):\n\n")
        out.append(fence("\n".join(f"{r['key']}: {fmt(r['running'])} -> {fmt(r['intended'])}" for r in rows)))
        out.append("\n")
    elif report.get("running_msg") and report.get("running_diff"):
        out.append(fence("\n".join(report["running_diff"])))
    diff = unit_diff_text(report)
    if diff:
        out.append(f"<details><summary>Unit diff <code>{report['unit']['path']}</code></summary>\n\n")
        out.append(fence(diff, "diff"))
        out.append("\n</details>\n\n")
    env_rows = report["env"].get("diff") or []
    if env_rows or report["env"]["changed"]:
        out.append(f"**Environment file** `{report['env']['path']}` (secret values masked):\n\n")
        if env_rows:
            out.append("| variable | change | on the host | from git |\n|---|---|---|---|\n")
            for r in env_rows:
                out.append(
                    f"| `{md_escape(r['key'])}` | {r['change']} | {md_escape(fmt(r['before']))} "
                    f"| {md_escape(fmt(r['after']))} |\n"
                )
        else:
            out.append("changed (file metadata, or the file is missing)\n")
        out.append("\n")
    if report["env"].get("api_key_from_host"):
        out.append(
            "The plan holds no secret: the --config file (the API key) was not compared, a key rotation "
            "does not show in this plan.\n\n"
        )
    return "".join(out)


TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def plan_context(meta: dict, reports: dict[str, dict], notes: list[str]) -> dict:
    """What templates/plan-comment.md.j2 shows, computed from the per-host reports."""
    hosts, sections = [], []
    for name, r in reports.items():
        if r.get("status") != "ok":
            hosts.append({"name": name, "cell": "ERROR", "restart": "?"})
            sections.append({"name": name, "error": r.get("error") or "unknown error"})
            continue
        what = host_changes(r)
        hosts.append(
            {
                "name": name,
                "cell": ", ".join(what) if what else "none",
                "restart": "yes" if r.get("restart") else "no",
            }
        )
        title = ("WILL RESTART" if r.get("restart") else "changes without restart") if what else "no change"
        rows = running_rows(r)
        sections.append(
            {
                "name": name,
                "error": None,
                "title": title,
                "invocation": r.get("invocation_id") or "-",
                "state": r.get("active_state") or "unknown",
                "inspectable": r.get("inspectable", True),
                "sglang_version": r.get("sglang_version"),
                "restart_reasons": r.get("restart_reasons") or [],
                "running_rows": rows,
                "running_diff": (r.get("running_diff") or []) if r.get("running_msg") else [],
                "unit_diff": unit_diff_text(r),
                "unit_path": r["unit"]["path"],
                "env_rows": r["env"].get("diff") or [],
                "env_changed": r["env"]["changed"],
                "env_path": r["env"]["path"],
                "api_key_from_host": r["env"].get("api_key_from_host"),
                "config_changed": bool((r.get("config") or {}).get("changed")),
                "config_path": (r.get("config") or {}).get("path"),
            }
        )
    return {
        "marker": PLAN_MARKER,
        "base": meta["base"],
        "head": meta["head"],
        "inventory": meta["inventory"],
        "hosts": hosts,
        "sections": sections,
        "notes": notes,
        "changed": [h for h in hosts if h["cell"] not in ("none", "ERROR")],
        "errors": [h for h in hosts if h["cell"] == "ERROR"],
        "code_changed": meta.get("code_changed") or [],
        "data_changes": meta.get("data_changes") or [],
        "changed_files": meta.get("changed_files") or [],
    }


def clip(body: str) -> str:
    if len(body) > BODY_LIMIT:
        body = body[: BODY_LIMIT - 200] + "\n\n... (truncated; the full report is in the job's artifacts)\n"
    return body


def significant(value) -> str:
    """A canary figure in four significant digits, '-' when there was none."""
    return "-" if value is None else f"{value:.4g}"


def comment_template(name: str):
    """templates/<name> (of the checkout this tool runs from) with the Markdown filters: fence (a code block
    that survives any backticks in its text), md_escape (a table cell), fmt (a value as the server reports
    it), significant (a figure)."""
    try:
        import jinja2
    except ImportError as exc:
        raise GitopsError(
            f"the comments are Jinja templates ({exc}): run with the controller virtualenv (make venv)"
        ) from None
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(fence=fence, md_escape=md_escape, fmt=fmt, significant=significant)
    return env.get_template(name)


def render_plan(meta: dict, reports: dict[str, dict], notes: list[str]) -> str:
    """The plan comment from templates/plan-comment.md.j2."""
    return clip(comment_template("plan-comment.md.j2").render(**plan_context(meta, reports, notes)))


def render_apply(record: dict, rows: list[dict], canary: dict | None, resume: str) -> str:
    """The apply comment from templates/apply-comment.md.j2: what tools/gitops/apply recorded (apply.json),
    each host's row of tools/rollout_status.py and the canary's verdict with its figures and thresholds."""
    if canary and canary.get("checks"):
        checks = [{**check, "limit_text": sglang_canary.limit_text(check)} for check in canary["checks"]]
        canary = {**canary, "checks": checks}
    template = comment_template("apply-comment.md.j2")
    return clip(template.render(marker=APPLY_MARKER, record=record, rows=rows, canary=canary, resume=resume))


def render(mode: str, meta: dict, reports: dict[str, dict], notes: list[str]) -> str:
    if mode == "plan":
        return render_plan(meta, reports, notes)
    marker = PLAN_MARKER if mode == "plan" else DRIFT_MARKER
    judge = host_changes if mode == "plan" else drift_findings
    errors = [h for h, r in reports.items() if r.get("status") != "ok"]
    changed = [h for h, r in reports.items() if judge(r)]
    head = [marker, ""]
    if mode == "plan":
        head.append(
            f"## SGLang deploy plan: {len(changed)} of {len(reports)} hosts change"
            + (f", {len(errors)} ERROR" if errors else "")
        )
        head.append("")
        head.append(
            f"base `{meta['base'][:12]}` -> head `{meta['head'][:12]}`, inventory `{meta['inventory']}`. "
            "Computed in check mode with read-only queries: no host was changed."
        )
    else:
        head.append(
            f"## SGLang drift: {len(changed)} of {len(reports)} hosts differ from git"
            + (f", {len(errors)} ERROR" if errors else "")
        )
        head.append("")
        head.append(f"ref `{meta['head'][:12]}`, inventory `{meta['inventory']}`, checked {meta['finished']}")
    head.append("")
    head.append("| host | " + ("changes" if mode == "plan" else "drift") + " | restart |")
    head.append("|---|---|---|")
    for host, r in reports.items():
        if r.get("status") != "ok":
            head.append(f"| {host} | ERROR | ? |")
            continue
        what = judge(r)
        cell = (", ".join(what) if mode == "plan" else f"{len(what)} finding(s)") if what else "none"
        head.append(f"| {host} | {md_escape(cell)} | {'yes' if r.get('restart') else 'no'} |")
    head.append("")
    for note in notes:
        head.append(f"> {note}")
    if notes:
        head.append("")
    if mode == "plan" and meta.get("changed_files"):
        head.append("<details><summary>Files changed between base and head</summary>\n")
        head.append(fence("\n".join(meta["changed_files"])))
        head.append("</details>\n")
    return clip("\n".join(head) + "\n" + "".join(host_section(h, r, mode) for h, r in reports.items()))


def summary(mode: str, meta: dict, reports: dict[str, dict], rc: int) -> dict:
    judge = host_changes if mode == "plan" else drift_findings
    hosts = {}
    for host, r in reports.items():
        entry = {"status": r.get("status"), "error": r.get("error")}
        if r.get("status") == "ok":
            entry.update(
                changes=judge(r) if mode == "plan" else [],
                drift=drift_findings(r),
                restart=bool(r.get("restart")),
                restart_reasons=r.get("restart_reasons", []),
                invocation_id=r.get("invocation_id"),
                invocation={
                    "running": r.get("invocation_id"),
                    "started": r.get("invocation_started"),
                    "last_verified": (r.get("known_good") or {}).get("invocation_id"),
                    "n_restarts": r.get("n_restarts"),
                    "verified_end": r.get("verified_end"),
                },
                running_args_diff=running_rows(r),
                unit_changed=r["unit"]["changed"],
                unit_sha256=r["unit"].get("sha256"),
                env_changed=r["env"]["changed"],
                env_sha256=r["env"].get("sha256"),
                env_diff=r["env"].get("diff", []),
                config_changed=bool((r.get("config") or {}).get("changed")),
                config_sha256=(r.get("config") or {}).get("sha256"),
            )
        hosts[host] = entry
    errors = sorted(h for h, e in hosts.items() if e["status"] != "ok")
    changed = sorted(h for h, r in reports.items() if judge(r))
    status = "error" if errors or rc != 0 else ("changes" if changed else "no_change")
    if mode == "drift" and status == "changes":
        status = "drift"
    return {
        "mode": mode,
        "status": status,
        **meta,
        "ansible_rc": rc,
        "changed_hosts": changed,
        "error_hosts": errors,
        "hosts": hosts,
    }


def exit_status(summ: dict) -> int:
    if summ["status"] == "error":
        return EXIT_ERROR
    return EXIT_CHANGES if summ["changed_hosts"] else EXIT_OK


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- inspection (plan and drift) --------------------------------------------------------------


def role_spec_texts(tree: Path) -> dict[str, str]:
    specs = sorted((tree / "roles").glob("*/meta/argument_specs.yml"))
    return {p.parent.parent.name: p.read_text() for p in specs}


def pr_data(repo: Path, base: str, head: str, tree: Path) -> dict:
    """Bring the pull request's DATA (inventory and variable files) into `tree`, the base's code,
    after checking each changed file (tools/gitops/datacheck.py); list the code it changes."""
    try:
        import datacheck
    except ImportError as exc:
        raise GitopsError(
            f"the plan checks the pull request's data with PyYAML and ansible-core ({exc}): "
            "run it with the controller virtualenv's python (make venv)"
        ) from None
    raw = str(git(repo, "diff", "--raw", "--no-renames", "--no-abbrev", "-z", base, head))
    fields = raw.split("\0")
    entries = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i], fields[i + 1]
        if not meta.startswith(":"):
            continue
        old_mode, new_mode, _, _, status = meta[1:].split()[:5]
        entries.append((status[0], path, new_mode if status[0] != "D" else old_mode))
    specs = datacheck.role_specs(role_spec_texts(tree))
    out: dict = {"data": [], "code": [], "inert": [], "data_changes": [], "errors": []}
    for status, path, mode in entries:
        kind = datacheck.classify(path, mode)
        out[kind].append(f"{status}  {path}")
        if kind != "data":
            continue
        target = tree / path
        if status == "D":
            if target.exists():
                target.unlink()
            out["data_changes"].append(f"{path}: removed")
            continue
        head_text = str(git(repo, "show", f"{head}:{path}"))
        base_text = str(git(repo, "show", f"{base}:{path}")) if tracked(repo, base, path) else None
        try:
            changes = datacheck.check_file(path, head_text, base_text, specs)
        except datacheck.DataError as exc:
            out["errors"].append(str(exc))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_text(head_text)
        target.chmod(0o644)
        out["data_changes"] += [f"{path}: {c}" for c in changes] or [f"{path}: no variable changed"]
    return out


def refused_report(meta: dict, errors: list[str]) -> str:
    return "\n".join(
        [
            PLAN_MARKER,
            "",
            "## SGLang deploy plan: REFUSED, the pull request's data did not pass the checks",
            "",
            f"base `{meta['base'][:12]}` -> head `{meta['head'][:12]}`, inventory `{meta['inventory']}`. "
            "No host was contacted.",
            "",
            *[f"- {md_escape(e)}" for e in errors],
            "",
        ]
    )


DEFAULT_PLAN_USER = "sglang-plan"


def plan_connection(args) -> dict:
    """Extra variables (the highest precedence: no inventory can override them) that make ansible connect
    as the plan account, never root and without become (docs/gitops.md, trust model)."""
    user = getattr(args, "plan_user", None) or DEFAULT_PLAN_USER
    if names.account_problem(user) or user == "root":
        raise GitopsError(f"--plan-user {user!r}: not a non-root account name")
    out = {"ansible_user": user, "ansible_become": False}
    key = getattr(args, "private_key", None)
    if key:
        path = Path(key).expanduser().resolve()
        if not path.is_file():
            raise GitopsError(f"--private-key {key}: no such file")
        out["ansible_ssh_private_key_file"] = str(path)
    return out


def inspect(tool: str, mode: str, args) -> int:
    """plan: the BASE revision's code (the checkout this runs from, or --base) with the pull request's
    data (--head), checked first; drift: everything from --ref."""
    repo = repo_root(args.repo)
    out = Path(args.out or (repo / "out" / mode)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    head = resolve(repo, args.head, "--head")
    base = None
    if mode == "plan":
        base = resolve(repo, getattr(args, "base", None) or "HEAD", "--base")
    relinv = inventory_relpath(repo, args.inventory)
    playbook = "playbooks/plan.yml" if mode == "plan" else "playbooks/drift.yml"
    notes: list[str] = []
    meta = {"base": base or head, "head": head, "inventory": relinv, "started": now()}
    if base:
        meta["changed_files"] = [
            ln.replace("\t", "  ") for ln in str(git(repo, "diff", "--name-status", base, head)).splitlines()
        ]
    with tempfile.TemporaryDirectory(prefix=f"sglang-gitops-{mode}-") as tmp:
        tree = Path(tmp) / "tree"
        reports_dir = Path(tmp) / "reports"
        tree.mkdir()
        reports_dir.mkdir(mode=0o700)
        # The code that runs is the base's (plan) or the ref's (drift); never the pull request's.
        materialise(repo, base or head, tree)
        if not (tree / playbook).is_file():
            raise GitopsError(f"{playbook} does not exist at {(base or head)[:12]}")
        if mode == "plan":
            trust = pr_data(repo, base, head, tree)
            meta.update(
                code_changed=trust["code"], data_changed=trust["data"], data_changes=trust["data_changes"]
            )
            if trust["errors"]:
                (out / "plan.md").write_text(refused_report(meta, trust["errors"]))
                summ = {
                    "mode": mode,
                    "status": "error",
                    **meta,
                    "refused": trust["errors"],
                    "changed_hosts": [],
                    "error_hosts": [],
                    "hosts": {},
                }
                (out / "plan.json").write_text(json.dumps(summ, indent=2, sort_keys=True) + "\n")
                raise GitopsError(
                    "the pull request's data was refused (nothing was planned):\n  "
                    + "\n  ".join(trust["errors"])
                )
        note = place_inventory(repo, head, relinv, tree)
        if note:
            notes.append(note)
        env = ansible_env(repo, tree, scrub=mode == "plan")
        playbook_bin = find_tool(repo, "ansible-playbook", args.ansible_playbook)
        inventory_bin = str(Path(playbook_bin).with_name("ansible-inventory"))
        hosts = inventory_hosts(inventory_bin, env, tree, relinv, args.limit)
        if not hosts:
            raise GitopsError(
                f"--inventory {relinv}: no hosts in group gpu_nodes"
                + (f" matching --limit {args.limit}" if args.limit else "")
            )
        argv = [
            playbook_bin,
            "-i",
            relinv,
            playbook,
            "--check",
            "--diff",
            "-e",
            json.dumps(
                {
                    "gitops_report_dir": str(reports_dir),
                    "gitops_api_key_from_host": bool(args.secrets_from_host),
                    **plan_connection(args),
                }
            ),
        ]
        if args.limit:
            argv += ["--limit", args.limit]
        if getattr(args, "vault_password_file", None):
            argv += ["--vault-password-file", str(Path(args.vault_password_file).resolve())]
        logfile = out / f"{mode}-ansible.log"
        log(tool, f"{mode} of {head[:12]} on {len(hosts)} host(s); ansible log: {logfile}")
        rc = run_logged(argv, env, tree, logfile, args.verbose, args.timeout)
        meta["finished"] = now()
        reports = collect(reports_dir, hosts, logfile.read_text(errors="replace"), rc)
    if rc != 0 and all(r.get("status") == "ok" for r in reports.values()):
        notes.append(f"ansible-playbook exited {rc}: see {logfile.name}")
    body = render(mode, meta, reports, notes)
    summ = summary(mode, meta, reports, rc)
    (out / f"{mode}.md").write_text(body)
    (out / f"{mode}.json").write_text(json.dumps(summ, indent=2, sort_keys=True) + "\n")
    print(body)
    log(tool, f"{summ['status']}: {out / (mode + '.md')}, {out / (mode + '.json')}")
    return exit_status(summ)


# ---- the deploy lock --------------------------------------------------------------------------


def default_lock_dir() -> Path:
    """$XDG_RUNTIME_DIR/sglang-gitops, else ~/.cache/sglang-gitops: never a shared /tmp or /var/lock."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime) / "sglang-gitops"
    return Path.home() / ".cache" / "sglang-gitops"


def private_dir(path: Path, flag: str) -> int:
    """Open `path` (created 0700 when missing) as a directory fd, refusing a symlink, a directory that
    is not the invoking user's, or one that anybody else may write to or read."""
    if not path.exists() and not path.is_symlink():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise GitopsError(
            f"{flag} {path}: not a directory of this user's ({exc.strerror}; a symlink is never followed)"
        ) from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        problem = f"mode {stat.S_IMODE(st.st_mode):04o}, others may create or replace files in it"
    if problem:
        os.close(fd)
        raise GitopsError(f"{flag} {path}: {problem}; use a directory of your own with mode 0700")
    return fd


def lock_path(lock_dir: Path, relinv: str) -> Path:
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", relinv).strip("_")
    return lock_dir / f"{key}.lock"


def open_private_file(dir_fd: int, name: str, path: Path, flag: str) -> int:
    """Open (create 0600) a regular file of this user's inside `dir_fd`, never through a symlink."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise GitopsError(f"{flag}: {path}: {exc.strerror} (a symlink is never followed)") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise GitopsError(f"{flag}: {path} is not a regular file of this user's")
    return fd


@contextlib.contextmanager
def deploy_lock(lock_dir: Path, relinv: str, wait: float, holder: dict):
    """flock(2) on a lock file keyed by the inventory: one deploy per inventory at a time.

    The lock directory is this user's, mode 0700; neither it nor the lock file is opened through a
    symlink, so another local user can neither pre-create the lock nor point it at a file to truncate."""
    path = lock_path(lock_dir, relinv)
    dir_fd = private_dir(lock_dir, "--lock-dir")
    try:
        fd = open_private_file(dir_fd, path.name, path, "--lock-dir")
    finally:
        os.close(dir_fd)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    who = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                    raise LockHeld(
                        f"another deploy of {relinv} holds {path} ({who}); waited {wait:.0f} s (--wait)"
                    ) from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        yield path
    finally:
        os.close(fd)
