"""Every systemd unit the project renders is held to a `systemd-analyze security` exposure threshold (issue 37
item 8, property P8 of docs/properties.md).

ONE controller-only ``ansible-playbook`` run (``ansible_connection: local``, nothing deployed) renders each
unit template with its role's own variables (the sglang role's controller checks included with ``public:
true``, as tests/unit/roles/test_sglang_environment.py does; the other roles' defaults and vars files read as
they are), then ``systemd-analyze security --offline=yes --threshold=N`` (systemd 252, Debian 12) rates each
file. A threshold above 2.0 is an exception; its reason stands beside it in THRESHOLDS and in the unit's own
comments. Timers and sockets start no process of their own: systemd-analyze rates only services, and the
services they start are in the table.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from conftest import REPO, run_playbook

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")

SGLANG = "roles/sglang/templates/etc/systemd/system/"
# (test id, host, template, file name systemd-analyze reads, threshold, why it is above 2.0 when it is)
THRESHOLDS = [
    ("sglang-gpu", "gpu", SGLANG + "sglang.service.j2", "sglang.service", 2.0, None),
    ("sglang-loopback", "gpu-loopback", SGLANG + "sglang.service.j2", "sglang.service", 2.0, None),
    (
        "sglang-no-device-policy",
        "cpu",
        SGLANG + "sglang.service.j2",
        "sglang.service",
        2.2,
        "sglang_gpu_devices: false (containers, CPU lab hosts) renders no device policy, and so no "
        "ProtectClock: its implied DeviceAllow=char-rtc would close every other device (DevicePolicy=auto)",
    ),
    ("deploy-heal", "gpu", SGLANG + "sglang-deploy-heal.service.j2", "sglang-deploy-heal.service", 2.0, None),
    (
        "deploy-watch",
        "gpu",
        SGLANG + "sglang-deploy-watch.service.j2",
        "sglang-deploy-watch.service",
        2.0,
        None,
    ),
    (
        "deploy-watch-revert",
        "gpu-revert",
        SGLANG + "sglang-deploy-watch.service.j2",
        "sglang-deploy-watch.service",
        2.0,
        None,
    ),
    (
        "plan-probe",
        "gpu",
        SGLANG + "sglang-plan-probe@.service.j2",
        "sglang-plan-probe@0.service",
        2.8,
        "root with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH (the server's /proc environ and fds, root-only "
        "files); HTTP to the server's address; no ProtectKernelTunables/ProtectControlGroups (journalctl "
        "then shows none of the unit's lines on systemd 252)",
    ),
    (
        "router",
        "router",
        "roles/sglang_router/templates/etc/systemd/system/sglang-router.service.j2",
        "sglang-router.service",
        2.0,
        None,
    ),
    (
        "pull",
        "gpu",
        "roles/sglang_pull/templates/etc/systemd/system/sglang-pull.service.j2",
        "sglang-pull.service",
        8.9,
        "it is the deploy (ansible-pull of deploy.yml as root): packages, the NVIDIA driver and its kernel "
        "modules, /etc, /opt, units; only what no deploy step needs is taken away",
    ),
    (
        "nvidia-device-nodes",
        "gpu",
        "roles/nvidia_driver/templates/etc/systemd/system/nvidia-device-nodes.service.j2",
        "nvidia-device-nodes.service",
        9.6,
        "root, loads the NVIDIA kernel modules and creates /dev/nvidia* with nvidia-modprobe at boot; it "
        "never runs in a lab container (ConditionVirtualization=!container): no sandbox of it is proven here",
    ),
]
# Units that start no process of their own, with the service each starts (rated above).
TRIGGERS = [
    (SGLANG + "sglang-plan-probe.socket.j2", "plan-probe"),
    (SGLANG + "sglang-deploy-watch.timer.j2", "deploy-watch"),
    ("roles/sglang_pull/templates/etc/systemd/system/sglang-pull.timer.j2", "pull"),
]

HOSTS = {
    # A GPU host of the sample inventory: device policy on, the server reachable by the router and clients.
    "gpu": {"sglang_host": "0.0.0.0"},
    # The role's defaults: loopback only.
    "gpu-loopback": {},
    # A CPU lab host: no device policy lines.
    "cpu": {"sglang_gpu_devices": False},
    # The watch with its opt-in revert: it writes the unit and the configuration.
    "gpu-revert": {"sglang_watch_revert": True},
}
STAND_INS = {
    # sglang_argv's result and the probe's release, as tests/unit/roles/test_sglang_environment.py stands in
    # for them.
    "__sglang_argv": {
        "argv": ["--model-path", "/srv/m", "--api-key", "${SGLANG_API_KEY}"],
        "secret_positions": [3],
        "env": {},
        "managed": {"model_path": "/srv/m"},
        "runner_lines": {},
        "flag_dests": {},
        "version": "0.5.23",
    },
    "__sglang_probe": {
        "release": {
            "key": "0.5.23-py3.11-0123456789ab",
            "path": "/opt/sglang/releases/0.5.23-py3.11-0123456789ab",
            "python_version": "3.11",
        }
    },
}


def _lookup(path):
    return "{{ lookup('ansible.builtin.template', repo ~ '/" + path + "') }}"


def _play():
    sglang_units = {t[2] for t in THRESHOLDS if t[2].startswith(SGLANG)} | {
        t[0] for t in TRIGGERS if t[0].startswith(SGLANG)
    }
    other = {t[2] for t in THRESHOLDS if not t[2].startswith(SGLANG) and "sglang_router" not in t[2]} | {
        t[0] for t in TRIGGERS if not t[0].startswith(SGLANG)
    }
    router = {t[2] for t in THRESHOLDS if "sglang_router" in t[2]}

    def show(paths):
        return {
            "name": "Show the rendered units",
            "ansible.builtin.debug": {"msg": {p: _lookup(p) for p in sorted(paths)}},
        }

    return [
        {
            "name": "Render the units of the sglang, sglang_pull and nvidia_driver roles",
            "hosts": "gpu_nodes",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the role's controller-side checks (and keep its variables)",
                    "ansible.builtin.include_role": {
                        "name": "sglang",
                        "tasks_from": "preflight.yml",
                        "public": True,
                    },
                },
                {"name": "Stand in for sglang_argv and the probe", "ansible.builtin.set_fact": STAND_INS},
                {
                    "name": "Read the other roles' variables",
                    "ansible.builtin.include_vars": {"file": "{{ repo }}/roles/{{ item }}"},
                    "loop": [
                        "sglang_pull/defaults/main.yml",
                        "sglang_pull/vars/main.yml",
                        "nvidia_driver/defaults/main.yml",
                    ],
                },
                show(sglang_units | other),
            ],
        },
        {
            "name": "Render the router's unit",
            "hosts": "routers",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the router role's checks (and keep its variables)",
                    "ansible.builtin.include_role": {
                        "name": "sglang_router",
                        "tasks_from": "preflight.yml",
                        "public": True,
                    },
                },
                {
                    "name": "Stand in for the router's command line",
                    "ansible.builtin.set_fact": {
                        "__sglang_router_argv": "{{ [sglang_router_venv ~ '/bin/python', '--worker-urls'] "
                        "+ __sglang_router_workers }}"
                    },
                },
                show(router),
            ],
        },
    ]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{host: {template path: text}} for every host of HOSTS and the router."""
    tmp = tmp_path_factory.mktemp("unit-hardening")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {
        "all": {
            "vars": {"repo": str(REPO)},
            "children": {
                "gpu_nodes": {"hosts": {name: dict(v, **local) for name, v in HOSTS.items()}},
                "routers": {"hosts": {"router": dict(local, sglang_router_admin_key="sk-admin-sentinel")}},
            },
        }
    }
    (tmp / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (tmp / "play.yml").write_text(yaml.safe_dump(_play(), sort_keys=False))
    done = run_playbook("-i", tmp / "inventory.yml", tmp / "play.yml", json_output=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = {}
    for play in json.loads(done.stdout)["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == "Show the rendered units":
                for host, result in task["hosts"].items():
                    out[host] = result["msg"]
    return out


def security(path, threshold):
    """(exit status, overall exposure, the table) of ``systemd-analyze security`` on a unit file."""
    done = subprocess.run(
        # --threshold counts tenths of the exposure level it prints (0-100).
        [
            SYSTEMD_ANALYZE,
            "security",
            "--offline=yes",
            f"--threshold={round(threshold * 10)}",
            "--no-pager",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", done.stdout + done.stderr)
    return done.returncode, float(found.group(1)) if found else None, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("host", "template", "name", "threshold", "reason"),
    [t[1:] for t in THRESHOLDS],
    ids=[t[0] for t in THRESHOLDS],
)
def test_unit_is_below_its_exposure_threshold(rendered, tmp_path, host, template, name, threshold, reason):
    """systemd-analyze itself judges the rendered file: exit 0 at --threshold, and an exception above 2.0
    carries its reason."""
    path = tmp_path / name
    path.write_text(rendered[host][template])
    rc, exposure, table = security(path, threshold)
    assert exposure is not None, table
    assert rc == 0 and exposure <= threshold, f"{name} ({host}): exposure {exposure} > {threshold}\n{table}"
    assert threshold <= 2.0 or reason, f"{name}: a threshold above 2.0 needs its reason"


@pytest.mark.parametrize(("template", "service"), TRIGGERS, ids=[t[1] for t in TRIGGERS])
def test_a_trigger_unit_starts_only_a_rated_service(rendered, template, service):
    """A socket or timer runs nothing itself (no Exec*= line); what it starts is rated above."""
    text = rendered["gpu"][template]
    assert not re.search(r"^\s*Exec\w*=", text, re.M), text
    assert service in {t[0] for t in THRESHOLDS}


def settings(text):
    """The unit's non-comment lines."""
    return [line for line in text.splitlines() if line and not line.startswith(("#", ";"))]


def test_the_sglang_unit_keeps_what_cuda_and_nccl_need(rendered):
    """The hardening leaves the GPUs, the shared /dev/shm, JIT-compiled code and CUDA's fd passing alone."""
    gpu = settings(rendered["gpu"][SGLANG + "sglang.service.j2"])
    cpu = settings(rendered["cpu"][SGLANG + "sglang.service.j2"])
    for lines in (gpu, cpu):
        keys = {line.split("=", 1)[0] for line in lines}
        assert not keys & {"PrivateDevices", "MemoryDenyWriteExecute", "PrivateIPC", "ProcSubset"}, keys
        assert not [line for line in lines if "/dev/shm" in line]
        assert "SystemCallFilter=@system-service pidfd_getfd" in lines
        assert "SystemCallErrorNumber=EPERM" in lines
    assert "DeviceAllow=char-nvidia* rw" in gpu and "ProtectClock=yes" in gpu
    # Without the device policy ProtectClock's implied DeviceAllow= would close every device.
    assert not [line for line in cpu if line.startswith(("DeviceAllow", "ProtectClock"))]
