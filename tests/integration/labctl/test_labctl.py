"""lab/labctl against real systemd-nspawn hosts (root, systemd-container; ~10 s).

Uses two hosts with high indices (LAB_TEST_FIRST_INDEX, default 240) and a temporary inventory, so
it does not collide with lab hosts others are using: `up --hosts 1 --routers 1`, a GPU node and a router
host sharing the fleet network of their inventory. The tests run in file order on that pair of hosts;
the last one stops them and checks that nothing is left behind (bridge included).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from labtools import missing_lab_prerequisite

REPO = Path(__file__).resolve().parents[3]
LABCTL = REPO / "lab" / "labctl"
KEY = REPO / ".lab" / "ssh" / "id_ed25519"
KNOWN_HOSTS = REPO / ".lab" / "known_hosts"
FIRST = int(os.environ.get("LAB_TEST_FIRST_INDEX", "240"))
NAMES = [f"lab{FIRST}", f"lab{FIRST + 1}"]


@pytest.fixture(scope="module", autouse=True)
def lab_prerequisites() -> None:
    """Before the module's hosts are started (an autouse fixture comes first among those of its scope)."""
    missing = missing_lab_prerequisite()
    if missing:
        pytest.fail(missing)


def labctl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(LABCTL), *args], text=True, capture_output=True, timeout=600)
    if check:
        assert proc.returncode == 0, (
            f"labctl {' '.join(args)} rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def ssh(address: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(KEY),
            "-o",
            f"UserKnownHostsFile={KNOWN_HOSTS}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{address}",
            command,
        ],
        text=True,
        capture_output=True,
        timeout=60,
    )


def state(name: str) -> dict:
    return json.loads(Path(f"/run/sglang-lab/{name}/state.json").read_text())


