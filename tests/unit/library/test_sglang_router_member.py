"""library/sglang_router_member.py driven through its real main() against a router that answers with
the recorded smg 1.13.0 bodies (tests/fixtures/router/) and a worker whose /v1/loads is the lab server's."""

from __future__ import annotations

import copy
import fcntl
import json
import os
import threading
import time
import types

import pytest
from conftest import FIXTURES, call_main, load_module

ROUTER = "http://127.0.0.1:42509"


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / "router" / f"{name}.json").read_text())


TWO = recorded("get_workers_two_ready")["body"]["workers"]
MINE = next(w for w in TWO if w["labels"].get("sglang_invocation") == "a1")
OTHER = next(w for w in TWO if w is not MINE)


class FakeRouter:
    """Serves GET /workers, PATCH and DELETE /workers/{id}, POST /workers and the worker's /v1/loads with the
    recorded bodies; removal shows only after `delete_lag` more GETs (smg removes asynchronously)."""

    def __init__(self, workers, loads=(0,), delete_lag=1, post_status=202):
        self.workers = copy.deepcopy(workers)
        self.loads, self.delete_lag, self.post_status = list(loads), delete_lag, post_status
        self.calls, self.pending_deletes, self.patch_pending = [], {}, 0
        self.mutex = threading.Lock()  # two leaves at once (threads) share one router

    def __call__(self, method, url, key="", body=None, timeout=10.0):
        with self.mutex:
            return self.answer(method, url, body)

    def answer(self, method, url, body):
        path = url.split("://", 1)[1].split("/", 1)[1]
        self.calls.append((method, "/" + path.split("?")[0], body))
        if path.startswith("v1/loads"):
            n = self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]
            return 200, {"loads": [{"dp_rank": 0, "num_running_reqs": n, "num_waiting_reqs": 0}]}
        if method == "GET" and path == "workers":
            for wid in list(self.pending_deletes):
                self.pending_deletes[wid] -= 1
                if self.pending_deletes[wid] < 0:
                    self.workers = [w for w in self.workers if w["id"] != wid]
                    del self.pending_deletes[wid]
            return 200, {"workers": copy.deepcopy(self.workers), "total": len(self.workers)}
        if method == "PATCH":
            self.patch_pending = 1  # one GET /workers/{id} still shows the update job processing
            answer = recorded("patch_worker_settle")
            return answer["status"], answer["body"]
        if method == "GET" and path.startswith("workers/"):
            name = "get_worker_right_after_patch" if self.patch_pending else "get_worker_after_patch"
            self.patch_pending = max(0, self.patch_pending - 1)
            answer = recorded(name)
            return answer["status"], answer["body"]
        if method == "DELETE":
            wid = path.split("/")[1]
            self.pending_deletes[wid] = self.delete_lag
            return recorded("delete_worker_accepted")["status"], dict(
                recorded("delete_worker_accepted")["body"], worker_id=wid
            )
        if method == "POST":
            if self.post_status != 202:
                answer = recorded("post_workers_same_url")
                return answer["status"], answer["body"]
            added = dict(copy.deepcopy(MINE), id="01a23e25-0000-7000-8000-000000000001", url=body["url"])
            added["labels"] = {
                **{k: v for k, v in MINE["labels"].items() if k != "sglang_invocation"},
                **body["labels"],
            }
            self.workers.append(added)
            answer = recorded("post_workers_accepted")
            return answer["status"], dict(answer["body"], worker_id=added["id"], url=body["url"])
        raise AssertionError(f"unexpected call {method} {url}")


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    """The capacity guard's lock directory of every call here (never the machine's /run/sglang-deploy)."""
    directory = tmp_path / "locks"
    monkeypatch.setattr(GUARD, "dir", str(directory))
    return directory


GUARD = types.SimpleNamespace(dir="")


def guard_file(directory) -> str:
    return os.path.join(directory, "router-guard-127.0.0.1_42509.lock")


