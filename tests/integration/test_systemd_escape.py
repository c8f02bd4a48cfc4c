"""The sglang role's systemd quoting (roles/sglang/filter_plugins/sglang_systemd.py) on a lab host: systemd
itself parses a unit and an env file rendered by the filters, starts the command, and /proc/MAINPID/cmdline
and /proc/MAINPID/environ equal the intended argv and environment byte for byte. The awkward values and the
table-driven tests are tests/unit/plugins/test_sglang_systemd_filters.py.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shlex
import subprocess
import sys
import uuid

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The cases and the rendering are the unit test's (one table for both).
sys.path.insert(0, str(ROOT / "tests" / "unit" / "plugins"))
from test_sglang_systemd_filters import AWKWARD_ARGV, AWKWARD_ENV, LAUNCHER, SECRET, _env_text, _unit_text


def _lab_host():
    path = pathlib.Path(os.environ.get("SGLANG_LAB_INVENTORY", ROOT / "inventory" / "lab" / "hosts.yml"))
    if not path.is_file():
        return None
    hosts = yaml.safe_load(path.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
    name, host = next(iter(hosts.items()))
    ssh = [
        "ssh",
        "-i",
        host["ansible_ssh_private_key_file"],
        *shlex.split(host.get("ansible_ssh_common_args", "")),
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        f"{host.get('ansible_user', 'root')}@{host['ansible_host']}",
    ]
    return name, ssh


# Runs ON the lab host (its python3): writes unit + env into /run/systemd/system, starts the
# unit, reads the main process's argv and environment as the kernel holds them, stops and
# removes the unit. Prints JSON.
_REMOTE = r"""
import base64, json, os, subprocess, sys, time
job = json.loads(base64.b64decode(sys.argv[1]))
unit, env_path = job["unit"], job["env_path"]
unit_path = "/run/systemd/system/" + unit
def sh(*argv, check=True):
    return subprocess.run(argv, capture_output=True, text=True, check=check)
out = {}
try:
    with open(env_path, "w", encoding="utf-8") as f:
        f.write(job["env"])
    os.chmod(env_path, 0o600)
    with open(unit_path, "w", encoding="utf-8") as f:
        f.write(job["unit_text"])
    verify = sh("systemd-analyze", "verify", "--recursive-errors=no", unit_path, check=False)
    out["verify"] = [verify.returncode, verify.stderr]
    sh("systemctl", "daemon-reload")
    sh("systemctl", "start", unit)
    pid = 0
    for _ in range(100):
        pid = int(sh("systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip() or 0)
        if pid:
            break
        time.sleep(0.1)
    # Type=simple: MainPID is set at the fork, and until the exec the child is named "(python3)".
    for _ in range(100):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        if cmdline and not cmdline.startswith(b"("):
            break
        time.sleep(0.1)
    out["cmdline"] = base64.b64encode(cmdline).decode()
    with open(f"/proc/{pid}/environ", "rb") as f:
        out["environ"] = base64.b64encode(f.read()).decode()
finally:
    sh("systemctl", "stop", unit, check=False)
    for path in (unit_path, env_path):
        if os.path.exists(path):
            os.unlink(path)
    sh("systemctl", "daemon-reload", check=False)
print(json.dumps(out))
"""


def test_systemd_runs_exactly_the_intended_argv_and_environment():
    lab = _lab_host()
    if lab is None:
        pytest.fail(
            "no lab inventory: set SGLANG_LAB_INVENTORY to one (make lab-tests does) or run make lab-up "
            "(inventory/lab/hosts.yml)"
        )
    _, ssh = lab
    name = f"escape-probe-{uuid.uuid4().hex[:8]}"
    env_path = f"/run/{name}.env"
    env = {**AWKWARD_ENV, "SGLANG_API_KEY": SECRET}
    argv = LAUNCHER + AWKWARD_ARGV + ["--api-key", "${SGLANG_API_KEY}", "x${SGLANG_API_KEY}y"]
    secret_at = len(argv) - 2
    job = {
        "unit": f"{name}.service",
        "env_path": env_path,
        "env": _env_text(env),
        "unit_text": _unit_text(argv, env_path, [secret_at]),
    }
    payload = base64.b64encode(json.dumps(job).encode()).decode()
    proc = subprocess.run(
        [*ssh, "python3", "-c", shlex.quote(_REMOTE), payload], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verify"][0] == 0, out["verify"][1]
    assert name not in out["verify"][1], out["verify"][1]

    cmdline = base64.b64decode(out["cmdline"]).decode("utf-8").split("\0")[:-1]
    # Substituted only at its position; the same text in user values arrives literally.
    intended = [SECRET if i == secret_at else a for i, a in enumerate(argv)]
    assert cmdline == intended

    environ = dict(
        item.split("=", 1) for item in base64.b64decode(out["environ"]).decode("utf-8").split("\0") if item
    )
    for key, value in env.items():
        assert environ.get(key) == value, key
