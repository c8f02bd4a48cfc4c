"""The operator's own build on a real lab host: DDTree with budget 8, top-k 4, window 2048 (issue 13).

The lab DDTree build (inventory/lab/ddtree.yml: the LAB REPLAY of PR sgl-project/sglang#29907, its own
release, service sglang-k26-ddtree on port 30001) is deployed next to SGLang 0.5.23 on the shared
integration host. Tests run top to bottom on the module fixture's deploy:
  1. `-e @inventory/lab/ddtree.yml -e budget=8 -e topk=4 -e window=2048` verifies, prints where each value
     was read (top-k from the running process's environ), and the history records them;
  2. the same again is `changed=0` with the same InvocationID;
  3. a one-point sweep of that build through playbooks/sweep.yml (budget 16 at top-k 4, window 2048; the
     knobs the same, so the restore keeps that invocation): its row carries the acceptance length its
     deploy's history record holds, above the fixture's budget 8 (docs/sweep.md; the seed's whole sweep is
     `make sweep-ddtree`);
  4. `-e window=4096` restarts and the DFLASH draft runner line of the NEW invocation proves 4096;
  5. bad DDTree inputs fail naming the setting and leave that service exactly as it was.
The fixture stops the DDTree service at the end (the other tests use sglang.service only).
"""

from __future__ import annotations

import csv
import json

import pytest

DDTREE = "@inventory/lab/ddtree.yml"
UNIT = "sglang-k26-ddtree.service"
STATE = (
    "echo unit=$(sha256sum < /etc/systemd/system/sglang-k26-ddtree.service | cut -d' ' -f1); "
    "echo env=$(sha256sum < /etc/sglang/sglang-k26-ddtree.env | cut -d' ' -f1); "
    f"systemctl show -p InvocationID -p MainPID -p ActiveState {UNIT}; "
    "echo history=$(wc -l < /var/lib/sglang-deploy/history.jsonl)"
)


def flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def state(host) -> dict:
    return dict(line.split("=", 1) for line in host.ssh(STATE).stdout.splitlines() if "=" in line)


def deploy(host, *knobs, extra=None):
    """deploy.yml with the DDTree vars file, then the knobs and ``extra`` (later -e wins: after the file)."""
    args = ["-e", DDTREE, *[arg for knob in knobs for arg in ("-e", knob)]]
    if extra:
        args += ["-e", json.dumps(extra)]
    return host.playbook(*args)


@pytest.fixture(scope="module")
def ddtree(lab_host):
    r = deploy(lab_host, "budget=8", "topk=4", "window=2048")
    try:
        yield {"deploy": r, "state": state(lab_host) if r.returncode == 0 else {}}
    finally:
        lab_host.ssh(f"systemctl disable --now {UNIT} || true", check=False)


def test_operator_8_4_2048_deploys_and_verifies(lab_host, ddtree):
    r = ddtree["deploy"]
    out = flat(r)
    assert r.returncode == 0, out[-6000:]
    main_pid = ddtree["state"]["MainPID"]
    # each value with where THIS invocation reported it
    assert f"SGLANG_DDTREE_MAX_TOPK: 4 (from /proc/{main_pid}/environ)" in out
    assert (
        f"speculative_ddtree_budget: 8 (from /server_info, journal server_args, /proc/{main_pid}/cmdline, "
        "DDTree worker)" in out
    )
    assert (
        "speculative_draft_window_size: 2048 (from /server_info, journal server_args, "
        f"/proc/{main_pid}/cmdline, DFLASH draft runner)" in out
    )
    # the running process really has the top-k (not only the env file)
    environ = lab_host.read_bytes(f"/proc/{main_pid}/environ").split(b"\0")
    assert b"SGLANG_DDTREE_MAX_TOPK=4" in environ
    record = lab_host.history()[-1]
    assert record["unit"] == UNIT and record["result"] == "verified"
    assert record["invocation_id"] == ddtree["state"]["InvocationID"]
    assert (record["budget"], record["topk"], record["window"]) == (8, 4, 2048)
    assert record["env"] == {"SGLANG_DDTREE_MAX_TOPK": "4"} and record["build_profile"] == "ddtree-pr29907"
    assert record["sglang_version"] == "0.0.0.dev0+labreplay.ddtree.pr29907"