def run(router: FakeRouter, **args):
    module = load_module("sglang_router_member")
    module.http = router
    module.time = types.SimpleNamespace(monotonic=time.monotonic, sleep=lambda _s: None)  # this module only
    params = {
        "router_url": ROUTER,
        "router_api_key": "router-admin-key",
        "worker_url": MINE["url"],
        "poll_interval": 0,
        "lock_dir": GUARD.dir,
        **args,
    }
    result, _ = call_main(module, params)
    return result


def methods(router):
    return [(m, p) for m, p, _ in router.calls if not p.startswith("/v1/loads")]


def test_absent_removes_confirms_gone_and_drains_by_the_workers_load():
    router = FakeRouter(TWO, loads=(2, 1, 0), delete_lag=2)
    result = run(router, state="absent", drain_timeout=60)
    assert not result.get("failed"), result
    assert result["changed"] and result["drained"] and result["requests_cut"] == 0
    assert result["status"] == "absent" and result["worker_id"] == MINE["id"]
    # its settle shortened to settle_seconds (default 1) for this worker, the update job waited for (the
    # recorded GET shows it processing, then done), then removed
    wid = f"/workers/{MINE['id']}"
    changes = [(m, p, b) for m, p, b in router.calls if p == wid]
    assert changes == [
        ("PATCH", wid, {"health": {"drain_settle_secs": 1}}),
        ("GET", wid, None),
        ("GET", wid, None),
        ("DELETE", wid, None),
    ]
    # gone confirmed by polling (the recorded list still shows it right after the 202), then drained
    assert [w["url"] for w in router.workers] == [OTHER["url"]]
    assert sum(p == "/v1/loads" for _, p, _ in router.calls) == 3
    first_load = next(i for i, c in enumerate(router.calls) if c[1] == "/v1/loads")
    assert all(w["url"] != MINE["url"] for w in router.workers) and first_load > 2


class AnsweringRouter:
    """A router that answers GET /workers with one recorded answer and is asked nothing else."""

    def __init__(self, answer: dict):
        self.answer, self.calls = answer, []

    def __call__(self, method, url, key="", body=None, timeout=10.0):
        self.calls.append((method, url))
        assert (method, url) == ("GET", ROUTER + "/workers"), (method, url)
        return self.answer["status"], copy.deepcopy(self.answer["body"])


# Which routers a leaving worker may go on with (every one of group routers must answer), over smg 1.13.0's
# recorded answers: (answer, reachable, the worker's status there, ready workers, what a refusal names).
REACHABLE = [
    ("get_workers_two_ready", True, "ready", 2, None),
    ("get_workers_one_ready", True, "absent", 1, None),  # the other worker only
    ("get_workers_empty", True, "absent", 0, None),
    ("get_workers_no_key", False, None, None, "answered GET /workers with 401: Missing or invalid"),
    ("readiness_no_workers", False, None, None, "answered GET /workers with 503"),
]


@pytest.mark.parametrize(
    ("name", "reachable", "status", "ready", "refusal"), REACHABLE, ids=[r[0] for r in REACHABLE]
)
def test_query_decides_whether_a_router_answers_over_recorded_answers(
    name, reachable, status, ready, refusal
):
    router = AnsweringRouter(recorded(name))
    result = run(router, state="query")
    assert result["changed"] is False and router.calls == [("GET", ROUTER + "/workers")]
    if reachable:
        assert not result.get("failed"), result
        assert result["status"] == status and result["workers_ready"] == ready and result["answered"]
    else:
        assert result["failed"] and refusal in result["msg"], result
        assert result["msg"].startswith(
            f"cannot reach router {ROUTER} before {MINE['url']} leaves any router"
        )
        assert "Nothing was touched" in result["msg"]
    # A failed canary's rollback (must_answer false): the same answer reported, never a failure.
    lenient = run(AnsweringRouter(recorded(name)), state="query", must_answer=False)
    assert not lenient.get("failed") and lenient["changed"] is False, lenient
    assert lenient["answered"] is reachable and lenient["installed"] is True
    if reachable:
        assert lenient["status"] == status and "problem" not in lenient
    else:
        assert lenient["status"] == "unreachable" and lenient["problem"] == result["msg"]