def nspawn_pids(name: str) -> list[int]:
    """Live (non-zombie) systemd-nspawn processes of a host."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if stat[0] != "Z" and argv[0].endswith(b"systemd-nspawn") and f"--machine={name}".encode() in argv:
            pids.append(int(entry))
    return pids


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    inventory = tmp_path_factory.mktemp("lab") / "hosts.yml"
    for name in NAMES:
        assert not nspawn_pids(name), f"{name} already runs; set LAB_TEST_FIRST_INDEX to a free range"
    up = labctl(
        "up", "--hosts", "1", "--routers", "1", "--first-index", str(FIRST), "--inventory", str(inventory)
    )
    yield {"inventory": inventory, "up": up}
    labctl("down", "--inventory", str(inventory), check=False)


def test_up_reports_every_host_running(lab) -> None:
    lines = [ln.split("\t") for ln in lab["up"].stdout.splitlines() if ln.startswith("lab")]
    assert [ln[0] for ln in lines] == NAMES
    for fields, name in zip(lines, NAMES):
        assert fields[1] == f"10.213.{name[3:]}.2"
        assert fields[3] == "running", fields
        assert fields[5:] == (["router"] if name == NAMES[1] else ["gpu_node"]) + [
            f"fleet=10.214.0.{name[3:]}"
        ]
        assert nspawn_pids(name) == [state(name)["pid"]]
        assert Path(f"/run/sglang-lab/{name}/pid").read_text().strip() == str(state(name)["pid"])


def test_inventory_groups_and_connection_vars(lab) -> None:
    inv = yaml.safe_load(lab["inventory"].read_text())
    groups = inv["all"]["children"]
    # The router host follows the GPU nodes and is not one of them.
    assert list(groups["gpu_nodes"]["hosts"]) == NAMES[:1]
    assert list(groups["routers"]["hosts"]) == NAMES[1:]
    assert list(groups["lab"]["hosts"]) == NAMES
    for name in NAMES:
        hv = {**groups["gpu_nodes"]["hosts"], **groups["routers"]["hosts"]}[name]
        assert hv["lab_fleet_address"] == f"10.214.0.{name[3:]}"
        assert hv["ansible_host"] == f"10.213.{name[3:]}.2"
        assert hv["ansible_user"] == "root"
        assert hv["ansible_ssh_private_key_file"] == str(KEY)
        assert f"-o UserKnownHostsFile={KNOWN_HOSTS}" in hv["ansible_ssh_common_args"]
        assert "-o StrictHostKeyChecking=yes" in hv["ansible_ssh_common_args"]
        assert hv["ansible_python_interpreter"] == "/usr/bin/python3"


def test_known_hosts_holds_each_hosts_own_key(lab) -> None:
    entries = {ln.split()[0]: " ".join(ln.split()[1:3]) for ln in KNOWN_HOSTS.read_text().splitlines()}
    keys = set()
    for name in NAMES:
        own = Path(state(name)["root"], "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
        assert entries[f"{name},10.213.{name[3:]}.2"] == " ".join(own)
        keys.add(own[1])
    assert len(keys) == len(NAMES), "hosts share a host key"


@pytest.mark.parametrize("name", NAMES)
def test_ssh_reaches_a_running_systemd(lab, name: str) -> None:
    address = f"10.213.{name[3:]}.2"
    proc = ssh(address, "systemctl is-system-running")
    assert (proc.returncode, proc.stdout.strip()) == (0, "running"), proc.stderr
    proc = ssh(address, "cat /proc/1/comm; readlink /proc/1/exe; hostname; cat /etc/machine-id")
    comm, exe, hostname, machine_id = proc.stdout.split()
    assert (comm, exe, hostname) == ("systemd", "/usr/lib/systemd/systemd", name)
    assert len(machine_id) == 32
    proc = ssh(address, "systemctl is-active systemd-journald.service ssh.service dbus.service")
    assert proc.stdout.split() == ["active", "active", "active"], proc.stdout + proc.stderr


def test_machine_ids_differ(lab) -> None:
    ids = {ssh(f"10.213.{n[3:]}.2", "cat /etc/machine-id").stdout.strip() for n in NAMES}
    assert len(ids) == len(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_host_sees_only_its_own_address(lab, name: str) -> None:
    """Its /30 link to the controller and its fleet address; the other host's /30 is unreachable."""
    k = name[3:]
    proc = ssh(f"10.213.{k}.2", "ip -o -4 addr show; echo ---; ip -4 route show")
    addrs, routes = proc.stdout.split("---\n")
    found = sorted((ln.split()[1], ln.split()[3]) for ln in addrs.splitlines())
    assert found == [("fleet0", f"10.214.0.{k}/24"), ("host0", f"10.213.{k}.2/30"), ("lo", "127.0.0.1/8")]
    assert sorted(routes.splitlines()) == [
        f"10.213.{k}.0/30 dev host0 proto kernel scope link src 10.213.{k}.2 ",
        f"10.214.0.0/24 dev fleet0 proto kernel scope link src 10.214.0.{k} ",
    ]
    other = f"10.213.{int(k) + 1 if name == NAMES[0] else int(k) - 1}.2"
    proc = ssh(f"10.213.{k}.2", f"ip route get {other}")
    assert proc.returncode != 0 and "unreachable" in proc.stderr, proc.stdout + proc.stderr


def test_fleet_network_joins_the_hosts_of_the_inventory_and_not_the_controller(lab) -> None:
    """The router host reaches the GPU node's fleet address (its sshd there); the controller holds no
    address on the bridge, so it routes nothing into the fleet network."""
    gpu = f"10.214.0.{NAMES[0][3:]}"
    probe = (
        f"python3 -c 'import socket; socket.create_connection((\"{gpu}\", 22), timeout=5).close(); print(1)'"
    )
    proc = ssh(f"10.213.{NAMES[1][3:]}.2", probe)
    assert (proc.returncode, proc.stdout.strip()) == (0, "1"), proc.stderr
    bridge = state(NAMES[0])["bridge"]
    assert bridge == state(NAMES[1])["bridge"] and bridge.startswith("sgbr")
    addrs = subprocess.run(
        ["ip", "-o", "addr", "show", "dev", bridge], text=True, capture_output=True, check=True
    )
    assert addrs.stdout.strip() == "", addrs.stdout
    ports = subprocess.run(["ip", "-o", "link", "show", "master", bridge], text=True, capture_output=True)
    assert sorted(ln.split(":")[1].strip().split("@")[0] for ln in ports.stdout.splitlines()) == sorted(
        f"vsf{n}" for n in NAMES
    )
    controller = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], text=True, capture_output=True, check=True
    )
    fleet = ipaddress.ip_network("10.214.0.0/16")
    assert not [
        ln for ln in controller.stdout.splitlines() if ipaddress.ip_interface(ln.split()[3]).ip in fleet
    ]


