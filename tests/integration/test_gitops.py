"""GitOps against a real lab host: plan on a git change, apply, drift, pull mode; workflow lint.

One lab host (systemd-nspawn, SSH) for every case, in file order:
  1. a temporary clone of this repository gets a base commit (lab inventory force-added, an API key
     sentinel, fast verification) that tools/gitops/apply deploys, and a head commit that changes the
     draft window 2048 -> 4096 and rotates the API key;
  2. tools/gitops/plan of a head that also plants a `check_mode: false` task writing a file (code)
     runs the base's code with the head's data, connected as the plan account (sglang-plan, set up by
     the base's deploy, no become): it names the host, shows
     `speculative_draft_window_size: 2048 -> 4096` in the running-arguments diff and a restart, says
     "code changed: needs review", masks every secret (a CI token in its environment reaches neither
     ansible nor the output), exits 2, and leaves the host as it was (no planted file, same unit/env
     hashes, same InvocationID, same history); the plan account, tried for real, reads neither the
     environment nor the --config file nor the known-good record, writes nothing in the unit directory,
     cannot restart, stop or signal the service, and its probe's answer holds no secret;
  3. tools/gitops/apply deploys head and the server reports 4096; a second apply of the same inventory
     while the lock is held fails at once naming the holder; drift right after the apply finds nothing;
  4. a restart by hand with the same arguments after a verified deploy is reported by tools/gitops/drift,
     naming the running and the verified invocation and how the verified one ended; a hand edit of the unit
     (window 1024, daemon-reload, restart) is reported both as a file difference and as running arguments
     that differ from git;
  5. pull mode: playbooks/pull.yml installs git (.deb files downloaded on the controller; the host has
     no network), ansible-core (lab wheelhouse) and the timer; a `git daemon` on the controller end of
     the host's veth serves a bare copy of the clone; a run applies the signed commit (window back to
     4096, verified), the next run does nothing (same InvocationID); a replayed older signed commit, a
     signed commit of another branch and an unsigned commit are refused with the host untouched, and a
     refusal is reported once (the next run exits 0 without retrying);
  6. the workflow files pass actionlint and zizmor.

Host: the shared, deployed lab host of tests/integration/conftest.py (fixture lab_inventory: one per
pytest-xdist worker, or LAB_REUSE_INVENTORY=<inventory inside inventory/lab/>), restored to the window 2048
baseline at the end.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labtools import ssh_argv

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
TOOLS = REPO / "tools" / "gitops"
WHEELHOUSE = Path(os.environ.get("WHEELHOUSE", "/var/cache/sglang-lab/wheelhouse"))
DEB_CACHE = Path(os.environ.get("GITOPS_DEB_CACHE", "/var/cache/sglang-lab/debs-git"))
UNIT_PATH = "/etc/systemd/system/sglang.service"
ENV_PATH = "/etc/sglang/sglang.env"
SECRET_A = "sentinel-gitops-key-A-5c1f9e"
SECRET_B = "sentinel-gitops-key-B-7d20aa"
TEST_VARS = "inventory/lab/group_vars/gpu_nodes/zz_gitops_test.yml"
PULL_BRANCH = "deploy-lab"
PLANTED_FILE = "/root/gitops-planted"
PLAN_USER = "sglang-plan"
PROBE_SOCKET = "/run/sglang-plan-probe.sock"
SENTINEL_ENV = "sentinel-gitops-ci-token-41d7"
PLANTED_TASK = f"""
- name: Planted by a pull request
  ansible.builtin.copy:
    content: "{{{{ sglang_api_key }}}} {{{{ lookup('ansible.builtin.env', 'GITLAB_API_TOKEN') }}}}"
    dest: {PLANTED_FILE}
    mode: "0600"
  check_mode: false
