"""playbooks/sweep.yml on one lab host: a 1x2 sweep (draft window x draft tokens, what SGLang 0.5.23
accepts for DFLASH; one window off the baseline's, two draft-token counts to compare), a baseline, a
point forced to crash, a point the build cannot honour (top-k 2: 0.5.23 forces top-k 1 for DFLASH;
rejected up front, never deployed), a real interruption (the
ansible-playbook process group is SIGKILLed after the first matrix point) and a resumed run, the original
configuration back at the end, and the report (table, CSV, plots) checked against its JSON and the
recorded points. The seed's DDTree sweep (the playbook's example) is planned controller-only in
tests/unit/plugins/test_sglang_settings_check_points.py; a DDTree point runs on the lab DDTree build in
tests/integration/test_ddtree.py.

Host: the shared, deployed lab host of tests/integration/conftest.py (fixture lab_inventory: one per
pytest-xdist worker, or LAB_REUSE_INVENTORY=<inventory/lab/...yml>); the sweep restores its configuration.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from labtools import ansible_env, ssh_argv

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
WINDOWS, DRAFT_TOKENS = [1024], [8, 16]
FAST_VERIFY = {"sglang_stable_seconds": 2, "sglang_health_count": 1}
BENCH = {"num_prompts": 8, "input_len": 64, "output_len": 32, "max_concurrency": 4, "warmup_requests": 1}
CRASH = {
    "name": "crash",
    "settings": {
        "sglang_speculative_draft_window_size": 3072,
        "sglang_environment": {"SGLANG_LAB_CRASH_AFTER": "1"},
    },
}
# SGLang 0.5.23 (profile upstream) forces top-k 1 with DFLASH: rejected before the host is touched.
REJECTED = {"name": "topk-2", "settings": {"sglang_speculative_topk": 2}}


class Host:
    def __init__(self, inventory: Path):
        self.inventory = inventory
        hosts = yaml.safe_load(inventory.read_text())["all"]["children"]["gpu_nodes"]["hosts"]
        self.name = sorted(hosts)[0]
        self.vars = hosts[self.name]

    def ssh(self, command: str) -> str:
        return subprocess.run(
            ssh_argv(self.vars, command), capture_output=True, text=True, timeout=60, check=True
        ).stdout

    def argv(self, playbook: str, extra: dict) -> list[str]:
        return [
            str(PLAYBOOK),
            "-i",
            str(self.inventory),
            "--limit",
            f"{self.name},localhost",
            playbook,
            "-e",
            json.dumps(extra),
        ]

    def invocation(self) -> str:
        return self.ssh("systemctl show -p InvocationID --value sglang.service").strip()


@pytest.fixture(scope="module")
def host(lab_inventory):
    """The shared, deployed lab host of tests/integration/conftest.py (one per pytest-xdist worker): at the
    baseline already (every test that changes it restores it), so the sweep starts from there."""
    return Host(lab_inventory)


@pytest.fixture(scope="module")
def sweep(host, tmp_path_factory):
    """Run 1 killed after the first matrix point, run 2 to the end. -> everything the tests look at."""
    state = tmp_path_factory.mktemp("sweep") / "state"
    extra = {
        "sweep_name": "lab-test",
        "sweep_state_dir": str(state),
        "sweep_bench": BENCH,
        "sweep_points": [CRASH, REJECTED],
        "sweep_axes": [
            {
                "name": "window",
                "variable": "sglang_speculative_draft_window_size",
                "arg": "speculative_draft_window_size",
                "values": WINDOWS,
            },
            {
                "name": "draft_tokens",
                "variable": "sglang_speculative_num_draft_tokens",
                "arg": "speculative_num_draft_tokens",
                "values": DRAFT_TOKENS,
            },
        ],
        **FAST_VERIFY,
    }
    points = state / "hosts" / host.name / "points"
    before = host.invocation()
    start = time.monotonic()
    run1 = subprocess.Popen(
        host.argv("playbooks/sweep.yml", extra),
        cwd=REPO,
        env=ansible_env(),
        stdin=subprocess.DEVNULL,  # ansible-playbook refuses a non-blocking stdin it inherited
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        while time.monotonic() - start < 300 and run1.poll() is None:
            if list(points.glob("window=*.json")):
                break
            time.sleep(0.2)
        assert run1.poll() is None, (
            f"run 1 ended before it could be interrupted:\n{run1.stdout.read()[-4000:]}"
        )
        assert list(points.glob("window=*.json")), "run 1 recorded no matrix point within 300 s"
        os.killpg(run1.pid, signal.SIGKILL)  # a real interruption: no always:, no restore
    finally:
        if run1.poll() is None:
            os.killpg(run1.pid, signal.SIGKILL)
        log1 = run1.communicate(timeout=60)[0]
    after_kill = {p.name: p.read_bytes() for p in points.glob("*.json")}
    host_state_after_kill = json.loads((state / "hosts" / host.name / "sweep.json").read_text())
    run2 = subprocess.run(
        host.argv("playbooks/sweep.yml", extra),
        cwd=REPO,
        env=ansible_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run2.returncode == 0, f"run 2 failed:\n{run2.stdout[-8000:]}\n{run2.stderr[-2000:]}"
    records = {
        json.loads(p.read_text())["point"]["name"]: json.loads(p.read_text()) for p in points.glob("*.json")
    }
    return {
        "state": state,
        "log1": log1,
        "log2": " ".join(run2.stdout.split()),
        "after_kill": after_kill,
        "before": before,
        "host_state_after_kill": host_state_after_kill,
        "records": records,
        "points_dir": points,
        "host_state": json.loads((state / "hosts" / host.name / "sweep.json").read_text()),
        "now": host.invocation(),
        "elapsed": time.monotonic() - start,
        "report": state / "report",
    }


def matrix_names() -> list[str]:
    return [f"window={w},draft_tokens={d}" for w in WINDOWS for d in DRAFT_TOKENS]


def test_matrix_points_verified_with_distinct_invocations(sweep):
    records = sweep["records"]
    assert set(records) == {"baseline", "crash", "topk-2", *matrix_names()}
    ids = []
    for name in matrix_names():
        r = records[name]
        assert r["result"] == "verified", f"{name}: {r.get('reason')}"
        assert r["lab_run"] is True
        window, draft = (int(v.split("=")[1]) for v in name.split(","))
        # The server (this invocation) reports the point's values; the role recorded that invocation.
        assert r["running_args"]["speculative_draft_window_size"] == window
        assert r["running_args"]["speculative_num_draft_tokens"] == draft
        assert r["deployed_invocation_id"] == r["invocation_id"]
        assert re.fullmatch(r"[0-9a-f]{32}", r["invocation_id"])
        assert r["metrics"]["completed"] == BENCH["num_prompts"]
        assert r["metrics"]["output_throughput"] > 0 and r["metrics"]["request_throughput"] > 0
        for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"):
            assert r["metrics"][key] > 0, key
        assert r["workload"]["max_concurrency"] == BENCH["max_concurrency"]
        assert r["workload"]["request_rate"] == "inf" and r["workload"]["seed"] == 1
        assert "sglang.bench_serving" in r["bench_argv"]
        ids.append(r["invocation_id"])
    assert len(set(ids)) == len(matrix_names())
    assert records["baseline"]["invocation_id"] not in ids
    # The lab server's acceptance model: more draft tokens, longer accepted runs (same window).
    for w in WINDOWS:
        short, long_ = (
            records[f"window={w},draft_tokens={d}"]["avg_spec_accept_length"] for d in DRAFT_TOKENS
        )
        assert long_ > short > 1.0


def test_crashing_point_is_recorded_as_failed_and_the_sweep_went_on(sweep):
    crash = sweep["records"]["crash"]
    assert crash["result"] == "failed"
    assert "SGLANG_LAB_CRASH_AFTER" in json.dumps(crash["point"]["settings"])
    assert "died" in crash["reason"] and "ROLLED BACK" in crash["reason"], crash["reason"]
    assert "invocation_id" not in crash and "metrics" not in crash
    assert "crash on" in sweep["log2"] and "recorded as failed; the sweep goes on" in sweep["log2"]


def test_point_the_build_cannot_honour_is_rejected_up_front(host, sweep):
    rejected = sweep["records"]["topk-2"]
    assert rejected["result"] == "rejected"
    assert rejected["reason"].startswith("sglang_speculative_topk=2: sglang_build_profile upstream ")
    assert "forces speculative_eagle_topk to 1 with speculative_algorithm DFLASH" in rejected["reason"]
    assert "invocation_id" not in rejected and "metrics" not in rejected and rejected["started"] is None
    # Written by run 1 before its first point, kept as it was by run 2 (same reason: not rewritten).
    name = next(n for n in sweep["after_kill"] if n.startswith("topk-2-"))
    assert json.loads(sweep["after_kill"][name])["result"] == "rejected"
    assert re.search(
        r"1 rejected by the build \(sglang_build_profile upstream\) - it cannot honour them, "
        r"they are never run: topk-2; why: sglang_speculative_topk=2",
        sweep["log2"],
    )
    assert "point topk-2 on " not in sweep["log2"]  # never deployed, never failed
    # The host never ran it: no deploy in its history asked for top-k 2.
    history = [json.loads(line) for line in host.ssh("cat /var/lib/sglang-deploy/history.jsonl").splitlines()]
    assert history and all(
        str((h.get("args") or {}).get("speculative_eagle_topk")) != "2" for h in history
    ), "a deploy with top-k 2 reached the host"


def test_interrupted_sweep_resumes_without_redoing_points(sweep):
    kept = sweep["after_kill"]
    assert any(name.startswith("baseline-") for name in kept)
    first = [name for name in kept if name.startswith("window=")]
    assert len(first) == 1 and first[0].startswith("window=1024,draft_tokens=8-")
    assert sweep["host_state_after_kill"]["status"] == "running"
    for name, data in kept.items():  # byte-identical: run 2 did not measure them again
        assert (sweep["points_dir"] / name).read_bytes() == data, name
    run1 = json.loads(kept[first[0]])["run_id"]
    later = {
        r["run_id"]
        for n, r in sweep["records"].items()
        if n not in ("baseline", "window=1024,draft_tokens=8", "topk-2")
    }
    assert later and run1 not in later
    assert re.search(r"2 recorded by earlier runs \(baseline, window=1024,draft_tokens=8\)", sweep["log2"])
    assert "PLAY RECAP" not in sweep["log1"]  # killed, not ended


def test_original_configuration_is_back_and_verified(sweep):
    final, base = sweep["host_state"], sweep["records"]["baseline"]
    assert final["status"] == "restored" and final["lab_run"] is True
    assert final["running_args"] == base["running_args"]
    assert final["running_args"]["speculative_draft_window_size"] == 2048
    assert "speculative_num_draft_tokens" not in final["running_args"]  # not set: taken from the drafter
    assert base["resolved_args"]["speculative_num_draft_tokens"] == 16
    assert final["invocation_id"] == sweep["now"]
    assert final["invocation_id"] != sweep["before"]
    assert final["invocation_id"] not in {r.get("invocation_id") for r in sweep["records"].values()}


def test_report_matches_the_json(host, sweep):
    report = sweep["report"]
    data = json.loads((report / "sweep.json").read_text())
    assert data["lab_run"] is True and "LAB RUN" in data["note"]
    rows = {r["point"]: r for r in data["rows"]}
    assert set(rows) == set(sweep["records"])
    for name, record in sweep["records"].items():
        assert rows[name]["result"] == record["result"]
        assert rows[name].get("invocation_id") == record.get("invocation_id")
        if record["result"] == "verified":
            assert rows[name]["metrics"]["output_throughput"] == record["metrics"]["output_throughput"]
    (summary,) = data["summary"]
    assert summary["verified"] == 1 + len(matrix_names()) and summary["failed"] == 1
    assert summary["pending"] == 0 and summary["rejected"] == 1
    best = max(
        (r for r in data["rows"] if r["result"] == "verified"),
        key=lambda r: r["metrics"]["output_throughput"],
    )
    assert summary["best"]["point"] == best["point"]
    base = rows["baseline"]["metrics"]["output_throughput"]
    assert summary["lead_percent"] == round(100 * (best["metrics"]["output_throughput"] / base - 1), 2)

    md = (report / "sweep.md").read_text()
    assert md.startswith("# Sweep report - LAB RUN")
    table = [line for line in md.splitlines() if line.startswith("| ") and not line.startswith("| host")]
    assert len(table) == len(data["rows"])
    cols = [
        c.strip()
        for c in md.splitlines()[[i for i, ln in enumerate(md.splitlines()) if ln.startswith("| host")][0]]
        .strip("|")
        .split("|")
    ]
    for line in table:
        cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
        row = rows[cells["point"].strip("*")]
        assert cells["result"] == row["result"]
        if row["result"] == "verified":
            assert cells["invocation"] == row["invocation_id"]
            assert cells["output tok/s"] == f"{row['metrics']['output_throughput']:.2f}"
            assert cells["ITL p99 ms"] == f"{row['metrics']['p99_itl_ms']:.2f}"
            assert cells["TTFT p50 ms"] == f"{row['metrics']['median_ttft_ms']:.2f}"
            assert (
                int(cells["window"])
                == (row["running_args"] | row["resolved_args"])["speculative_draft_window_size"]
            )
    with open(report / "sweep.csv", newline="") as handle:
        csv_rows = {r["point"]: r for r in csv.DictReader(handle)}
    assert set(csv_rows) == set(rows)
    assert all(r["lab_run"] == "True" for r in csv_rows.values())
    assert float(csv_rows[best["point"]]["output_throughput"]) == best["metrics"]["output_throughput"]

    assert "## Rejected points" in md and f"- {host.name} topk-2: sglang_speculative_topk=2" in md
    assert rows["topk-2"]["result"] == "rejected" and csv_rows["topk-2"]["result"] == "rejected"
    verified = [r for r in data["rows"] if r["result"] == "verified"]
    # No budget axis: only the two bar plots (the budget line plots: tests/unit/tools/test_sweep_report.py).
    assert [p["file"] for p in data["plots"]] == ["output_throughput.png", "latency.png"]
    for plot in data["plots"]:
        png = (report / plot["file"]).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert "LAB RUN" in plot["title"]
        for metric, series in plot["series"].items():
            assert [(p, v) for _, p, v in series] == [(r["point"], r["metrics"][metric]) for r in verified]
        assert f"]({plot['file']})" in md
