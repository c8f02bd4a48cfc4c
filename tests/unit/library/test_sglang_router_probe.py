"""library/sglang_router_probe.py: what keeps a router host from being as the sglang_router role leaves it,
judged from systemd 252's recorded `systemctl show` outputs (tests/fixtures/systemd/), smg 1.13.0's recorded
`GET /workers` answers (tests/fixtures/router/) and real files."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd

import pytest
from conftest import FIXTURES, load_module

probe = load_module("sglang_router_probe")


def show(name: str) -> dict:
    text = (FIXTURES / "systemd" / name).read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def workers(name: str) -> tuple:
    recorded = json.loads((FIXTURES / "router" / f"{name}.json").read_text())
    return recorded["status"], recorded["body"]


SERVICE = "sglang-router.service"
WORKER = "http://127.0.0.1:60623"  # the worker of the recording


@pytest.mark.parametrize(
    "fixture, reasons",
    [
        ("unit-show-enabled.txt", []),
        ("unit-show-need-reload.txt", [f"{SERVICE}: systemd has not read its unit file since it changed"]),
        ("unit-show-not-found.txt", [f"{SERVICE} is not installed (LoadState=not-found)"]),
        ("show-vr-crash.txt", [f"{SERVICE} is not active (ActiveState=failed)"]),
    ],
)
def test_service_differences_from_recorded_systemctl_show(fixture, reasons):
    props = show(fixture)
    if fixture.startswith("show-vr"):  # a recorded sglang.service: loaded and enabled
        props.setdefault("UnitFileState", "enabled")
    assert probe.service_differences(props, SERVICE) == reasons


def test_a_disabled_unit_is_a_difference():
    props = dict(show("unit-show-enabled.txt"), UnitFileState="disabled")
    assert probe.service_differences(props, SERVICE) == [f"{SERVICE} is not enabled (UnitFileState=disabled)"]


@pytest.mark.parametrize(
    "fixture, wanted, ready, reasons",
    [
        ("get_workers_one_ready", [WORKER], [WORKER], []),
        (
            "get_workers_one_ready",
            ["http://127.0.0.1:60623", "http://10.0.0.2:30000"],
            ["http://127.0.0.1:60623"],
            ["the router does not list http://10.0.0.2:30000 ready"],
        ),
        (
            "get_workers_empty",
            ["http://127.0.0.1:60623"],
            [],
            ["the router does not list http://127.0.0.1:60623 ready"],
        ),
        (
            "get_workers_no_key",
            ["http://127.0.0.1:60623"],
            [],
            ["GET /workers answered 401, not the worker list"],
        ),
    ],
)
def test_workers_differences_from_recorded_answers(fixture, wanted, ready, reasons):
    assert probe.workers_differences(workers(fixture), wanted) == (ready, reasons)


def test_listener_differences():
    group = "/system.slice/sglang-router.service"
    mine = {"pids": [41], "in_cgroup": True}
    assert probe.listener_differences([mine], 30000, group) == []
    assert probe.listener_differences([], 30000, group) == ["nothing listens on port 30000"]
    assert probe.listener_differences([mine, {"pids": [7], "in_cgroup": False}], 30000, group) == [
        f"port 30000 is held outside {group} (pid 7)"
    ]


def wanted(path, content=None, mode="0600"):
    me, my_group = pwd.getpwuid(os.getuid())[0], grp.getgrgid(os.getgid())[0]
    item = {"path": str(path), "owner": me, "group": my_group, "mode": mode}
    if content is not None:
        item["sha256"] = hashlib.sha256(content).hexdigest()
    return item


def test_file_differences_on_real_files(tmp_path):
    key = tmp_path / "admin_key"
    key.write_bytes(b"secret\n")
    key.chmod(0o600)
    assert probe.file_differences(wanted(key, b"secret\n"), probe.path_state(str(key))) == []
    assert probe.file_differences(wanted(key, b"rotated\n"), probe.path_state(str(key))) == [
        f"{key}: content differs"
    ]
    key.chmod(0o644)
    assert probe.file_differences(wanted(key, b"secret\n"), probe.path_state(str(key))) == [
        f"{key}: mode 0644, not 0600"
    ]
    other = dict(wanted(key, b"secret\n", mode="0644"), owner="nobody-else")
    assert probe.file_differences(other, probe.path_state(str(key))) == [
        f"{key}: owner {pwd.getpwuid(os.getuid())[0]}, not nobody-else"
    ]
    assert probe.file_differences(
        wanted(tmp_path / "gone", b"x"), probe.path_state(str(tmp_path / "gone"))
    ) == [f"{tmp_path / 'gone'} is missing"]
    tmp_path.chmod(0o700)
    assert probe.file_differences(wanted(tmp_path, mode="0700"), probe.path_state(str(tmp_path))) == []
    assert probe.file_differences(wanted(tmp_path, b"x"), probe.path_state(str(tmp_path))) == [
        f"{tmp_path} is not a regular file"
    ]
