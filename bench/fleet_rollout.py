#!/usr/bin/env python3
"""Wall time of the rolling deploy through the router (issue 17) on lab GPU hosts behind a lab router.

Three figures, printed (asserts nothing):
  1. the same window change (4096 -> 2048, then back in the next pair; both windows deployed once before on
     every host, so no parse is cached in one rollout and not in the other) rolled through 2 hosts, then
     through 3 others, --rollouts times (playbooks/sglang.yml, sglang_rollout_batch 1): the wall time beyond
     the sum of each host's drain (the "drained in X s" the run reports: from the router's DELETE until the
     worker is idle) and server restart (restart request -> ready: the old process stops, the new one starts
     and loads; the verified restart's timings in the host's history), in total and per host, the stability
     window (sglang_stable_seconds) shown apart; and what one more host adds beyond its drain + restart (the
     3-host figure minus the 2-host one: the run's fixed part - Ansible's start, the first play over all
     hosts at once - cancels out), pair by pair and their median (target <= 5 s per host). Both rollouts
     have at least 2 hosts, so both go through the rolling play (one host is deployed by the first play
     alone). The first host of each is the canary: it bakes CANARY_BAKE s (no warm-up delay) under one
     lab/loadgen client through the router and gets its verdict; the bake is subtracted like a drain, and
     the verdict's own cost (its two scrapes of the router and the computation, canary.json) is printed;
  2. a no-change run of playbooks/sglang.yml on 1, 2 and 4 GPU hosts, interleaved --runs times, the fastest
     of each (target: 4 hosts <= 1.5x 1 host), each round's own 4-host / 1-host ratio and their median, and
     the machine's speed over the rounds (CPU seconds of a fixed loop before each);
  3. the floor of that ratio on this machine: a play of as many tasks per host that do nothing (2 of them
     module runs, as in the no-change run), on 1 and 4 of the same hosts, --runs rounds: the fastest of each
     and the median of the rounds' own ratios.
With each no-change figure, the CPU seconds it took: the controller's (ansible-playbook and its workers) and
the lab hosts' (their cgroups: the modules, sshd, the lab servers), and how many of the machine's cores that
kept busy on average over the run's wall time - the lab hosts share the controller's cores here, where a
fleet's GPU hosts run their modules on their own.

Brings up `--hosts 5 --routers 1` lab hosts from --first-index (its own inventory
inventory/lab/fleet-bench-<index>.yml, gitignored), deploys window 2048, then 4096 to all of them (not
measured), measures, and takes exactly those hosts down. Needs root, the SGLang layer and the wheelhouse
(smg/ too).
"""

from __future__ import annotations

import argparse
import configparser
import importlib.machinery
import importlib.util
import json
import os
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = ROOT / ".venv" / "bin"
LABCTL = ROOT / "lab" / "labctl"
# lab/labctl as a module, for where it puts each lab host's cgroups.
_LOADER = importlib.machinery.SourceFileLoader("labctl", str(LABCTL))
LAB = importlib.util.module_from_spec(importlib.util.spec_from_loader("labctl", _LOADER))
_LOADER.exec_module(LAB)
GPU_HOSTS = 5  # a 2-host and a 3-host rollout, on distinct hosts
# The untimed steps roll every host at once: behind the router, the capacity guard lets them all leave only
# with no other worker required ready (no load runs then).
ALL_AT_ONCE = {"sglang_rollout_batch": "100%", "sglang_min_ready_workers": 0}
CANARY_BAKE = 3  # seconds; production bakes minutes, the bench subtracts it


