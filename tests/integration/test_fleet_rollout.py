"""A fleet behind the SGLang router (issue 17): two lab GPU hosts and a router host, a rolling deploy.

The module fixture brings up lab$FLEET_LAB_INDEX and the next index as GPU hosts (gpu_nodes) and the two
after as router hosts (group routers), with the SGLang layer and the fleet network that `labctl up
--routers 2` gives the hosts of one inventory (the routers reach the workers at 10.214.0.K). The checks go
over ROUTERS, and the load of a test runs through each of them (one lab/loadgen per router). On the fresh
hosts it first runs `playbooks/router.yml --check --diff` (nothing may be installed or started), then
`deploy.yml -e window=2048` once: SGLang on both GPU hosts, then smg on the router hosts in front of them.
The inventory is inventory/lab/fleet-<index>.yml (gitignored; inventory/lab/group_vars apply). The router's
admin key is the one labctl made (.lab/router_admin_key, which the inventory it writes reads: the deploy runs
as the README says); its client key (sglang_router_worker_api_key) is random per run and goes in as
`-e @file` only. In file order:
  - the router role on its own host (formerly test_router_role.py on a host of its own): check mode on the
    fresh host, the deploy order, /readiness and /workers, the listener in the unit's cgroup, no key in any
    cmdline / the unit / the output, 401 without the keys;
  1. window 2048 -> 4096 rolls through both hosts while lab/loadgen streams through each router: no
     non-2xx, no truncated stream, at least one ready worker in every sample of the router's list, no
     generation request reaching a host between two samples that show it out of the router, both hosts
     on new invocations serving the new window and listed with their new invocation as label;
  2. a configuration that crashes after start: the canary (first host) is rolled back and rejoins the
     router with its old configuration, the run fails and stops, the second host is untouched, the
     router never has zero ready workers;
  3. the same deploy again is changed=0 on all three hosts: no invocation changes, the router's list
     neither;
  4. a request longer than sglang_drain_timeout under sglang_drain_policy=fail: the worker is back in the
     router with its running invocation (the router re-added it; the role then fails the host), the
     run fails, the host's files, pending marker and invocation are as they were (the refusal comes before
     anything is written), the request completes;
  5. the same under force: restarted anyway, the request in flight reported (SGLang's SIGTERM drain, as
     the lab server's, still finishes it: observed and asserted);
  6. a write refused after the worker left (systemd-analyze refuses the unit): rejoined with its running
     invocation, nothing written or restarted, the run fails naming the refusal;
  7. the capacity guard refuses when the other worker is unhealthy (its server stopped), host untouched;
     two leaves at once (two controllers, or a batch of 2) with room for one: one leaves, the guard refuses
     the other; a rollout batch of 2 with room for one puts the host that left back and fails, both hosts
     as they were;
  8. the second host renamed in the inventory (same address): its change rolls as remove-then-add of the
     same URL, the router's list never empty, the router itself untouched;
  9. a router down before the rollout (its service stopped) stops it at the first host with nothing
     changed: no host left the other router, no file written, no restart;
 10. a changed router setting restarts the router with proof (last: a restarted router forgets labels).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time

import pytest
from fleetlab import (
    REPO,
    ROUTER_UNIT,
    Fleet,
    fleet_up,
    load_failures,
    long_result,
    recap,
    rolling_play,
    stop_load,
    why,
)

INDEX = int(os.environ.get("FLEET_LAB_INDEX", "150"))
GPU = [f"lab{INDEX}", f"lab{INDEX + 1}"]
ROUTERS = [f"lab{INDEX + 2}", f"lab{INDEX + 3}"]
ROUTER = ROUTERS[0]  # the router role's checks run on it
INVENTORY = REPO / "inventory" / "lab" / f"fleet-{INDEX}.yml"
# The same fleet with the second GPU host under another inventory name (test 7; gitignored too).
RENAMED_INVENTORY = REPO / "inventory" / "lab" / f"fleet-{INDEX}-renamed.yml"
RENAMED = f"lab{INDEX + 1}b"
FILES = "sha256sum /etc/systemd/system/sglang.service /etc/sglang/sglang.env /etc/sglang/sglang.yaml"
PENDING = "/var/lib/sglang-deploy/sglang.pending.json"
ROUTER_UNIT_PATH = f"/etc/systemd/system/{ROUTER_UNIT}"
ROUTER_METRICS_PORT = 29000
# One long non-streaming chat completion straight to a worker, from the router host (the controller has
# no address on the fleet network). The lab server generates max_tokens tokens at its synthetic pace:
# 15000 tokens took 25.5 s at window 4096/8192, 30000 50.8 s (measured, ~1.7 ms a token). It must still run
# when the deploy reaches the drain, so it starts as the run reaches the check of every router
# (ROUTERS_CHECKED): the leaves and the drain come a few delegated tasks later. Started before the run, it
# races the run's first play, which takes over a minute on a busy machine: the drain then finds the host idle.
LONG_TOKENS = 36000
ROUTERS_CHECKED = "TASK [sglang : Check that every router answers before the worker leaves any]"


@pytest.fixture(scope="module")
def fleet():
    with fleet_up(INDEX, len(ROUTERS), INVENTORY):
        try:
            lab = Fleet("client-" + secrets.token_hex(16), INVENTORY)
            # Check mode BEFORE the first real router deploy: on the fresh router host it installs and starts
            # nothing.
            lab.fresh = lab.unit()
            lab.check = lab.playbook("--check", "--diff", playbook="playbooks/router.yml")
            lab.after_check = lab.unit()
            lab.after_check_files = lab.ssh(
                ROUTER, "ls -d /opt/sglang-router /etc/sglang-router 2>/dev/null || true"
            )
            # The first deploy has no router to leave yet (the router play comes last): all hosts at once.
            lab.deploy = lab.playbook("-e", "window=2048", extra={"sglang_rollout_batch": "100%"})
            assert lab.deploy.returncode == 0, why(lab.deploy)
            lab.deployed = lab.unit()
            lab.sglang = {h: lab.invocation(h) for h in GPU}
            yield lab
        finally:
            RENAMED_INVENTORY.unlink(missing_ok=True)


def out_of_router_windows(samples: list, url: str) -> list[tuple[float, float]]:
    """(first, last) sample times of each run of consecutive samples that do not list the URL."""
    windows, run = [], []
    for when, _ready, listed in samples:
        if isinstance(listed, list) and url not in listed:
            run.append(when)
        elif run:
            windows.append((run[0], run[-1]))
            run = []
    if run:
        windows.append((run[0], run[-1]))
    return windows


# ---- the router role on its own host (formerly tests/integration/test_router_role.py) ----


def test_check_mode_on_a_fresh_host_installs_and_starts_nothing(fleet):
    r = fleet.check
    assert r.returncode == 0, why(r)
    out = " ".join(r.stdout.split())
    assert "Would install smg==1.13.0 into /opt/sglang-router/venv from wheelhouse (installed: none)" in out
    assert f"Would (re)start {ROUTER_UNIT} and verify it" in out
    assert fleet.fresh["ActiveState"] == fleet.after_check["ActiveState"] == "inactive"
    assert fleet.after_check["InvocationID"] == ""
    assert fleet.after_check_files.strip() == ""


def test_deploy_runs_sglang_then_the_router_and_verifies_it(fleet):
    r = fleet.deploy
    plays = re.findall(r"^PLAY \[(.*?)\]", r.stdout, re.M)
    # (the fleet revert's play, P27, runs no host when nothing failed)
    assert plays[-3:] == [
        "Deploy SGLang and verify the running server",
        "Revert the hosts this run changed, after a failure in a later batch",
        "Deploy the SGLang router and verify it",
    ]
    unit = fleet.deployed
    assert unit["ActiveState"] == "active"
    assert unit["InvocationID"] not in ("", fleet.fresh["InvocationID"])
    out = " ".join(r.stdout.split())
    assert f"sglang-router: ActiveState=active, InvocationID={unit['InvocationID']}" in out
    ready = re.search(r"workers ready: \[([^\]]*)\]", out)
    assert ready, out[-3000:]
    assert sorted(re.findall(r"http://[0-9.]+:\d+", ready.group(1))) == sorted(fleet.url(h) for h in GPU)
    assert re.search(r"TASK \[sglang_router : Install smg from the wheelhouse\] \**\nchanged:", r.stdout)


def test_router_is_ready_and_lists_its_worker_ready(fleet):
    answers = fleet.probe(["GET", "/readiness", None, None], ["GET", "/workers", fleet.admin_key, None])[
        "answers"
    ]
    ready, workers = answers
    assert ready[0] == 200
    assert json.loads(ready[1]) == {"status": "ready", "healthy_workers": 2, "total_workers": 2}
    assert workers[0] == 200
    listed = json.loads(workers[1])["workers"]
    assert sorted((w["url"], w["status"], w["is_healthy"]) for w in listed) == sorted(
        (fleet.url(h), "ready", True) for h in GPU
    )
    assert {w["labels"]["served_model_name"] for w in listed} == {"lab-target"}


def test_the_listener_is_the_units_main_process_in_its_cgroup(fleet):
    unit = fleet.unit()
    listeners = fleet.ssh(ROUTER, "ss -Hltnp 'sport = :30000'")
    assert set(re.findall(r"pid=(\d+)", listeners)) == {unit["MainPID"]}, listeners
    assert unit["ControlGroup"] == f"/system.slice/{ROUTER_UNIT}"
    # systemd's hierarchy: "0::<path>" (cgroup v2) and/or "N:name=systemd:<path>" (hybrid, as in the lab).
    lines = fleet.ssh(ROUTER, f"cat /proc/{unit['MainPID']}/cgroup").split()
    systemd = [line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] in ("", "name=systemd")]
    assert systemd and set(systemd) == {unit["ControlGroup"]}, lines
    metrics = fleet.ssh(ROUTER, f"ss -Hltnp 'sport = :{ROUTER_METRICS_PORT}'")
    assert set(re.findall(r"pid=(\d+)", metrics)) == {unit["MainPID"]}, metrics


def test_no_key_is_in_any_cmdline_the_unit_or_the_output(fleet):
    seen = fleet.probe()
    main_pid = fleet.unit()["MainPID"]
    # The scan saw the router itself (smg names its process), and no process holds a key.
    assert seen["cmdlines"][main_pid].startswith("smg::router"), seen["cmdlines"]
    assert seen["holders"] == []
    unit_text = fleet.ssh(ROUTER, f"cat {ROUTER_UNIT_PATH}")
    assert "ExecStart=" in unit_text and "--worker-urls " + fleet.url(GPU[0]) in unit_text
    files = fleet.ssh(ROUTER, "stat -c '%U %a %n' /etc/sglang-router /etc/sglang-router/*").split("\n")
    assert files[:3] == [
        "root 700 /etc/sglang-router",
        "root 600 /etc/sglang-router/admin_key",
        "root 600 /etc/sglang-router/worker_api_key",
    ]
    for key in fleet.keys.values():
        assert key not in unit_text
        assert all(key not in out for out in fleet.runs)


def test_a_wrong_admin_key_gets_401_and_the_worker_key_is_in_force(fleet):
    admin, client = fleet.admin_key, fleet.client_key
    chat = {"model": "lab-target", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    wrong, missing, right, anonymous, answered = fleet.probe(
        ["GET", "/workers", "not-" + admin, None],
        ["GET", "/workers", None, None],
        ["GET", "/workers", admin, None],
        ["POST", "/v1/chat/completions", None, chat],
        ["POST", "/v1/chat/completions", client, chat],
    )["answers"]
    assert wrong == [401, "Invalid authentication token"]
    assert missing == [401, "Missing or invalid Authorization header"]
    assert right[0] == 200
    # smg's --api-key (the workers' key, from its credential) also guards the router's own API.
    assert anonymous[0] == 401 and json.loads(anonymous[1])["error"]["code"] == "invalid_api_key"
    assert answered[0] == 200 and json.loads(answered[1])["object"] == "chat.completion", answered


# ---- the rolling deploy ----


def test_window_change_rolls_through_both_hosts_under_load_with_zero_failed_requests(fleet, tmp_path):
    before = {h: fleet.invocation(h) for h in GPU}
    router_before = fleet.invocation(ROUTER, "sglang-router.service")
    out = tmp_path / "load.json"
    load = fleet.start_load(out)
    try:
        time.sleep(2)  # the load runs before the first host leaves
        r = fleet.playbook("-e", "window=4096", playbook="playbooks/sglang.yml")
    finally:
        results = stop_load(load)
    assert r.returncode == 0, why(r)
    for router, result in results.items():
        failed = load_failures(result)
        print(
            f"FAILED REQUESTS through {router}: {failed} of {result['requests']} (non-2xx "
            f"{result['non_2xx']}, truncated {result['truncated']}, no answer {result['errors']}); "
            f"samples: {len(result['samples'])}"
        )
        assert failed == 0, (router, result["failures"])
        assert result["requests"] > 50, router
        samples = result["samples"]
        assert len(samples) > 50, router
        assert all(ready is not None and len(ready) >= 1 for _, ready, _ in samples), [
            s for s in samples if not s[1]
        ][:5]
        # Each router saw each host leave and rejoin, one at a time (host by host: never both out).
        assert min(len(listed) for _, _, listed in samples) == 1, router
        for host in GPU:
            windows = out_of_router_windows(samples, fleet.url(host))
            assert len(windows) == 1, (router, host, windows)
    # No chat request reached a host while BOTH routers' samples showed it out (a request routed just before
    # the leave may start within a sample interval).
    for host in GPU:
        out_of_both = [
            (max(a[0], b[0]), min(a[1], b[1]))
            for a in out_of_router_windows(results[ROUTERS[0]]["samples"], fleet.url(host))
            for b in out_of_router_windows(results[ROUTERS[1]]["samples"], fleet.url(host))
        ]
        first, last = out_of_both[0]
        arrivals = fleet.chat_arrivals(host, min(result["started"] for result in results.values()))
        late = [t for t in arrivals if first + 0.3 < t < last]
        print(
            f"{host}: out of both routers {last - first:.1f} s; {len(arrivals)} chat requests, "
            f"{len(late)} then"
        )
        assert last > first and arrivals and not late
        # A new invocation serves the new window, and the router lists it with that invocation as label.
        after = fleet.invocation(host)
        assert after and after != before[host]
        assert fleet.server_info(host)["speculative_draft_window_size"] == 4096
        for router in ROUTERS:
            assert fleet.listed(host, router) == [("ready", after)], router
    assert fleet.invocation(ROUTER, "sglang-router.service") == router_before
    # The first play (both hosts at once) only decided; the rolling play left, restarted and rejoined.
    rolling = rolling_play(r.stdout)
    assert rolling.index(f"{GPU[0]} left {ROUTER}") < rolling.index(f"{GPU[1]} left {ROUTER}")
    assert rolling.index(f"{GPU[0]} left {ROUTER}") < rolling.index("TASK [sglang : Rejoin the router")


def test_crashing_configuration_on_the_canary_rolls_back_rejoins_and_stops_the_rollout(fleet, tmp_path):
    canary, other = GPU
    before = {h: fleet.invocation(h) for h in GPU}
    other_files = fleet.ssh(other, FILES)
    out = tmp_path / "load.json"
    load = fleet.start_load(out)
    try:
        time.sleep(2)
        crash = {"sglang_environment": {"SGLANG_LAB_CRASH_AFTER": "3"}}
        r = fleet.playbook("-e", "window=4096", extra=crash, playbook="playbooks/sglang.yml")
    finally:
        results = stop_load(load)
    text = r.stdout
    assert r.returncode != 0
    assert f"Deploy of sglang.service on {canary} FAILED" in text
    assert "ROLLED BACK to the known-good configuration" in text
    # The rollout stopped at the canary: the other host never reached the rolling play (the first play,
    # all hosts at once, only decided that both must restart and wrote nothing).
    assert f"[{other}]" not in rolling_play(text)
    assert fleet.invocation(other) == before[other]
    assert fleet.ssh(other, FILES) == other_files
    # The canary runs its old configuration (a new, verified invocation) and is back in the router with it.
    now = fleet.invocation(canary)
    assert now != before[canary]
    assert "SGLANG_LAB_CRASH_AFTER" not in fleet.ssh(canary, "cat /etc/sglang/sglang.env")
    assert fleet.server_info(canary)["speculative_draft_window_size"] == 4096
    for router in ROUTERS:
        assert fleet.listed(canary, router) == [("ready", now)], router
    for router, result in results.items():
        assert all(ready is not None and len(ready) >= 1 for _, ready, _ in result["samples"]), router
        failed = load_failures(result)
        print(f"FAILED REQUESTS through {router} during the failed rollout: {failed} of {result['requests']}")
        assert failed == 0, (router, result["failures"])


def test_the_same_deploy_again_touches_nothing_router_included(fleet):
    before = {h: fleet.invocation(h) for h in GPU} | {
        ROUTER: fleet.invocation(ROUTER, "sglang-router.service")
    }
    workers = sorted((w["id"], w["url"]) for w in fleet.workers())
    r = fleet.playbook("-e", "window=4096")
    assert r.returncode == 0, why(r)
    for host, line in recap(r.stdout).items():
        assert "changed=0" in line and "failed=0" in line, (host, line)
    assert f"left {ROUTER}" not in r.stdout and "Rejoin the router(s) and wait until ready" not in r.stdout
    # Both hosts verified in the first play, at once: the rolling play had no host.
    assert "skipping: no hosts matched" in rolling_play(r.stdout)
    after = {h: fleet.invocation(h) for h in GPU} | {
        ROUTER: fleet.invocation(ROUTER, "sglang-router.service")
    }
    assert after == before
    assert sorted((w["id"], w["url"]) for w in fleet.workers()) == workers


def host_state(fleet, host: str) -> dict:
    """What a refused leave must leave exactly as it was: the files, the pending marker, the invocation."""
    return {
        "files": fleet.ssh(host, FILES),
        "pending": fleet.ssh(host, f"ls {PENDING} 2>/dev/null || true"),
        "invocation": fleet.invocation(host),
    }


def rollout_with_a_long_request(fleet, canary: str, extra: dict):
    """playbooks/sglang.yml -e window=8192 on the canary alone, a LONG_TOKENS request straight to it started
    as the run reaches the check of every router: the run's result and the request's process."""
    started = []
    r = fleet.playbook(
        "-e",
        "window=8192",
        "--limit",
        canary,
        extra=extra,
        playbook="playbooks/sglang.yml",
        at=(ROUTERS_CHECKED, lambda: started.append(fleet.start_long_request(canary, LONG_TOKENS))),
    )
    assert started, f"the run never reached {ROUTERS_CHECKED!r}: {why(r)}"
    return r, started[0]


def test_a_request_longer_than_the_drain_timeout_under_policy_fail_leaves_the_host_as_it_was(fleet, tmp_path):
    canary = GPU[0]
    before = host_state(fleet, canary)
    assert before["pending"] == ""
    window = fleet.server_info(canary)["speculative_draft_window_size"]
    assert window != 8192
    out = tmp_path / "load.json"
    load = fleet.start_load(out, clients=2)
    try:
        extra = {"sglang_drain_timeout": 2, "sglang_drain_policy": "fail"}
        r, long = rollout_with_a_long_request(fleet, canary, extra)
        refused_at = time.time()
        answer = long_result(long)
    finally:
        results = stop_load(load)
    assert r.returncode != 0
    text = " ".join(r.stdout.split())
    assert (
        "still had 1 request(s) in flight after drain_timeout=2 s; re-added to the router untouched" in text
    )
    # Refused before anything was written: same files, no pending marker, the same server, back in the
    # router with its running invocation.
    assert host_state(fleet, canary) == before
    assert "Install the systemd unit, the environment file" not in r.stdout
    # The router refused the drain and re-added the worker itself; the role then failed the host (with
    # several routers it also puts the worker back into the ones it had left: not run here).
    assert "TASK [sglang : Fail the host, naming what the router(s) refused]" in r.stdout
    for router in ROUTERS:
        assert fleet.listed(canary, router) == [("ready", before["invocation"])], router
    assert fleet.server_info(canary)["speculative_draft_window_size"] == window
    # The long request was still in flight when the run was refused, and completed.
    assert answer["status"] == 200 and answer["complete"], answer
    assert answer["start"] + answer["seconds"] > refused_at - 5
    for router, result in results.items():
        failed = load_failures(result)
        print(
            f"FAILED REQUESTS through {router} (policy fail): {failed} of {result['requests']} + the long one"
        )
        assert failed == 0, (router, result["failures"])
        assert all(ready for _, ready, _ in result["samples"]), router


def test_a_request_longer_than_the_drain_timeout_under_policy_force_is_reported_and_the_host_restarted(fleet):
    canary = GPU[0]
    before = fleet.invocation(canary)
    # The test before left the host as it was: window 8192 is a change, so the host leaves and drains.
    assert fleet.server_info(canary)["speculative_draft_window_size"] != 8192
    # As long as under fail: the restart's SIGTERM drain then waits for the rest of it.
    extra = {"sglang_drain_timeout": 2, "sglang_drain_policy": "force"}
    r, long = rollout_with_a_long_request(fleet, canary, extra)
    answer = long_result(long)
    assert r.returncode == 0, why(r)
    text = " ".join(r.stdout.split())
    assert "NOT idle after sglang_drain_timeout=2 s: 1 request(s) still in flight" in text
    after = fleet.invocation(canary)
    assert after not in ("", before)
    assert fleet.server_info(canary)["speculative_draft_window_size"] == 8192
    assert fleet.listed(canary) == [("ready", after)]
    # Observed: SGLang's SIGTERM drain (the lab server's, as SGLang's) finished the request before the old
    # process exited, well within TimeoutStopSec; "cut" is what force risks, not what happened here.
    assert answer["status"] == 200 and answer["complete"], answer


def test_a_write_refused_after_the_worker_left_rejoins_it_untouched(fleet):
    """The worker leaves the router before anything is written; when the write is then refused (here
    systemd-analyze refuses the new unit: the host's own systemd-analyze is swapped for one that says no)
    the worker rejoins with the invocation that still runs, nothing is written or restarted, and the run
    fails naming the refusal."""
    canary = GPU[0]
    before = host_state(fleet, canary)
    window = fleet.server_info(canary)["speculative_draft_window_size"]
    assert window != 4096 and before["pending"] == ""
    analyze = "/usr/bin/systemd-analyze"
    fleet.ssh(
        canary,
        f"mv {analyze} {analyze}.lab-real"
        f" && printf '#!/bin/sh\\necho lab: unit refused >&2\\nexit 1\\n' > {analyze}"
        f" && chmod 0755 {analyze}",
    )
    try:
        r = fleet.playbook("-e", "window=4096", "--limit", canary, playbook="playbooks/sglang.yml")
    finally:
        fleet.ssh(canary, f"mv {analyze}.lab-real {analyze}")
    assert r.returncode != 0
    text = " ".join(r.stdout.split())
    assert f"{canary} left {', '.join(ROUTERS)}: drained in" in text
    assert "systemd-analyze verify refused the new sglang.service (nothing was changed on the host)" in text
    assert "lab: unit refused" in text
    assert "Rejoin the router(s) with the running invocation" in r.stdout
    assert host_state(fleet, canary) == before
    for router in ROUTERS:
        assert fleet.listed(canary, router) == [("ready", before["invocation"])], router
    assert fleet.server_info(canary)["speculative_draft_window_size"] == window


def test_the_capacity_guard_refuses_when_the_other_worker_is_unhealthy(fleet):
    canary, other = GPU
    before = host_state(fleet, canary)
    fleet.ssh(other, "systemctl stop sglang.service")
    try:
        # The routers notice within their health checks (interval 5 s, 2 failures in the lab's settings).
        deadline = time.monotonic() + 60
        while any(status == "ready" for router in ROUTERS for status, _ in fleet.listed(other, router)):
            assert time.monotonic() < deadline, fleet.workers()
            time.sleep(0.5)
        r = fleet.playbook("-e", "window=4096", "--limit", canary, playbook="playbooks/sglang.yml")
        assert r.returncode != 0
        text = " ".join(r.stdout.split())
        assert "refusing to take " + fleet.url(canary) + " out of the router: 0 other worker(s) ready" in text
        assert host_state(fleet, canary) == before
        for router in ROUTERS:
            assert fleet.listed(canary, router)[0][0] == "ready", router
    finally:
        fleet.ssh(other, "systemctl start sglang.service")
        deadline = time.monotonic() + 90
        while not all(("ready" in [s for s, _ in fleet.listed(other, router)]) for router in ROUTERS):
            assert time.monotonic() < deadline, fleet.workers()
            time.sleep(0.5)


def test_two_leaves_at_once_leave_one_worker_and_the_guard_refuses_the_other(fleet):
    """Both workers leave the router at the same time (two controllers, or a batch of 2), each the role's
    module on the router host in its own process, with room for one (min_ready_workers=1): exactly one
    leaves, the other is refused by the capacity guard and stays listed. The settle (5 s) keeps the first
    leaving worker listed ready long after its count: a count not guarded against it would see it ready."""
    listed = {h: fleet.listed(h) for h in GPU}
    running = {h: fleet.invocation(h) for h in GPU}
    leave = {"state": "absent", "min_ready_workers": 1, "settle_seconds": 5, "drain_timeout": 30}
    procs = {h: fleet.member(h, **leave) for h in GPU}
    results = {h: fleet.member_result(p) for h, p in procs.items()}
    try:
        left = [h for h in GPU if not results[h].get("failed")]
        refused = [h for h in GPU if results[h].get("failed")]
        assert len(left) == 1 and len(refused) == 1, results
        assert results[left[0]]["status"] == "absent" and results[left[0]]["drained"], results
        assert results[refused[0]]["msg"] == (
            f"capacity guard: refusing to take {fleet.url(refused[0])} out of the router: 0 other worker(s) "
            "ready, fewer than min_ready_workers=1"
        )
        assert fleet.listed(left[0]) == []
        assert fleet.listed(refused[0]) == listed[refused[0]]
    finally:
        # Every worker back with its running invocation, as after a rollout; the one out first.
        for host in sorted(GPU, key=lambda h: bool(results[h].get("failed"))):
            back = fleet.member_result(
                fleet.member(host, state="present", labels={"sglang_invocation": running[host]})
            )
            assert not back.get("failed"), back
    assert {h: fleet.invocation(h) for h in GPU} == running


def test_a_batch_of_two_with_room_for_one_puts_the_leaver_back_and_fails_with_both_as_they_were(fleet):
    """sglang_rollout_batch=2, min_ready_workers=1: the guard lets one host of the batch leave and refuses the
    other; the one that left is put back untouched before the batch fails (any_errors_fatal would otherwise
    stop it out of the router, never restarted): both listed ready with their running invocations, files,
    pending markers and invocations as they were, the run fails naming the refusal."""
    before = {h: host_state(fleet, h) for h in GPU}
    # A window neither host runs (an earlier test may leave them on different ones): both must leave.
    running = {fleet.server_info(h)["speculative_draft_window_size"] for h in GPU}
    window = next(w for w in (4096, 8192, 1024) if w not in running)
    r = fleet.playbook(
        "-e", f"window={window}", extra={"sglang_rollout_batch": 2}, playbook="playbooks/sglang.yml"
    )
    assert r.returncode != 0
    text = " ".join(r.stdout.split())
    assert "0 other worker(s) ready, fewer than min_ready_workers=1" in text, why(r)
    assert "untouched, nothing written or restarted: the leave of lab" in text, why(r)
    assert "in the same batch was refused: capacity guard: refusing to take http" in text
    assert {h: host_state(fleet, h) for h in GPU} == before
    for host in GPU:
        for router in ROUTERS:
            assert fleet.listed(host, router) == [("ready", before[host]["invocation"])], router


def test_a_renamed_host_rolls_as_remove_then_add_and_the_pool_is_never_empty(fleet, tmp_path):
    other = GPU[1]
    text = INVENTORY.read_text()
    # In gpu_nodes and in lab: the same address, user and key under another inventory name.
    assert text.count(f"        {other}:\n") == 2
    RENAMED_INVENTORY.write_text(text.replace(f"        {other}:\n", f"        {RENAMED}:\n"))
    router_before = fleet.invocation(ROUTER, ROUTER_UNIT)
    before = fleet.invocation(other)
    out = tmp_path / "load.json"
    load = fleet.start_load(out, clients=2)
    try:
        time.sleep(1)  # the load runs before the host leaves
        r = fleet.playbook(
            "-e", "window=8192", "--limit", f"{RENAMED},{ROUTER},localhost", inventory=RENAMED_INVENTORY
        )
    finally:
        results = stop_load(load)
    assert r.returncode == 0, why(r)
    assert recap(r.stdout)[ROUTER].split()[1] == "changed=0"
    # The same URL left each router once and came back (new ids), the other worker always ready.
    after = fleet.invocation(other)
    assert after != before
    for router, result in results.items():
        samples = result["samples"]
        windows = out_of_router_windows(samples, fleet.url(other))
        assert len(windows) == 1, (router, windows)
        assert all(ready for _, ready, _ in samples), [s for s in samples if not s[1]][:5]
        assert fleet.listed(other, router) == [("ready", after)], router
        failed = load_failures(result)
        print(f"FAILED REQUESTS through {router} (renamed host): {failed} of {result['requests']}")
        assert failed == 0, (router, result["failures"])
    assert fleet.invocation(ROUTER, ROUTER_UNIT) == router_before


def test_a_router_down_before_the_rollout_stops_it_at_the_first_host_with_nothing_changed(fleet):
    """The second router's service stopped (nothing listens on its port): the canary's check of every router
    fails before it leaves any, the rollout stops there; no host left the first router, nothing was written
    or restarted. Run before the last test: the restarted router lists its workers without their labels."""
    canary, other = GPU
    down = ROUTERS[1]
    before = {h: host_state(fleet, h) for h in GPU}
    listed = {h: fleet.listed(h, ROUTERS[0]) for h in GPU}
    running = {fleet.server_info(h)["speculative_draft_window_size"] for h in GPU}
    window = next(w for w in (4096, 8192, 1024) if w not in running)
    fleet.ssh(down, f"systemctl stop {ROUTER_UNIT}")
    try:
        r = fleet.playbook("-e", f"window={window}", playbook="playbooks/sglang.yml")
    finally:
        fleet.ssh(down, f"systemctl start {ROUTER_UNIT}")
    assert r.returncode != 0
    text = " ".join(r.stdout.split())
    assert f"failed: [{canary} -> {down}(" in r.stdout and f"(item={down})" in r.stdout, why(r)
    assert f"cannot reach router http://127.0.0.1:30000 before {fleet.url(canary)} leaves any router" in text
    assert "Connection refused" in text
    assert "TASK [sglang : Leave the router(s) and drain]" not in r.stdout
    assert f"[{other}]" not in rolling_play(r.stdout)
    assert {h: host_state(fleet, h) for h in GPU} == before
    # Neither host left the first router: listed as before (ready, the same label).
    assert {h: fleet.listed(h, ROUTERS[0]) for h in GPU} == listed
    assert all(status == "ready" for h in GPU for status, _ in listed[h])
    # The stopped router back, both workers ready in it, before the last test (it opens its port after start).
    deadline = time.monotonic() + 60
    while True:
        try:
            if [w["status"] for w in fleet.workers(down)] == ["ready", "ready"]:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"router {down} not back with both workers ready"
        time.sleep(0.5)


# Last: a restarted router lists the workers of its command line again, without the rollout's labels.
def test_a_changed_router_setting_restarts_it_and_verifies_again(fleet):
    before = fleet.unit()
    sglang = {h: fleet.invocation(h) for h in GPU}
    r = fleet.playbook(playbook="playbooks/router.yml", extra={"sglang_router_health_check_interval_secs": 3})
    assert r.returncode == 0, why(r)
    assert int(recap(r.stdout)[ROUTER].split()[1].split("=")[1]) >= 1
    after = fleet.unit()
    assert after["ActiveState"] == "active" and after["InvocationID"] not in ("", before["InvocationID"])
    assert "--health-check-interval-secs 3 " in fleet.ssh(ROUTER, f"grep ^ExecStart= {ROUTER_UNIT_PATH}")
    assert f"sglang-router: ActiveState=active, InvocationID={after['InvocationID']}" in " ".join(
        r.stdout.split()
    )
    assert fleet.probe(["GET", "/readiness", None, None])["answers"][0][0] == 200
    assert {h: fleet.invocation(h) for h in GPU} == sglang


def test_a_failure_on_the_second_batch_reverts_the_first_behind_the_router_with_zero_failed_requests(
    fleet, tmp_path
):
    """sglang_fleet_revert (on by default), batch 1: the first host rolls to a new window and verifies, the
    second host's configuration crashes after start (only its own: the environment is templated per host), it
    is rolled back itself; then the first host is reverted to the configuration it ran before the run -
    drained behind the router, its files byte for byte the ones from before, verified, back in the router
    with its new invocation, recorded reverted_by_run and reported so - while lab/loadgen streams through the
    router with zero failed requests; the run fails naming the host that failed and the host reverted."""
    first, second = GPU
    running = {fleet.server_info(h)["speculative_draft_window_size"] for h in GPU}
    window = next(w for w in (4096, 8192, 1024) if w not in running)
    before = {
        h: host_state(fleet, h) | {"window": fleet.server_info(h)["speculative_draft_window_size"]}
        for h in GPU
    }
    assert all(state["pending"] == "" for state in before.values())
    crashes = "{'SGLANG_LAB_CRASH_AFTER': '3'} if inventory_hostname == '" + second + "' else {}"
    # A report directory of its own: lab files running beside this one write runs under out/deploy too.
    crash = {"sglang_environment": "{{ " + crashes + " }}", "deploy_report_dir": str(tmp_path / "report")}
    out = tmp_path / "load.json"
    load = fleet.start_load(out, clients=2)
    try:
        time.sleep(2)  # the load runs before the first host leaves
        r = fleet.playbook("-e", f"window={window}", extra=crash, playbook="playbooks/sglang.yml")
    finally:
        results = stop_load(load)
    text = " ".join(r.stdout.split())
    assert r.returncode != 0
    assert f"Deploy of sglang.service on {second} FAILED" in text, why(r)
    assert "ROLLED BACK to the known-good configuration" in text
    assert "PLAY [Revert the hosts this run changed, after a failure in a later batch]" in r.stdout, why(r)
    assert (
        f"The rollout FAILED on {second} (" in text
        and f"REVERTED to their configuration from before it, each verified: {first}." in text
    ), why(r)
    # The first host ran the new window in between (its deploy verified), then left the router and drained
    # again, and runs its configuration from before the run: the same files, a new verified invocation.
    rolling = rolling_play(r.stdout).split("PLAY [Revert the hosts this run changed", 1)[0]
    left = f"left {', '.join(ROUTERS)}: drained"
    assert f"{first} {left}" in " ".join(rolling.split()) and f"{second} {left}" in " ".join(rolling.split())
    revert = r.stdout.split("PLAY [Revert the hosts this run changed", 1)[1]
    assert f"{first} {left}" in " ".join(revert.split()) and f"[{second}]" not in revert
    for host in GPU:
        now = host_state(fleet, host)
        assert now["files"] == before[host]["files"] and now["pending"] == "", host
        assert now["invocation"] not in ("", before[host]["invocation"]), host
        assert fleet.server_info(host)["speculative_draft_window_size"] == before[host]["window"], host
        for router in ROUTERS:
            assert fleet.listed(host, router) == [("ready", now["invocation"])], (host, router)
    history = [
        json.loads(line)
        for line in fleet.ssh(first, "tail -n 2 /var/lib/sglang-deploy/history.jsonl").splitlines()
    ]
    assert [h["result"] for h in history] == ["verified", "reverted_by_run"], history
    assert int(history[0]["window"]) == window
    assert int(history[1]["args"]["speculative_draft_window_size"]) == before[first]["window"]
    assert f"{second} failed in a later batch" in history[1]["failure"]
    assert history[1]["invocation_id"] == fleet.invocation(first)
    report = json.loads((tmp_path / "report" / f"{first}.json").read_text())
    assert report["result"] == "reverted_by_run" and report["invocation_id"] == fleet.invocation(first)
    # Behind the routers all along: a ready worker in every sample of each, the first host out of each twice
    # (its deploy, then its revert), no request to it while both showed it out, and no failed request.
    for router, result in results.items():
        samples = result["samples"]
        assert all(ready for _, ready, _ in samples), (router, [s for s in samples if not s[1]][:5])
        assert len(out_of_router_windows(samples, fleet.url(first))) == 2, router
        failed = load_failures(result)
        print(f"FAILED REQUESTS (fleet revert) through {router}: {failed} of {result['requests']}")
        assert failed == 0, (router, result["failures"])
    out_of_both = [
        (max(a[0], b[0]), min(a[1], b[1]))
        for a in out_of_router_windows(results[ROUTERS[0]]["samples"], fleet.url(first))
        for b in out_of_router_windows(results[ROUTERS[1]]["samples"], fleet.url(first))
        if max(a[0], b[0]) < min(a[1], b[1])
    ]
    arrivals = fleet.chat_arrivals(first, min(result["started"] for result in results.values()))
    late = [t for start, end in out_of_both for t in arrivals if start + 0.3 < t < end]
    assert len(out_of_both) == 2 and arrivals and not late, (out_of_both, late)
