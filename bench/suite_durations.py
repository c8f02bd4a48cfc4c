#!/usr/bin/env python3
"""Where the suite's time goes: each part of `make check` / `make test`, timed, and the slowest tests.

    python bench/suite_durations.py [--only check|lab|all] [--top 15] [--out DIR]
    python bench/suite_durations.py --junit out/suite-durations/*.xml      # read earlier results only

Runs the same make targets as `make check` (lint, unit, suite-ids) and, with `lab` or `all`, the lab
parts of `make test` (lab-tests: lab server, lab tooling and integration in one pytest-xdist run;
molecule; root, lab hosts), one after the other as `make test` does. Every pytest run writes a JUnit
XML (PYTEST_ADDOPTS=--junitxml=...; the test's time there is setup + call + teardown, as
`pytest --durations=0` splits it), and each target's
make output goes to a log beside it. Prints the wall time of each part, the 15 slowest tests and the
total, against the budgets of issue 15 (check <= 3 min; the whole `make test` <= 20 min, caches warm).
Exit status: 1 when a part failed, else 0 (a budget overrun is printed, not fatal).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ["lint", "unit", "suite-ids"]
LAB = ["lab-tests", "molecule"]
PARTS = {"check": CHECK, "lab": LAB, "all": CHECK + LAB}
BUDGET = {"check": 180, "lab": None, "all": 20 * 60}


def run_target(target: str, out: Path) -> tuple[float, int, Path | None]:
    """`make <target>` with its pytest run writing out/<target>.xml; (wall seconds, rc, junit or None)."""
    junit = out / f"{target}.xml"
    junit.unlink(missing_ok=True)
    env = dict(os.environ)
    env["PYTEST_ADDOPTS"] = " ".join(
        filter(None, [env.get("PYTEST_ADDOPTS", ""), f"--junitxml={shlex.quote(str(junit))}"])
    )
    log = out / f"{target}.log"
    print(f"make {target} ...", end=" ", flush=True)
    started = time.monotonic()
    with open(log, "w") as handle:
        rc = subprocess.run(
            ["make", target],
            cwd=ROOT,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        ).returncode
    wall = time.monotonic() - started
    print(f"{wall:.1f} s" + ("" if rc == 0 else f"  FAILED (rc {rc}, log {log})"), flush=True)
    if rc != 0:
        sys.stdout.write("".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:]))
    return wall, rc, junit if junit.exists() else None


def read_junit(path: Path) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) of every test case in a pytest JUnit XML."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        cases.append((float(case.get("time") or 0), f"{file}::{case.get('name')}", outcome))
    return cases


def report(cases: list[tuple[float, str, str]], top: int) -> None:
    outcomes: dict[str, int] = {}
    for _, _, outcome in cases:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
    print(f"\n{len(cases)} tests ({summary}); sum of their times {sum(c[0] for c in cases):.1f} s")
    print(f"{top} slowest (setup + call + teardown):")
    for seconds, test_id, outcome in sorted(cases, reverse=True)[:top]:
        print(f"  {seconds:8.2f} s  {test_id}" + ("" if outcome == "passed" else f"  [{outcome}]"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", choices=sorted(PARTS), default="check", help="which parts to run (default check)"
    )
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "suite-durations")
    parser.add_argument("--junit", type=Path, nargs="+", help="only read these JUnit XML files; run nothing")
    args = parser.parse_args(argv)

    if args.junit:
        cases = [c for path in args.junit for c in read_junit(path)]
        report(cases, args.top)
        return 0

    if args.only != "check" and os.geteuid() != 0:
        sys.exit("the lab parts need root (lab hosts are systemd-nspawn machines)")
    args.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    failed = []
    cases = []
    started = time.monotonic()
    for target in PARTS[args.only]:
        wall, rc, junit = run_target(target, args.out)
        walls[target] = wall
        if rc != 0:
            failed.append(target)
        if junit:
            cases += read_junit(junit)
    total = time.monotonic() - started

    report(cases, args.top)
    print("\nwall time per part: " + ", ".join(f"{t} {w:.1f} s" for t, w in walls.items()))
    budget = BUDGET[args.only]
    verdict = "" if budget is None else f" (budget {budget // 60} min: {'OK' if total <= budget else 'OVER'})"
    print(f"total wall time ({args.only}): {total:.1f} s = {total / 60:.1f} min{verdict}")
    if failed:
        print(f"FAILED: {', '.join(failed)} (logs in {args.out})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
