"""A local signed TEST apt repository standing in for NVIDIA's CUDA repository, for lab hosts.

The repository carries packages with the real NVIDIA package names and versions but no payload
(Description "TEST FIXTURE - not the NVIDIA driver"), plus a newer 590 version that the pin must
not pick, a proprietary module package that must never be installable, and the CUDA 13.0 toolkit
package (one marker file under /usr/local/cuda-13.0). It is signed with a throwaway gpg key (so
Signed-By is exercised) and served over HTTP on the lab host's veth address, the only address a
lab host reaches.

Used by test_gpu_roles.py (playbooks/gpu.yml) and test_sample_inventory.py (deploy.yml with the
sample production inventory). Needs dpkg-deb, dpkg-scanpackages and gpg on the controller.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

# The driver version the nvidia_driver role pins (roles/nvidia_driver/defaults/main.yml) and a newer
# one of the next branch that the repository also offers.
VERSION = "580.126.09"
NEWER = "590.44.01"
# Debian 12/13 open-module compute packages (roles/nvidia_driver/vars/Debian-12.yml).
OPEN_PACKAGES = ["nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced", "nvidia-modprobe"]
# The proprietary kernel module package the role refuses.
REFUSED_PACKAGE = "nvidia-kernel-dkms"
# The cuda_toolkit role's default package for cuda_toolkit_version 13.0, and the file it ships.
CUDA_PACKAGE = "cuda-toolkit-13-0"
CUDA_VERSION = "13.0.2-1"
CUDA_HOME = "/usr/local/cuda-13.0"
CUDA_MARKER = f"{CUDA_HOME}/bin/.fixture"
PERSISTENCED_UNIT = """\
[Unit]
Description=NVIDIA Persistence Daemon (TEST FIXTURE)

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("check", True)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(cmd, **kw)


def build_deb(out: Path, name: str, version: str, files: dict[str, str] | None = None) -> Path:
    root = out / f"build-{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        textwrap.dedent(f"""\
        Package: {name}
        Version: {version}
        Architecture: amd64
        Maintainer: sglang-deploy tests <tests@invalid>
        Section: non-free/libs
        Priority: optional
        Description: TEST FIXTURE - not the NVIDIA driver
         Empty package with the name and version of NVIDIA's {name}, built by tests/integration/gpu_roles.
        """)
    )
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    deb = out / f"{name}_{version}_amd64.deb"
    run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)])
    shutil.rmtree(root)
    return deb


def build_repo(repo: Path, gnupg: Path) -> dict:
    """Build and sign the repository in `repo` (flat layout: Packages, Release, InRelease, test-key.asc).

    Returns {'debs': {(name, version): path}, 'key_sha256': hex digest of test-key.asc}.
    """
    repo.mkdir(parents=True)
    debs = {}
    for version in (f"{VERSION}-1", f"{NEWER}-1"):
        for name in OPEN_PACKAGES:
            files = (
                {"lib/systemd/system/nvidia-persistenced.service": PERSISTENCED_UNIT}
                if name == "nvidia-persistenced"
                else None
            )
            debs[(name, version)] = build_deb(repo, name, version, files)
    debs[(REFUSED_PACKAGE, f"{VERSION}-1")] = build_deb(repo, REFUSED_PACKAGE, f"{VERSION}-1")
    debs[(CUDA_PACKAGE, CUDA_VERSION)] = build_deb(
        repo, CUDA_PACKAGE, CUDA_VERSION, {CUDA_MARKER.lstrip("/"): "TEST FIXTURE\n"}
    )
    packages = run(["dpkg-scanpackages", "--multiversion", ".", "/dev/null"], cwd=repo).stdout
    (repo / "Packages").write_text(packages)
    data = (repo / "Packages").read_bytes()
    release = textwrap.dedent(f"""\
        Origin: sglang-deploy TEST FIXTURE
        Label: sglang-deploy TEST FIXTURE
        Date: {time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime())}
        SHA256:
         {hashlib.sha256(data).hexdigest()} {len(data)} Packages
        """)
    (repo / "Release").write_text(release)
    gnupg.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    run(
        [
            "gpg",
            "--batch",
            "--passphrase",
            "",
            "--quick-gen-key",
            "sglang-deploy TEST FIXTURE repository key",
            "ed25519",
            "sign",
            "1d",
        ],
        env=env,
    )
    run(
        ["gpg", "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
        env=env,
    )
    key = run(["gpg", "--batch", "--armor", "--export"], env=env).stdout
    # gpg started an agent for this throwaway home: stop it, or it outlives the test run.
    run(["gpgconf", "--kill", "gpg-agent"], env=env)
    (repo / "test-key.asc").write_text(key)
    return {"debs": debs, "key_sha256": hashlib.sha256(key.encode()).hexdigest()}


@contextlib.contextmanager
def serve_repo(base: Path, address: str, port: int) -> Iterator[dict]:
    """Build the repository under `base` and serve it on http://address:port/ while the block runs.

    Yields build_repo()'s dict plus 'url' (with the trailing slash) and 'dir'.
    """
    info = build_repo(base / "repo", base / "gnupg")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "http.server",
            str(port),
            "--bind",
            address,
            "--directory",
            str(base / "repo"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://{address}:{port}/"
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(url + "Release", timeout=2).close()
                break
            except OSError as exc:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"TEST apt repository not served on {url} (http.server rc {server.poll()}): {exc}"
                    ) from exc
            time.sleep(0.2)
        info["url"] = url
        info["dir"] = base / "repo"
        yield info
    finally:
        server.terminate()
        server.wait(timeout=10)


def driver_repo_settings(info: dict) -> dict:
    """The nvidia_driver settings that point the role at the served TEST repository."""
    return {
        "nvidia_driver_repo_url": info["url"],
        "nvidia_driver_repo_key_url": info["url"] + "test-key.asc",
        "nvidia_driver_repo_key_checksum": "sha256:" + info["key_sha256"],
    }


def recap(out: str, host: str) -> dict[str, int]:
    """The PLAY RECAP counters of `host` in ansible-playbook output (whitespace may be collapsed)."""
    match = re.search(
        rf"(?<![\w.-]){re.escape(host)}\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)"
        rf"\s+failed=(\d+)",
        out,
    )
    if not match:
        raise AssertionError(f"no PLAY RECAP line for {host}:\n{out[-3000:]}")
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, match.groups())))
