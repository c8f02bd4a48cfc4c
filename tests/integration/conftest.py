"""Shared lab host for tests/integration: one systemd-nspawn host with SGLang deployed (window 2048).

Fixtures:
  lab_inventory  path of an inventory INSIDE inventory/lab/ (so inventory/lab/group_vars apply) with one
                 host in gpu_nodes on which `deploy.yml -e window=2048` has just succeeded.
                 LAB_REUSE_INVENTORY=<path> reuses running hosts (left running at the end; serial runs
                 only); otherwise `lab/labctl up --sglang-layer --first-index $LAB_IT_INDEX (default 100)`
                 starts one, written to inventory/lab/it-<index>.yml, and `labctl down` stops it at session
                 end. Under pytest-xdist each worker has its own host: index LAB_IT_INDEX + N for worker gwN.
                 The host boots with the SGLang layer (lab/labctl: SGLang installed as the role installs it),
                 so its first deploy installs nothing; the fresh install through the role is covered by
                 gpu_roles/test_sample_inventory.py (and the incremental one by test_role_convergence).
  lab_host       a LabHost for that inventory: ssh(), playbook(), state(), history().
test_sweep.py and test_gitops.py use the same host (fixture lab_inventory).

Tests that change the host restore the baseline with LabHost.restore_baseline() before they end, so the
next test (of any file) starts from the deployed window-2048 configuration.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from labtools import ansible_env, missing_lab_prerequisite, ssh_argv

REPO = Path(__file__).resolve().parents[2]
LAB_INVENTORY_DIR = REPO / "inventory" / "lab"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
LABCTL = REPO / "lab" / "labctl"
WHEELHOUSE = Path(os.environ.get("WHEELHOUSE", "/var/cache/sglang-lab/wheelhouse"))

UNIT = "sglang.service"
UNIT_PATH = "/etc/systemd/system/sglang.service"
ENV_PATH = "/etc/sglang/sglang.env"
HISTORY_PATH = "/var/lib/sglang-deploy/history.jsonl"
BASELINE_WINDOW = 2048
# deploy.yml's last play, the one that deploys SGLang (knobs mapped, then the sglang role).
SGLANG_PLAYBOOK = "playbooks/sglang.yml"

# Restarts in these tests wait for a short stability window (the role default is 30 s); the crash
# that rollback tests inject happens well inside it. JSON extra vars keep the integer an integer.
FAST_VERIFY = {"sglang_stable_seconds": 6, "sglang_health_count": 2}
# A restore injects nothing: the lab inventory's own window (inventory/lab/group_vars/lab/lab.yml) is enough.
RESTORE_VERIFY = {"sglang_stable_seconds": 3, "sglang_health_count": 2}


@dataclass
class HostState:
    """What "the host is exactly as before" compares."""

    unit_sha256: str
    env_sha256: str
    invocation_id: str
    main_pid: int
    active_state: str
    history_lines: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class LabHost:
    def __init__(self, inventory: Path):
        self.inventory = Path(inventory)
        data = yaml.safe_load(self.inventory.read_text())
        hosts = data["all"]["children"]["gpu_nodes"]["hosts"]
        self.name = sorted(hosts)[0]
        self.vars = hosts[self.name]

    # -- transport ---------------------------------------------------------------------------------
    def ssh_argv(self, command: str) -> list[str]:
        """ssh to the host (labtools.ssh_argv: one master connection per host)."""
        return ssh_argv(self.vars, command)

    def ssh(self, command: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess:
        r = subprocess.run(self.ssh_argv(command), capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"ssh {self.name} {command!r} -> rc {r.returncode}: {r.stderr.strip()}")
        return r

    def read_bytes(self, path: str) -> bytes:
        argv = self.ssh_argv(f"cat {shlex.quote(path)}")
        return subprocess.run(argv, capture_output=True, check=True, timeout=60).stdout

    def playbook(
        self,
        *args: str,
        extra: dict | None = None,
        playbook: str | Path = "deploy.yml",
        timeout: int = 600,
    ) -> subprocess.CompletedProcess:
        """ansible-playbook against this host only.

        ``extra`` goes in as ``-e @file`` (JSON, types kept): a secret in it never appears on the
        ansible-playbook command line, so a sentinel found in the output was printed by Ansible.
        """
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(self.inventory), "--limit", f"{self.name},localhost"]
        argv.append(str(playbook))
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="it-extra-") as handle:
            if extra:
                json.dump(extra, handle)
                handle.flush()
                argv += ["-e", "@" + handle.name]
            argv += list(args)
            return subprocess.run(
                argv,
                cwd=REPO,
                env=ansible_env(),
                stdin=subprocess.DEVNULL,  # ansible-playbook refuses a non-blocking stdin it inherited
                capture_output=True,
                text=True,
                timeout=timeout,
            )

    def start_playbook(
        self, out: Path, extra: dict, *args: str, playbook: str = "playbooks/sglang.yml"
    ) -> subprocess.Popen:
        """ansible-playbook against this host in the background, in its own process group (killed whole),
        output in ``out``; ``extra`` as ``-e @<out>.json`` after ``args``. Results as JSON: a message is
        one JSON string (the yaml format folds and re-quotes it)."""
        extra_file = out.with_suffix(".json")
        extra_file.write_text(json.dumps(extra))
        argv = [str(ANSIBLE_PLAYBOOK), "-i", str(self.inventory), "--limit", f"{self.name},localhost"]
        argv += [playbook, *args, "-e", f"@{extra_file}"]
        with out.open("w") as handle:
            return subprocess.Popen(
                argv,
                cwd=REPO,
                env=dict(ansible_env(), ANSIBLE_CALLBACK_RESULT_FORMAT="json"),
                stdin=subprocess.DEVNULL,  # ansible-playbook refuses a non-blocking stdin it inherited
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> HostState:
        return parse_state(self.ssh(STATE_SCRIPT).stdout)

    # For generated playbooks that read the state in a task (test modules cannot import conftest).
    @property
    def state_script(self) -> str:
        return STATE_SCRIPT

    @staticmethod
    def parse_state(stdout: str) -> HostState:
        return parse_state(stdout)

    def history(self) -> list[dict]:
        text = self.ssh(f"cat {HISTORY_PATH} 2>/dev/null || true").stdout
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def cmdline(self, pid: int) -> list[str]:
        raw = self.read_bytes(f"/proc/{pid}/cmdline")
        return [part.decode("utf-8") for part in raw.split(b"\0")[:-1]]

    # -- baseline ----------------------------------------------------------------------------------
    def deploy_baseline(self, fast: bool = False, layer: bool = False) -> subprocess.CompletedProcess:
        r = self.playbook("-e", f"window={BASELINE_WINDOW}", extra=FAST_VERIFY if fast else None)
        if r.returncode != 0:
            raise AssertionError(
                f"baseline deploy (window={BASELINE_WINDOW}) on {self.name} failed, rc {r.returncode}:\n"
                + r.stdout[-6000:]
                + r.stderr[-2000:]
            )
        if layer:
            # The layer exists to spare this install: if the role installs anyway, the layer no longer
            # matches what the role wants (lab/labctl sglang_layer_spec), and every run pays minutes.
            task = r"TASK \[sglang : Install SGLang into the new release\][^\n]*\n(\w+):"
            installed = re.search(task, r.stdout)
            if installed and installed.group(1) != "skipping":
                raise AssertionError(
                    f"{self.name} boots with the SGLang layer, yet the role installed SGLang: the layer no "
                    f"longer matches the role's install (lab/labctl sglang_layer_spec)\n{r.stdout[-6000:]}"
                )
        return r

    def restore_baseline(self) -> None:
        """Deploy the baseline again (a no-change run when nothing drifted).

        Only the play that deploys SGLang (playbooks/sglang.yml, the last play of deploy.yml): the knob is
        valid, the GPU play is off on lab hosts and the weights play only reads the tiny checkpoints,
        so the other three plays would change nothing here; each ansible-playbook run spares them."""
        r = self.playbook("-e", f"window={BASELINE_WINDOW}", extra=RESTORE_VERIFY, playbook=SGLANG_PLAYBOOK)
        if r.returncode != 0:
            raise AssertionError(
                f"baseline restore (window={BASELINE_WINDOW}) on {self.name} failed, rc {r.returncode}:\n"
                + r.stdout[-6000:]
                + r.stderr[-2000:]
            )


# One shell round trip that reads everything HostState compares (also run by generated playbooks).
STATE_SCRIPT = (
    f"echo unit=$(sha256sum < {UNIT_PATH} | cut -d' ' -f1); "
    f"echo env=$(sha256sum < {ENV_PATH} | cut -d' ' -f1); "
    f"systemctl show -p InvocationID -p MainPID -p ActiveState {UNIT}; "
    f"echo history=$(cat {HISTORY_PATH} 2>/dev/null | wc -l)"
)


def parse_state(stdout: str) -> HostState:
    values = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    return HostState(
        unit_sha256=values["unit"],
        env_sha256=values["env"],
        invocation_id=values.get("InvocationID", ""),
        main_pid=int(values.get("MainPID", "0")),
        active_state=values.get("ActiveState", ""),
        history_lines=int(values["history"]),
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# A lab test never skips: a prerequisite it lacks (root, systemd-nspawn, the toolchain, the wheelhouse,
# SGLang's interpreter, what an earlier test of its file built) fails it, so `make test` cannot pass without
# running it. The tests fail with what is missing and how to get it; a skip from anywhere else (a skipif,
# a helper) is turned into a failure here with its reason.
SKIP_IS_FAILURE = "a lab test does not skip (tests/integration/conftest.py); it lacks: "


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = SKIP_IS_FAILURE + reason.removeprefix("Skipped: ")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = SKIP_IS_FAILURE + reason.removeprefix("Skipped: ")
    return report


def xdist_worker_number() -> int:
    """N of pytest-xdist worker gwN (0 without xdist)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


