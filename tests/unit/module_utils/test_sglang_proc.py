"""module_utils/sglang_proc on proc trees copied from lab40 (tests/fixtures/systemd/SOURCE.md) and sock_diag
replies recorded on lab160 (tests/fixtures/sock_diag/SOURCE.md)."""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import struct

import pytest
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


# sock_diag: the listeners of a lab host's own namespace (tests/fixtures/sock_diag/SOURCE.md).
RECORDED = json.loads((FIXTURES / "sock_diag" / "lab-host.json").read_text())
SOCK_DIAG = RECORDED["listening"]


def _replies(family):
    return [base64.b64decode(datagram) for datagram in SOCK_DIAG["replies"][family]]


def _diag_rows(family):
    """The recorded dump read as diag_listening reads the kernel's replies."""
    return sp.diag_rows(_replies(family))


@pytest.mark.parametrize(("family", "number"), [("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)])
def test_the_sock_diag_request_is_the_recorded_one(family, number):
    assert sp.diag_request(number) == base64.b64decode(SOCK_DIAG["requests"][family])


@pytest.mark.parametrize("family", ["tcp", "tcp6"])
def test_sock_diag_lists_the_listening_rows_of_the_proc_table(family):
    proc = [row for row in sp.parse_net_tcp(SOCK_DIAG["proc_net"][family]) if row["state"] == sp.TCP_LISTEN]
    rows = _diag_rows(family)
    assert rows and sorted(rows, key=lambda r: r["inode"]) == sorted(proc, key=lambda r: r["inode"])


def test_the_recorded_listeners_are_the_lab_server_and_sshd():
    assert {(r["local_address"], r["local_port"], r["uid"]) for r in _diag_rows("tcp")} == {
        ("0.0.0.0", 22, 0),
        ("10.214.0.160", 30000, 999),
    }
    assert {(r["local_address"], r["local_port"]) for r in _diag_rows("tcp6")} == {("::", 22)}


def test_a_netlink_error_is_an_os_error():
    with pytest.raises(OSError) as raised:
        sp.parse_diag(base64.b64decode(RECORDED["error"]["reply"]))
    assert raised.value.errno == errno.EINVAL


@pytest.mark.parametrize("family", ["tcp", "tcp6"])
def test_a_dump_whose_replies_end_before_nlmsg_done_is_an_os_error(family):
    """The recorded dump without its last datagram (the NLMSG_DONE); the rows before it are not taken."""
    assert sp.parse_diag(_replies(family)[-1]) == ([], True)
    with pytest.raises(OSError, match="without NLMSG_DONE"):
        sp.diag_rows(_replies(family)[:-1])


def test_a_cut_reply_is_an_os_error_and_the_proc_tables_are_read_instead(monkeypatch):
    """A datagram that does not hold its messages whole (as recv cuts one longer than its buffer) is refused,
    never read past; listeners() then reads the proc tables."""
    whole = _replies("tcp")[0]
    # The recorded datagram less its last 8 bytes; a socket message of 24 bytes (inet_diag_msg alone is 72).
    short = struct.pack("=IHHII", 24, 20, 2, 1, 0) + bytes(8)
    for cut in (whole[:-8], short):
        with pytest.raises(OSError, match="sock_diag"):
            sp.parse_diag(cut)

    def cut_reply(family):
        return sp.parse_diag(whole[:-8])[0]

    monkeypatch.setattr(sp, "diag_listening", cut_reply)
    monkeypatch.setattr(sp, "_read", lambda path, mode="r": SOCK_DIAG["proc_net"][os.path.basename(path)])
    assert [f["inode"] for f in sp.listeners(30000, "10.214.0.160")] == [1312843]


def test_this_hosts_listeners_come_from_sock_diag_without_reading_the_proc_tables(monkeypatch):
    def unread(path, mode="r"):
        raise AssertionError(f"{path} read")

    monkeypatch.setattr(sp, "diag_listening", _diag_rows)
    monkeypatch.setattr(sp, "_read", unread)
    found = sp.listeners(30000, "10.214.0.160")
    assert [(f["local_address"], f["family"], f["inode"]) for f in found] == [
        ("10.214.0.160", "tcp", 1312843)
    ]
    assert {f["family"] for f in sp.listeners(22)} == {"tcp", "tcp6"}
    assert sp.listeners(30000, "10.214.0.161") == []


def test_without_sock_diag_the_proc_tables_are_read(monkeypatch):
    def refused(family):
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    read = []

    def proc(path, mode="r"):
        read.append(path)
        return SOCK_DIAG["proc_net"][os.path.basename(path)]

    monkeypatch.setattr(sp, "diag_listening", refused)
    monkeypatch.setattr(sp, "_read", proc)
    found = sp.listeners(30000, "10.214.0.160")
    assert [(f["local_address"], f["family"], f["inode"]) for f in found] == [
        ("10.214.0.160", "tcp", 1312843)
    ]
    assert read == ["/proc/net/tcp", "/proc/net/tcp6"]