class Bench:
    def __init__(self, index: int) -> None:
        self.inventory = ROOT / "inventory" / "lab" / f"fleet-bench-{index}.yml"
        self.gpu = [f"lab{index + k}" for k in range(GPU_HOSTS)]
        self.router = f"lab{index + GPU_HOSTS}"
        self.index = index
        self.keys = {"sglang_router_admin_key": secrets.token_hex(16)}
        # The CPU seconds of the last play: the controller's, the lab hosts' (None: no cgroup to read).
        self.cpu: tuple[float, float | None] = (0.0, None)

    def lab_cpu_seconds(self) -> float | None:
        """CPU seconds the bench's lab hosts have used so far: the usage_usec of each host's cgroup
        (lab/labctl's host_cgroups; the cgroup2 one has cpu.stat)."""
        total = 0.0
        for host in [*self.gpu, self.router]:
            found = [p for p in (Path(c, "cpu.stat") for c in LAB.host_cgroups(host)) if p.exists()]
            if not found:
                return None
            usage = dict(line.split() for line in found[0].read_text().splitlines())
            total += int(usage["usage_usec"]) / 1e6
        return total

    def router_url(self) -> str:
        return f"http://10.213.{self.index + GPU_HOSTS}.2:30000"  # labctl's address of lab<K>

    def env(self) -> dict[str, str]:
        return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")

    def play(
        self, playbook: str, *args: str, extra: dict | None = None, profile: bool = False
    ) -> tuple[float, str]:
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="bench-extra-") as handle:
            json.dump({**self.keys, "sglang_stable_seconds": 3, **(extra or {})}, handle)
            handle.flush()
            argv = [
                str(ANSIBLE / "ansible-playbook"),
                "-i",
                str(self.inventory),
                playbook,
                "-e",
                "@" + handle.name,
            ]
            env = self.env()
            # ansible.posix's profile_tasks: each task's seconds, the slowest listed at the end; the variable
            # replaces ansible.cfg's callbacks_enabled, so it adds to the repository's list.
            if profile:
                cfg = configparser.ConfigParser()
                cfg.read(ROOT / "ansible.cfg")
                enabled = cfg.get("defaults", "callbacks_enabled", fallback="")
                env.update(
                    ANSIBLE_CALLBACKS_ENABLED=f"{enabled},ansible.posix.profile_tasks".lstrip(","),
                    PROFILE_TASKS_TASK_OUTPUT_LIMIT="15",
                )
            lab_before = self.lab_cpu_seconds()
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.monotonic()
            r = subprocess.run(
                [*argv, *args],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
            )
            wall = time.monotonic() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            lab_after = self.lab_cpu_seconds()
            self.cpu = (
                after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime,
                None if lab_before is None or lab_after is None else lab_after - lab_before,
            )
        if r.returncode != 0:
            sys.stdout.write(r.stdout[-4000:] + r.stderr[-2000:])
            sys.exit(f"{playbook} {' '.join(args)} failed (rc {r.returncode})")
        return wall, r.stdout

    def last_timings(self, host: str) -> dict:
        out = subprocess.run(
            [
                str(ANSIBLE / "ansible"),
                "-i",
                str(self.inventory),
                host,
                "-m",
                "sglang_history",
                "-a",
                "limit=3",  # the verified restart's record, and a canary's verdict after it
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**self.env(), "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json"},
        ).stdout
        records = json.loads(out)["plays"][0]["tasks"][0]["hosts"][host]["records"]
        return [r for r in records if "timings" in r][-1]["timings"]