# Whether a router has a worker to leave, over systemd 252's recorded `systemctl show` (fixtures/systemd/):
# never installed (the fleet's first deploy) - nothing to leave; installed, running or not - it must answer.
INSTALLED = [
    ("unit-show-not-found.txt", False),
    ("healthy/show.txt", True),  # loaded, active
    ("stale-after/show.txt", True),  # loaded, failed: installed and down, the rollout must stop
]


@pytest.mark.parametrize(("name", "installed"), INSTALLED, ids=[r[0] for r in INSTALLED])
def test_query_with_service_leaves_out_only_a_router_never_installed(monkeypatch, name, installed):
    show = (FIXTURES / "systemd" / name).read_text()
    module = load_module("sglang_router_member")
    asked = []

    def systemctl(_self, argv, **_kw):
        asked.append(argv)
        return 0, show, ""

    monkeypatch.setattr(module.AnsibleModule, "run_command", systemctl)
    router = AnsweringRouter({"status": 200, "body": {"workers": TWO}}) if installed else FakeRouter([])
    module.http = router
    params = {
        "router_url": ROUTER,
        "worker_url": MINE["url"],
        "state": "query",
        "service": "sglang-router.service",
    }
    result, _ = call_main(module, params)
    assert asked == [["systemctl", "show", "-p", "LoadState", "--", "sglang-router.service"]]
    assert not result.get("failed") and result["changed"] is False, result
    assert result["installed"] is installed and result["answered"] is installed
    assert router.calls == ([("GET", ROUTER + "/workers")] if installed else [])


