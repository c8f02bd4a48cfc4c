"""Suite-wide: a lab test is a test under tests/integration (marked `lab` here, by its path), and the order
in which pytest-xdist hands out the lab test files (`make lab-tests`).

`make lab-tests` (and `make integration`) run the lab tests on pytest-xdist workers with `--dist loadfile
--no-loadscope-reorder`: each test FILE runs whole on one worker (its module fixtures own a lab host;
tests/integration/conftest.py gives every worker its own shared host), and the files are handed out in
collection order as workers become free. Longest first keeps the workers finishing together, so the
files below are moved to the front, longest first. The seconds are measured (`pytest --durations`, setup
+ call + teardown summed per file, bench/suite_durations.py) on the 2-core machine, SGLang layer cached,
the first file of a worker to use the shared host paying its deploy; they only steer the order, never
which tests run. A file not listed keeps its place after the listed ones.
"""

from __future__ import annotations

import pytest

# Wall seconds of each lab test file on one worker (its fixtures' lab hosts and deploys included).
LAB_FILE_SECONDS = {
    # 14 tests (test_router_role.py's 7 folded in, its own host lab180 and ~255 s gone), measured on lab150-2
    # (pytest --durations=0, single worker, other helpers' lab runs on the machine meanwhile): 652 s in one
    # run - setup 202 s (labctl up, router check mode, the first deploy), rollout under load 139 s, crashing
    # canary 67 s, renamed host 58 s, drain timeout under fail 55 s and under force 44 s, repeat 34 s,
    # capacity guard 24 s, router setting 18 s, the router role's read-only checks ~5 s, teardown 7 s - and
    # 696 s in a busier one. The force test's request was made as long as the fail test's (~61 s) after that.
    # 2026-12-05, after the controller-side cuts: 14 passed in 605 s; with the refused write (15 tests) 439 s
    # (single worker, one other lab run beside it). Stop 26: 342 s alone (a second router, run once: 366 s).
    "tests/integration/test_fleet_rollout.py": 450,
    # bench/lab_cpu.py, lab120, fixture host included, beside test_gitops.py on lab121 (load ~3): 414 s wall,
    # 236 CPU s with an empty role-cache store, 233 s wall, 157 CPU s with the store of an earlier run (labctl
    # carries the role's preflight cache: the 7 preflight SGLang imports, 56-60 CPU s, are gone). What is
    # left is mostly SGLang's own benchmark client (5 runs, 32-48 CPU s) and Ansible (23-50 CPU s).
    "tests/integration/test_sweep.py": 235,
    # Same pair of runs, lab121: 425 s wall, 248 CPU s with an empty role-cache store; 273 s wall, 193 CPU s
    # with it (SGLang imports 52 -> 16 CPU s: the plan account's preflight has its own cache in its home).
    # Earlier: + ~20 s for the plan account (issue 16 item 2), 290 s on lab170 under load 5-6.
    "tests/integration/test_gitops.py": 275,
    # 2 tests: calls 149 s -> 115 s on lab202/lab209 (load gate, 3 s windows, SSH master; 57 ssh calls),
    # plus the fixture's baseline deploy when the file is the worker's first.
    "tests/integration/test_host_lock.py": 145,
    # Fresh host, SGLang installed through the role: 551 s wall, 252 CPU s (lab122, beside two other files,
    # load ~5), of which pip 99 CPU s, SGLang imports 13 s; it starts bare (no role-cache seed), by design.
    "tests/integration/gpu_roles/test_sample_inventory.py": 180,
    # 2 tests, 166 s measured on lab220 (calls; each ends with a baseline restore).
    "tests/integration/test_known_good_integrity.py": 170,
    "tests/integration/test_role_convergence.py": 130,
    "tests/integration/test_rollback_and_check.py": 105,
    "tests/integration/weights/test_weights_lab.py": 100,
    "tests/integration/gpu_roles/test_gpu_roles.py": 75,
    "tests/integration/test_bad_inputs.py": 65,
    "tests/integration/test_ddtree.py": 60,
    # Quiet-machine figure. Paired on the loaded machine (load average 3-5): 149 s and 147 s with an empty
    # parse-cache store (its baseline and NCCL starts parse with SGLang), 94 s and 88 s seeded (lab203-206).
    "tests/integration/test_nccl_environment.py": 45,
    # 3 tests, 81 s measured on a reused host (baseline deploy of the fixture included).
    "tests/integration/test_foreign_dropins.py": 85,
    # 2 tests, each a deploy killed in its slow verified restart (SGLANG_LAB_LOAD_SECONDS=40), then the next
    # deploy, or the replayed boot and a deploy: calls 115 s and 183 s (the latter beside `make unit`) on
    # lab230, plus the fixture's baseline deploy (99 s) when the file is the worker's first; with the
    # parse-cache seed, 3 s restore window and SSH master: calls 77 s and 32 s, deploy 81 s (lab200,
    # load average ~5 from other runs).
    "tests/integration/test_interrupted_heal.py": 190,
    # 5 tests sharing their deploys (failed upgrade + rollback, verified upgrade, weights revision, keep 1,
    # running release not rebuilt): calls 194 s + 7 s on lab160 (reused host, single worker, other helpers'
    # lab runs beside it); the session fixture's baseline deploy is not counted (reused).
    "tests/integration/test_releases.py": 205,
    # make lab-tests: the lab server's processes on the controller, and labctl's own two hosts.
    "tests/integration/lab_server/test_lab_server.py": 120,
    "tests/integration/lab_server/test_parse_cache.py": 35,
    "tests/integration/labctl/test_labctl.py": 10,
}


LAB_TESTS = "tests/integration/"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Where a test lives says whether it is a lab test: every test under tests/integration is marked `lab`
    # (so `-m lab` still picks them), and a test marked `lab` anywhere else is refused.
    misplaced = []
    for item in items:
        if item.nodeid.startswith(LAB_TESTS):
            item.add_marker(pytest.mark.lab)
        elif item.get_closest_marker("lab"):
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            f"marked lab outside {LAB_TESTS} (lab tests live there, tests/README.md): " + ", ".join(misplaced)
        )

    def cost(item) -> int:
        return -LAB_FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0)

    # Stable: the order inside a file, and of the files not listed, stays as collected.
    items.sort(key=cost)