"""


def run(argv, cwd=REPO, check=True, timeout=900, env=None, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env, **kw
    )
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} -> rc {r.returncode}\n{r.stdout[-6000:]}\n{r.stderr[-4000:]}")
    return r


class Host:
    def __init__(self, inventory: Path):
        self.inventory = inventory
        data = yaml.safe_load(inventory.read_text())
        hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
        self.name = sorted(hosts)[0]
        self.vars = hosts[self.name]
        self.address = self.vars["ansible_host"]
        # The controller end of the host's veth (/30: .1 is the controller, .2 the host).
        self.controller_address = self.address.rsplit(".", 1)[0] + ".1"

    def ssh(self, command: str, check=True, timeout=300, user=None) -> subprocess.CompletedProcess:
        return run(ssh_argv(self.vars, command, user=user), check=check, timeout=timeout)

    def state(self) -> dict:
        out = self.ssh(
            f"echo unit=$(sha256sum < {UNIT_PATH} | cut -d' ' -f1);"
            f" echo env=$(sha256sum < {ENV_PATH} | cut -d' ' -f1);"
            " systemctl show -p InvocationID -p MainPID -p ActiveState sglang.service;"
            " echo history=$(wc -l < /var/lib/sglang-deploy/history.jsonl)"
        ).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def server_info(self, key: str) -> dict:
        script = (
            "import json, urllib.request as u; r = u.Request('http://127.0.0.1:30000/server_info', "
            f"headers={{'Authorization': 'Bearer {key}'}});"
            " print(json.dumps(json.load(u.urlopen(r, timeout=10))))"
        )
        return json.loads(self.ssh(f"python3 -c {shlex.quote(script)}").stdout)

    def wait_healthy(self, timeout=120) -> None:
        deadline = time.monotonic() + timeout
        probe = (
            "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:30000/health', timeout=3)\""
        )
        while time.monotonic() < deadline:
            if self.ssh(probe, check=False).returncode == 0:
                return
            time.sleep(1)
        raise AssertionError(f"{self.name}: /health did not answer within {timeout} s")


@pytest.fixture(scope="module")
def host(lab_inventory):
    """The shared, deployed lab host of tests/integration/conftest.py (one per pytest-xdist worker).

    Left as the other tests expect it: pull mode removed, the window 2048 baseline deployed again."""
    if not any(WHEELHOUSE.glob("sglang-*.whl")) or not (WHEELHOUSE / "ansible-core").is_dir():
        pytest.fail(f"no complete wheelhouse in {WHEELHOUSE} (sglang, ansible-core/): run `make wheelhouse`")
    h = Host(Path(lab_inventory))
    yield h
    cleanup_pull(h)
    cleanup_plan_account(h)
    # Back to the baseline the other lab tests expect: window 2048, no API key (as LabHost.restore_baseline:
    # only the play that deploys SGLang, the lab inventory's stability window).
    run(
        [
            VENV_BIN / "ansible-playbook",
            "-i",
            h.inventory,
            "--limit",
            f"{h.name},localhost",
            "playbooks/sglang.yml",
            "-e",
            "window=2048",
            "-e",
            json.dumps({"sglang_stable_seconds": 3, "sglang_health_count": 2}),
        ],
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
    )


def cleanup_pull(h: Host) -> None:
    h.ssh(
        "systemctl disable --now sglang-pull.timer 2>/dev/null;"
        " systemctl stop sglang-pull.service 2>/dev/null;"
        " rm -f /etc/systemd/system/sglang-pull.service /etc/systemd/system/sglang-pull.timer;"
        " rm -rf /etc/sglang-pull /var/lib/sglang-pull /usr/local/sbin/sglang-pull; systemctl daemon-reload",
        check=False,
    )


def cleanup_plan_account(h: Host) -> None:
    """The plan account and its probe, set up by the base commit's deploy (other tests' hosts have none)."""
    h.ssh(
        "systemctl disable --now sglang-plan-probe.socket 2>/dev/null;"
        " rm -f /etc/systemd/system/sglang-plan-probe.socket '/etc/systemd/system/sglang-plan-probe@.service'"
        " /etc/sglang/sglang.plan-probe.json /usr/local/lib/sglang-deploy/plan-probe"
        " /usr/local/lib/sglang-deploy/sglang_redact.py /usr/local/lib/sglang-deploy/sglang_journal.py;"
        f" systemctl daemon-reload; userdel -r {PLAN_USER} 2>/dev/null; groupdel {PLAN_USER} 2>/dev/null;"
        " true",
        check=False,
    )


def plan_public_key(h: Host) -> str:
    # The lab's key logs in as the plan account too (a site gives the plan its own key pair).
    return Path(h.vars["ansible_ssh_private_key_file"] + ".pub").read_text().strip()


def tool_env() -> dict:
    # The clone has no .venv and no installed collections: use this checkout's.
    return dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(REPO / ".ansible" / "collections"),
        PATH=f"{VENV_BIN}:{os.environ.get('PATH', '')}",
    )


def git(repo: Path, *args, **kw) -> str:
    return run(
        ["git", "-C", repo, "-c", "user.name=gitops test", "-c", "user.email=gitops@lab.invalid", *args], **kw
    ).stdout.strip()


def set_vars(repo: Path, window: int, key: str, plan_key: str) -> None:
    # The window is the group's setting (what a site changes in a pull request); the key and the fast
    # verification are this test's.
    gv = repo / "inventory" / "lab" / "group_vars" / "gpu_nodes" / "sglang.yml"
    text = gv.read_text()
    lines = [
        f"sglang_speculative_draft_window_size: {window}"
        if ln.startswith("sglang_speculative_draft_window_size:")
        else ln
        for ln in text.splitlines()
    ]
    gv.write_text("\n".join(lines) + "\n")
    (repo / TEST_VARS).write_text(
        "---\n# tests/integration/test_gitops.py\n"
        f"sglang_api_key: {key}\nsglang_stable_seconds: 5\nsglang_health_count: 2\n"
        f"sglang_plan_authorized_keys:\n  - {json.dumps(plan_key)}\n"
    )


@pytest.fixture(scope="module")
def clone(host, tmp_path_factory):
    """A clone of this repository's HEAD with the lab inventory committed; base deployed."""
    repo = tmp_path_factory.mktemp("gitops") / "repo"
    run(["git", "clone", "--quiet", "--no-hardlinks", REPO, repo])
    rel = host.inventory.relative_to(REPO)
    (repo / rel).write_text(host.inventory.read_text())
    set_vars(repo, 2048, SECRET_A, plan_public_key(host))
    git(repo, "add", "-f", rel, TEST_VARS, "inventory/lab/group_vars/gpu_nodes/sglang.yml")
    git(repo, "commit", "--quiet", "-m", "base: window 2048")
    base = git(repo, "rev-parse", "HEAD")
    r = apply(repo, rel, base, tmp_path_factory.mktemp("apply-base"))
    assert r.returncode == 0, f"apply of the base commit failed:\n{r.stdout[-6000:]}\n{r.stderr[-4000:]}"
    set_vars(repo, 4096, SECRET_B, plan_public_key(host))
    git(repo, "commit", "--quiet", "-am", "head: window 4096, rotate the API key")
    head = git(repo, "rev-parse", "HEAD")
    # The same data plus code: a task that check mode would run for real (check_mode: false).
    git(repo, "checkout", "--quiet", "-b", "gitops-planted", head)
    main = repo / "roles" / "sglang" / "tasks" / "main.yml"
    main.write_text(main.read_text() + PLANTED_TASK)
    git(repo, "commit", "--quiet", "-am", "head with code: a task check mode runs for real")
    planted = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "--quiet", "-")
    return {"repo": repo, "inventory": str(rel), "base": base, "head": head, "planted": planted}


