"""tools/sweep_report.py on a small synthetic state directory (what playbooks/sweep.yml records):
every row carries its own InvocationID, rejected points get their own section and count, failed and
rejected points are never plotted, and a budget x top-k sweep gets the two line plots.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import importlib.util
import io
import json

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("sweep_report", REPO / "tools" / "sweep_report.py")
report_tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report_tool)

PNG = b"\x89PNG\r\n\x1a\n"
AXES = [
    {
        "name": "budget",
        "variable": "sglang_speculative_tree_budget",
        "arg": "speculative_ddtree_budget",
        "values": [8, 16],
    },
    {"name": "topk", "variable": "sglang_speculative_topk", "values": [1, 2, 4]},
    {
        "name": "window",
        "variable": "sglang_speculative_draft_window_size",
        "arg": "speculative_draft_window_size",
        "values": [2048],
    },
]
REJECT = (
    "sglang_speculative_topk={k}: sglang_build_profile ddtree-rancy-wang"
    " (the Rancy-Wang/sglang ddtree-v2 fork) forces speculative_eagle_topk to 1"
    " with speculative_algorithm DDTREE; remove it or set 1"
)
# point name -> (result, output tok/s, acceptance length of the deploy's speculation probe)
OUTCOME = {
    "baseline": ("verified", 100.0, 3.0),
    "budget=8,topk=1,window=2048": ("verified", 110.0, 3.5),
    "budget=16,topk=1,window=2048": ("verified", 120.0, 3.9),
    "budget=8,topk=2,window=2048": ("verified", 115.0, 3.7),
    "budget=16,topk=2,window=2048": ("failed", None, None),
    "budget=8,topk=4,window=2048": ("rejected", None, None),
    "budget=16,topk=4,window=2048": ("rejected", None, None),
    "mem-0.80": (None, None, None),  # no record: pending
}


def invocation(name):
    return hashlib.md5(name.encode()).hexdigest()


def make_state(tmp_path, host="lab1", axes=AXES, outcome=OUTCOME, lab=True):
    """plan.json + one record per measured point, as sweep_setup/sweep_point/sweep_measure write them."""
    host_dir = tmp_path / "state" / "hosts" / host
    (host_dir / "points").mkdir(parents=True)
    points = []
    for index, name in enumerate(outcome):
        axes_of = {}
        if "=" in name and "," in name:
            axes_of = {k: int(v) for k, v in (part.split("=") for part in name.split(","))}
        settings = {a["variable"]: axes_of[a["name"]] for a in axes if a["name"] in axes_of}
        if axes_of:
            settings["sglang_speculative_algorithm"] = "DDTREE"
        points.append(
            {
                "name": name,
                "id": f"{name}-{index:010d}",
                "baseline": name == "baseline",
                "axes": axes_of,
                "settings": settings,
                "checks": {},
            }
        )
    (host_dir / "plan.json").write_text(
        json.dumps({"sweep": "t", "host": host, "lab_run": lab, "axes": axes, "points": points})
    )
    for point in points:
        result, tput, accept = outcome[point["name"]]
        if result is None:
            continue
        record = {
            "sweep": "t",
            "lab_run": lab,
            "run_id": "r1",
            "host": host,
            "point": point,
            "result": result,
        }
        if result == "verified":
            inv = invocation(point["name"])
            running = {"speculative_algorithm": "DDTREE", "speculative_draft_window_size": 2048}
            if "budget" in point["axes"]:
                running["speculative_ddtree_budget"] = point["axes"]["budget"]
            record.update(
                invocation_id=inv,
                deployed_invocation_id=inv,
                running_args=running,
                resolved_args={},
                sglang_version="0.0.0.dev0+labreplay.ddtree.pr29907",
                # bench_serving's average differs from the deploy's probe: the report shows the probe's.
                avg_spec_accept_length=accept + 0.5,
                # sglang_verified_restart's speculation of this invocation, as the history recorded it
                # (module_utils/sglang_speculation.py measure: 64 new tokens).
                speculation={
                    "accept_length": accept,
                    "completion_tokens": 64,
                    "spec_verify_ct": round(64 / accept),
                    "stand_in": lab,
                    "new_tokens": 64,
                },
                workload={"backend": "sglang", "num_prompts": 8},
                metrics={
                    "output_throughput": tput,
                    "request_throughput": tput / 100,
                    "median_ttft_ms": 10.0,
                    "p99_ttft_ms": 20.0,
                    "median_itl_ms": 2.0,
                    "p90_itl_ms": 3.0,
                    "p99_itl_ms": 4.0,
                },
            )
        elif result == "failed":
            record.update(failed_task="Deploy", reason="the server died\nROLLED BACK", started=None)
        else:
            k = point["axes"]["topk"]
            record.update(
                failed_task="Reject the points the build cannot honour",
                reason=REJECT.format(k=k),
                started=None,
                running_after_failure=None,
            )
        (host_dir / "points" / f"{point['id']}.json").write_text(json.dumps(record))
    return tmp_path / "state"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("sweep")
    state = make_state(tmp_path)
    out = tmp_path / "report"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert report_tool.main(["--state-dir", str(state), "--out", str(out)]) == 0
    data = json.loads((out / "sweep.json").read_text())
    return {
        "state": state,
        "out": out,
        "data": data,
        "md": (out / "sweep.md").read_text(),
        "stdout": printed.getvalue(),
        "rows": {r["point"]: r for r in data["rows"]},
    }


def test_each_row_carries_its_own_invocation(report):
    records = {}
    for path in (report["state"] / "hosts" / "lab1" / "points").glob("*.json"):
        record = json.loads(path.read_text())
        records[record["point"]["name"]] = record
    verified = [r for r in report["data"]["rows"] if r["result"] == "verified"]
    assert len(verified) == 4
    for row in verified:
        assert row["invocation_id"] == records[row["point"]]["invocation_id"] == invocation(row["point"])
        assert row["deployed_invocation_id"] == row["invocation_id"]
    assert len({r["invocation_id"] for r in verified}) == len(verified)
    for row in report["data"]["rows"]:
        if row["result"] != "verified":
            assert row.get("invocation_id") is None, row["point"]


def test_each_row_shows_the_acceptance_length_its_deploy_recorded(report):
    """accept len is the history record's speculation.accept_length of the row's invocation (issue 38 item 5),
    not bench_serving's average (kept as bench_accept_length)."""
    rows, md = report["rows"], report["md"]
    with open(report["out"] / "sweep.csv", newline="") as handle:
        csv_rows = {r["point"]: r for r in csv.DictReader(handle)}
    cols = [
        c.strip() for c in next(ln for ln in md.splitlines() if ln.startswith("| host")).strip("|").split("|")
    ]
    cells = {}
    for line in md.splitlines():
        if line.startswith("| lab1"):
            row = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
            cells[row["point"].strip("*")] = row
    for name, (result, _, accept) in OUTCOME.items():
        row = rows[name]
        if result == "verified":
            assert row["accept_length"] == accept and row["bench_accept_length"] == accept + 0.5
            assert row["speculation"]["accept_length"] == accept and row["speculation"]["stand_in"] is True
            assert cells[name]["accept len"] == f"{accept:.2f}"
            assert float(csv_rows[name]["accept_length"]) == accept
            assert float(csv_rows[name]["bench_accept_length"]) == accept + 0.5
        else:
            assert row.get("accept_length") is None and cells[name]["accept len"] == ""
    assert report["data"]["accept_length_note"] in md


