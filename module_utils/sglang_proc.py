# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who listens on a TCP port, which cgroup a process is in, when it started.

Reads /proc and /sys/fs/cgroup directly (standard library only).  Every function takes the
root directory as a parameter so unit tests can point it at a recorded proc tree.  The listening
sockets of the host itself (root ``/proc``) come from the kernel's sock_diag netlink interface, as
``ss`` reads them, and from ``/proc/net/tcp`` and ``tcp6`` where that is not offered.  Both are
the tables of the reader's network namespace: call these from the namespace the server listens in
(the module runs on the target host, so it is).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

TCP_LISTEN = "0A"


def _read(path, mode="r"):
    with open(path, mode) as handle:
        return handle.read()


def _decode_address(hex_addr):
    """``0100007F:1F90`` (tcp) or the 32-hex-digit tcp6 form -> (ip string, port)."""
    addr, _, port = hex_addr.partition(":")
    raw = bytes.fromhex(addr)
    if len(raw) == 4:
        ip = socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    else:
        # The kernel prints the in6_addr as four host-order (little-endian here) 32-bit words.
        words = struct.unpack(">4I", raw)
        ip = socket.inet_ntop(socket.AF_INET6, struct.pack("<4I", *words))
    return ip, int(port, 16)


def parse_net_tcp(text):
    """Rows of /proc/net/tcp or /proc/net/tcp6 as dicts: local ip/port, state, uid, inode."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        ip, port = _decode_address(fields[1])
        rows.append(
            {
                "local_address": ip,
                "local_port": port,
                "state": fields[3],
                "uid": int(fields[7]),
                "inode": int(fields[9]),
            }
        )
    return rows


def host_addresses(host):
    """The IP addresses ``host`` stands for: itself when it is an address, else what it resolves to.

    SGLang (uvicorn) binds the address a hostname resolves to, so ``--host gpu01.example`` listens
    on e.g. 10.0.0.5 and the listener must be matched by that address, not by the name. A name that
    does not resolve matches only wildcard listeners.
    """
    if host is None:
        return None
    text = str(host).strip("[]")
    try:
        return {ipaddress.ip_address(text).compressed}
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {ipaddress.ip_address(info[4][0].split("%", 1)[0]).compressed for info in infos}


def _address_matches(listen_ip, host, addresses=None):
    """A socket bound to the wildcard (or its v4-mapped form) accepts connections to any host."""
    if host is None:
        return True
    if addresses is None:
        addresses = host_addresses(host)
    if listen_ip in ("0.0.0.0", "::", host) or listen_ip in addresses:
        return True
    if listen_ip.startswith("::ffff:") and listen_ip[7:] in addresses | {host}:
        return True
    # 'localhost' and friends: accept any loopback listener.
    return host == "localhost" and (listen_ip.startswith("127.") or listen_ip == "::1")


# The kernel's socket listing for `ss` (sock_diag netlink: linux/sock_diag.h, linux/inet_diag.h). A dump of
# the LISTEN state walks the listening hash only; reading /proc/net/tcp walks every bucket of the established
# hash too, whose size grows with the host's memory (~4 ms of kernel CPU per read on a lab host, against
# ~0.1 ms), and the verifier reads the listeners at every poll.
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCPF_LISTEN = 1 << int(TCP_LISTEN, 16)
_NLMSG_HEADER = struct.Struct("=IHHII")
# struct inet_diag_msg: family, state, timer, retrans, inet_diag_sockid (ports and addresses in network order,
# interface, cookie), expires, rqueue, wqueue, uid, inode.
_DIAG_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")
_DIAG_FAMILIES = {"tcp": socket.AF_INET, "tcp6": socket.AF_INET6}


def diag_request(family):
    """The sock_diag request: every LISTEN TCP socket of ``family`` in this network namespace."""
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, _TCPF_LISTEN) + bytes(48)
    return (
        _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0)
        + request
    )


def parse_diag(data):
    """(rows, done) of one sock_diag reply datagram: rows as ``parse_net_tcp`` returns them, done at the
    dump's end; a netlink error, or a message its datagram does not hold whole, raises OSError."""
    rows, offset = [], 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size or offset + length > len(data):
            raise OSError("sock_diag: a malformed netlink message")
        if kind == _SOCK_DIAG_BY_FAMILY and length < _NLMSG_HEADER.size + _DIAG_MSG.size:
            raise OSError("sock_diag: a socket message shorter than inet_diag_msg")
        if kind == _NLMSG_DONE:
            return rows, True
        if kind == _NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", data, offset + _NLMSG_HEADER.size)
            raise OSError(-error, f"sock_diag: {os.strerror(-error)}")
        if kind == _SOCK_DIAG_BY_FAMILY:
            family, state, _t, _r, sport, _d, src, _s, _i, _c, _e, _rq, _wq, uid, inode = (
                _DIAG_MSG.unpack_from(data, offset + _NLMSG_HEADER.size)
            )
            rows.append(
                {
                    "local_address": socket.inet_ntop(family, src[: 4 if family == socket.AF_INET else 16]),
                    "local_port": int.from_bytes(sport, "big"),
                    "state": f"{state:02X}",
                    "uid": uid,
                    "inode": inode,
                }
            )
        offset += (length + 3) & ~3
    return rows, False