def test_second_run_changes_nothing(lab_host, ddtree):
    r = deploy(lab_host, "budget=8", "topk=4", "window=2048")
    out = flat(r)
    assert r.returncode == 0, out[-4000:]
    assert f"{lab_host.name} : ok=" in out and "changed=0" in out[out.rindex("PLAY RECAP") :]
    assert state(lab_host)["InvocationID"] == ddtree["state"]["InvocationID"]


# The sweep's point: budget 16 at top-k 4, window 2048, a wider tree than the fixture's budget 8 (top-k 2 of
# SGLANG_DDTREE_MAX_TOPK 4 in PR #29907's sizing). The knobs give the same values as the original
# configuration, so the restore at the end keeps the point's invocation (one restart in all).
SWEEP_AXES = [
    {
        "name": "budget",
        "variable": "sglang_speculative_tree_budget",
        "arg": "speculative_ddtree_budget",
        "values": [16],
    },
    {"name": "topk", "variable": "sglang_speculative_topk", "values": [4]},
]
SWEEP_BENCH = {
    "num_prompts": 8,
    "input_len": 64,
    "output_len": 32,
    "max_concurrency": 4,
    "warmup_requests": 1,
}


def test_sweep_point_reports_the_acceptance_length_its_deploy_recorded(lab_host, ddtree, tmp_path):
    state_dir = tmp_path / "sweep"
    extra = {
        "sweep_name": "ddtree-lab-test",
        "sweep_state_dir": str(state_dir),
        "sweep_axes": SWEEP_AXES,
        "sweep_baseline": False,
        "sweep_bench": SWEEP_BENCH,
        # the DDTree replay has no bench_serving: SGLang 0.5.23's, next to it on the host
        "sweep_bench_python": "/opt/sglang/venv/bin/python",
        "sglang_stable_seconds": 2,
        "sglang_health_count": 1,
    }
    knobs = ["-e", "budget=16", "-e", "topk=4", "-e", "window=2048"]
    r = lab_host.playbook("-e", DDTREE, *knobs, extra=extra, playbook="playbooks/sweep.yml")
    assert r.returncode == 0, flat(r)[-8000:]
    host_dir = state_dir / "hosts" / lab_host.name
    (rec,) = [json.loads(p.read_text()) for p in (host_dir / "points").glob("*.json")]
    assert rec["point"]["name"] == "budget=16,topk=4"
    assert rec["result"] == "verified", rec.get("reason")
    assert rec["running_args"]["speculative_ddtree_budget"] == 16
    assert rec["sglang_version"] == "0.0.0.dev0+labreplay.ddtree.pr29907"  # the server benchmarked
    assert rec["metrics"]["completed"] == SWEEP_BENCH["num_prompts"]
    assert rec["invocation_id"] != ddtree["state"]["InvocationID"]  # the point restarted the build
    history = {h["invocation_id"]: h for h in lab_host.history() if h.get("invocation_id")}
    deployed = history[rec["invocation_id"]]
    assert deployed["unit"] == UNIT and deployed["result"] == "verified" and deployed["budget"] == 16
    # the row's acceptance length is the one the deploy's probe recorded for this very invocation
    assert rec["speculation"] == deployed["speculation"]
    assert rec["speculation"]["stand_in"] is True
    # the wider tree accepts more than the fixture's budget 8 (the lab server's model)
    fixture = history[ddtree["state"]["InvocationID"]]["speculation"]
    assert rec["speculation"]["accept_length"] > fixture["accept_length"] > 1.0

    report_dir = state_dir / "report"
    report = json.loads((report_dir / "sweep.json").read_text())
    (row,) = report["rows"]
    assert row["accept_length"] == rec["speculation"]["accept_length"]
    assert row["invocation_id"] == rec["invocation_id"]
    with open(report_dir / "sweep.csv", newline="") as handle:
        (csv_row,) = csv.DictReader(handle)
    assert float(csv_row["accept_length"]) == rec["speculation"]["accept_length"]
    md = (report_dir / "sweep.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {lab_host.name} | budget=16,topk=4 |"))
    assert line.rstrip(" |").endswith(f"{rec['speculation']['accept_length']:.2f}"), line
    assert report["accept_length_note"] in md

    final = json.loads((host_dir / "sweep.json").read_text())
    assert final["status"] == "restored" and final["running_args"]["speculative_ddtree_budget"] == 16
    assert final["invocation_id"] == rec["invocation_id"] == state(lab_host)["InvocationID"]