@pytest.fixture(scope="session")
def lab_inventory():
    reuse = os.environ.get("LAB_REUSE_INVENTORY")
    if reuse and os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.fail(
            f"LAB_REUSE_INVENTORY={reuse} with pytest-xdist: every worker would deploy to the same host at "
            "once; run serially (no -n) or leave LAB_REUSE_INVENTORY unset (each worker starts its own host)"
        )
    if reuse:
        path = Path(reuse).resolve()
        if LAB_INVENTORY_DIR.resolve() not in path.parents:
            pytest.fail(
                f"LAB_REUSE_INVENTORY={reuse}: must be inside {LAB_INVENTORY_DIR} so that its group_vars "
                "(the lab settings) apply"
            )
        LabHost(path).deploy_baseline()
        yield path
        return
    missing = missing_lab_prerequisite()
    if missing:
        pytest.fail(missing)
    if not any(WHEELHOUSE.glob("sglang-*.whl")):
        pytest.fail(f"no sglang wheel in {WHEELHOUSE}: run `make wheelhouse` first")
    index = int(os.environ.get("LAB_IT_INDEX", "100")) + xdist_worker_number()
    path = LAB_INVENTORY_DIR / f"it-{index}.yml"
    subprocess.run(
        [
            str(LABCTL),
            "up",
            "--sglang-layer",
            "--hosts",
            "1",
            "--first-index",
            str(index),
            "--inventory",
            str(path),
        ],
        check=True,
        cwd=REPO,
    )
    try:
        LabHost(path).deploy_baseline(layer=True)
        yield path
    finally:
        subprocess.run([str(LABCTL), "down", "--inventory", str(path)], check=False, cwd=REPO)


@pytest.fixture(scope="session")
def lab_host(lab_inventory) -> LabHost:
    return LabHost(lab_inventory)