def diag_rows(datagrams):
    """The rows of one sock_diag dump from its reply datagrams (an iterable), up to its NLMSG_DONE; OSError
    when they end before it."""
    rows = []
    for data in datagrams:
        part, done = parse_diag(data)
        rows += part
        if done:
            return rows
    raise OSError("sock_diag: the dump ended without NLMSG_DONE")


def diag_listening(family):
    """The LISTEN TCP sockets of ``family`` ("tcp", "tcp6") from sock_diag; OSError when the kernel (or a
    sandbox) does not offer it."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(5)
        sock.sendto(diag_request(_DIAG_FAMILIES[family]), (0, 0))
        # recv never returns None: datagrams until the dump's end (or the timeout, an OSError).
        return diag_rows(iter(lambda: sock.recv(1 << 16), None))


def listening_rows(family, root="/proc"):
    """Rows of the LISTEN TCP sockets of ``family`` ("tcp", "tcp6"): from sock_diag when ``root`` is this
    host's /proc, else (or without sock_diag) parsed from ``root``/net/``family``; None when neither exists
    (a kernel without IPv6)."""
    if root == "/proc":
        try:
            return diag_listening(family)
        except OSError:
            pass  # no sock_diag here: the proc file says the same, more slowly
    try:
        text = _read(os.path.join(root, "net", family))
    except FileNotFoundError:
        return None
    return [row for row in parse_net_tcp(text) if row["state"] == TCP_LISTEN]


def listeners(port, host=None, root="/proc"):
    """LISTEN sockets on ``port`` (tcp and tcp6) that accept connections to ``host``.

    Returns dicts ``{local_address, local_port, inode, family}``; inode 0 rows are skipped
    (a socket being torn down).
    """
    found = []
    # Resolved once per call (a hostname in sglang_host: the addresses it stands for).
    addresses = host_addresses(host)
    for family in ("tcp", "tcp6"):
        for row in listening_rows(family, root) or []:
            if row["local_port"] != port or not row["inode"]:
                continue
            if not _address_matches(row["local_address"], host, addresses):
                continue
            found.append(
                {
                    "local_address": row["local_address"],
                    "local_port": port,
                    "inode": row["inode"],
                    "family": family,
                }
            )
    return found


def pids(root="/proc"):
    return sorted(int(name) for name in os.listdir(root) if name.isdigit())


def pids_of_inode(inode, root="/proc"):
    """Every PID with an open fd on socket ``inode`` (forked children share the listener)."""
    target = f"socket:[{inode}]"
    holders = []
    for pid in pids(root):
        fd_dir = os.path.join(root, str(pid), "fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # exited, or a kernel thread we may not read
        for fd in fds:
            try:
                if os.readlink(os.path.join(fd_dir, fd)) == target:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return holders


def pid_of_inode(inode, root="/proc"):
    """The lowest PID holding socket ``inode`` (the parent of forked holders), or None."""
    holders = pids_of_inode(inode, root)
    return holders[0] if holders else None


def parse_cgroup(text):
    """The unified-hierarchy path from /proc/PID/cgroup (``0::/path``), else the name=systemd one."""
    named = None
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
        if controllers == "name=systemd":
            named = path
    return named


def cgroup_of(pid, root="/proc"):
    try:
        return parse_cgroup(_read(os.path.join(root, str(pid), "cgroup")))
    except OSError:
        return None


def cmdline(pid, root="/proc"):
    """argv of ``pid`` (NUL-separated in /proc, trailing NUL dropped); [] for a zombie/kernel thread."""
    try:
        raw = _read(os.path.join(root, str(pid), "cmdline"), "rb")
    except OSError:
        return None
    if raw.endswith(b"\0"):
        raw = raw[:-1]
    if not raw:
        return []
    return [part.decode("utf-8", "replace") for part in raw.split(b"\0")]


def parse_stat(text):
    """Fields of /proc/PID/stat; ``comm`` (field 2) may contain spaces and parentheses."""
    head, _, tail = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    rest = tail.split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return {
        "pid": int(pid),
        "comm": comm,
        "state": rest[0],
        "ppid": int(rest[1]),
        "starttime": int(rest[22 - 3]),
    }


def clock_ticks():
    return os.sysconf("SC_CLK_TCK")


def start_time_us(pid, root="/proc", ticks=None):
    """When ``pid`` started, in microseconds since boot (field 22 of /proc/PID/stat / SC_CLK_TCK).

    The kernel counts this on the boot-time clock (CLOCK_BOOTTIME, which includes suspend);
    :func:`boottime_offset_us` converts to CLOCK_MONOTONIC.  Resolution is one clock tick
    (10 ms at the usual 100 Hz).
    """
    try:
        stat = parse_stat(_read(os.path.join(root, str(pid), "stat")))
    except (OSError, ValueError, IndexError):
        return None
    ticks = ticks or clock_ticks()
    return stat["starttime"] * 1000000 // ticks


def started_before(pids, main_pid, fallback_cutoff_us=None, root="/proc", ticks=None):
    """The ``pids`` that started before the main process ``main_pid``: ``{pid: start in us since boot}``.

    P14 asks which processes of the unit's cgroup are older than the invocation's main process.  Both
    sides of this comparison are /proc start times (field 22): one clock, one clock tick, one event
    (the fork).  systemd's ExecMainStartTimestampMonotonic is not such a side: PID 1 stamps it after
    fork() has returned in the parent, and on a loaded host that came 50 ms after the child's /proc
    start time, so the main process looked older than its own invocation.  A process started in the
    same clock tick as the main process is not older (a child forked at once shares the tick; the
    processes of an earlier run are older by the whole stop).  The main process itself never is.

    When the main process's start time cannot be read (it has exited), a process is older when it
    started before ``fallback_cutoff_us`` (us since boot; None: none is counted).
    """
    ticks = ticks or clock_ticks()
    cutoff = start_time_us(main_pid, root, ticks) if main_pid else None
    if cutoff is None:
        cutoff = fallback_cutoff_us
    older = {}
    for pid in pids:
        if pid == main_pid or cutoff is None:
            continue
        started = start_time_us(pid, root, ticks)
        if started is not None and started < cutoff:
            older[pid] = started
    return older


def boottime_offset_us():
    """CLOCK_BOOTTIME - CLOCK_MONOTONIC in microseconds (time spent suspended; 0 on a server)."""
    import time

    return int((time.clock_gettime(time.CLOCK_BOOTTIME) - time.clock_gettime(time.CLOCK_MONOTONIC)) * 1000000)


def cgroup_procs(control_group, cgroup_root="/sys/fs/cgroup"):
    """PIDs in the unit's cgroup and its sub-cgroups (cgroup v2 ``cgroup.procs`` files).

    Tries the unified hierarchy at ``cgroup_root`` (v2), then ``unified/`` (hybrid, as in
    systemd-nspawn lab hosts on a v1 kernel), then ``systemd/`` (legacy).  Returns None when the
    unit's cgroup exists in none of them (the unit has no processes).
    """
    if not control_group:
        return None
    # cgroup v2 (unified), hybrid (v2 under unified/), legacy v1 (name=systemd hierarchy).
    for sub in ("", "unified", "systemd"):
        base = os.path.join(cgroup_root, sub, control_group.lstrip("/"))
        if os.path.isfile(os.path.join(base, "cgroup.procs")):
            break
    else:
        return None
    found = set()
    for dirpath, _dirnames, filenames in os.walk(base):
        if "cgroup.procs" not in filenames:
            continue
        try:
            text = _read(os.path.join(dirpath, "cgroup.procs"))
        except OSError:
            continue
        found.update(int(line) for line in text.split() if line.isdigit())
    return sorted(found)


def in_cgroup(path, control_group):
    """``path`` is the unit's cgroup or below it (a delegated sub-cgroup)."""
    if not path or not control_group:
        return False
    return path == control_group or path.startswith(control_group.rstrip("/") + "/")


