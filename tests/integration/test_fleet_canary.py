"""The canary of a rolling deploy behind the SGLang router (issue 39 items 1 and 4): bake, verdict, rollback,
hold and resume, on two lab GPU hosts and a router host (tests/integration/fleetlab.py).

The module fixture brings up lab$FLEET_CANARY_LAB_INDEX (default 200) and the next index as GPU hosts and the
one after as the router host, and deploys window 2048 on both at once (no canary: nothing left on the old
configuration). One router: the verdict reads every worker's metrics through the first router, and what
several routers add (every one checked, left and rejoined) is test_fleet_rollout.py's, with two. Bake
seconds, not minutes: sglang_canary_delay 1, sglang_canary_bake 6, min requests 20.
In file order:
  1. a canary whose configuration makes the lab server slower and erroring (SGLANG_LAB_SLOW,
     SGLANG_LAB_ERROR_RATE) under lab/loadgen through the router: verdict Failed, the canary rolled back to
     the configuration from before it (proved again, recorded rolled_back) and back in the router with it,
     the run fails, the other host untouched; the verdict, its figures and thresholds in the history and
     the report;
  2. a canary with too little traffic (no load): Inconclusive, the run holds (its marker on the canary); the
     next run without the operator's word is refused with nothing changed and says how to resume;
     `-e canary=promote` rolls the rest on without a new bake;
  3. held again, `-e canary=abort`: the canary rolled back, the marker gone, the other host untouched.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest
from fleetlab import REPO, Fleet, fleet_up, stop_load, why

INDEX = int(os.environ.get("FLEET_CANARY_LAB_INDEX", "200"))
GPU = [f"lab{INDEX}", f"lab{INDEX + 1}"]
CANARY, OTHER = GPU
INVENTORY = REPO / "inventory" / "lab" / f"fleet-{INDEX}.yml"
FILES = "sha256sum /etc/systemd/system/sglang.service /etc/sglang/sglang.env /etc/sglang/sglang.yaml"
HOLD = "/var/lib/sglang-deploy/canary-hold.json"
BAKE = {"sglang_canary_delay": 1, "sglang_canary_bake": 6, "sglang_canary_min_requests": 20}
FAULTY = {"SGLANG_LAB_SLOW": "3", "SGLANG_LAB_ERROR_RATE": "0.2"}
# The tests' runs: deploy.yml's play that rolls the GPU hosts and judges the canary (its router play, run by
# the fixture's deploy, is test_fleet_rollout.py's).
SGLANG = "playbooks/sglang.yml"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    with fleet_up(INDEX, 1, INVENTORY):
        lab = Fleet("client-" + secrets.token_hex(16), INVENTORY)
        lab.reports = tmp_path_factory.mktemp("reports")
        deploy = lab.playbook("-e", "window=2048", extra={"sglang_rollout_batch": "100%"})
        assert deploy.returncode == 0, why(deploy)
        yield lab


def state(fleet: Fleet, host: str) -> dict:
    return {
        "invocation": fleet.invocation(host),
        "files": fleet.ssh(host, FILES),
        "window": fleet.server_info(host)["speculative_draft_window_size"],
    }


def history(fleet: Fleet, host: str) -> list[dict]:
    return [
        json.loads(line) for line in fleet.ssh(host, "cat /var/lib/sglang-deploy/history.jsonl").splitlines()
    ]


def held(fleet: Fleet, host: str) -> bool:
    return fleet.ssh(host, f"test -e {HOLD} && echo held || true").strip() == "held"


def test_a_slow_erroring_canary_fails_its_verdict_and_is_rolled_back_the_other_host_untouched(
    fleet, tmp_path
):
    before = {h: state(fleet, h) for h in GPU}
    load_out = tmp_path / "load.json"
    load = fleet.start_load(load_out, clients=3)
    extra = {**BAKE, "sglang_environment": FAULTY, "deploy_report_dir": str(tmp_path / "report")}
    r = fleet.playbook("-e", "window=2048", extra=extra, playbook=SGLANG)
    result = stop_load(load)[fleet.router]
    print(f"load: {result['requests']} requests, {result['non_2xx']} non-2xx (smg retries a 500 elsewhere)")
    assert r.returncode != 0
    assert f"Canary {CANARY} FAILED its verdict and was rolled back" in r.stdout, why(r)
    after = {h: state(fleet, h) for h in GPU}
    assert after[OTHER] == before[OTHER]  # never restarted, files as they were
    # the canary ran the faulty configuration, then was rolled back to the one from before it: a new
    # invocation of the old files, proved, back in the router with its label
    assert after[CANARY]["invocation"] != before[CANARY]["invocation"]
    assert after[CANARY]["files"] == before[CANARY]["files"]
    assert "SGLANG_LAB_ERROR_RATE" not in fleet.ssh(CANARY, "cat /etc/sglang/sglang.env")
    assert fleet.listed(CANARY) == [("ready", after[CANARY]["invocation"])]
    records = history(fleet, CANARY)
    verdict, rollback = records[-2], records[-1]
    assert verdict["result"] == "canary_failed" and verdict["verdict"] == "Failed"
    failed = {c["metric"] for c in verdict["checks"] if c["result"] == "failed"}
    assert {"error_ratio", "ttft_seconds", "itl_seconds"} <= failed, verdict["reason"]
    assert verdict["limits"]["ttft_seconds"] == 1.2 and verdict["min_requests"] == 20
    assert verdict["requests"]["canary"] >= 20 and verdict["requests"]["baseline"] >= 20
    assert rollback["result"] == "rolled_back" and rollback["invocation_id"] == after[CANARY]["invocation"]
    assert "canary verdict Failed" in rollback["failure"]
    report = json.loads((tmp_path / "report" / "canary.json").read_text())
    assert report["verdict"] == "Failed" and report["canary_hosts"] == [CANARY]
    assert report["baseline_hosts"] == [OTHER] and report["checks"] == verdict["checks"]
    print(f"verdict cost: {report['seconds']['verdict']} s (bake {report['seconds']['bake']} s)")
    assert not held(fleet, CANARY)


def test_too_little_traffic_holds_and_promote_rolls_on(fleet, tmp_path):
    before = {h: state(fleet, h) for h in GPU}
    extra = {**BAKE, "deploy_report_dir": str(tmp_path / "report")}
    r = fleet.playbook("-e", "window=4096", extra=extra, playbook=SGLANG)
    assert r.returncode != 0
    assert f"Canary {CANARY} is HOLDING: verdict Inconclusive" in r.stdout, why(r)
    assert held(fleet, CANARY) and not held(fleet, OTHER)
    assert state(fleet, CANARY)["window"] == 4096 and state(fleet, OTHER) == before[OTHER]
    assert history(fleet, CANARY)[-1]["verdict"] == "Inconclusive"
    holding = state(fleet, CANARY)

    # without the operator's word: refused before anything changes, saying how to resume
    r = fleet.playbook("-e", "window=4096", extra=extra, playbook=SGLANG)
    assert r.returncode != 0
    assert "The rollout is HOLDING after an Inconclusive canary verdict on " + CANARY in " ".join(
        r.stdout.split()
    )
    assert "-e canary=promote" in r.stdout and "-e canary=abort" in r.stdout
    assert state(fleet, CANARY) == holding and state(fleet, OTHER) == before[OTHER]

    r = fleet.playbook("-e", "window=4096", "-e", "canary=promote", extra=extra, playbook=SGLANG)
    assert r.returncode == 0, why(r)
    assert "Bake the canary in the router's rotation" not in r.stdout.replace("skipping", "")
    assert state(fleet, CANARY) == holding  # promoted as it ran
    other = state(fleet, OTHER)
    assert other["window"] == 4096 and other["invocation"] != before[OTHER]["invocation"]
    assert not held(fleet, CANARY)


def test_a_held_canary_aborted_is_rolled_back_and_the_rest_untouched(fleet, tmp_path):
    before = {h: state(fleet, h) for h in GPU}
    extra = {**BAKE, "deploy_report_dir": str(tmp_path / "report")}
    r = fleet.playbook("-e", "window=8192", extra=extra, playbook=SGLANG)
    assert r.returncode != 0 and held(fleet, CANARY), why(r)
    r = fleet.playbook("-e", "window=8192", "-e", "canary=abort", extra=extra, playbook=SGLANG)
    assert r.returncode == 0, why(r)
    after = {h: state(fleet, h) for h in GPU}
    assert after[OTHER] == before[OTHER]
    assert after[CANARY]["window"] == 4096 and after[CANARY]["files"] == before[CANARY]["files"]
    assert fleet.listed(CANARY) == [("ready", after[CANARY]["invocation"])]
    assert history(fleet, CANARY)[-1]["result"] == "rolled_back"
    assert not held(fleet, CANARY)
