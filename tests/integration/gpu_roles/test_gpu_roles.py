"""playbooks/gpu.yml for real on a lab host, against a local signed TEST apt repository.

The repository carries packages with the real NVIDIA package names and versions but no payload
(Description "TEST FIXTURE - not the NVIDIA driver"), plus a newer 590 version that the pin must
not pick and a proprietary module package that must never be installable. It is signed with a
throwaway gpg key (so Signed-By is exercised) and served over HTTP on the lab host's veth address.

Needs root, lab/labctl, dpkg-deb, dpkg-scanpackages and gpg. Lab host: lab70 (or the inventory
in $GPU_ROLES_INVENTORY, which is then neither started nor stopped here).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from apt_fixture import (
    CUDA_PACKAGE,
    NEWER,
    OPEN_PACKAGES,
    REFUSED_PACKAGE,
    VERSION,
    driver_repo_settings,
    recap,
    run,
    serve_repo,
)

REPO = Path(__file__).resolve().parents[3]
BIN = REPO / ".venv" / "bin"
INDEX = int(os.environ.get("GPU_ROLES_LAB_INDEX", "70"))
PORT = 8770


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    own = "GPU_ROLES_INVENTORY" not in os.environ
    inventory = Path(os.environ.get("GPU_ROLES_INVENTORY") or tmp_path_factory.mktemp("inv") / "hosts.yml")
    if own:
        up = run(
            [
                str(REPO / "lab" / "labctl"),
                "up",
                "--hosts",
                "1",
                "--first-index",
                str(INDEX),
                "--inventory",
                str(inventory),
            ],
            check=False,
            timeout=900,
        )
        if up.returncode != 0:
            run([str(REPO / "lab" / "labctl"), "down", "--inventory", str(inventory)], check=False)
            pytest.fail(f"labctl up failed: {up.stderr[-2000:]}")
    try:
        yield {"inventory": inventory, "host": f"lab{INDEX}", "address": f"10.213.{INDEX}.1"}
    finally:
        if own:
            run(
                [str(REPO / "lab" / "labctl"), "down", "--inventory", str(inventory)],
                check=False,
                timeout=300,
            )


@pytest.fixture(scope="module")
def served_repo(lab, tmp_path_factory):
    # A lab host has no route out: its Debian mirror source would make every `apt update` fail.
    # Set it aside for the test (the air-gapped situation this repository stands in for).
    rc, out = on_host(
        lab,
        'sh -c "test ! -e /etc/apt/sources.list || mv /etc/apt/sources.list '
        '/etc/apt/sources.list.gpu-roles-test"',
    )
    assert rc == 0, out
    reset_host(lab)
    try:
        with serve_repo(tmp_path_factory.mktemp("aptrepo"), lab["address"], PORT) as info:
            yield info
    finally:
        on_host(
            lab,
            'sh -c "test ! -e /etc/apt/sources.list.gpu-roles-test || mv '
            '/etc/apt/sources.list.gpu-roles-test /etc/apt/sources.list"',
        )


ROLE_FILES = [
    "/etc/apt/keyrings/nvidia-cuda.asc",
    "/etc/apt/sources.list.d/nvidia-cuda.sources",
    "/etc/apt/preferences.d/nvidia-driver.pref",
    "/etc/modprobe.d/blacklist-nouveau.conf",
    "/etc/systemd/system/nvidia-device-nodes.service",
    "/etc/profile.d/cuda.sh",
    "/etc/ld.so.conf.d/cuda.conf",
]


def reset_host(lab):
    """Remove what an earlier run left, so the first run below starts from a fresh host."""
    names = " ".join([*OPEN_PACKAGES, REFUSED_PACKAGE, CUDA_PACKAGE])
    script = (
        f"systemctl disable nvidia-device-nodes.service nvidia-persistenced.service 2>/dev/null; "
        f"dpkg --purge --force-hold {names} >/dev/null; rm -f {' '.join(ROLE_FILES)}; "
        "systemctl daemon-reload"
    )
    rc, out = on_host(lab, f"sh -c '{script}'")
    assert rc == 0, out


def playbook(lab, served_repo, tmp_path, extra=None, expect_rc=0):
    values = {
        **driver_repo_settings(served_repo),
        "nvidia_driver_version": VERSION,
        "nvidia_driver_reboot_allowed": False,
        "nvidia_gpu_check_enabled": False,
        "cuda_toolkit_enabled": True,
    }
    values.update(extra or {})
    args = [str(BIN / "ansible-playbook"), "-i", str(lab["inventory"]), str(REPO / "playbooks" / "gpu.yml")]
    for key, value in values.items():
        args += ["-e", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        PATH=f"{BIN}:{os.environ['PATH']}",
    )
    proc = run(args, check=False, env=env, cwd=REPO, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect_rc, out[-6000:]
    # the yaml result format wraps long messages: compare with whitespace collapsed
    return " ".join(out.split())


def on_host(lab, command):
    args = [
        str(BIN / "ansible"),
        "-i",
        str(lab["inventory"]),
        lab["host"],
        "-m",
        "ansible.builtin.command",
        "-a",
        command,
    ]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), PATH=f"{BIN}:{os.environ['PATH']}")
    proc = run(args, check=False, env=env, cwd=REPO)
    return proc.returncode, proc.stdout


def test_gpu_play_installs_pins_holds_and_is_idempotent(lab, served_repo, tmp_path):
    first = playbook(lab, served_repo, tmp_path)
    assert recap(first, lab["host"])["changed"] > 0
    assert "reboot required, not allowed (nvidia_driver_reboot_allowed: false)" in first
    assert "initramfs rebuild SKIPPED: this host is a container" in first
    assert "GPU check DISABLED" in first

    rc, policy = on_host(lab, "apt-cache policy nvidia-kernel-open-dkms nvidia-kernel-dkms")
    assert rc == 0, policy
    open_block = policy.split("nvidia-kernel-dkms:")[0]
    assert f"Installed: {VERSION}-1" in open_block
    assert f"Candidate: {VERSION}-1" in open_block, "the pin must win over the newer 590 package"
    assert f"{NEWER}-1" in open_block, "the newer version must be visible (and not chosen)"
    refused = policy.split("nvidia-kernel-dkms:")[1]
    assert "Candidate: (none)" in refused, "the proprietary package must be refused"

    rc, selections = on_host(lab, "dpkg --get-selections " + " ".join(OPEN_PACKAGES))
    for name in OPEN_PACKAGES:
        assert re.search(rf"^{name}\s+hold$", selections, re.M), selections

    rc, sources = on_host(lab, "cat /etc/apt/sources.list.d/nvidia-cuda.sources")
    assert f"URIs: {served_repo['url']}" in sources
    assert "Signed-By: /etc/apt/keyrings/nvidia-cuda.asc" in sources
    rc, blacklist = on_host(lab, "cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert "blacklist nouveau" in blacklist
    rc, unit = on_host(lab, "systemctl cat nvidia-device-nodes.service")
    assert "Before=sglang.service nvidia-persistenced.service" in unit
    assert "ExecStart=/usr/bin/nvidia-modprobe -u -c=0" in unit
    assert "ExecStart=/usr/bin/nvidia-modprobe -c=7" in unit
    rc, enabled = on_host(lab, "systemctl is-enabled nvidia-device-nodes.service nvidia-persistenced.service")
    assert enabled.count("enabled") == 2, enabled
    rc, profile = on_host(lab, "cat /etc/profile.d/cuda.sh /etc/ld.so.conf.d/cuda.conf")
    assert "/usr/local/cuda-13.0/bin" in profile and "/usr/local/cuda-13.0/lib64" in profile

    second = playbook(lab, served_repo, tmp_path)
    assert recap(second, lab["host"])["changed"] == 0, second[-4000:]
    assert "reboot required" not in second, "nothing changed: no reboot to decide"


def test_reboot_decision_paths(lab, served_repo, tmp_path):
    forced = playbook(lab, served_repo, tmp_path, {"nvidia_driver_force_module_changed": True})
    assert "reboot required, not allowed (nvidia_driver_reboot_allowed: false)" in forced
    assert recap(forced, lab["host"])["changed"] == 0
    allowed = playbook(
        lab,
        served_repo,
        tmp_path,
        {"nvidia_driver_force_module_changed": True, "nvidia_driver_reboot_allowed": True},
    )
    assert "reboot required, SKIPPED: this host is a container" in allowed
    assert "Reboot to load the new kernel module" in allowed  # the task exists and was skipped
    assert recap(allowed, lab["host"])["changed"] == 0


def test_installed_proprietary_module_fails_the_run(lab, served_repo, tmp_path):
    deb = served_repo["debs"][(REFUSED_PACKAGE, f"{VERSION}-1")]
    # the lab host (Debian minbase) has no curl: fetch with its python
    rc, out = on_host(
        lab,
        f'python3 -c "import urllib.request as u; '
        f"u.urlretrieve('{served_repo['url']}{deb.name}', '/tmp/{deb.name}')\"",
    )
    assert rc == 0, out
    rc, out = on_host(lab, f"dpkg -i /tmp/{deb.name}")
    assert rc == 0, out
    try:
        failed = playbook(lab, served_repo, tmp_path, expect_rc=2)
        assert "nvidia-kernel-dkms installed: the proprietary NVIDIA kernel module" in failed
    finally:
        rc, out = on_host(lab, "dpkg --purge nvidia-kernel-dkms")
        assert rc == 0, out