def test_payload_is_in_every_host(lab) -> None:
    server = REPO / "lab" / "sglang_lab_server.py"
    for name in NAMES:
        root = Path(state(name)["root"])
        target = json.loads((root / "srv/models/lab-target/config.json").read_text())
        draft = json.loads((root / "srv/models/lab-dflash-draft/config.json").read_text())
        assert target["architectures"] == ["LlamaForCausalLM"]
        assert draft["architectures"] == ["DFlashDraftModel"]
        for model in ("lab-target", "lab-dflash-draft"):
            index = json.loads((root / f"srv/models/{model}/model.safetensors.index.json").read_text())
            for shard in set(index["weight_map"].values()):
                assert (root / f"srv/models/{model}" / shard).stat().st_size > 1000
        copied = root / "opt/sglang-lab/sglang_lab_server.py"
        if server.exists():
            assert (
                hashlib.sha256(copied.read_bytes()).digest() == hashlib.sha256(server.read_bytes()).digest()
            )
        else:
            assert not copied.exists()


def test_ansible_reaches_hosts_through_the_inventory(lab) -> None:
    ansible = Path(sys.executable).with_name("ansible")
    if not ansible.exists():
        pytest.fail(f"{ansible} not installed: make venv")
    proc = subprocess.run(
        [str(ansible), "-i", str(lab["inventory"]), "lab", "-m", "ansible.builtin.ping"],
        text=True,
        capture_output=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in NAMES:
        assert f"{name} | SUCCESS" in proc.stdout


def test_second_up_keeps_running_hosts(lab) -> None:
    before = {name: state(name)["pid"] for name in NAMES}
    again = labctl(
        "up",
        "--hosts",
        "1",
        "--routers",
        "1",
        "--first-index",
        str(FIRST),
        "--inventory",
        str(lab["inventory"]),
    )
    assert again.stdout.count("(already running)") == 2, again.stdout
    assert {name: state(name)["pid"] for name in NAMES} == before
    for name in NAMES:
        assert nspawn_pids(name) == [before[name]]


def test_up_refuses_a_host_of_another_inventory(lab, tmp_path: Path) -> None:
    other = tmp_path / "other.yml"
    proc = labctl("up", "--hosts", "1", "--first-index", str(FIRST), "--inventory", str(other), check=False)
    assert proc.returncode == 1
    assert f"{NAMES[0]} is already up for inventory {lab['inventory']}" in proc.stderr
    assert not other.exists()


def test_status_lists_hosts_up(lab) -> None:
    out = labctl("status").stdout
    for name in NAMES:
        line = next(ln for ln in out.splitlines() if ln.startswith(name + "\t"))
        assert "\tup\t" in line and "system=running" in line


def test_down_leaves_nothing_behind(lab) -> None:
    pids = {name: state(name)["pid"] for name in NAMES}
    roots = {name: state(name)["root"] for name in NAMES}
    bridge = state(NAMES[0])["bridge"]
    proc = labctl("down", "--inventory", str(lab["inventory"]))
    for name in NAMES:
        assert f"{name}\tdown\tpowered off (nspawn {pids[name]})" in proc.stdout, proc.stdout + proc.stderr
        assert nspawn_pids(name) == []
        assert not Path(f"/run/netns/sglab-{name}").exists()
        assert not Path(f"/sys/class/net/vsg{name}").exists()
        assert not Path(f"/sys/class/net/vsf{name}").exists()
        mounts = Path("/proc/self/mountinfo").read_text()
        assert f"/var/lib/sglang-lab/hosts/{name}/" not in mounts
        assert not Path(roots[name]).parent.exists()
        assert not Path(f"/run/sglang-lab/{name}").exists()
        assert f"{name}," not in KNOWN_HOSTS.read_text()
    netns = subprocess.run(["ip", "netns", "list"], text=True, capture_output=True, check=True).stdout
    assert not any(ln.split()[0] in {f"sglab-{n}" for n in NAMES} for ln in netns.splitlines())
    assert f"bridge {bridge}\tdeleted" in proc.stdout
    assert not Path(f"/sys/class/net/{bridge}").exists()
    assert not lab["inventory"].exists()
    assert list(Path("/var/cache/sglang-lab").glob("rootfs-*/.sglang-lab-complete")), (
        "base rootfs was removed"
    )
    assert labctl("down", "--inventory", str(lab["inventory"])).stdout.startswith("no lab hosts to stop")
