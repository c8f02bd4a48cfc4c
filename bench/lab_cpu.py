#!/usr/bin/env python3
"""CPU seconds a lab test run costs: the controller's process tree and each lab host, apart.

    python bench/lab_cpu.py [--hosts-prefix lab12] [--procs 25] [--json FILE] -- <command...>
    LAB_IT_INDEX=120 python bench/lab_cpu.py --hosts-prefix lab120 --procs 30 -- \
        .venv/bin/pytest -p no:randomly --durations=0 tests/integration/test_sweep.py

On a 2-core machine shared with other lab runs, wall time says little; CPU seconds add up. The command
runs in a cgroup of its own in the cgroup2 hierarchy (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
hybrid host; cpu.stat usage_usec needs no controller; created and removed here): pytest,
ansible-playbook and its forks, ssh - everything on the controller that the command starts, daemons
included (an ssh master outlives the ansible-playbook that opened it). A lab host moves itself into
sglang-lab/<name> when it boots (lab/labctl enter_host_cgroups), so its systemd, sshd, the lab SGLang
server and every task Ansible runs there are counted per host, read every --interval seconds while it
lives (the last reading before `labctl down` removes it counts). Only the hosts whose name starts with
--hosts-prefix are counted (other runs' hosts on the machine are not this command's work). --procs N
also reads every process of those cgroups each interval and prints the N command lines that used the
most CPU, and the same summed per program (processes shorter than an interval are missed: compare the
attributed sum with the total). --acct FILE counts EVERY process of the machine that ends while the command
runs, however short (BSD process accounting, acct(2), into FILE; the kernel writes a record per exit, lab
hosts' processes included; run nothing else beside it): CPU by kind - ansible-playbook (the runs and their
forks), the modules Ansible runs on the lab hosts (python3 below their sshd), the lab SGLang servers and
SGLang parses there (python), the rest of the lab hosts, the rest of the controller - and how many pythons
there took over PARSE_MISS_S (an import of SGLang and torch: no cached parse). Root only (cgroups). Prints a
summary line and a JSON line.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path


def cgroup_root() -> tuple[Path, str]:
    """The cgroup2 hierarchy (hybrid hosts mount it at unified/): where lab/labctl puts its hosts too."""
    for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists():
            return root, "v2"
    raise SystemExit("lab_cpu: no cgroup2 hierarchy (lab/labctl puts its hosts there)")


def usage_seconds(cg: Path, kind: str) -> float | None:
    try:
        for line in (cg / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        return None
    return None


def tree_usage(cg: Path, kind: str) -> float:
    """usage_usec includes the child cgroups."""
    return usage_seconds(cg, kind) or 0.0


# acct(2)'s version-3 record (linux/acct.h struct acct_v3): 64 bytes, times as comp_t in AHZ (100) ticks.
ACCT_RECORD = struct.Struct("<BBHIIIIIIfHHHHHHHH16s")
ACCT_HZ = 100
# A python on a lab host that took this much CPU imported SGLang and torch (no cached parse): ~12 s here.
PARSE_MISS_S = 5.0


def comp_t(value: int) -> int:
    """comp_t: 13-bit mantissa, 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def acct_records(path: Path) -> list[tuple[str, int | None, float]]:
    """(command name, index of the parent's record or None, CPU seconds) of every process the accounting file
    recorded, in the order they ended. Pids are reused over a long run (pid_max 32768 here): a process's
    parent is the next process to END with its parent pid, the parent ending after its children."""
    data = path.read_bytes()
    rows = []
    for offset in range(0, len(data) - ACCT_RECORD.size + 1, ACCT_RECORD.size):
        fields = ACCT_RECORD.unpack_from(data, offset)
        pid, ppid, utime, stime, comm = fields[6], fields[7], fields[10], fields[11], fields[-1]
        name = comm.split(b"\0", 1)[0].decode(errors="replace")
        rows.append((pid, ppid, name, (comp_t(utime) + comp_t(stime)) / ACCT_HZ))
    records: list[tuple[str, int | None, float]] = [("", None, 0.0)] * len(rows)
    ended_later: dict[int, int] = {}  # pid -> the index of the next record (in exit order) with that pid
    for index in range(len(rows) - 1, -1, -1):
        pid, ppid, name, seconds = rows[index]
        records[index] = (name, ended_later.get(ppid), seconds)
        ended_later[pid] = index
    return records


