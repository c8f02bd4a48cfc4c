#!/usr/bin/env python3
"""The suite keeps every test it had (issue 15): tests may move, merge or run on a shared host, not vanish.

Collects the ids of the whole suite the way the baseline was made:
- every pytest test under tests/ (``pytest --collect-only -q tests``: tests/unit and tests/integration;
  the directory decides WHERE a test runs, tests/README.md);
- every molecule scenario (``molecule/<name>`` for each ``molecule/*/molecule.yml``), the Testinfra
  tests of each scenario's ``tests/`` directory, and each failure case of a scenario's verify.yml
  (``molecule/<name>/verify.yml::Case ...``: a ``- name: Case ...`` task of verify.yml or of a task
  file it imports or includes, e.g. molecule/failures/cases/*.yml; the id keeps naming verify.yml,
  which runs the case, so moving a case between files does not rename it).

FAILS, listing them, when an id of ``tests/suite-baseline.txt`` is no longer collected. A test that
moved or was renamed stays listed in the baseline as ``old_id -> new_id`` (the new id must then be
collected); ``old_id -> new_a, new_b`` when one test became several, and several old ids may name
the same new id when tests were merged.

With ``--selection ARGS`` (repeatable; the Makefile passes the pytest arguments of every part of
``make test``) it also FAILS when a collected test is selected by none of them, i.e. exists but runs
under no make target. ``--molecule-exclude NAME`` names scenarios ``make test`` deliberately skips.

    python tests/check_suite_ids.py                      # baseline ids still collected?
    python tests/check_suite_ids.py --write              # (re)write the baseline from what is collected now
    python tests/check_suite_ids.py --print              # print the current ids

Standard library only; pytest is run as a subprocess with the interpreter that runs this script.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import functools
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "tests" / "suite-baseline.txt"
CASE = re.compile(r"""^\s*-\s+name:\s+(["']?)(Case .+?)\1\s*$""")
# A task file verify.yml imports or includes by a literal path (relative to the file naming it).
TASK_FILE = re.compile(
    r"""^\s*(?:-\s+)?(?:ansible\.builtin\.)?(?:import|include)_tasks:\s*(?:file:\s*)?(["']?)([^"'{}\s]+)\1\s*$"""
)


def pytest_ids(args: list[str]) -> set[str]:
    """Test ids ``pytest --collect-only -q ARGS`` collects (run from the repository root)."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args]
    # Options meant for the test runs (bench/suite_durations.py's --junitxml) are not for collecting.
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, env=env)
    # 5: nothing collected (a selection may legitimately select nothing in a directory).
    if proc.returncode not in (0, 5):
        sys.stderr.write(proc.stdout[-6000:] + proc.stderr[-3000:])
        sys.exit(f"check_suite_ids: collection failed (rc {proc.returncode}): {shlex.join(cmd)}")
    return {line.strip() for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")}


@functools.cache
def molecule_ids() -> dict[str, set[str]]:
    """scenario name -> its ids (the scenario itself, its Testinfra tests, its verify.yml cases)."""
    out: dict[str, set[str]] = {}
    for config in sorted((REPO / "molecule").glob("*/molecule.yml")):
        scenario = config.parent
        rel = scenario.relative_to(REPO).as_posix()
        ids = {rel}
        if (scenario / "tests").is_dir():
            ids |= pytest_ids([f"{rel}/tests"])
        verify = scenario / "verify.yml"
        if verify.is_file():
            ids |= {f"{rel}/verify.yml::{case}" for case in case_names(verify)}
        out[scenario.name] = ids
    return out


def case_names(path: Path, seen: frozenset[Path] = frozenset()) -> list[str]:
    """The ``Case ...`` task names of ``path`` and of the task files it imports or includes, in order.

    FAILS (exits) when an imported file is missing: its cases would silently drop out of the suite."""
    names = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        match = CASE.match(line)
        if match:
            names.append(match.group(2))
            continue
        match = TASK_FILE.match(line)
        if match:
            child = (path.parent / match.group(2)).resolve()
            if not child.is_file():
                where = f"{path.relative_to(REPO)}:{number}"
                sys.exit(f"check_suite_ids: {where} imports {match.group(2)}, which is not a file")
            if child not in seen:
                names += case_names(child, seen | {path.resolve()})
    return names


@functools.cache
def tests_ids() -> set[str]:
    """The ids of every test under tests/ (one collection)."""
    return pytest_ids(["tests"])


def current_ids() -> set[str]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        tests = pool.submit(tests_ids)
        ids = set().union(*molecule_ids().values())
        return ids | tests.result()


def _under(test_id: str, path: str) -> bool:
    file = test_id.split("::", 1)[0]
    return file == path or file.startswith(path + "/")


def selected_ids(selection: str) -> set[str]:
    """The ids one part's pytest arguments select. Paths and --ignore are applied to the collection of
    tests/ (no further pytest run); any other argument (a marker, a node id) makes pytest collect the
    selection itself."""
    args = shlex.split(selection)
    paths, ignores = [], []
    it = iter(args)
    for arg in it:
        if arg.startswith("--ignore="):
            ignores.append(os.path.normpath(arg.split("=", 1)[1]))
        elif arg == "--ignore":
            ignores.append(os.path.normpath(next(it, "")))
        elif arg.startswith("-") or "::" in arg:
            return pytest_ids(args)
        else:
            paths.append(os.path.normpath(arg))
    return {
        i
        for i in tests_ids()
        if (not paths or any(_under(i, p) for p in paths)) and not any(_under(i, g) for g in ignores)
    }


def read_baseline(path: Path) -> dict[str, list[str]]:
    """baseline id -> the ids that must be collected for it (itself, or what it moved to)."""
    wanted: dict[str, list[str]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if " -> " in line:
            old, new = line.split(" -> ", 1)
            # New ids are separated by ", " before a path: a case name may contain ", " itself.
            targets = [t.strip() for t in re.split(r", (?=[\w.-]+/)", new) if t.strip()]
            if not targets:
                sys.exit(f"{path}:{number}: '{line}' names no new id")
            wanted[old.strip()] = targets
        else:
            wanted[line] = [line]
    return wanted


def directory(test_id: str) -> str:
    """tests/<part>/<folder> of a pytest id (tests/unit/library, tests/integration), molecule/<scenario>."""
    parts = test_id.split("::", 1)[0].split("/")
    if parts[0] == "tests":
        return "/".join(parts[:-1][:3])
    return "/".join(parts[:2]) if len(parts) > 1 else parts[0]


def write_baseline(path: Path, ids: set[str]) -> None:
    counts = Counter(directory(i) for i in ids)
    head = [
        "# Test ids of the whole suite (issue 15): every one must still be collected, and run by `make test`",
        "# (tests/check_suite_ids.py, run by `make check`). A moved or renamed test stays here as",
        "# `old_id -> new_id`. Produced by `python tests/check_suite_ids.py --write` on "
        f"{datetime.date.today().isoformat()}:",
        "#   pytest --collect-only -q tests  (tests/unit: no lab host; tests/integration: the lab tests),",
        "#   plus molecule/<scenario>, its Testinfra tests (molecule/<s>/tests) and the failure cases",
        "#   of molecule/<s>/verify.yml.",
        "# Counts: " + ", ".join(f"{d} {n}" for d, n in sorted(counts.items())) + f"; total {len(ids)}.",
    ]
    path.write_text("\n".join(head + sorted(ids)) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=BASELINE)
    parser.add_argument("--write", action="store_true", help="write the baseline from the current ids")
    parser.add_argument("--print", action="store_true", dest="print_ids", help="print the current ids")
    parser.add_argument(
        "--selection",
        action="append",
        default=[],
        metavar="ARGS",
        help="pytest arguments of one part of `make test` (shell-quoted string; repeatable)",
    )
    parser.add_argument("--molecule-exclude", action="append", default=[], metavar="SCENARIO")
    args = parser.parse_args(argv)

    ids = current_ids()
    if args.print_ids:
        print("\n".join(sorted(ids)))
        return 0
    if args.write:
        write_baseline(args.baseline, ids)
        print(f"{args.baseline}: {len(ids)} ids")
        return 0

    problems = []
    wanted = read_baseline(args.baseline)
    missing = sorted(
        f"{old}" + ("" if targets == [old] else f" -> {', '.join(t for t in targets if t not in ids)}")
        for old, targets in wanted.items()
        if any(t not in ids for t in targets)
    )
    if missing:
        problems.append(f"{len(missing)} test id(s) of {args.baseline.name} are no longer collected:")
        problems += [f"  {m}" for m in missing]

    if args.selection:
        selected: set[str] = set()
        excluded = [["molecule", name] for name in args.molecule_exclude]  # run by hand (real GPU)
        for selection in args.selection:
            selected |= selected_ids(selection)
        for name, scenario_ids in molecule_ids().items():
            if name not in args.molecule_exclude:
                selected |= scenario_ids
        unrun = sorted(i for i in ids - selected if i.split("/")[:2] not in excluded)
        if unrun:
            problems.append(f"{len(unrun)} collected test(s) run under no part of `make test`:")
            problems += [f"  {u}" for u in unrun]

    if problems:
        print("\n".join(problems), file=sys.stderr)
        print(
            "A test may move or merge, not disappear: record a move in the baseline as `old_id -> new_id`.",
            file=sys.stderr,
        )
        return 1
    summary = f"suite ids: all {len(wanted)} baseline ids collected ({len(ids)} now)"
    if args.selection:
        summary += f"; every one runs in `make test` ({len(args.selection)} pytest parts + molecule)"
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
