"""playbooks/gpu.yml for real on a lab host, against a local signed TEST apt repository.

The repository carries packages with the real NVIDIA package names and versions but no payload
(Description "TEST FIXTURE - not the NVIDIA driver"), plus a newer 590 version that the pin must
not pick and a proprietary module package that must never be installable. It is signed with a
throwaway gpg key (so Signed-By is exercised) and served over HTTP on the lab host's veth address.

Needs root, lab/labctl, dpkg-deb, dpkg-scanpackages and gpg. Lab host: lab70 (or the inventory
in $GPU_ROLES_INVENTORY, which is then neither started nor stopped here).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / '.venv' / 'bin'
INDEX = int(os.environ.get('GPU_ROLES_LAB_INDEX', '70'))
PORT = 8770
VERSION = '580.126.09'
NEWER = '590.44.01'
OPEN_PACKAGES = ['nvidia-kernel-open-dkms', 'nvidia-driver-cuda', 'nvidia-persistenced', 'nvidia-modprobe']
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


def run(cmd, **kw):
    kw.setdefault('check', True)
    kw.setdefault('capture_output', True)
    kw.setdefault('text', True)
    return subprocess.run(cmd, **kw)


def build_deb(out: Path, name: str, version: str, files: dict[str, str] | None = None) -> Path:
    root = out / f'build-{name}-{version}'
    (root / 'DEBIAN').mkdir(parents=True)
    (root / 'DEBIAN' / 'control').write_text(textwrap.dedent(f"""\
        Package: {name}
        Version: {version}
        Architecture: amd64
        Maintainer: sglang-deploy tests <tests@invalid>
        Section: non-free/libs
        Priority: optional
        Description: TEST FIXTURE - not the NVIDIA driver
         Empty package with the name and version of NVIDIA's {name}, built by tests/gpu_roles.
        """))
    for rel, content in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    deb = out / f'{name}_{version}_amd64.deb'
    run(['dpkg-deb', '--root-owner-group', '--build', str(root), str(deb)])
    shutil.rmtree(root)
    return deb


def build_repo(repo: Path, gnupg: Path) -> dict:
    repo.mkdir(parents=True)
    debs = {}
    for version in (f'{VERSION}-1', f'{NEWER}-1'):
        for name in OPEN_PACKAGES:
            files = {'lib/systemd/system/nvidia-persistenced.service': PERSISTENCED_UNIT} \
                if name == 'nvidia-persistenced' else None
            debs[(name, version)] = build_deb(repo, name, version, files)
    debs[('nvidia-kernel-dkms', f'{VERSION}-1')] = build_deb(repo, 'nvidia-kernel-dkms', f'{VERSION}-1')
    debs[('cuda-toolkit-13-0', '13.0.2-1')] = build_deb(
        repo, 'cuda-toolkit-13-0', '13.0.2-1', {'usr/local/cuda-13.0/bin/.fixture': 'TEST FIXTURE\n'})
    packages = run(['dpkg-scanpackages', '--multiversion', '.', '/dev/null'], cwd=repo).stdout
    (repo / 'Packages').write_text(packages)
    data = (repo / 'Packages').read_bytes()
    release = textwrap.dedent(f"""\
        Origin: sglang-deploy TEST FIXTURE
        Label: sglang-deploy TEST FIXTURE
        Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}
        SHA256:
         {hashlib.sha256(data).hexdigest()} {len(data)} Packages
        """)
    (repo / 'Release').write_text(release)
    gnupg.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    run(['gpg', '--batch', '--passphrase', '', '--quick-gen-key',
         'sglang-deploy TEST FIXTURE repository key', 'ed25519', 'sign', '1d'], env=env)
    run(['gpg', '--batch', '--yes', '--clearsign', '-o', str(repo / 'InRelease'), str(repo / 'Release')],
        env=env)
    key = run(['gpg', '--batch', '--armor', '--export'], env=env).stdout
    (repo / 'test-key.asc').write_text(key)
    return {'debs': debs, 'key_sha256': hashlib.sha256(key.encode()).hexdigest()}


@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    own = 'GPU_ROLES_INVENTORY' not in os.environ
    inventory = Path(os.environ.get('GPU_ROLES_INVENTORY') or tmp_path_factory.mktemp('inv') / 'hosts.yml')
    if own:
        up = run([str(REPO / 'lab' / 'labctl'), 'up', '--hosts', '1', '--first-index', str(INDEX),
                  '--inventory', str(inventory)], check=False, timeout=900)
        if up.returncode != 0:
            run([str(REPO / 'lab' / 'labctl'), 'down', '--inventory', str(inventory)], check=False)
            pytest.fail(f'labctl up failed: {up.stderr[-2000:]}')
    try:
        yield {'inventory': inventory, 'host': f'lab{INDEX}', 'address': f'10.213.{INDEX}.1'}
    finally:
        if own:
            run([str(REPO / 'lab' / 'labctl'), 'down', '--inventory', str(inventory)],
                check=False, timeout=300)


@pytest.fixture(scope='module')
def served_repo(lab, tmp_path_factory):
    # A lab host has no route out: its Debian mirror source would make every `apt update` fail.
    # Set it aside for the test (the air-gapped situation this repository stands in for).
    rc, out = on_host(lab, 'sh -c "test ! -e /etc/apt/sources.list || mv /etc/apt/sources.list '
                           '/etc/apt/sources.list.gpu-roles-test"')
    assert rc == 0, out
    reset_host(lab)
    base = tmp_path_factory.mktemp('aptrepo')
    info = build_repo(base / 'repo', base / 'gnupg')
    server = subprocess.Popen(
        [sys.executable, '-m', 'http.server', str(PORT), '--bind', lab['address'],
         '--directory', str(base / 'repo')],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f'http://{lab["address"]}:{PORT}/Release', timeout=2).close()
                break
            except OSError:
                pass
            time.sleep(0.2)
        info['url'] = f'http://{lab["address"]}:{PORT}/'
        info['dir'] = base / 'repo'
        yield info
    finally:
        server.terminate()
        server.wait(timeout=10)
        on_host(lab, 'sh -c "test ! -e /etc/apt/sources.list.gpu-roles-test || mv '
                     '/etc/apt/sources.list.gpu-roles-test /etc/apt/sources.list"')


ROLE_FILES = [
    '/etc/apt/keyrings/nvidia-cuda.asc',
    '/etc/apt/sources.list.d/nvidia-cuda.sources',
    '/etc/apt/preferences.d/nvidia-driver.pref',
    '/etc/modprobe.d/blacklist-nouveau.conf',
    '/etc/systemd/system/nvidia-device-nodes.service',
    '/etc/profile.d/cuda.sh',
    '/etc/ld.so.conf.d/cuda.conf',
]


def reset_host(lab):
    """Remove what an earlier run left, so the first run below starts from a fresh host."""
    names = ' '.join([*OPEN_PACKAGES, 'nvidia-kernel-dkms', 'cuda-toolkit-13-0'])
    script = (f'systemctl disable nvidia-device-nodes.service nvidia-persistenced.service 2>/dev/null; '
              f'dpkg --purge --force-hold {names} >/dev/null; rm -f {" ".join(ROLE_FILES)}; '
              'systemctl daemon-reload')
    rc, out = on_host(lab, f"sh -c '{script}'")
    assert rc == 0, out


def playbook(lab, served_repo, tmp_path, extra=None, expect_rc=0):
    values = {
        'nvidia_driver_repo_url': served_repo['url'],
        'nvidia_driver_repo_key_url': served_repo['url'] + 'test-key.asc',
        'nvidia_driver_repo_key_checksum': 'sha256:' + served_repo['key_sha256'],
        'nvidia_driver_version': VERSION,
        'nvidia_driver_reboot_allowed': False,
        'nvidia_gpu_check_enabled': False,
        'cuda_toolkit_enabled': True,
    }
    values.update(extra or {})
    args = [str(BIN / 'ansible-playbook'), '-i', str(lab['inventory']), str(REPO / 'playbooks' / 'gpu.yml')]
    for key, value in values.items():
        args += ['-e', f'{key}={str(value).lower() if isinstance(value, bool) else value}']
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_FORCE_COLOR='0',
               PATH=f'{BIN}:{os.environ["PATH"]}')
    proc = run(args, check=False, env=env, cwd=REPO, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == expect_rc, out[-6000:]
    # the yaml result format wraps long messages: compare with whitespace collapsed
    return ' '.join(out.split())


def recap(out, host):
    match = re.search(rf'{host} : ok=(\d+) changed=(\d+) unreachable=(\d+) failed=(\d+)', out)
    assert match, out[-3000:]
    return dict(zip(('ok', 'changed', 'unreachable', 'failed'), map(int, match.groups())))


def on_host(lab, command):
    args = [str(BIN / 'ansible'), '-i', str(lab['inventory']), lab['host'], '-m', 'ansible.builtin.command',
            '-a', command]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), PATH=f'{BIN}:{os.environ["PATH"]}')
    proc = run(args, check=False, env=env, cwd=REPO)
    return proc.returncode, proc.stdout


def test_gpu_play_installs_pins_holds_and_is_idempotent(lab, served_repo, tmp_path):
    first = playbook(lab, served_repo, tmp_path)
    assert recap(first, lab['host'])['changed'] > 0
    assert 'reboot required, not allowed (nvidia_driver_reboot_allowed: false)' in first
    assert 'initramfs rebuild SKIPPED: this host is a container' in first
    assert 'GPU check DISABLED' in first

    rc, policy = on_host(lab, 'apt-cache policy nvidia-kernel-open-dkms nvidia-kernel-dkms')
    assert rc == 0, policy
    open_block = policy.split('nvidia-kernel-dkms:')[0]
    assert f'Installed: {VERSION}-1' in open_block
    assert f'Candidate: {VERSION}-1' in open_block, 'the pin must win over the newer 590 package'
    assert f'{NEWER}-1' in open_block, 'the newer version must be visible (and not chosen)'
    refused = policy.split('nvidia-kernel-dkms:')[1]
    assert 'Candidate: (none)' in refused, 'the proprietary package must be refused'

    rc, selections = on_host(lab, 'dpkg --get-selections ' + ' '.join(OPEN_PACKAGES))
    for name in OPEN_PACKAGES:
        assert re.search(rf'^{name}\s+hold$', selections, re.M), selections

    rc, sources = on_host(lab, 'cat /etc/apt/sources.list.d/nvidia-cuda.sources')
    assert f'URIs: {served_repo["url"]}' in sources
    assert 'Signed-By: /etc/apt/keyrings/nvidia-cuda.asc' in sources
    rc, blacklist = on_host(lab, 'cat /etc/modprobe.d/blacklist-nouveau.conf')
    assert 'blacklist nouveau' in blacklist
    rc, unit = on_host(lab, 'systemctl cat nvidia-device-nodes.service')
    assert 'Before=sglang.service nvidia-persistenced.service' in unit
    assert 'ExecStart=/usr/bin/nvidia-modprobe -u -c=0' in unit
    assert 'ExecStart=/usr/bin/nvidia-modprobe -c=7' in unit
    rc, enabled = on_host(lab, 'systemctl is-enabled nvidia-device-nodes.service nvidia-persistenced.service')
    assert enabled.count('enabled') == 2, enabled
    rc, profile = on_host(lab, 'cat /etc/profile.d/cuda.sh /etc/ld.so.conf.d/cuda.conf')
    assert '/usr/local/cuda-13.0/bin' in profile and '/usr/local/cuda-13.0/lib64' in profile

    second = playbook(lab, served_repo, tmp_path)
    assert recap(second, lab['host'])['changed'] == 0, second[-4000:]
    assert 'reboot required' not in second, 'nothing changed: no reboot to decide'


def test_reboot_decision_paths(lab, served_repo, tmp_path):
    forced = playbook(lab, served_repo, tmp_path, {'nvidia_driver_force_module_changed': True})
    assert 'reboot required, not allowed (nvidia_driver_reboot_allowed: false)' in forced
    assert recap(forced, lab['host'])['changed'] == 0
    allowed = playbook(lab, served_repo, tmp_path, {'nvidia_driver_force_module_changed': True,
                                                    'nvidia_driver_reboot_allowed': True})
    assert 'reboot required, SKIPPED: this host is a container' in allowed
    assert 'Reboot to load the new kernel module' in allowed  # the task exists and was skipped
    assert recap(allowed, lab['host'])['changed'] == 0


def test_installed_proprietary_module_fails_the_run(lab, served_repo, tmp_path):
    deb = served_repo['debs'][('nvidia-kernel-dkms', f'{VERSION}-1')]
    # the lab host (Debian minbase) has no curl: fetch with its python
    rc, out = on_host(lab, f'python3 -c "import urllib.request as u; '
                           f'u.urlretrieve(\'{served_repo["url"]}{deb.name}\', \'/tmp/{deb.name}\')"')
    assert rc == 0, out
    rc, out = on_host(lab, f'dpkg -i /tmp/{deb.name}')
    assert rc == 0, out
    try:
        failed = playbook(lab, served_repo, tmp_path, expect_rc=2)
        assert 'nvidia-kernel-dkms installed: the proprietary NVIDIA kernel module' in failed
    finally:
        rc, out = on_host(lab, 'dpkg --purge nvidia-kernel-dkms')
        assert rc == 0, out