def acct_kinds(records: list[tuple[str, int | None, float]]) -> dict:
    """CPU seconds by kind, from each process's ancestors (a lab host's processes descend from its
    systemd-nspawn; an Ansible module there from its sshd)."""

    def ancestors(index: int) -> list[str]:
        names = []
        parent = records[index][1]
        while parent is not None and len(names) < 64:
            names.append(records[parent][0])
            parent = records[parent][1]
        return names

    cpu: dict[str, float] = collections.defaultdict(float)
    runs = modules = servers = misses = 0
    for index, (name, _parent, seconds) in enumerate(records):
        above = ancestors(index)
        if "systemd-nspawn" in above or name == "systemd-nspawn":
            if name == "python3" and "sshd" in above:
                kind, modules = "lab hosts: Ansible modules", modules + 1
            elif name == "python":
                kind = "lab hosts: lab servers and SGLang parses"
                servers += 1
                misses += seconds >= PARSE_MISS_S
            else:
                kind = "lab hosts: the rest"
        elif name == "ansible-playboo":  # comm is 15 characters
            kind = "controller: ansible-playbook"
            runs += not above or above[0] != "ansible-playboo"
        else:
            kind = "controller: the rest"
        cpu[kind] += seconds
    return {
        "cpu_s": {kind: round(value, 1) for kind, value in sorted(cpu.items(), key=lambda kv: -kv[1])},
        "processes": len(records),
        "ansible_playbook_runs": runs,
        "module_runs": modules,
        "python_on_hosts": servers,
        "parse_misses": misses,
    }