def read_boot_id(path="/proc/sys/kernel/random/boot_id"):
    """This boot's id ('' when unreadable): a value taken before a reboot names another boot."""
    try:
        return _read(path).strip()
    except OSError:
        return ""


def describe_pid(pid, root="/proc"):
    return {"pid": pid, "cmdline": cmdline(pid, root), "cgroup": cgroup_of(pid, root)}


def port_listeners(host, port, control_group, root="/proc"):
    """Listeners on ``host``:``port``, each with its holder pids and whether all are in ``control_group``
    (``foreign``: the holders outside it, described)."""
    found = []
    for sock in listeners(port, host, root):
        holders = pids_of_inode(sock["inode"], root)
        groups = {pid: cgroup_of(pid, root) for pid in holders}
        found.append(
            {
                "address": sock["local_address"],
                "family": sock["family"],
                "inode": sock["inode"],
                "pids": holders,
                "pid": holders[0] if holders else None,
                "cgroup": groups[holders[0]] if holders else None,
                "in_cgroup": bool(holders) and all(in_cgroup(g, control_group) for g in groups.values()),
                "foreign": [
                    describe_pid(pid, root) for pid, g in groups.items() if not in_cgroup(g, control_group)
                ],
            }
        )
    return found


def older_processes(
    control_group, start_us, main_pid, offset_us, tolerance_us, root="/proc", cgroup_root="/sys/fs/cgroup"
):
    """P14: processes in the unit's cgroup that started before its main process (by /proc start times;
    systemd's stamp ``start_us``, monotonic, less ``tolerance_us``, only when the main process is gone).
    ``offset_us`` is :func:`boottime_offset_us`. None when the cgroup is gone."""
    procs = cgroup_procs(control_group, cgroup_root)
    if procs is None:
        return None
    older = []
    cutoff = start_us + offset_us - tolerance_us
    for pid, started in started_before(procs, main_pid, cutoff, root).items():
        info = describe_pid(pid, root)
        info["started_monotonic"] = round((started - offset_us) / 1e6, 3)
        older.append(info)
    return older