def test_rejected_points_are_listed_counted_and_never_plotted(report):
    rows, md = report["rows"], report["md"]
    rejected = [name for name, r in rows.items() if r["result"] == "rejected"]
    assert rejected == ["budget=8,topk=4,window=2048", "budget=16,topk=4,window=2048"]
    assert "ddtree-rancy-wang" in rows[rejected[0]]["reason"]
    assert "sglang_speculative_topk=4" in rows[rejected[0]]["reason"]
    (summary,) = report["data"]["summary"]
    assert (summary["verified"], summary["failed"], summary["rejected"], summary["pending"]) == (4, 1, 2, 1)
    assert summary["best"]["point"] == "budget=16,topk=1,window=2048"
    assert summary["lead_percent"] == 20.0
    assert "4 verified, 1 failed, 2 rejected" in report["stdout"]
    section = md.split("## Rejected points", 1)[1].split("\n## ", 1)[0]
    for name in rejected:
        assert f"- lab1 {name}: sglang_speculative_topk=4: sglang_build_profile ddtree-rancy-wang" in section
    assert "budget=16,topk=2,window=2048" not in section  # failed, not rejected
    assert "## Failed points" in md
    plotted = json.dumps(report["data"]["plots"])
    for name in rejected + ["budget=16,topk=2,window=2048", "mem-0.80"]:
        assert name not in plotted
    with open(report["out"] / "sweep.csv", newline="") as handle:
        csv_rows = {r["point"]: r for r in csv.DictReader(handle)}
    assert csv_rows[rejected[0]]["result"] == "rejected"
    assert "ddtree-rancy-wang" in csv_rows[rejected[0]]["reason"]
    assert csv_rows[rejected[0]].keys() >= {"budget", "topk", "window", "invocation_id"}