def apply(repo, inventory, ref, out, lock_dir=None, check=False):
    argv = [
        TOOLS / "apply",
        "--repo",
        repo,
        "--inventory",
        inventory,
        "--ref",
        ref,
        "--out",
        out,
        "--lock-dir",
        lock_dir or (Path(out) / "locks"),
    ]
    return run(argv, cwd=repo, check=check, env=tool_env())


def drift(clone, out):
    """tools/gitops/drift of the clone's head against the host (exit status checked by the caller)."""
    argv = [TOOLS / "drift", "--repo", clone["repo"], "--inventory", clone["inventory"]]
    return run([*argv, "--ref", clone["head"], "--out", out], cwd=clone["repo"], check=False, env=tool_env())


def no_secret(*texts: str) -> None:
    for text in texts:
        for secret in (SECRET_A, SECRET_B):
            assert secret not in text, "a secret value reached the output"


def probe_runs(h: Host) -> int:
    """How many times the plan account (its UID) has started the plan probe on this boot (systemd's
    "Starting sglang-plan-probe@<n>-<pid>-<uid>.service ... (PID <pid>/UID <uid>)...")."""
    uid = h.ssh(f"id -u {PLAN_USER}").stdout.strip()
    r = h.ssh("journalctl -q -b -o cat -u 'sglang-plan-probe@*.service'", check=False)
    if r.returncode != 0 and "No data available" in r.stderr:
        return 0  # no probe unit has logged on this boot yet (journalctl finds no unit to filter by)
    assert r.returncode == 0, r.stderr
    journal = r.stdout
    return sum(1 for line in journal.splitlines() if line.startswith("Starting ") and f"/UID {uid})" in line)


