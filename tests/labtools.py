"""What the lab tests (tests/integration) share: what a lab host needs on the controller, the environment of
their ansible-playbook runs and the ssh command line of their own reads (one master connection per host,
as Ansible's own)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The tests' SSH master connections: this user's directory, 0700, as Ansible's ~/.ansible/cp (a socket path
# must stay short; %C is a hash of the connection).
SSH_CONTROL_DIR = Path.home() / ".ansible" / "cp-it"


def missing_lab_prerequisite() -> str | None:
    """What the controller lacks to start a lab host, and how to get it; None when nothing is missing.
    A lab test FAILS with this text (tests/integration/conftest.py): `make test` never passes without them."""
    if os.geteuid() != 0:
        return "lab hosts need root: run the lab tests as root (sudo make test, or sudo .venv/bin/pytest ...)"
    if not shutil.which("systemd-nspawn"):
        return (
            "lab hosts need systemd-nspawn: make deps (installs systemd-container and the other lab packages)"
        )
    if not (REPO / ".venv" / "bin" / "ansible-playbook").exists():
        return "no controller toolchain in .venv: make venv"
    return None


def ansible_env() -> dict[str, str]:
    """The environment of an ansible-playbook run from the repository: its ansible.cfg, its venv first."""
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        PATH=f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
    )


def ssh_argv(host_vars: dict, command: str, user: str | None = None) -> list[str]:
    """ssh to a lab host by its inventory variables. One master connection per host (ControlPersist), so
    the many short reads of a test cost ~0.05 s each instead of a new handshake (~0.3 s on 2 cores)."""
    SSH_CONTROL_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    return [
        "ssh",
        "-i",
        host_vars["ansible_ssh_private_key_file"],
        *shlex.split(host_vars.get("ansible_ssh_common_args", "")),
        "-o",
        "BatchMode=yes",
        "-o",
        "ControlMaster=auto",
        "-o",
        "ControlPersist=30s",
        "-o",
        f"ControlPath={SSH_CONTROL_DIR}/%C",
        f"{user or host_vars.get('ansible_user', 'root')}@{host_vars['ansible_host']}",
        command,
    ]
