"""deploy.yml with the SAMPLE production inventory's settings on one fresh lab host.

The inventory is generated here, inside inventory/ (gitignored: inventory/sample-lab/):

  inventory/sample-lab/hosts.yml                   written by `lab/labctl up` (groups gpu_nodes, lab)
  inventory/sample-lab/group_vars/gpu_nodes/*.yml  SYMLINKS to inventory/sample/group_vars/gpu_nodes/*.yml
  inventory/sample-lab/host_vars/<host>/00-lab.yml SYMLINK to inventory/lab/group_vars/lab/lab.yml
  inventory/sample-lab/host_vars/<host>/10-sample-lab.yml
                                                   the overrides below (OVERRIDES), each with its reason

The lab settings and the overrides are host vars, so they win over the sample's group vars whatever
the group names are; every other sample setting applies as written (test_inventory_is_the_sample_...
checks that with ansible-inventory). The NVIDIA apt source points at the signed TEST repository of
apt_fixture.py (real package names and versions, no payload), served on the host's veth address.

First `deploy.yml --check --diff` on the bare host (nothing installed) shows the whole plan and leaves
the host as it was. Then: deploy.yml converges the host (driver, CUDA toolkit, weights check, SGLang from
the wheelhouse with the lab server as launcher, its pip steps printed while they run), and a second run
reports changed=0 with the same InvocationID.

Needs root, lab/labctl, the wheelhouse (make wheelhouse), dpkg-deb, dpkg-scanpackages and gpg.
Host index: $SAMPLE_LAB_INDEX (default 75). The host is always brought up here and torn down at the end:
the point is a FRESH host, so LAB_REUSE_INVENTORY does not apply. Takes ~4-6 minutes, most of it the
SGLang venv install of the first run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml
from apt_fixture import (
    CUDA_HOME,
    CUDA_MARKER,
    CUDA_PACKAGE,
    OPEN_PACKAGES,
    VERSION,
    driver_repo_settings,
    recap,
    run,
    serve_repo,
)
from labtools import ansible_env

REPO = Path(__file__).resolve().parents[3]
BIN = REPO / ".venv" / "bin"
LABCTL = REPO / "lab" / "labctl"
INDEX = int(os.environ.get("SAMPLE_LAB_INDEX", "75"))
HOST = f"lab{INDEX}"
ADDRESS = f"10.213.{INDEX}.1"  # the controller's end of the host's veth
PORT = 8775
SAMPLE = REPO / "inventory" / "sample"
SAMPLE_GROUP_VARS = SAMPLE / "group_vars" / "gpu_nodes"
LAB_SETTINGS = REPO / "inventory" / "lab" / "group_vars" / "lab" / "lab.yml"
INVENTORY_DIR = REPO / "inventory" / "sample-lab"
INVENTORY = INVENTORY_DIR / "hosts.yml"
OVERLAY = INVENTORY_DIR / "host_vars" / HOST / "10-sample-lab.yml"
LAB_TARGET = "/srv/models/lab-target"
LAB_DRAFT = "/srv/models/lab-dflash-draft"

# What a lab host cannot have, with the reason. Everything else of inventory/sample applies.
# The driver repository settings (URL, key URL, key checksum) are added at run time: they name the
# served TEST repository and the checksum of its throwaway key.
OVERRIDES = {
    "nvidia_gpu_check_enabled": (
        False,
        "sample: true. A lab host has no GPU: there is no nvidia-smi output to check. The run "
        'prints "GPU check DISABLED", which the test asserts.',
    ),
    "cuda_toolkit_enabled": (
        True,
        "sample: false. On here so that the cuda_toolkit role converges too; the TEST repository "
        f"carries {CUDA_PACKAGE} (one marker file under {CUDA_HOME}).",
    ),
    "sglang_model_path": (
        LAB_TARGET,
        "sample: /srv/models/Kimi-K2.6. The tiny checkpoint lab/labctl writes; the weights check "
        '(model_weights_models target: "{{ sglang_model_path }}") follows it.',
    ),
    "sglang_speculative_draft_model_path": (
        LAB_DRAFT,
        "sample: /srv/models/Kimi-K2.6-DFlash. The tiny DFlash drafter lab/labctl writes "
        "(block_size 16, sliding window 2048); the weights check follows it.",
    ),
}
# sglang_tp_size 8 stays: SGLang 0.5.23 parses and resolves --tp-size 8 with --device cuda on a CPU-only
# host (checked with prepare_server_args(...).resolve_once()), so the lab server runs the sample's 8.
# From inventory/lab/group_vars/lab/lab.yml (symlinked; its comments give the reasons): the install from
# the controller's wheelhouse instead of PyPI (no route out), the lab server as launcher, preflight
# resolution for device cuda, no NVIDIA device policy, a 3 s stability window.
LAB_KEYS = set(yaml.safe_load(LAB_SETTINGS.read_text()))

# The running server must show these sample settings (canonical SGLang dests -> sample variable).
SAMPLE_ARGS = {
    "served_model_name": "sglang_served_model_name",
    "tp_size": "sglang_tp_size",
    "trust_remote_code": "sglang_trust_remote_code",
    "reasoning_parser": "sglang_reasoning_parser",
    "tool_call_parser": "sglang_tool_call_parser",
    "mem_fraction_static": "sglang_mem_fraction_static",
    "host": "sglang_host",
    "port": "sglang_port",
    "speculative_algorithm": "sglang_speculative_algorithm",
    "speculative_draft_window_size": "sglang_speculative_draft_window_size",
}


def sample_settings() -> dict:
    settings = {}
    for path in sorted(SAMPLE_GROUP_VARS.glob("*.yml")):
        settings.update(yaml.safe_load(path.read_text()) or {})
    return settings


def write_overlay(repo_settings: dict) -> None:
    """Symlink the sample's and the lab's settings into inventory/sample-lab and write the overrides."""
    group_vars = INVENTORY_DIR / "group_vars" / "gpu_nodes"
    host_vars = OVERLAY.parent
    for directory in (group_vars, host_vars):
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
    for path in sorted(SAMPLE_GROUP_VARS.glob("*.yml")):
        (group_vars / path.name).symlink_to(os.path.relpath(path, group_vars))
    (host_vars / "00-lab.yml").symlink_to(os.path.relpath(LAB_SETTINGS, host_vars))
    lines = [
        "---",
        f"# GENERATED by tests/integration/gpu_roles/test_sample_inventory.py for {HOST}; rewritten on every",
        "# run.",
        "# inventory/sample-lab = the sample production inventory (group_vars/gpu_nodes/*.yml are symlinks",
        "# to inventory/sample/group_vars/gpu_nodes/) on a lab host: a systemd-nspawn container with no GPU",
        "# and no route out. Host vars win over group vars: 00-lab.yml (a symlink to",
        "# inventory/lab/group_vars/lab/lab.yml) brings the lab install and launcher, this file overrides",
        "# what else a lab host cannot have. Every other sample setting applies as written.",
        "# Besides: the test sets the Debian apt sources aside on the host (the Debian mirror is",
        "# unreachable, as on an air-gapped site), so apt sees only the TEST repository.",
        "# Kept although a lab host has no GPU: sglang_tp_size 8 and CUDA_VISIBLE_DEVICES 0-7. SGLang",
        "# 0.5.23 parses and resolves --tp-size 8 with --device cuda on a CPU-only host, so the lab",
        "# server runs with the sample's values.",
        "",
        "# The NVIDIA CUDA apt repository and its key -> the signed TEST repository of",
        "# tests/integration/gpu_roles/apt_fixture.py on the controller's veth address (the only one a lab",
        "# host reaches): NVIDIA's package names and versions, no payload; the key pinned by its sha256.",
    ]
    lines += [f"{key}: {json.dumps(value)}" for key, value in repo_settings.items()]
    for key, (value, reason) in OVERRIDES.items():
        lines.append("")
        lines += ["# " + line for line in textwrap.wrap(reason, 96)]
        lines.append(f"{key}: {json.dumps(value)}")
    OVERLAY.write_text("\n".join(lines) + "\n")


def ssh(command: str, timeout: int = 120) -> str:
    """Run a shell command on the lab host (root), return stdout; fail the test on a non-zero rc."""
    hv = yaml.safe_load(INVENTORY.read_text())["all"]["children"]["gpu_nodes"]["hosts"][HOST]
    argv = [
        "ssh",
        "-i",
        hv["ansible_ssh_private_key_file"],
        *shlex.split(hv["ansible_ssh_common_args"]),
        "-o",
        "BatchMode=yes",
        f"{hv['ansible_user']}@{hv['ansible_host']}",
        command,
    ]
    proc = run(argv, check=False, timeout=timeout)
    assert proc.returncode == 0, f"{HOST}: {command!r} -> rc {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout


def deploy(timeout: int) -> str:
    proc = run(
        [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), str(REPO / "deploy.yml")],
        check=False,
        env=ansible_env(),
        cwd=REPO,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"deploy.yml rc {proc.returncode}:\n{out[-8000:]}"
    return out


# Collected on the host in one round trip: packages, CUDA files, the unit and its running process.
HOST_FACTS = r"""
import json, subprocess, urllib.request
def sh(*argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout
show = dict(line.split('=', 1) for line in sh('systemctl', 'show', 'sglang.service', '-p',
            'ActiveState,SubState,InvocationID,MainPID,NRestarts').splitlines() if '=' in line)
pid = show.get('MainPID', '0')
def read(path):
    try:
        with open(path, 'rb') as f:
            return f.read().decode(errors='replace')
    except OSError as exc:
        return 'UNREADABLE: %s' % exc
try:
    info = json.load(urllib.request.urlopen('http://127.0.0.1:PORT/server_info', timeout=10))
except Exception as exc:
    info = {'error': repr(exc)}
print(json.dumps({
    'packages': sh('dpkg-query', '-W', '-f', '${Package} ${Version} ${db:Status-Want} ${db:Status-Status}\n',
                   *PACKAGES),
    'cuda_marker': read('MARKER'), 'profile': read('/etc/profile.d/cuda.sh'),
    'ldconfig': read('/etc/ld.so.conf.d/cuda.conf'), 'show': show,
    'cmdline': read('/proc/%s/cmdline' % pid).split('\0')[:-1],
    'environ': dict(kv.split('=', 1) for kv in read('/proc/%s/environ' % pid).split('\0') if '=' in kv),
    'server_info': info,
}))
"""


def host_facts(port: int) -> dict:
    script = (
        HOST_FACTS.replace("PORT", str(port))
        .replace("MARKER", CUDA_MARKER)
        .replace("*PACKAGES", ", ".join(repr(p) for p in [*OPEN_PACKAGES, CUDA_PACKAGE]))
    )
    return json.loads(ssh(f"python3 -c {shlex.quote(script)}"))


@pytest.fixture(scope="module")
def sample_lab(tmp_path_factory):
    labctl = [str(LABCTL)]
    # A host left over from an interrupted run of this test is not fresh: stop it first (only hosts
    # of this inventory; a lab{INDEX} up for another inventory makes `labctl up` refuse, by name).
    run([*labctl, "down", "--inventory", str(INVENTORY)], check=False, timeout=300)
    # --no-sglang-layer: this host installs SGLang from the wheelhouse THROUGH THE ROLE, the one lab
    # test of the fresh install (make integration boots its other hosts with the layer: SGLANG_LAB_LAYER).
    up = run(
        [
            *labctl,
            "up",
            "--no-sglang-layer",
            "--hosts",
            "1",
            "--first-index",
            str(INDEX),
            "--inventory",
            str(INVENTORY),
        ],
        check=False,
        timeout=900,
    )
    try:
        assert up.returncode == 0, f"labctl up failed: {up.stdout[-1000:]}{up.stderr[-2000:]}"
        # No route out: the Debian mirror source would make every `apt update` fail.
        ssh(
            "mkdir -p /etc/apt/sources.sample-lab-test && for f in /etc/apt/sources.list "
            "/etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do "
            'if [ -e "$f" ]; then mv "$f" /etc/apt/sources.sample-lab-test/; fi; done'
        )
        with serve_repo(tmp_path_factory.mktemp("aptrepo"), ADDRESS, PORT) as repo:
            write_overlay(driver_repo_settings(repo))
            yield repo
    finally:
        run([*labctl, "down", "--inventory", str(INVENTORY)], check=False, timeout=300)
        shutil.rmtree(INVENTORY_DIR, ignore_errors=True)


def test_inventory_is_the_sample_except_the_named_overrides(sample_lab):
    proc = run(
        [str(BIN / "ansible-inventory"), "-i", str(INVENTORY), "--host", HOST], env=ansible_env(), cwd=REPO
    )
    effective = json.loads(proc.stdout)
    sample = sample_settings()
    overridden = set(OVERRIDES) | set(driver_repo_settings(sample_lab)) | LAB_KEYS
    differing = {key for key, value in sample.items() if effective.get(key) != value}
    unnamed = differing - overridden
    assert not unnamed, f"sample settings changed without a named override: {unnamed}"
    for key, (value, _) in OVERRIDES.items():
        assert effective[key] == value, key
    assert effective["sglang_install_source"] == "wheelhouse"
    # The sample settings that matter most here really are the sample's.
    for key in (
        "sglang_tp_size",
        "sglang_mem_fraction_static",
        "sglang_reasoning_parser",
        "sglang_environment",
        "nvidia_driver_enabled",
        "nvidia_driver_reboot_allowed",
        "model_weights_models",
        "sglang_ready_timeout",
    ):
        assert effective[key] == sample[key], key


# What the roles would create on this bare host; the dry run must leave every one absent.
PLANNED_PATHS = [
    "/etc/apt/keyrings/nvidia-cuda.asc",
    "/etc/apt/sources.list.d/nvidia-cuda.sources",
    "/etc/apt/preferences.d/nvidia-driver.pref",
    "/etc/modprobe.d/blacklist-nouveau.conf",
    "/etc/systemd/system/nvidia-device-nodes.service",
    CUDA_HOME,
    "/etc/profile.d/cuda.sh",
    "/etc/ld.so.conf.d/cuda.conf",
    "/opt/sglang",
    "/etc/sglang",
    "/etc/systemd/system/sglang.service",
    "/var/lib/sglang",
    "/var/lib/sglang-deploy",
    "/usr/local/bin/sglang-history",
]
# The host's state the dry run must not touch, in one round trip: which planned paths exist, the
# installed packages and their selections, the accounts, the unit files systemd knows.
BARE_STATE = r"""
import hashlib, json, os, subprocess
def sh(*argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout
def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()
print(json.dumps({
    'present': [p for p in PATHS if os.path.lexists(p)],
    'packages': digest(sh('dpkg-query', '-W', '-f', '${Package} ${Version} ${db:Status-Abbrev}\n')),
    'nvidia_packages': sh('dpkg-query', '-W', '-f', '${Package}\n', '*nvidia*', 'cuda-*').split(),
    'accounts': digest(open('/etc/passwd').read() + open('/etc/group').read()),
    'unit_files': digest(sh('systemctl', 'list-unit-files', '--no-legend')),
}))
"""


def bare_state() -> dict:
    script = BARE_STATE.replace("PATHS", repr(PLANNED_PATHS))
    return json.loads(ssh(f"python3 -c {shlex.quote(script)}"))


def test_check_diff_on_the_bare_host_plans_everything_and_changes_nothing(sample_lab):
    """Issue 18: `deploy.yml --check --diff` on a GPU host with nothing installed yet shows the whole plan
    (driver, CUDA toolkit, SGLang, the unit) and fails nowhere; the host is left as it was.

    The GPU check runs as the sample has it (on): with the driver still to be installed, check mode
    defers it to the real run instead of failing on the missing nvidia-smi."""
    sample = sample_settings()
    before = bare_state()
    assert before["present"] == [] and before["nvidia_packages"] == [], f"{HOST} is not bare: {before}"
    proc = run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(INVENTORY),
            str(REPO / "deploy.yml"),
            "--check",
            "--diff",
            "-e",
            "nvidia_gpu_check_enabled=true",
        ],
        check=False,
        env=ansible_env(),
        cwd=REPO,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"check mode on a bare host: rc {proc.returncode}:\n{out[-8000:]}"
    counts = recap(out, HOST)
    assert counts["failed"] == 0 and counts["unreachable"] == 0, counts
    flat = " ".join(out.split())
    driver = ", ".join(f"{name}={VERSION}-*" for name in OPEN_PACKAGES)
    assert (
        f"Would install the NVIDIA driver {VERSION} (open kernel modules): {driver} from "
        f"{sample_lab['url']}, held at that version." in flat
    ), out[-8000:]
    assert (
        f"GPU check deferred to the real run on {HOST}: check mode would install the NVIDIA driver "
        f"{VERSION} ({', '.join(OPEN_PACKAGES)}) first." in flat
    ), out[-8000:]
    assert "GPU check DISABLED" not in flat
    assert "Would enable nvidia-device-nodes.service and nvidia-persistenced.service" in flat
    assert f"Would install the CUDA 13.0 toolkit: {CUDA_PACKAGE} into {CUDA_HOME}" in flat, out[-8000:]
    assert (
        f"Would install SGLang {sample['sglang_version']} from wheelhouse as the new release "
        f"/opt/sglang/releases/{sample['sglang_version']}-py3." in flat
    ), out[-8000:]
    assert (
        "Then the unit /etc/systemd/system/sglang.service and the environment file "
        "/etc/sglang/sglang.env would be written" in flat
    ), out[-8000:]
    # --diff shows the files the driver and toolkit roles would write, with their content.
    for line in (
        f"+URIs: {sample_lab['url']}",
        "+Signed-By: /etc/apt/keyrings/nvidia-cuda.asc",
        "+blacklist nouveau",
        "+Before=sglang.service nvidia-persistenced.service",
        f"+export CUDA_HOME={CUDA_HOME}",
    ):
        assert f"\n{line}\n" in out, (line, out[-8000:])
    # Nothing ran that only a real run may run.
    for task in (
        "Install the driver packages at the pinned version",
        "Check the GPUs",
        "Install SGLang into the new release",
        # The include of the write and the restart (roles/sglang/tasks/main.yml): nothing to inspect before
        # the install.
        "Write the files and restart SGLang with proof (apply.yml)",
    ):
        assert re.search(rf"TASK \[[^\]]*{re.escape(task)}[^\]]*\][^\n]*\nskipping: ", out), task
    after = bare_state()
    assert after == before, f"the dry run changed {HOST}: {before} -> {after}"


def test_fresh_host_converges_and_second_run_changes_nothing(sample_lab):
    sample = sample_settings()
    first = deploy(timeout=1500)
    counts = recap(first, HOST)
    assert counts["failed"] == 0 and counts["unreachable"] == 0, counts
    assert counts["changed"] > 0, "a fresh host must have been changed"
    flat = " ".join(first.split())
    assert "GPU check DISABLED" in flat
    assert "nvidia_driver SKIPPED" not in flat, "the sample enables the driver role"
    assert "initramfs rebuild SKIPPED: this host is a container" in flat
    # The fresh install of the suite: SGLang came from the pushed wheelhouse, through the role.
    installed = (
        r"TASK \[sglang : Install SGLang from the wheelhouse, version [^\]]+\][^\n]*\n"
        rf"(?:{HOST}: .*\n)*changed: "
    )
    assert re.search(installed, first), "no wheelhouse install by the role on this fresh host"
    # Issue 18: the minutes of pip say what pip is doing, a line at least every 30 s, while it runs.
    for label in ("SGLang dependency requirements", f"SGLang {sample['sglang_version']}"):
        steps = re.findall(rf"^{HOST}: {re.escape(label)} \[(\d+)m(\d\d)s\]: (.+)$", first, re.MULTILINE)
        assert steps, f"no progress lines of {label}:\n{first[-6000:]}"
        seconds = [0] + [int(m) * 60 + int(s) for m, s, _ in steps]
        assert max(b - a for a, b in zip(seconds, seconds[1:])) <= 30, (label, steps)
        assert steps[-1][2].startswith("done, installed "), (label, steps[-1])
        # An install that took 30 s or more said what pip was doing on the way (one done in less, e.g. the
        # SGLang wheel alone in ~10 s on a quiet machine, owes only its done line).
        named = [step for _, _, step in steps if step.startswith(("Processing ", "Installing "))]
        assert named or seconds[-1] < 30, (label, steps)

    facts = host_facts(sample["sglang_port"])
    # Driver packages: installed at the pinned version and held; the toolkit installed, not held.
    packages = {line.split()[0]: line.split()[1:] for line in facts["packages"].splitlines()}
    for name in OPEN_PACKAGES:
        assert packages.get(name) == [f"{VERSION}-1", "hold", "installed"], (name, facts["packages"])
    assert packages.get(CUDA_PACKAGE, [None])[0] is not None and packages[CUDA_PACKAGE][2] == "installed"
    assert facts["cuda_marker"] == "TEST FIXTURE\n", facts["cuda_marker"]
    assert f"{CUDA_HOME}/bin" in facts["profile"], facts["profile"]
    assert f"{CUDA_HOME}/lib64" in facts["ldconfig"], facts["ldconfig"]

    # The unit runs with the sample's settings: the process's argv, its environment and the
    # server's own report (the lab server parses that argv with the installed SGLang and resolves it).
    show = facts["show"]
    assert (show["ActiveState"], show["SubState"]) == ("active", "running"), show
    assert show["NRestarts"] == "0", show
    argv = facts["cmdline"]
    # The release's python (/opt/sglang/releases/<version>-py<major.minor>-<hash>/bin/python).
    assert argv[0].startswith(f"/opt/sglang/releases/{sample['sglang_version']}-py3.") and argv[0].endswith(
        "/bin/python"
    ), argv
    assert argv[1:4] == [
        "/usr/local/lib/sglang-deploy/sglang_launch.py",
        "--script",
        "/opt/sglang-lab/sglang_lab_server.py",
    ], argv
    args = argv[4:]
    # (the first flag of each dest in SGLang 0.5.23's parser, which the role's sglang_argv picks)
    for flag, value in (
        ("--tp-size", sample["sglang_tp_size"]),
        ("--mem-fraction-static", sample["sglang_mem_fraction_static"]),
        ("--reasoning-parser", sample["sglang_reasoning_parser"]),
        ("--tool-call-parser", sample["sglang_tool_call_parser"]),
        ("--served-model-name", sample["sglang_served_model_name"]),
        ("--speculative-algorithm", sample["sglang_speculative_algorithm"]),
        ("--speculative-draft-window-size", sample["sglang_speculative_draft_window_size"]),
        ("--model-path", LAB_TARGET),
        ("--speculative-draft-model-path", LAB_DRAFT),
    ):
        assert flag in args and args[args.index(flag) + 1] == str(value), (flag, value, args)
    assert "--trust-remote-code" in args, args
    for key, value in sample["sglang_environment"].items():
        assert facts["environ"].get(key) == value, (key, facts["environ"].get(key))
    info = facts["server_info"]
    assert "error" not in info, info
    for dest, setting in SAMPLE_ARGS.items():
        assert info.get(dest) == sample[setting], (dest, info.get(dest), sample[setting])
    assert info["model_path"] == LAB_TARGET and info["speculative_draft_model_path"] == LAB_DRAFT, info

    second = deploy(timeout=600)
    counts = recap(second, HOST)
    assert counts["changed"] == 0 and counts["failed"] == 0, (counts, second[-6000:])
    assert recap(second, "localhost")["changed"] == 0
    again = host_facts(sample["sglang_port"])["show"]
    assert again["InvocationID"] == show["InvocationID"], "a run with no change must not restart SGLang"
    assert (again["MainPID"], again["ActiveState"]) == (show["MainPID"], "active"), again
