#!/usr/bin/env python3
"""Latency of the verified restart (library/sglang_verified_restart.py) on an existing lab host.

(a) death -> failure: the server is made to crash SGLANG_LAB_CRASH_AFTER seconds after start
    (a temporary drop-in Environment=); the module's own figures are printed: when the main
    process died after its start (systemd's ExecMainExitTimestampMonotonic) and how long after
    that death the module failed (`detected_after_death`). Target: <= 2 s.
(b) overhead beyond the server's own ready time: healthy restarts; the server's own ready time
    is its "The server is fired up and ready to roll!" journal line (monotonic, relative to the
    restart request); the module's are `timings.ready` (first /health_generate 200) and
    `timings.total` (verdict). Overhead = total - server ready - stability window, printed with
    the window 0 (health_count 1) and with --stable-seconds/--health-count. Target: <= 1 s.

The host is left as it was found: the drop-in is removed and the unit restarted healthy.
Prints figures; asserts nothing.

    .venv/bin/python bench/restart_latency.py inventory/lab/molecule-failures.yml [--host lab12]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
ANSIBLE = str(ROOT / ".venv" / "bin" / "ansible")
DROPIN_DIR = "/etc/systemd/system/{unit}.d"
DROPIN = "bench-restart-latency.conf"
READY_LINE = "The server is fired up and ready to roll!"


class Host:
    """Ad-hoc Ansible calls to one host, results parsed from the json callback."""

    def __init__(self, inventory: str, host: str) -> None:
        self.inventory, self.host = inventory, host
        self.env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "json",
        }

    def run(self, module: str, args: dict) -> tuple[dict, float]:
        start = time.monotonic()
        proc = subprocess.run(
            [ANSIBLE, "-i", self.inventory, self.host, "-m", module, "-a", json.dumps(args)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=self.env,
        )
        wall = time.monotonic() - start
        try:
            result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"][self.host]
        except (ValueError, KeyError, IndexError):
            sys.exit(f"ansible -m {module} gave no result (rc {proc.returncode}): {proc.stderr[-2000:]}")
        return result, wall

    def command(self, *argv: str) -> dict:
        result, _ = self.run("ansible.builtin.command", {"argv": list(argv)})
        if result.get("failed"):
            sys.exit(f"{' '.join(argv)} failed on {self.host}: {result.get('msg') or result.get('stderr')}")
        return result


def restart(host: Host, unit: str, port: int, stable: float, count: int, timeout: float):
    """One verified restart; returns (module result, controller wall seconds)."""
    # As the role does: a deliberate restart must not count against StartLimitBurst.
    host.command("systemctl", "reset-failed", unit)
    return host.run(
        "sglang_verified_restart",
        {
            "unit": unit,
            "port": port,
            "ready_timeout": timeout,
            "stable_seconds": stable,
            "health_count": count,
        },
    )


def server_ready_rel(host: Host, result: dict) -> float | None:
    """Seconds from the restart request to the server's own ready line of that invocation."""
    invocation = result.get("invocation_id")
    request_us = (result.get("baseline") or {}).get("request_us")
    if not invocation or not request_us:
        return None
    out = host.command(
        "journalctl", "--no-pager", "-o", "json", "--all", f"_SYSTEMD_INVOCATION_ID={invocation}"
    )["stdout"]
    for line in out.splitlines():
        entry = json.loads(line)
        if READY_LINE in str(entry.get("MESSAGE", "")):
            return (int(entry["__MONOTONIC_TIMESTAMP"]) - int(request_us)) / 1e6
    return None


def set_crash(host: Host, unit: str, crash_after: float | None) -> None:
    directory = DROPIN_DIR.format(unit=unit)
    if crash_after is None:
        host.run("ansible.builtin.file", {"path": f"{directory}/{DROPIN}", "state": "absent"})
    else:
        host.run("ansible.builtin.file", {"path": directory, "state": "directory", "mode": "0755"})
        host.run(
            "ansible.builtin.copy",
            {
                "dest": f"{directory}/{DROPIN}",
                "mode": "0644",
                "content": f"# bench/restart_latency.py (temporary)\n[Service]\n"
                f"Environment=SGLANG_LAB_CRASH_AFTER={crash_after:g}\n",
            },
        )
    host.command("systemctl", "daemon-reload")


def fmt(values: list[float]) -> str:
    if not values:
        return "n/a"
    text = " ".join(f"{v:.3f}" for v in values)
    return f"{text}  (median {statistics.median(values):.3f}, max {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory", help="lab inventory (in inventory/lab/) of a host with SGLang deployed")
    parser.add_argument("--host", help="inventory host (default: the first of group gpu_nodes)")
    parser.add_argument("--unit", default="sglang.service")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--crashes", type=int, default=3)
    parser.add_argument("--crash-after", type=float, default=3.0)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--stable-seconds", type=float, default=5.0)
    parser.add_argument("--health-count", type=int, default=3)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    args = parser.parse_args()

    inventory = str(pathlib.Path(args.inventory).resolve())
    host_name = args.host
    if host_name is None:
        listed = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i", inventory, "--list"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        host_name = json.loads(listed)["gpu_nodes"]["hosts"][0]
    host = Host(inventory, host_name)
    print(f"host {host_name} ({inventory}), unit {args.unit}, port {args.port}")

    # (a) death -> failure
    lived, detected = [], []
    set_crash(host, args.unit, args.crash_after)
    try:
        for n in range(args.crashes):
            result, _ = restart(host, args.unit, args.port, 0, 1, args.ready_timeout)
            if not result.get("failed") or result.get("detected_after_death") is None:
                print(f"  crash {n + 1}: no death reported: {result.get('msg')}")
                continue
            lived.append(result["died_after"])
            detected.append(result["detected_after_death"])
            print(
                f"  crash {n + 1}: died {result['died_after']:.3f} s after start, module failed "
                f"{result['detected_after_death']:.3f} s after the death (exit {result.get('exit')})"
            )
    finally:
        set_crash(host, args.unit, None)
    print(f"(a) death -> module failure, s (target <= 2): {fmt(detected)}")
    print(f"    process lifetime, s (SGLANG_LAB_CRASH_AFTER={args.crash_after:g}): {fmt(lived)}")

    # (b) overhead beyond the server's own ready time
    for stable, count in ((0.0, 1), (args.stable_seconds, args.health_count)):
        own, ready_gap, overhead, walls = [], [], [], []
        for n in range(args.restarts):
            result, wall = restart(host, args.unit, args.port, stable, count, args.ready_timeout)
            if result.get("failed"):
                print(f"  restart {n + 1} (stable {stable:g} s) FAILED: {result.get('msg')}")
                continue
            timings = result["timings"]
            server = server_ready_rel(host, result)
            if server is None:
                print(f"  restart {n + 1}: no '{READY_LINE}' line in invocation {result['invocation_id']}")
                continue
            own.append(server)
            ready_gap.append(timings["ready"] - server)
            overhead.append(timings["total"] - server - stable)
            walls.append(wall)
        print(f"(b) stable_seconds={stable:g}, health_count={count}:")
        print(f"    server's own ready time after the request, s: {fmt(own)}")
        print(f"    first /health_generate 200 after it, s:       {fmt(ready_gap)}")
        print(f"    verdict after it minus the window, s (target <= 1): {fmt(overhead)}")
        print(f"    controller wall time of the whole ansible call, s: {fmt(walls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