def rollout(bench: Bench, hosts: list[str], window: int) -> tuple[float, float]:
    """Roll ``window`` through ``hosts`` (batch 1), print the figures, return the wall time beyond the sum of
    each host's drain + server restart, and the sum of their stability windows."""
    reports = Path(tempfile.mkdtemp(prefix="bench-report-"))
    # The bench measures what the verdict costs, not the lab's noise: latency limits no like change trips.
    canary = {"sglang_canary_delay": 0, "sglang_canary_bake": CANARY_BAKE, "sglang_canary_min_requests": 1}
    canary["sglang_canary_limits"] = {"ttft_seconds": 100, "itl_seconds": 100}
    load = subprocess.Popen(
        [sys.executable, str(ROOT / "lab" / "loadgen"), "--router", bench.router_url(), "--clients", "1"],
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        wall, out = bench.play(
            "playbooks/sglang.yml",
            "-e",
            f"window={window}",
            "--limit",
            ",".join(hosts),
            extra={**canary, "deploy_report_dir": str(reports)},
            profile=True,
        )
    finally:
        load.send_signal(signal.SIGINT)
        load.wait(timeout=120)
    verdict = json.loads((reports / "canary.json").read_text())
    drains = {h: float(s) for h, s in re.findall(r"(lab\d+) left lab\d+: drained in ([0-9.]+) s", out)}
    rows, accounted = [], 0.0
    for host in hosts:
        t = bench.last_timings(host)
        start, stable = t["ready"], t["stable"] - t["ready"]
        accounted += drains.get(host, 0.0) + start
        rows.append((host, drains.get(host), start, stable))
    beyond = wall - accounted - verdict["seconds"]["bake"] - verdict["seconds"]["delay"]
    print(f"rollout of {len(hosts)} host(s) (window -> {window}, batch 1): {wall:.1f} s wall")
    print(
        f"  canary {hosts[0]}: {verdict['verdict']} after a bake of {verdict['seconds']['bake']:g} s "
        f"(not counted); the verdict's own cost {verdict['seconds']['verdict']:.3f} s"
    )
    for host, drain, start, stable in rows:
        print(f"  {host}: drain {drain} s, server restart->ready {start:.2f} s, stability {stable:.2f} s")
    print("  slowest tasks of that run (ansible.posix profile_tasks):")
    for task, seconds in re.findall(r"^(.+?) -{2,} +([0-9.]+s)$", out, re.M):
        print(f"    {seconds:>8}  {task.strip()}")
    stable_sum = sum(r[3] for r in rows)
    n = len(hosts)
    print(
        f"  beyond drain + restart: {beyond:.1f} s = {beyond / n:.1f} s per host; "
        f"without the stability windows: {(beyond - stable_sum) / n:.1f} s per host"
    )
    return beyond, stable_sum


def floor(bench: Bench, no_change_out: str, runs: int) -> None:
    """The same ratio for an Ansible pass of the same shape that does nothing: as many task evaluations per
    host as the no-change run (its output for the first host), 2 of them module runs (ping, as the host probe
    and the proof), the rest set_fact. What this machine's cores allow Ansible itself, the controller and the
    lab hosts sharing them."""
    host = bench.gpu[0]
    tasks = len(re.findall(r"^(?:ok|changed|skipping): \[" + re.escape(host) + r"\]", no_change_out, re.M))
    body = ["    - ansible.builtin.ping:"] * 2
    body += ["    - ansible.builtin.set_fact:\n        bench_floor: 1"] * (tasks - 2)
    with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="bench-floor-") as handle:
        handle.write("- name: Floor\n  hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n")
        handle.write("\n".join(body) + "\n")
        handle.flush()
        walls: dict[int, list[float]] = {1: [], 4: []}
        cpus: dict[int, list[tuple[float, float | None]]] = {1: [], 4: []}
        for _ in range(runs):
            for n in walls:
                walls[n].append(bench.play(handle.name, "--limit", ",".join(bench.gpu[:n]))[0])
                cpus[n].append(bench.cpu)
    one, four = min(walls[1]), min(walls[4])
    controller, lab = cpus[4][walls[4].index(four)]
    rounds = statistics.median(b / a for a, b in zip(walls[1], walls[4]))
    print(
        f"floor: {tasks} tasks per host that do nothing (2 of them pings): 1 host {one:.1f} s, "
        f"4 hosts {four:.1f} s ({four / one:.2f}x; the rounds' own ratios, median {rounds:.2f}x); "
        f"the 4-host run's CPU: controller {controller:.1f} s"
        + ("" if lab is None else f" + lab hosts {lab:.1f} s")
    )