def test_plan_shows_the_change_and_changes_nothing(host, clone, tmp_path):
    before = host.state()
    probes_before = probe_runs(host)
    # The head also changes code (a check_mode: false task writing a file): the plan runs the base's
    # code with the head's data, so the file never appears and the plan says the code changed. A CI
    # token in the plan job's environment reaches neither ansible nor the output.
    r = run(
        [
            TOOLS / "plan",
            "--repo",
            clone["repo"],
            "--inventory",
            clone["inventory"],
            "--base",
            clone["base"],
            "--head",
            clone["planted"],
            "--out",
            tmp_path,
        ],
        cwd=clone["repo"],
        check=False,
        env=dict(tool_env(), GITLAB_API_TOKEN=SENTINEL_ENV),
    )
    assert r.returncode == 2, f"plan should exit 2 (changes):\n{r.stdout}\n{r.stderr}"
    md = (tmp_path / "plan.md").read_text()
    summary = json.loads((tmp_path / "plan.json").read_text())
    log = (tmp_path / "plan-ansible.log").read_text()
    assert md.startswith("<!-- sglang-gitops-plan -->")
    assert summary["status"] == "changes" and summary["changed_hosts"] == [host.name]
    assert f"### {host.name}: WILL RESTART" in md
    assert "speculative_draft_window_size: 2048 -> 4096" in md
    entry = summary["hosts"][host.name]
    assert entry["restart"] is True and "the unit changed" in entry["restart_reasons"]
    # The window, and so the configuration's hash on every metric (P24).
    diff = {item["key"]: item for item in entry["running_args_diff"]}
    assert sorted(diff) == ["extra_metric_labels", "speculative_draft_window_size"], diff
    assert diff["speculative_draft_window_size"] == {
        "key": "speculative_draft_window_size",
        "running": 2048,
        "intended": 4096,
        "source": "server_info",
    }
    labels = diff["extra_metric_labels"]
    assert labels["intended"]["config_hash"] != labels["running"]["config_hash"], labels
    assert (
        '-    "--speculative-draft-window-size" "2048"' in md
        and '+    "--speculative-draft-window-size" "4096"' in md
    )
    # The rotated key (in SGLang's --config file) shows as a change by hash; its values never.
    assert entry["config_changed"] is True and "--config file (secrets)" in entry["changes"]
    assert "**--config file** `/etc/sglang/sglang.yaml`: changed" in md
    no_secret(md, json.dumps(summary), log, r.stdout, r.stderr)
    for text in (md, json.dumps(summary), log, r.stdout, r.stderr):
        assert SENTINEL_ENV not in text
    assert "**Code changed: needs review, not planned against production.**" in md
    assert summary["code_changed"] == ["M  roles/sglang/tasks/main.yml"]
    assert "Planted by a pull request" not in log
    assert host.ssh(f"test ! -e {PLANTED_FILE}", check=False).returncode == 0, "the planted task ran"
    # P12: nothing on the host changed.
    assert host.state() == before
    assert entry["invocation_id"] == before["InvocationID"]
    # It connected as the plan account (the role's plan asserts a non-root uid) and asked the probe once.
    assert "TASK [sglang : Check that the plan runs as the plan account, not as root]" in log
    assert probe_runs(host) == probes_before + 1