def test_budget_line_plots_one_line_per_topk(report):
    data, md, out = report["data"], report["md"], report["out"]
    assert data["axes"] == ["budget", "topk", "window"]  # the plan's order
    plots = {p["file"]: p for p in data["plots"]}
    assert list(plots) == [
        "output_throughput.png",
        "latency.png",
        "throughput_vs_budget.png",
        "accept_length_vs_budget.png",
    ]
    for name, plot in plots.items():
        png = (out / name).read_bytes()
        assert png[:8] == PNG and len(png) > 5000, name
        assert f"]({name})" in md and "LAB RUN" in plot["title"]
        assert name in report["stdout"]
    tput, accept = plots["throughput_vs_budget.png"], plots["accept_length_vs_budget.png"]
    assert tput["kind"] == accept["kind"] == "line" and tput["x"] == "budget"
    assert tput["lines_by"] == ["topk"]  # window has one value: not a line of its own
    assert tput["y"] == "output_throughput" and accept["y"] == "accept_length"
    assert tput["lines"] == {
        "topk=1": [
            ["lab1", "budget=8,topk=1,window=2048", 8, 110.0],
            ["lab1", "budget=16,topk=1,window=2048", 16, 120.0],
        ],
        "topk=2": [["lab1", "budget=8,topk=2,window=2048", 8, 115.0]],
    }
    assert accept["lines"] == {
        "topk=1": [
            ["lab1", "budget=8,topk=1,window=2048", 8, 3.5],
            ["lab1", "budget=16,topk=1,window=2048", 16, 3.9],
        ],
        "topk=2": [["lab1", "budget=8,topk=2,window=2048", 8, 3.7]],
    }


def test_without_a_budget_axis_only_the_bar_plots(tmp_path):
    axes = [
        {
            "name": "window",
            "variable": "sglang_speculative_draft_window_size",
            "arg": "speculative_draft_window_size",
            "values": [1024, 4096],
        },
        {"name": "draft_tokens", "variable": "sglang_speculative_num_draft_tokens", "values": [8]},
    ]
    outcome = {
        "baseline": ("verified", 100.0, 3.0),
        "window=1024,draft_tokens=8": ("verified", 90.0, 2.0),
        "window=4096,draft_tokens=8": ("verified", 95.0, 2.5),
    }
    state = make_state(tmp_path, axes=axes, outcome=outcome, lab=False)
    assert report_tool.main(["--state-dir", str(state)]) == 0
    data = json.loads((state / "report" / "sweep.json").read_text())
    assert [p["file"] for p in data["plots"]] == ["output_throughput.png", "latency.png"]
    assert not (state / "report" / "throughput_vs_budget.png").exists()
    assert data["summary"][0]["rejected"] == 0 and data["lab_run"] is False
    assert "## Rejected points" not in (state / "report" / "sweep.md").read_text()


def test_a_point_rejected_earlier_but_honoured_by_the_current_plan_is_pending(tmp_path):
    """The plan records what the current build rejects: an older rejection no longer counts."""
    outcome = {"baseline": ("verified", 100.0, 3.0), "budget=8,topk=4,window=2048": ("rejected", None, None)}
    state = make_state(tmp_path, outcome=outcome)
    plan_path = state / "hosts" / "lab1" / "plan.json"
    plan = json.loads(plan_path.read_text())
    rows, _, _ = report_tool.load_rows(str(state))
    assert [r["result"] for r in rows] == ["verified", "rejected"]  # a plan without `rejected`: as recorded
    plan_path.write_text(json.dumps(dict(plan, rejected={})))
    rows, _, _ = report_tool.load_rows(str(state))
    assert [r["result"] for r in rows] == ["verified", "pending"]
    assert rows[1]["reason"].startswith("not measured yet (rejected by an earlier run: sglang_")
    plan_path.write_text(json.dumps(dict(plan, rejected={"budget=8,topk=4,window=2048": "why"})))
    rows, _, _ = report_tool.load_rows(str(state))
    assert [r["result"] for r in rows] == ["verified", "rejected"]


@pytest.mark.parametrize("report_dir", ["docs/sweep/ddtree", "docs/sweep"])
def test_the_template_renders_the_committed_lab_reports_from_their_json(report_dir):
    """sweep.md comes from templates/sweep_report.md.j2 and the report written as sweep.json: the two
    committed LAB RUN reports (written by the sweep before the Markdown moved into the template) render
    byte for byte from their own sweep.json."""
    data = json.loads((REPO / report_dir / "sweep.json").read_text())
    assert report_tool.render_markdown(data) == (REPO / report_dir / "sweep.md").read_text()


def test_sweep_md_is_rendered_from_the_top_level_template(tmp_path, report):
    """The layout lives in templates/ (what playbooks render), not in the tool: another template in its
    place changes sweep.md, and the template sees every row with its axis values and metrics."""
    assert (REPO / "templates" / report_tool.MARKDOWN_TEMPLATE).is_file()
    (tmp_path / report_tool.MARKDOWN_TEMPLATE).write_text(
        "{% for row in rows %}{{ row.point }}={{ row.axis_values.budget | cell }}/"
        "{{ row.metrics.output_throughput | cell }}/{{ row.invocation_id | cell }};{% endfor %}"
    )
    text = report_tool.render_markdown(report["data"], templates=str(tmp_path))
    assert "budget=16,topk=1,window=2048=16/120.00/" + invocation("budget=16,topk=1,window=2048") in text
    assert "mem-0.80=//;" in text  # pending: no values, no numbers, no invocation
    assert report_tool.render_markdown(report["data"]) == report["md"]
