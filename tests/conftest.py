"""Suite-wide: the order in which pytest-xdist hands out the lab test files (`make lab-tests`).

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
    "tests/integration/test_sweep.py": 265,
    "tests/integration/test_router_role.py": 255,
    "tests/integration/test_gitops.py": 210,
    "tests/integration/test_host_lock.py": 180,
    "tests/gpu_roles/test_sample_inventory.py": 180,
    # 2 tests, 166 s measured on lab220 (calls; each ends with a baseline restore).
    "tests/integration/test_known_good_integrity.py": 170,
    "tests/integration/test_role_convergence.py": 130,
    "tests/integration/test_rollback_and_check.py": 105,
    "tests/weights/test_weights_lab.py": 100,
    "tests/gpu_roles/test_gpu_roles.py": 75,
    "tests/integration/test_bad_inputs.py": 65,
    "tests/integration/test_ddtree.py": 60,
    "tests/integration/test_nccl_environment.py": 45,
    # 3 tests, 81 s measured on a reused host (baseline deploy of the fixture included).
    "tests/integration/test_foreign_dropins.py": 85,
    # 2 tests, each a deploy killed in its slow verified restart (SGLANG_LAB_LOAD_SECONDS=40), then the next
    # deploy, or the replayed boot and a deploy: calls 115 s and 183 s (the latter beside `make unit`) on
    # lab230, plus the fixture's baseline deploy (99 s) when the file is the worker's first.
    "tests/integration/test_interrupted_heal.py": 220,
    # make lab-tests: the lab server's processes on the controller, and labctl's own two hosts.
    "tests/lab_server/test_lab_server.py": 120,
    "tests/lab_server/test_parse_cache.py": 35,
    "tests/lab/test_labctl.py": 10,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    def cost(item) -> int:
        return -LAB_FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0)

    # Stable: the order inside a file, and of the files not listed, stays as collected.
    items.sort(key=cost)