def cpu_loop_seconds() -> float:
    """CPU seconds of a fixed loop in this process: the speed the machine gives right now (a VM's moves by
    tens of percent within seconds, and every figure of the bench with it)."""
    started, total = time.process_time(), 0
    for i in range(3_000_000):
        total += i
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--first-index", type=int, default=150, help="lab<K>..lab<K+4> (4 GPU hosts, 1 router)"
    )
    parser.add_argument(
        "--runs", type=int, default=5, help="no-change rounds of 1, 2, 4 hosts (the fastest is shown)"
    )
    parser.add_argument(
        "--rollouts",
        type=int,
        default=3,
        help="pairs of rollouts, 2 hosts then 3 others (the median is shown)",
    )
    args = parser.parse_args()
    bench = Bench(args.first_index)
    up = [str(LABCTL), "up", "--sglang-layer", "--hosts", str(GPU_HOSTS), "--routers", "1"]
    up += ["--first-index", str(args.first_index), "--inventory", str(bench.inventory)]
    subprocess.run(up, check=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    try:
        bench.play("deploy.yml", "-e", "window=2048", extra=ALL_AT_ONCE)
        bench.play("playbooks/sglang.yml", "-e", "window=4096", extra=ALL_AT_ONCE)
        # The same change rolled through 2 hosts, then through 3 others: what a host adds to the rollout
        # beyond its own drain + restart is the difference (the run's fixed part cancels out). A difference
        # of two runs of 25-40 s moves by a second or more between pairs here, so --rollouts pairs, the
        # window changing 4096 -> 2048 and back, and their median.
        margins = []
        for pair in range(args.rollouts):
            window = 2048 if pair % 2 == 0 else 4096
            two, two_stable = rollout(bench, bench.gpu[:2], window)
            three, three_stable = rollout(bench, bench.gpu[2:5], window)
            more, more_stable = three - two, three_stable - two_stable
            margins.append(more - more_stable)
            print(
                f"  what one more host adds beyond its drain + restart (3 hosts - 2 hosts): {more:.1f} s, of "
                f"which its stability window (sglang_stable_seconds 3) {more_stable:.1f} s; without it "
                f"{more - more_stable:.1f} s. The fixed part of a rollout: {3 * two - 2 * three:.1f} s"
            )
        print(
            f"one more host beyond its drain + restart, without its stability window, pair by pair: "
            f"{', '.join(f'{m:.1f}' for m in margins)} s (median {statistics.median(margins):.1f} s; "
            "target <= 5 s)"
        )
        # All hosts on window 4096 again (not measured), then no-change runs on 1, 2 and 4 of them.
        bench.play("playbooks/sglang.yml", "-e", "window=4096", extra=ALL_AT_ONCE)
        # Interleaved (1, 2, 4 hosts, then again): the machine's speed drifts within minutes, and runs of one
        # host count after another would charge that drift to the host count.
        walls: dict[int, list[float]] = {1: [], 2: [], 4: []}
        cpus: dict[int, list[tuple[float, float | None]]] = {n: [] for n in walls}
        speed: list[float] = []
        for _ in range(args.runs):
            speed.append(cpu_loop_seconds())
            for n in walls:
                wall, out = bench.play(
                    "playbooks/sglang.yml", "-e", "window=4096", "--limit", ",".join(bench.gpu[:n])
                )
                assert all("changed=0" in line for line in out.splitlines() if " : ok=" in line)
                walls[n].append(wall)
                cpus[n].append(bench.cpu)
        figures = {n: min(w) for n, w in walls.items()}
        for n, seconds in figures.items():
            controller, lab = cpus[n][walls[n].index(seconds)]
            busy = ""
            if lab is not None:
                cores = (controller + lab) / seconds
                busy = f" + lab hosts {lab:.1f} s = {cores:.1f} of {os.cpu_count()} cores busy"
            print(
                f"no-change run, {n} GPU host(s): {seconds:.1f} s ({seconds / figures[1]:.2f}x one host; "
                f"runs {', '.join(f'{w:.1f}' for w in walls[n])}); "
                f"its CPU: controller {controller:.1f} s{busy}"
            )
        rounds = sorted(four / one for one, four in zip(walls[1], walls[4]))
        print(
            f"each round's own 4-host / 1-host ratio: {', '.join(f'{r:.2f}' for r in rounds)} (median "
            f"{statistics.median(rounds):.2f}x); the machine's speed meanwhile: a fixed Python loop took "
            f"{min(speed):.2f}-{max(speed):.2f} s of CPU, one before each round"
        )
        print("target: 4 hosts <= 1.5x one host")
        floor(bench, out, args.runs)
    finally:
        subprocess.run([str(LABCTL), "down", "--inventory", str(bench.inventory)], check=False, cwd=ROOT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
