#!/usr/bin/env python3
"""This project's deploy against Ansible's own floor and against the naive peer, on lab hosts (issue 36).

Figures, printed (asserts nothing), each the fastest of --runs, with the controller's CPU seconds
(ansible-playbook and its workers) per host:
  floor       a play of one `ping` task on the hosts: what any Ansible run costs here;
  no-change   `playbooks/sglang.yml` on hosts that are converged (the window they run);
  change      a known-window change (--windows A B, alternated, both deployed once before so neither is a
              first parse) on one host with sglang_stable_seconds 0: the stability window excluded;
  naive       the same change as an operator writes it by hand: replace the window in the unit, daemon-reload,
              restart, poll /health until 200 (bench/naive_peer.yml): no proof of the process, its arguments
              or its cgroup, no rollback.
The ratios asked for: no-change / floor (target <= 2) and change / naive (target <= 1.3).

    bench/naive_peer.py --inventory inventory/lab/hosts.yml            # every host of gpu_nodes
    bench/naive_peer.py --inventory inventory/lab/hosts.yml --repo DIR # another checkout's code

Needs lab hosts deployed by this project (`make demo`, or `make lab-up LAB_HOSTS=4` then a deploy).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NAIVE = HERE / "naive_peer.yml"
FLOOR = "- hosts: gpu_nodes\n  gather_facts: false\n  tasks:\n    - name: Ping\n      ansible.builtin.ping:\n"


class Runner:
    def __init__(self, repo: Path, inventory: str, limit: str | None) -> None:
        self.repo, self.inventory, self.limit = repo, inventory, limit

    def play(self, playbook: str | Path, *extra: str) -> tuple[float, float]:
        """(wall seconds, controller CPU seconds) of one ansible-playbook run; exits on failure."""
        cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", self.inventory, str(playbook), *extra]
        if self.limit:
            cmd += ["--limit", self.limit]
        env = dict(os.environ, ANSIBLE_CONFIG=str(self.repo / "ansible.cfg"))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        done = subprocess.run(
            cmd, cwd=self.repo, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
        )
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            sys.stdout.write(done.stdout[-4000:])
            sys.exit(f"{playbook} {' '.join(extra)} failed (rc {done.returncode})")
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(runs)


def line(name: str, figure: tuple[float, float], hosts: int) -> str:
    wall, cpu = figure
    return f"{name:<10} {wall:6.2f} s wall, controller CPU {cpu / hosts:5.2f} s per host ({hosts} host(s))"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True)
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose code is measured")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", type=int, nargs=2, default=(4096, 2048))
    parser.add_argument("--change-host", default="lab1")
    args = parser.parse_args()
    repo = args.repo.resolve()
    hosts = Runner(repo, args.inventory, None)
    one = Runner(repo, args.inventory, args.change_host)
    count = int(
        subprocess.run(
            [str(ROOT / ".venv/bin/ansible"), "-i", args.inventory, "gpu_nodes", "--list-hosts"],
            capture_output=True,
            text=True,
            check=True,
        )
        .stdout.splitlines()[0]
        .split("(")[1]
        .split(")")[0]
    )
    a, b = args.windows
    fast = ["-e", '{"sglang_stable_seconds": 0, "sglang_health_count": 1}']
    with tempfile.TemporaryDirectory() as tmp:
        floor_play = Path(tmp) / "floor.yml"
        floor_play.write_text(FLOOR)
        # Both windows deployed once, every host back on the last: neither measured change is a first parse.
        for window in (a, b):
            hosts.play("playbooks/sglang.yml", "-e", f"window={window}")
        floor, no_change, change, naive = [], [], [], []
        for _ in range(args.runs):
            floor.append(hosts.play(floor_play))
            no_change.append(hosts.play("playbooks/sglang.yml", "-e", f"window={b}"))
        for i in range(args.runs):
            to, back = (a, b) if i % 2 == 0 else (b, a)
            change.append(one.play("playbooks/sglang.yml", "-e", f"window={to}", *fast))
            naive.append(one.play(NAIVE, "-e", f"window={back}"))
        # The naive peer's unit is not the verified one: the project's deploy puts the host back.
        one.play("playbooks/sglang.yml", "-e", f"window={b}", *fast)
    commit = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    print(f"code: {repo} ({commit.stdout.strip()})")
    print(line("floor", best(floor), count))
    print(line("no-change", best(no_change), count))
    print(line("change", best(change), 1))
    print(line("naive", best(naive), 1))
    print(f"no-change / floor: {best(no_change)[0] / best(floor)[0]:.2f} (target <= 2)")
    print(f"change / naive:    {best(change)[0] / best(naive)[0]:.2f} (target <= 1.3)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