def test_plan_account_cannot_read_secrets_write_or_restart(host, clone):
    """Real attempts as the plan account, each of which must fail; its probe's answer holds no secret."""
    before = host.state()
    pid = before["MainPID"]
    attempts = {
        "read the --config file": "cat /etc/sglang/sglang.yaml",
        "read the environment file": "cat /etc/sglang/sglang.env",
        "read the known-good record": "cat /var/lib/sglang-deploy/known-good/sglang.json",
        "write the unit directory": "touch /etc/systemd/system/sglang.service.d-planted",
        "replace the unit": "cp /dev/null /etc/systemd/system/sglang.service",
        "restart the service": "systemctl restart sglang.service",
        "stop the service": "systemctl stop sglang.service",
        "signal the server": f"kill -TERM {pid}",
        "read the server's environ": f"cat /proc/{pid}/environ",
        "become root": "su -c id root </dev/null",
    }
    for what, command in attempts.items():
        r = host.ssh(command, check=False, user=PLAN_USER, timeout=60)
        assert r.returncode != 0, f"the plan account could {what}: {command} -> {r.stdout}{r.stderr}"
        # Refused for want of the right, not for another reason (a typo, a missing file).
        assert re.search(
            r"Permission denied|Access denied|Operation not permitted|Authentication failure", r.stderr
        ), f"{what}: {r.stderr}"
        no_secret(r.stdout, r.stderr)
    # Its journal access is the probe's: journalctl as the account shows none of the server's lines.
    j = host.ssh("journalctl -q -b -u sglang.service --no-pager | head -5", check=False, user=PLAN_USER)
    assert "server_args" not in j.stdout and "sglang" not in j.stdout.lower(), j.stdout
    # The probe answers it (hashes, the journal, /server_info) with every secret redacted on the host;
    # whatever the caller sends is ignored.
    script = (
        "import socket, sys; s = socket.socket(socket.AF_UNIX); "
        f"s.connect('{PROBE_SOCKET}'); s.sendall(b'--config-dir /tmp\\n'); s.shutdown(socket.SHUT_WR); "
        "sys.stdout.buffer.write(b''.join(iter(lambda: s.recv(65536), b'')))"
    )
    answer = host.ssh(f"python3 -c {shlex.quote(script)}", user=PLAN_USER).stdout
    doc = json.loads(answer)
    obs = doc["services"]["sglang"]
    no_secret(answer)
    assert (
        obs["running"]["server_info"]["status"] == 200
        and obs["running"]["server_info"]["status_without_key"] == 401
    )
    assert any("server_args=" in str(e.get("MESSAGE")) for e in obs["running"]["journal"]), (
        "no server_args line"
    )
    real = host.ssh("sha256sum /etc/sglang/sglang.yaml | cut -d' ' -f1").stdout.strip()
    assert obs["sha256"]["config"] == real
    # root may connect; nobody else (not in the socket's group) may.
    denied = host.ssh(
        f"setpriv --reuid=nobody --regid=nogroup --clear-groups python3 -c {shlex.quote(script)}", check=False
    )
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied.stderr
    assert host.state() == before