def test_window_4096_restarts_and_the_new_runner_line_proves_it(lab_host, ddtree):
    r = deploy(lab_host, "budget=8", "topk=4", "window=4096")
    assert r.returncode == 0, flat(r)[-6000:]
    now = state(lab_host)
    assert now["InvocationID"] != ddtree["state"]["InvocationID"]
    journal = lab_host.ssh(
        f"journalctl -o json --all --no-pager _SYSTEMD_INVOCATION_ID={now['InvocationID']}"
    ).stdout
    messages = [json.loads(line).get("MESSAGE") for line in journal.splitlines() if line.strip()]
    assert any(
        isinstance(m, str)
        and "Initialized DFLASH draft runner." in m
        and "draft_window_size=4096, compact_cache=True" in m
        for m in messages
    )
    assert any(
        isinstance(m, str) and "Initialized DDTree worker. block_size=16, tree_budget=8," in m
        for m in messages
    )
    assert lab_host.history()[-1]["window"] == 4096


BAD = [
    # (what, extra vars / knobs, the text that names the setting)
    ("budget 0", {"knobs": ["budget=0"]}, "budget='0': must be an integer from 1 to 4096"),
    ("budget negative", {"knobs": ["budget=-3"]}, "budget='-3': must be an integer from 1 to 4096"),
    ("budget not an integer", {"knobs": ["budget=8.5"]}, "budget='8.5': must be an integer from 1 to 4096"),
    (
        "budget above the limit",
        {"knobs": ["budget=5000"]},
        "budget='5000': must be an integer from 1 to 4096",
    ),
    (
        "budget above the build's declared limit",
        {
            "extra": {
                "sglang_build_profile": "capped",
                "sglang_speculative_tree_budget": 64,
                "sglang_build_profiles": {
                    "capped": {
                        "dests": ["speculative_ddtree_budget"],
                        "limits": {"speculative_ddtree_budget": [1, 32]},
                    }
                },
            }
        },
        "sglang_speculative_tree_budget=64: must be from 1 to 32 with sglang_build_profile capped",
    ),
    (
        "top-k on a build that forces 1",
        {"extra": {"sglang_build_profile": "ddtree-rancy-wang", "sglang_speculative_topk": 4}},
        "sglang_speculative_topk=4: sglang_build_profile ddtree-rancy-wang (the Rancy-Wang/sglang ddtree-v2 "
        "fork) forces speculative_eagle_topk to 1 with speculative_algorithm DDTREE",
    ),
    (
        "a profile naming an environment variable with a newline",
        {
            "extra": {
                "sglang_build_profile": "mine",
                "sglang_build_profiles": {
                    "mine": {"env_knobs": {"DDTREE": {"speculative_eagle_topk": "SGLANG_X\nEVIL=1"}}}
                },
            }
        },
        "sglang_build_profiles.mine.env_knobs.DDTREE.speculative_eagle_topk:",
    ),
    (
        "an unknown profile name",
        {"extra": {"sglang_build_profile": "ddtree-nope"}},
        "sglang_build_profile='ddtree-nope': not a known build profile",
    ),
]


@pytest.mark.parametrize("what,given,message", BAD, ids=[b[0] for b in BAD])
def test_bad_ddtree_input_names_the_setting_and_leaves_the_host_untouched(
    lab_host, ddtree, what, given, message
):
    before = state(lab_host)
    r = deploy(lab_host, *given.get("knobs", []), extra=given.get("extra"))
    out = flat(r)
    assert r.returncode != 0, f"{what} was accepted:\n{out[-3000:]}"
    assert message in out, out[-4000:]
    assert state(lab_host) == before
