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
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

PLAN_MARKER = "<!-- sglang-gitops-plan -->"
DRIFT_MARKER = "<!-- sglang-gitops-drift -->"
# GitHub refuses comment and issue bodies over 65536 characters.
BODY_LIMIT = 60000
EXIT_OK, EXIT_ERROR, EXIT_CHANGES = 0, 1, 2


class GitopsError(Exception):
    """An error the user can act on; the message names the ref, file or flag concerned."""


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


def ansible_env(repo: Path, tree: Path) -> dict[str, str]:
    env = dict(os.environ)
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


def inventory_hosts(ansible_inventory: str, env: dict[str, str], tree: Path, inventory: str,
                    limit: str | None) -> list[str]:
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
    return sorted(set(hosts))


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
    if report.get("need_daemon_reload"):
        out.append("daemon-reload")
    if running_rows(report):
        out.append("running arguments")
    if report.get("restart"):
        out.append("restart")
    return out


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
        out.append(f"the service is {report['active_state']}")
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
        path = report_dir / f"{host}.json"
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
        out.append(f"SGLang {report.get('sglang_version')} is not installed yet: the command line, unit and "
                   "environment file cannot be rendered before it is (the apply installs it first).\n\n")
    if mode == "drift" and findings:
        out += [f"- {f}\n" for f in findings]
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
        out.append("The API key was taken from the host: a key rotation does not show in this plan.\n\n")
    return "".join(out)


def render(mode: str, meta: dict, reports: dict[str, dict], notes: list[str]) -> str:
    marker = PLAN_MARKER if mode == "plan" else DRIFT_MARKER
    judge = host_changes if mode == "plan" else drift_findings
    errors = [h for h, r in reports.items() if r.get("status") != "ok"]
    changed = [h for h, r in reports.items() if judge(r)]
    head = [marker, ""]
    if mode == "plan":
        head.append(f"## SGLang deploy plan: {len(changed)} of {len(reports)} hosts change"
                    + (f", {len(errors)} ERROR" if errors else ""))
        head.append("")
        head.append(
            f"base `{meta['base'][:12]}` -> head `{meta['head'][:12]}`, inventory `{meta['inventory']}`. "
            "Computed in check mode with read-only queries: no host was changed."
        )
    else:
        head.append(f"## SGLang drift: {len(changed)} of {len(reports)} hosts differ from git"
                    + (f", {len(errors)} ERROR" if errors else ""))
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
    body = "\n".join(head) + "\n" + "".join(host_section(h, r, mode) for h, r in reports.items())
    if len(body) > BODY_LIMIT:
        body = body[: BODY_LIMIT - 200] + "\n\n... (truncated; the full report is in the job's artifacts)\n"
    return body


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
                running_args_diff=running_rows(r),
                unit_changed=r["unit"]["changed"],
                unit_sha256=r["unit"].get("sha256"),
                env_changed=r["env"]["changed"],
                env_sha256=r["env"].get("sha256"),
                env_diff=r["env"].get("diff", []),
            )
        hosts[host] = entry
    errors = sorted(h for h, e in hosts.items() if e["status"] != "ok")
    changed = sorted(h for h, r in reports.items() if judge(r))
    status = "error" if errors or rc != 0 else ("changes" if changed else "no_change")
    if mode == "drift" and status == "changes":
        status = "drift"
    return {"mode": mode, "status": status, **meta, "ansible_rc": rc, "changed_hosts": changed,
            "error_hosts": errors, "hosts": hosts}


def exit_status(summ: dict) -> int:
    if summ["status"] == "error":
        return EXIT_ERROR
    return EXIT_CHANGES if summ["changed_hosts"] else EXIT_OK


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- inspection (plan and drift) --------------------------------------------------------------

def inspect(tool: str, mode: str, args) -> int:
    repo = repo_root(args.repo)
    out = Path(args.out or (repo / "out" / mode)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    head = resolve(repo, args.head, "--head")
    base = resolve(repo, args.base, "--base") if getattr(args, "base", None) else None
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
        materialise(repo, head, tree)
        if not (tree / playbook).is_file():
            raise GitopsError(f"--head {args.head}: {playbook} does not exist at {head[:12]}")
        note = place_inventory(repo, head, relinv, tree)
        if note:
            notes.append(note)
        env = ansible_env(repo, tree)
        playbook_bin = find_tool(repo, "ansible-playbook", args.ansible_playbook)
        inventory_bin = str(Path(playbook_bin).with_name("ansible-inventory"))
        hosts = inventory_hosts(inventory_bin, env, tree, relinv, args.limit)
        if not hosts:
            raise GitopsError(f"--inventory {relinv}: no hosts in group gpu_nodes" + (
                f" matching --limit {args.limit}" if args.limit else ""))
        argv = [playbook_bin, "-i", relinv, playbook, "--check", "--diff",
                "-e", json.dumps({"gitops_report_dir": str(reports_dir),
                                  "gitops_api_key_from_host": bool(args.secrets_from_host)})]
        if args.limit:
            argv += ["--limit", args.limit]
        if args.vault_password_file:
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

def lock_path(lock_dir: Path, relinv: str) -> Path:
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", relinv).strip("_")
    return lock_dir / f"{key}.lock"


@contextlib.contextmanager
def deploy_lock(lock_dir: Path, relinv: str, wait: float, holder: dict):
    """flock(2) on a lock file keyed by the inventory: one deploy per inventory at a time."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(lock_dir, relinv)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    try:
                        with open(path, encoding="utf-8") as f:
                            who = f.read().strip() or "unknown"
                    except OSError:
                        who = "unknown"
                    raise GitopsError(
                        f"another deploy of {relinv} holds {path} ({who}); waited {wait:.0f} s (--wait)"
                    ) from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(holder) + "\n").encode())
        yield path
    finally:
        os.close(fd)