def test_apply_deploys_and_verifies_the_change(host, clone, tmp_path):
    lock_dir = tmp_path / "locks"
    lock_dir.mkdir(mode=0o700)
    # Another deploy of the same inventory holds the lock: this one fails at once and names it.
    held = os.open(lock_dir / (clone["inventory"].replace("/", "_") + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        os.write(held, b'{"pid": 4242, "commit": "the-other-deploy"}\n')
        blocked = apply(clone["repo"], clone["inventory"], clone["head"], tmp_path / "blocked", lock_dir)
        assert blocked.returncode == 3, blocked.stderr
        assert "the-other-deploy" in blocked.stderr and "another deploy of" in blocked.stderr
    finally:
        os.close(held)
    before = host.state()
    r = apply(clone["repo"], clone["inventory"], clone["head"], tmp_path / "out", lock_dir)
    assert r.returncode == 0, f"apply failed:\n{r.stdout[-6000:]}\n{r.stderr[-4000:]}"
    record = json.loads((tmp_path / "out" / "apply.json").read_text())
    assert record["commit"] == clone["head"] and record["status"] == "verified"
    # The merged pull request's apply comment: the host restarted onto the head's window.
    comment = (tmp_path / "out" / "apply.md").read_text()
    assert comment.startswith("<!-- sglang-gitops-apply -->\n")
    assert f"## SGLang deploy applied and verified: `{clone['head'][:12]}`" in comment
    assert re.search(
        r"^\| \S+ \| verified, restarted \| config [0-9a-f]{12}, window 4096 \| - \|", comment, re.M
    ), comment
    after = host.state()
    assert after["InvocationID"] != before["InvocationID"] and after["ActiveState"] == "active"
    assert host.server_info(SECRET_B)["speculative_draft_window_size"] == 4096
    no_secret(r.stdout, r.stderr, (tmp_path / "out" / "apply-ansible.log").read_text(), comment)
    # In sync with git right after the apply: drift exits 0 and the host is untouched.
    d = drift(clone, tmp_path / "drift")
    assert d.returncode == 0, f"drift right after apply:\n{d.stdout}\n{d.stderr}"
    assert json.loads((tmp_path / "drift" / "drift.json").read_text())["status"] == "no_change"
    assert host.state() == after


def test_drift_reports_a_restart_by_hand_with_the_same_arguments(host, clone, tmp_path):
    """P17: after a verified deploy, `systemctl restart` by hand (the same unit, the same arguments: no file
    and no running argument differs from git) is drift, naming both invocations and how the verified one
    ended."""
    r = apply(clone["repo"], clone["inventory"], clone["head"], tmp_path / "apply")
    assert r.returncode == 0, f"apply failed:\n{r.stdout[-6000:]}\n{r.stderr[-4000:]}"
    verified = host.state()["InvocationID"]
    host.ssh("systemctl restart sglang.service")
    host.wait_healthy()
    running = host.state()["InvocationID"]
    started = host.ssh("systemctl show -P ExecMainStartTimestamp sglang.service").stdout.strip()
    assert running != verified
    d = drift(clone, tmp_path / "drift")
    assert d.returncode == 2, f"drift should exit 2:\n{d.stdout}\n{d.stderr}"
    summary = json.loads((tmp_path / "drift" / "drift.json").read_text())
    (finding,) = summary["hosts"][host.name]["drift"]
    assert finding.startswith(
        f"running invocation {running} (started {started}) is not the last verified deploy's {verified}: "
        "it ended "
    )
    assert "exited cleanly, stopped by a `systemctl restart` job" in finding and "NRestarts=0 now" in finding
    md = (tmp_path / "drift" / "drift.md").read_text()
    assert f"Last lines of the verified invocation `{verified}`" in md
    no_secret(md, json.dumps(summary), (tmp_path / "drift" / "drift-ansible.log").read_text())


def test_drift_reports_a_hand_edited_unit(host, clone, tmp_path):
    # By hand: another window in the unit, reloaded and restarted (a "quick fix" on the box).
    host.ssh(
        f'sed -i \'s/"--speculative-draft-window-size" "4096"/"--speculative-draft-window-size" "1024"/\''
        f" {UNIT_PATH} && systemctl daemon-reload && systemctl restart sglang.service"
    )
    host.wait_healthy()
    r = drift(clone, tmp_path)
    assert r.returncode == 2, f"drift should exit 2:\n{r.stdout}\n{r.stderr}"
    md = (tmp_path / "drift.md").read_text()
    summary = json.loads((tmp_path / "drift.json").read_text())
    assert md.startswith("<!-- sglang-gitops-drift -->")
    assert summary["status"] == "drift" and summary["changed_hosts"] == [host.name]
    findings = summary["hosts"][host.name]["drift"]
    assert f"{UNIT_PATH} differs from what git renders" in findings
    assert any(f.startswith("unit sha256 ") and "last verified deploy" in f for f in findings)
    assert "running arguments differ from git: speculative_draft_window_size 1024 (git: 4096)" in findings
    no_secret(md, json.dumps(summary), (tmp_path / "drift-ansible.log").read_text())


def git_debs(h: Host) -> Path:
    """git and what it needs beyond the host's packages, downloaded on the controller (no network there)."""
    status = DEB_CACHE.parent / f"dpkg-status-{h.name}"
    DEB_CACHE.mkdir(parents=True, exist_ok=True)
    status.write_text(h.ssh("cat /var/lib/dpkg/status").stdout)
    sim = run(
        ["apt-get", "-s", "-o", f"Dir::State::status={status}", "install", "--no-install-recommends", "git"],
        timeout=120,
    )
    names = [ln.split()[1] for ln in sim.stdout.splitlines() if ln.startswith("Inst ")]
    # A reused host may have git from an earlier run: then the role installs nothing.
    assert "git" in names or "git is already the newest version" in sim.stdout, sim.stdout
    for old in DEB_CACHE.glob("*.deb") if names else []:
        if old.name.split("_")[0] not in names:
            old.unlink()
    missing = [n for n in names if not list(DEB_CACHE.glob(f"{n}_*.deb"))]
    if missing:
        run(["apt-get", "download", *missing], cwd=DEB_CACHE, timeout=300)
    return DEB_CACHE


@pytest.fixture
def git_daemon(host, clone, tmp_path):
    """A bare copy of the clone served by `git daemon` on the controller end of the host's veth."""
    served = tmp_path / "served"
    served.mkdir()
    bare = served / "sglang-deploy.git"
    run(["git", "clone", "--quiet", "--bare", clone["repo"], bare])
    (bare / "git-daemon-export-ok").write_text("")
    proc = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            f"--listen={host.controller_address}",
            "--port=9418",
            f"--base-path={served}",
            "--informative-errors",
            str(served),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while (
            run(
                ["git", "ls-remote", f"git://{host.controller_address}/sglang-deploy.git"],
                check=False,
                timeout=10,
            ).returncode
            != 0
        ):
            assert proc.poll() is None and time.monotonic() < deadline, f"git daemon: {proc.stderr.read()}"
            time.sleep(0.3)
        yield {"bare": bare, "url": f"git://{host.controller_address}/sglang-deploy.git"}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def pull_run(h: Host) -> tuple[int, str]:
    """Start one pull run (as the timer would), wait for it, return its result and that run's journal."""
    rc = h.ssh("systemctl start sglang-pull.service", check=False, timeout=900).returncode
    invocation = h.ssh("systemctl show -p InvocationID --value sglang-pull.service").stdout.strip()
    assert invocation, "sglang-pull.service has no InvocationID after a run"
    log = h.ssh(f"journalctl --sync; journalctl -q -o cat _SYSTEMD_INVOCATION_ID={invocation}").stdout
    return rc, log


def test_pull_mode_applies_a_signed_commit_once(host, clone, git_daemon, tmp_path):
    repo = clone["repo"]
    key = tmp_path / "signing_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gitops-test", "-f", key])
    pub = (tmp_path / "signing_key.pub").read_text().split()
    signer = f'gitops@lab.invalid namespaces="git" {pub[0]} {pub[1]}'
    # The pull branch: head (window 4096) plus a signed commit that only touches a comment.
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}"]
    git(repo, "checkout", "--quiet", "-b", PULL_BRANCH, clone["head"])
    # An older signed release of the branch, replayed below.
    (repo / TEST_VARS).write_text((repo / TEST_VARS).read_text() + "# an older release\n")
    git(repo, *sign, "commit", "--quiet", "-S", "-am", "pull: an older signed release")
    older = git(repo, "rev-parse", "HEAD")
    (repo / TEST_VARS).write_text((repo / TEST_VARS).read_text() + "# applied by sglang-pull\n")
    debs = git_debs(host)
    setup = {
        "sglang_pull_repo_url": git_daemon["url"],
        "sglang_pull_branch": PULL_BRANCH,
        "sglang_pull_allowed_signers": [signer],
        "sglang_pull_inventory": clone["inventory"],
        "sglang_pull_install_source": "wheelhouse",
        "sglang_pull_wheelhouse_src": str(WHEELHOUSE / "ansible-core"),
        "sglang_pull_deb_src": str(debs),
        # The first run is started by this test, not by the timer.
        "sglang_pull_on_boot_sec": "1h",
        "sglang_pull_interval": "1h",
    }
    # A host in pull mode is its own controller: it installs SGLang from a source it reaches itself
    # (the lab wheelhouse is on the real controller). SGLang is installed already, so nothing changes.
    inv_path = repo / clone["inventory"]
    inv = yaml.safe_load(inv_path.read_text())
    # The pull settings live in the inventory beside the sglang ones, as on a site (the deploy of every
    # pull run must accept them).
    inv["all"]["children"]["gpu_nodes"]["hosts"][host.name].update(setup, sglang_install_source="pypi")
    inv_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    git(repo, *sign, "commit", "--quiet", "-S", "-am", "pull: signed commit")
    signed = git(repo, "rev-parse", "HEAD")
    git(repo, "push", "--quiet", git_daemon["bare"], f"{PULL_BRANCH}:{PULL_BRANCH}")

    r = run(
        [VENV_BIN / "ansible-playbook", "-i", host.inventory, "playbooks/pull.yml", "-e", json.dumps(setup)],
        check=False,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
    )
    assert r.returncode == 0, f"playbooks/pull.yml failed:\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert host.ssh("systemctl is-enabled sglang-pull.timer").stdout.strip() == "enabled"

    # Tick 1: the signed commit is applied with the deploy's verification (the hand-edited 1024 goes).
    before = host.state()
    rc, log = pull_run(host)
    assert rc == 0, f"pull run failed:\n{log}"
    assert f"{signed} is signed by gitops@lab.invalid" in log and f"applied and verified {signed}" in log
    after = host.state()
    assert after["InvocationID"] != before["InvocationID"]
    assert host.server_info(SECRET_B)["speculative_draft_window_size"] == 4096
    state = json.loads(host.ssh("cat /var/lib/sglang-pull/state.json").stdout)
    assert state["applied"] == signed and state["failed"] is None
    no_secret(log)

    # Tick 2: same commit, nothing to do, the server is untouched.
    rc, log = pull_run(host)
    assert rc == 0 and f"up to date: {PULL_BRANCH} is at {signed}" in log, log
    assert "running " not in log
    assert host.state() == after

    # Replay: the branch rewound to the older signed release is refused; the host is untouched.
    git(repo, "push", "--quiet", git_daemon["bare"], f"+{older}:refs/heads/{PULL_BRANCH}")
    rc, log = pull_run(host)
    assert rc != 0 and f"REFUSED: commit {older} is OLDER than the applied {signed}" in log, log
    assert "running " not in log and host.state() == after
    # A signed commit of another branch force-pushed to the pull branch is refused as well.
    git(repo, "checkout", "--quiet", "-b", "gitops-other", clone["head"])
    set_vars(repo, 1024, SECRET_B, plan_public_key(host))
    git(repo, *sign, "commit", "--quiet", "-S", "-am", "pull: a signed commit of another branch")
    other = git(repo, "rev-parse", "HEAD")
    git(repo, "push", "--quiet", git_daemon["bare"], f"+{other}:refs/heads/{PULL_BRANCH}")
    rc, log = pull_run(host)
    assert rc != 0 and f"REFUSED: commit {other} does not descend from the applied {signed}" in log, log
    assert "running " not in log and host.state() == after

    # An unsigned commit is refused before any of its files is used; the server is untouched.
    git(repo, "checkout", "--quiet", PULL_BRANCH)
    set_vars(repo, 8192, SECRET_B, plan_public_key(host))
    git(repo, "commit", "--quiet", "-am", "pull: unsigned commit")
    unsigned = git(repo, "rev-parse", "HEAD")
    git(repo, "push", "--quiet", git_daemon["bare"], f"+{PULL_BRANCH}:{PULL_BRANCH}")
    rc, log = pull_run(host)
    assert (
        rc != 0 and f"commit {unsigned} is not signed by a key in /etc/sglang-pull/allowed_signers" in log
    ), log
    assert host.state() == after
    # Reported once: the next run neither fails again nor retries.
    rc, log = pull_run(host)
    assert rc == 0 and "not retried" in log and "running " not in log, log
    assert host.state() == after
    assert json.loads(host.ssh("cat /var/lib/sglang-pull/state.json").stdout)["applied"] == signed


def test_workflows_pass_actionlint_and_zizmor():
    workflows = sorted((REPO / ".github" / "workflows").glob("*.yml"))
    assert len(workflows) >= 3, workflows
    lint = run([VENV_BIN / "actionlint", "-color=false", *workflows], check=False, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    audit = run(
        [VENV_BIN / "zizmor", "--offline", "--no-progress", "--min-severity", "informational", *workflows],
        check=False,
        timeout=120,
    )
    assert audit.returncode == 0, audit.stdout + audit.stderr
