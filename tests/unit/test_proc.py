"""module_utils/sglang_proc on proc trees copied from lab40 (tests/fixtures/systemd/SOURCE.md)."""

from __future__ import annotations

from ansible.module_utils import sglang_proc as sp
from conftest import FIXTURES

FIX = FIXTURES / "systemd"


def test_listener_of_healthy_unit_is_its_main_pid_in_its_cgroup():
    root = str(FIX / "healthy" / "proc")
    found = sp.listeners(18001, "127.0.0.1", root)
    assert [(f["local_address"], f["family"]) for f in found] == [("0.0.0.0", "tcp")]
    assert sp.pids_of_inode(found[0]["inode"], root) == [554]
    assert sp.pid_of_inode(found[0]["inode"], root) == 554
    assert sp.cgroup_of(554, root) == "/system.slice/vr-healthy.service"
    assert sp.in_cgroup(sp.cgroup_of(554, root), "/system.slice/vr-healthy.service")
    assert sp.cmdline(554, root) == ["/usr/bin/python3", "/opt/vrtest/server.py"]


def test_other_ports_and_hosts_do_not_match():
    root = str(FIX / "healthy" / "proc")
    assert sp.listeners(18009, None, root) == []
    # 22 (sshd) listens on 0.0.0.0 and :: — both tables are read.
    assert {f["family"] for f in sp.listeners(22, None, root)} == {"tcp", "tcp6"}
    assert sp.listeners(18001, "10.9.9.9", root)  # wildcard bind accepts any address


def test_stale_listener_is_outside_the_unit_cgroup():
    root = str(FIX / "stale" / "proc")
    (sock,) = sp.listeners(18004, "127.0.0.1", root)
    assert sp.pids_of_inode(sock["inode"], root) == [373]
    assert sp.cgroup_of(373, root) == "/system.slice/ssh.service"
    assert not sp.in_cgroup(sp.cgroup_of(373, root), "/system.slice/vr-stale.service")
    # the unit's own main process is alive but holds no listening socket
    assert sp.cgroup_of(704, root) == "/system.slice/vr-stale.service"


def test_cgroup_procs_and_start_times_find_the_orphan():
    base = FIX / "orphan"
    procs = sp.cgroup_procs("/system.slice/vr-orphan.service", str(base / "sys" / "fs" / "cgroup"))
    assert procs == [410, 417, 609, 610]  # 410, 417: sleeps of two earlier invocations
    root = str(base / "proc")
    starts = {pid: sp.start_time_us(pid, root, ticks=100) for pid in procs}
    assert starts[410] < starts[417] < starts[609] <= starts[610]
    assert sp.cmdline(410, root) == ["/usr/bin/sleep", "1000"]


def test_started_before_compares_with_the_main_process_own_start_time():
    """P14 on the recorded orphan tree: the sleeps of two earlier invocations are older than main
    process 609; 609 itself and its child 610 are not. With the main process gone, systemd's stamp
    (the fallback cutoff) decides."""
    base = FIX / "orphan"
    procs = sp.cgroup_procs("/system.slice/vr-orphan.service", str(base / "sys" / "fs" / "cgroup"))
    root = str(base / "proc")
    main = sp.start_time_us(609, root, ticks=100)
    older = sp.started_before(procs, 609, None, root, ticks=100)
    assert sorted(older) == [410, 417] and all(started < main for started in older.values())
    # systemd's stamp (the cutoff) is not used while the main process's own start can be read.
    assert sorted(sp.started_before(procs, 609, main + 1, root, ticks=100)) == [410, 417]
    assert sorted(sp.started_before(procs, 999999, main, root, ticks=100)) == [410, 417]
    assert sp.started_before(procs, 999999, None, root, ticks=100) == {}


def test_parse_stat_handles_spaces_and_parens_in_comm():
    text = "42 (a b) c) S 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 123456 0 0"
    stat = sp.parse_stat(text)
    assert stat == {"pid": 42, "comm": "a b) c", "state": "S", "ppid": 1, "starttime": 123456}


def test_parse_cgroup_prefers_unified_line():
    text = (FIX / "healthy" / "proc" / "554" / "cgroup").read_text()
    assert text.startswith("9:name=systemd:/system.slice/vr-healthy.service")
    assert sp.parse_cgroup(text) == "/system.slice/vr-healthy.service"
    assert sp.parse_cgroup("1:name=systemd:/system.slice/x.service\n") == "/system.slice/x.service"


def test_missing_pid_is_none():
    root = str(FIX / "healthy" / "proc")
    assert sp.cgroup_of(99999, root) is None and sp.cmdline(99999, root) is None
    assert sp.start_time_us(99999, root) is None
