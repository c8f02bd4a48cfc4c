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
    "tests/integration/test_fleet_rollout.py": 1500,
    "tests/integration/test_gitops.py": 1085,
    "tests/integration/test_fleet_canary.py": 975,
    "tests/integration/gpu_roles/test_sample_inventory.py": 660,
    "tests/integration/test_sweep.py": 355,
    "tests/integration/test_ddtree.py": 305,
    "tests/integration/lab_server/test_lab_server.py": 295,
    "tests/integration/gpu_roles/test_gpu_roles.py": 245,
    "tests/integration/test_releases.py": 245,
    "tests/integration/test_role_convergence.py": 200,
    "tests/integration/test_rollback_and_check.py": 200,
    "tests/integration/test_foreign_dropins.py": 200,
    "tests/integration/test_bad_inputs.py": 190,
    "tests/integration/weights/test_weights_lab.py": 185,
    "tests/integration/test_host_lock.py": 150,
    "tests/integration/test_known_good_integrity.py": 115,
    "tests/integration/lab_server/test_parse_cache.py": 80,
    "tests/integration/test_interrupted_heal.py": 80,
    "tests/integration/test_watch.py": 60,
    "tests/integration/test_nccl_environment.py": 40,
    "tests/integration/test_deploy_report.py": 30,
    "tests/integration/lab_server/test_drain_endpoints.py": 25,
    "tests/integration/labctl/test_labctl.py": 15,
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