def test_query_of_a_router_that_does_not_listen_fails_naming_it():
    """A router host whose service is stopped: nothing listens on its port (a real closed port here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: connection refused
    module = load_module("sglang_router_member")
    params = {"router_url": f"http://127.0.0.1:{port}", "worker_url": MINE["url"], "state": "query"}
    result, _ = call_main(module, params)
    assert result["failed"], result
    assert (
        f"cannot reach router http://127.0.0.1:{port} before {MINE['url']} leaves any router" in result["msg"]
    )
    assert "Connection refused" in result["msg"]


def test_absent_twice_is_unchanged():
    router = FakeRouter(recorded("get_workers_after_delete")["body"]["workers"])
    result = run(router, state="absent")
    assert result["changed"] is False and result["status"] == "absent"
    assert methods(router) == [("GET", "/workers")]


def test_capacity_guard_refuses_and_touches_nothing():
    lonely = FakeRouter([MINE])
    result = run(lonely, state="absent")
    assert result["failed"] and "min_ready_workers=1" in result["msg"]
    assert result["msg"].startswith(f"capacity guard: refusing to take {MINE['url']} out of the router: ")
    assert "0 other worker(s) ready" in result["msg"]
    assert methods(lonely) == [("GET", "/workers")]
    other_down = FakeRouter([MINE, dict(OTHER, status="not_ready", is_healthy=False)])
    assert run(other_down, state="absent")["failed"]
    assert methods(other_down) == [("GET", "/workers")]


def test_drain_timeout_policy_fail_readds_untouched_and_fails():
    router = FakeRouter(TWO, loads=(3,))
    result = run(
        router, state="absent", drain_timeout=0, drain_policy="fail", labels={"sglang_invocation": "a1"}
    )
    assert result["failed"] and "still had 3 request(s) in flight" in result["msg"]
    assert "drain_policy=fail" in result["msg"] and result["drained"] is False
    posts = [b for m, _, b in router.calls if m == "POST"]
    assert posts == [{"url": MINE["url"], "labels": {"sglang_invocation": "a1"}}]
    assert {w["url"]: w["status"] for w in router.workers} == {OTHER["url"]: "ready", MINE["url"]: "ready"}


def test_drain_timeout_policy_force_records_the_requests_cut():
    router = FakeRouter(TWO, loads=(3,))
    result = run(router, state="absent", drain_timeout=0, drain_policy="force")
    assert not result.get("failed") and result["requests_cut"] == 3 and result["drained"] is False
    assert not [m for m, _ in methods(router) if m == "POST"]


def test_present_readds_a_restarted_worker_with_fresh_labels():
    router = FakeRouter(TWO)  # listed ready, but with the old invocation's label
    result = run(router, state="present", labels={"sglang_invocation": "b2"})
    assert not result.get("failed"), result
    assert result["changed"] and result["status"] == "ready" and result["labels"]["sglang_invocation"] == "b2"
    assert [m for m, _ in methods(router) if m != "GET"] == ["PATCH", "DELETE", "POST"]  # remove, then add
    assert result["worker_id"] != MINE["id"]


def test_present_with_its_labels_is_unchanged_and_check_mode_touches_nothing():
    router = FakeRouter(TWO)
    assert run(router, state="present", labels={"sglang_invocation": "a1"})["changed"] is False
    router = FakeRouter(TWO)
    result = run(router, state="absent", _ansible_check_mode=True)
    assert result["changed"] and methods(router) == [("GET", "/workers")]


def test_router_refusal_and_bad_input_name_the_problem():
    router = FakeRouter(recorded("get_workers_empty")["body"]["workers"], post_status=409)
    result = run(router, state="present", labels={"sglang_invocation": "x"})
    assert result["failed"] and "409" in result["msg"] and "WORKER_CREATE_IN_PROGRESS" in result["msg"]
    result = run(FakeRouter(TWO), state="absent", worker_url="gpu-1:30000")
    assert result["failed"] and result["msg"].startswith("worker_url must be")


@pytest.mark.parametrize("name", ["get_workers_no_key"])
def test_unauthorised_router_answer_is_reported(name):
    answer = recorded(name)

    def refuse(method, url, key="", body=None, timeout=10.0):
        return answer["status"], answer["body"]

    module = load_module("sglang_router_member")
    module.http = refuse
    result, _ = call_main(module, {"router_url": ROUTER, "worker_url": MINE["url"], "state": "absent"})
    assert result["failed"] and "401" in result["msg"] and "Missing or invalid Authorization" in result["msg"]


ONE = recorded("get_workers_one_ready")["body"]["workers"]
DRAINING = recorded("get_workers_draining")["body"]["workers"]  # MINE draining, OTHER ready
EMPTY = recorded("get_workers_empty")["body"]["workers"]


@pytest.mark.parametrize(
    ("workers", "leaving", "floor", "listed", "others"),
    [
        (TWO, MINE["url"], 1, True, None),  # one other ready: it may leave
        (TWO, MINE["url"], 2, True, 1),
        (TWO, OTHER["url"], 0, True, None),
        (ONE, OTHER["url"], 1, True, 0),  # the last worker
        (ONE, OTHER["url"], 0, True, None),  # a floor of 0 lets the last one go
        (ONE, MINE["url"], 1, False, None),  # not listed: nothing to leave, nothing refused
        (DRAINING, OTHER["url"], 1, True, 0),  # a draining worker is not ready
        (DRAINING, MINE["url"], 1, True, None),  # the draining one itself: its other is ready
        (EMPTY, MINE["url"], 1, False, None),
    ],
    ids=[
        "two-ready-leaves",
        "two-ready-floor-2-refused",
        "floor-0-leaves",
        "the-last-one-refused",
        "the-last-one-floor-0-leaves",
        "not-listed",
        "other-draining-refused",
        "draining-itself-leaves",
        "empty-list",
    ],
)
def test_the_capacity_decision_counts_only_other_ready_workers(workers, leaving, floor, listed, others):
    module = load_module("sglang_router_member")
    worker, refusal = module.capacity(copy.deepcopy(workers), leaving + "/", floor)
    assert (worker is not None) == listed and (worker is None or worker["url"] == leaving)
    if others is None:
        assert refusal is None
    else:
        assert refusal == (
            f"capacity guard: refusing to take {leaving}/ out of the router: {others} other worker(s) ready, "
            f"fewer than min_ready_workers={floor}"
        )


def flocked(path) -> bool:
    """Whether another open file description holds flock(2) on ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_the_count_and_the_removal_hold_the_routers_guard_and_the_drain_does_not(lock_dir):
    class Watched(FakeRouter):
        def answer(self, method, url, body):
            path = url.split("/", 3)[3]
            held = os.path.exists(guard_file(lock_dir)) and flocked(guard_file(lock_dir))
            self.held = [*getattr(self, "held", []), (method, "/" + path.split("?")[0].split("/")[0], held)]
            return super().answer(method, url, body)

    router = Watched(TWO, loads=(1, 0))
    result = run(router, state="absent")
    assert not result.get("failed") and result["status"] == "absent", result
    router_calls = {held for _, path, held in router.held if path == "/workers"}
    drain_calls = {held for _, path, held in router.held if path == "/v1"}
    assert router_calls == {True} and drain_calls == {False}, router.held
    assert oct(os.stat(guard_file(lock_dir)).st_mode & 0o777) == "0o600"
    assert oct(os.stat(lock_dir).st_mode & 0o777) == "0o700"