def program(cmdline: str) -> str:
    """A short name of what a process runs: the program, and for an interpreter its module or script."""
    words = cmdline.split()
    if not words:
        return "?"
    name = os.path.basename(words[0])
    if name.startswith("python") or name in ("ansible-playbook", "pytest"):
        rest = words[1:]
        for i, word in enumerate(rest):
            if word == "-m" and i + 1 < len(rest):
                return f"{name} -m {rest[i + 1]}"
            if not word.startswith("-"):
                return f"{name} {os.path.basename(word)}"
    return name


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hosts-prefix", default="lab12", help="count lab hosts whose name starts so")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--procs", type=int, default=0, help="print the N costliest command lines")
    parser.add_argument("--json", type=Path, help="append the summary as one JSON line to this file")
    parser.add_argument("--label", default="", help="a name for the JSON line")
    parser.add_argument("--acct", type=Path, help="BSD process accounting into this file: CPU by kind")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    if os.geteuid() != 0:
        print("lab_cpu: root only (cgroups)", file=sys.stderr)
        return 2
    root, kind = cgroup_root()
    mine = root / f"lab-cpu-{os.getpid()}"
    mine.mkdir()
    hosts_root = root / "sglang-lab"
    seen: dict[str, tuple[float, float]] = {}  # host -> (first reading, last reading)
    stop = threading.Event()
    procs: dict[tuple[int, int], tuple[str, str, float]] = {}  # (pid, starttime) -> (where, cmdline, cpu s)
    tick = os.sysconf("SC_CLK_TCK")

    def where(pid: str) -> str | None:
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("0::"):
                path = line[3:]
                if path.startswith(f"/{mine.name}"):
                    return "controller"
                parts = path.strip("/").split("/")
                if parts[0] == "sglang-lab" and len(parts) > 1 and parts[1].startswith(args.hosts_prefix):
                    return parts[1]
        return None

    def sample_procs() -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            place = where(entry.name)
            if place is None:
                continue
            try:
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                raw = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / tick
            cmdline = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:160]
            procs[(int(entry.name), int(fields[19]))] = (
                place,
                cmdline or stat.split("(", 1)[1].split(")")[0],
                cpu,
            )

    def sample() -> None:
        while True:
            if args.procs:
                sample_procs()
            if hosts_root.is_dir():
                for cg in hosts_root.iterdir():
                    if not cg.is_dir() or not cg.name.startswith(args.hosts_prefix):
                        continue
                    value = usage_seconds(cg, kind)
                    if value is None:
                        continue
                    first = seen.get(cg.name, (value, value))[0]
                    seen[cg.name] = (first, value)
            if stop.wait(args.interval):
                return

    # A host that exists before the command (a reused one) counts from its first reading; one booted
    # by the command counts from 0 (its cgroup is new).
    preexisting = {cg.name for cg in hosts_root.iterdir()} if hosts_root.is_dir() else set()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    loadavg_before = os.getloadavg()
    libc = ctypes.CDLL(None, use_errno=True)
    if args.acct:
        args.acct.write_bytes(b"")
        if libc.acct(os.fsencode(args.acct)) != 0:
            print(f"lab_cpu: acct({args.acct}): {os.strerror(ctypes.get_errno())}", file=sys.stderr)
            return 2
    start = time.monotonic()
    proc = subprocess.Popen(command, preexec_fn=lambda: (mine / "cgroup.procs").write_text(str(os.getpid())))
    try:
        rc = proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait()
    wall = time.monotonic() - start
    time.sleep(args.interval)  # daemons of the command (ssh masters) may still be exiting
    stop.set()
    sampler.join()
    if args.acct:
        libc.acct(None)
    controller = tree_usage(mine, kind)
    # Leftover processes (an ssh master with ControlPersist): counted so far, moved out so the cgroup goes.
    try:
        leftovers = [p for p in (mine / "cgroup.procs").read_text().split() if p]
        for pid in leftovers:
            (root / "cgroup.procs").write_text(pid)
        mine.rmdir()
    except OSError as exc:
        print(f"lab_cpu: cannot remove {mine}: {exc}", file=sys.stderr)
    hosts = {
        name: round(last - (first if name in preexisting else 0.0), 1)
        for name, (first, last) in sorted(seen.items())
    }
    summary = {
        "label": args.label,
        "command": command,
        "rc": rc,
        "wall_s": round(wall, 1),
        "controller_cpu_s": round(controller, 1),
        "hosts_cpu_s": hosts,
        "total_cpu_s": round(controller + sum(hosts.values()), 1),
        "loadavg_before": [round(x, 2) for x in loadavg_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(
        f"lab_cpu: wall {summary['wall_s']} s, CPU {summary['total_cpu_s']} s = controller "
        f"{summary['controller_cpu_s']} s + hosts {hosts} (load {summary['loadavg_before']} -> "
        f"{summary['loadavg_after']}), rc {rc}"
    )
    if args.procs:
        ranked = sorted(procs.values(), key=lambda v: -v[2])
        attributed = sum(v[2] for v in ranked)
        print(f"lab_cpu: {len(ranked)} processes seen, {attributed:.1f} s attributed, the costliest:")
        for place, cmdline, cpu in ranked[: args.procs]:
            print(f"  {cpu:7.1f} s  {place:12} {cmdline}")
        groups: dict[str, float] = {}
        for place, cmdline, cpu in ranked:
            key = f"{'host' if place != 'controller' else place} {program(cmdline)}"
            groups[key] = groups.get(key, 0.0) + cpu
        print("lab_cpu: by program (hosts summed):")
        for key, cpu in sorted(groups.items(), key=lambda kv: -kv[1])[: args.procs]:
            print(f"  {cpu:7.1f} s  {key}")
        summary["procs_attributed_cpu_s"] = round(attributed, 1)
        summary["procs_top"] = [
            [place, cmdline, round(cpu, 1)] for place, cmdline, cpu in ranked[: args.procs]
        ]
    if args.acct:
        summary["acct"] = acct_kinds(acct_records(args.acct))
        acct = summary["acct"]
        print(
            f"lab_cpu: acct: {acct['processes']} processes, {acct['ansible_playbook_runs']} ansible-playbook "
            f"runs, "
            f"{acct['module_runs']} module runs on lab hosts, {acct['parse_misses']} of "
            f"{acct['python_on_hosts']} pythons there over {PARSE_MISS_S:.0f} s CPU; CPU s by kind:"
        )
        for kind, seconds in acct["cpu_s"].items():
            print(f"  {seconds:8.1f} s  {kind}")
    print(json.dumps(summary))
    if args.json:
        with args.json.open("a") as handle:
            handle.write(json.dumps(summary) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