def test_a_leave_that_cannot_take_the_guard_is_refused_naming_its_holder(lock_dir):
    lock_dir.mkdir(mode=0o700)
    fd = os.open(guard_file(lock_dir), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        holder = {"worker_url": OTHER["url"], "pid": 4242, "since": "2026-01-02T03:04:05Z"}
        os.write(fd, json.dumps(holder).encode())
        router = FakeRouter(TWO)
        result = run(router, state="absent", timeout=0.2)
    finally:
        os.close(fd)
    assert result["failed"] and router.calls == [], result  # nothing asked, nothing touched
    assert result["msg"] == (
        f"capacity guard: refusing to take {MINE['url']} out of router {ROUTER}: another leave holds its "
        f"guard ({guard_file(lock_dir)}) for more than timeout=0.2 s: the leave of {OTHER['url']} (PID 4242 "
        "on this host, since 2026-01-02T03:04:05Z). Nothing was touched; run again when it has finished"
    )


def test_two_leaves_at_once_leave_one_worker_ready():
    """Two workers, a floor of one: both leaves start together (a batch of 2, or two controllers) and each
    router call takes a while, as over a network; exactly one leaves, the other is refused by the guard."""
    module = load_module("sglang_router_member")

    class Slow(FakeRouter):
        def answer(self, method, url, body):
            time.sleep(0.05)
            return super().answer(method, url, body)

    router = Slow(TWO, delete_lag=0)
    results = {}

    def leave(worker):
        params = {
            "router_url": ROUTER,
            "router_api_key": "",
            "worker_url": worker["url"],
            "worker_api_key": "",
            "state": "absent",
            "labels": {},
            "drain_timeout": 5,
            "drain_policy": "fail",
            "min_ready_workers": 1,
            "timeout": 5,
            "settle_seconds": 1,
            "poll_interval": 0.01,
            "lock_dir": GUARD.dir,
        }
        member = module.Member(params, check_mode=False)
        try:
            member.absent()
            results[worker["url"]] = "left"
        except module.RouterError as err:
            results[worker["url"]] = str(err)

    module.http = router
    threads = [threading.Thread(target=leave, args=(w,)) for w in (MINE, OTHER)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results.values(), key=lambda v: v != "left")[0] == "left", results
    refused = [v for v in results.values() if v != "left"]
    assert len(refused) == 1 and refused[0].startswith("capacity guard: refusing to take "), results
    assert "0 other worker(s) ready, fewer than min_ready_workers=1" in refused[0]
    assert [w["status"] for w in router.workers] == ["ready"]
