#!/usr/bin/env python3
"""Report of a sweep (playbooks/sweep.yml): CSV, JSON, a Markdown table, PNG plots, a summary.

  tools/sweep_report.py --state-dir .sweep/<name> [--out DIR]     (default DIR: <state-dir>/report)

Reads what the sweep recorded on the controller: <state-dir>/hosts/<host>/plan.json (the points of
the current plan) and <state-dir>/hosts/<host>/points/<point-id>.json (one record per host + point:
the point's settings, the verified InvocationID, the verified running arguments, the workload and
bench_serving's numbers, the acceptance length the deploy's history recorded for that invocation
(its `speculation`), or the failure and its reason, or the rejection: a point the host's build
cannot honour, refused before anything ran). Records of points that are no longer in a host's plan
(changed settings or workload) are listed as stale and left out of the table.

Writes into DIR: sweep.json (every row, each with its own InvocationID, + the summary + what each
plot shows), sweep.csv, sweep.md (rendered from sweep.json's content with the top-level template
templates/sweep_report.md.j2), output_throughput.png, latency.png, and when the axes include
`budget` and another axis (DDTree: budget x top-k) throughput_vs_budget.png and
accept_length_vs_budget.png (one line per value of the other axes). Prints the summary: per host the
best verified point by output throughput and its lead over the baseline (the host's original
configuration), and how many points were verified, failed, rejected, pending. Only verified points
are plotted. When any row comes from a lab host, every output says LAB RUN: the lab server's timings
are synthetic.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import sys

LAB_NOTE = (
    "LAB RUN - synthetic numbers: the lab server (lab/sglang_lab_server.py) sleeps a deterministic time "
    "that depends on the settings; they show that the sweep works, not how SGLang performs."
)
ACCEPT_LENGTH_NOTE = (
    "accept len: the point's acceptance length as its deploy measured it (the history record's "
    "speculation.accept_length: completion_tokens / spec_verify_ct of one deterministic /generate); "
    "bench_serving's average is bench_accept_length in sweep.json and sweep.csv."
)
# (metric key of bench_serving's result, column title, unit)
METRICS = (
    ("output_throughput", "output tok/s", "tok/s"),
    ("request_throughput", "req/s", "req/s"),
    ("median_ttft_ms", "TTFT p50 ms", "ms"),
    ("p99_ttft_ms", "TTFT p99 ms", "ms"),
    ("median_itl_ms", "ITL p50 ms", "ms"),
    ("p90_itl_ms", "ITL p90 ms", "ms"),
    ("p99_itl_ms", "ITL p99 ms", "ms"),
)
WORKLOAD_KEYS = (
    "backend",
    "dataset_name",
    "dataset_sha256",
    "num_prompts",
    "input_len",
    "output_len",
    "range_ratio",
    "request_rate",
    "max_concurrency",
    "seed",
    "warmup_requests",
)
LATENCY_PLOT = ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")


def load_json(path: str):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_rows(state_dir: str) -> tuple[list[dict], list[dict], dict]:
    """-> (rows of the current plans in plan order, stale records, host states)."""
    rows, stale, states = [], [], {}
    host_dirs = sorted(glob.glob(os.path.join(state_dir, "hosts", "*")))
    if not host_dirs:
        raise SystemExit(f"sweep_report: no hosts under {state_dir}/hosts: nothing was recorded")
    for host_dir in host_dirs:
        host = os.path.basename(host_dir)
        records = {}
        for path in sorted(glob.glob(os.path.join(host_dir, "points", "*.json"))):
            record = load_json(path)
            records[record["point"]["id"]] = record
        plan_path = os.path.join(host_dir, "plan.json")
        planned = load_json(plan_path) if os.path.exists(plan_path) else None
        plan = (
            planned["points"]
            if planned
            else [{"id": pid, "name": r["point"]["name"]} for pid, r in records.items()]
        )
        # The points the build of the current plan rejects (plans before rejections: unknown).
        rejected_now = set(planned["rejected"]) if planned and "rejected" in planned else None
        for index, point in enumerate(plan):
            record = records.pop(point["id"], None)
            row = make_row(host, index, point, record)
            if row["result"] == "rejected" and rejected_now is not None and point["name"] not in rejected_now:
                # Rejected by an earlier run; the build of this plan honours it: not measured yet.
                row = dict(
                    make_row(host, index, point, None),
                    reason=(
                        "not measured yet (rejected by an earlier run: " + first_line(row["reason"]) + ")"
                    ),
                )
            rows.append(row)
        stale += [
            {"host": host, "point": r["point"]["name"], "id": pid, "result": r.get("result")}
            for pid, r in records.items()
        ]
        state_path = os.path.join(host_dir, "sweep.json")
        states[host] = load_json(state_path) if os.path.exists(state_path) else {}
    return rows, stale, states


def make_row(host: str, index: int, point: dict, record: dict | None) -> dict:
    if record is None:
        return {
            "host": host,
            "order": index,
            "point": point["name"],
            "point_id": point["id"],
            "baseline": bool(point.get("baseline")),
            "result": "pending",
            "reason": "not measured yet",
            "lab_run": None,
            "settings": point.get("settings", {}),
            "axes": point.get("axes", {}),
        }
    metrics = record.get("metrics") or {}
    speculation = record.get("speculation") or {}
    row = {
        "host": host,
        "order": index,
        "point": record["point"]["name"],
        "point_id": record["point"]["id"],
        "baseline": bool(record["point"].get("baseline")),
        "result": record["result"],
        "lab_run": bool(record.get("lab_run")),
        "run_id": record.get("run_id"),
        "settings": record["point"].get("settings", {}),
        "axes": record["point"].get("axes", {}),
        "invocation_id": record.get("invocation_id"),
        "deployed_invocation_id": record.get("deployed_invocation_id"),
        "running_args": record.get("running_args"),
        "resolved_args": record.get("resolved_args"),
        "sglang_version": record.get("sglang_version"),
        "accept_length": speculation.get("accept_length"),
        "speculation": record.get("speculation"),
        "bench_accept_length": record.get("avg_spec_accept_length"),
        "workload": {k: (record.get("workload") or {}).get(k) for k in WORKLOAD_KEYS}
        if record.get("workload")
        else None,
        "metrics": {key: metrics.get(key) for key, _, _ in METRICS},
        "started": record.get("started"),
        "finished": record.get("finished"),
        "reason": record.get("reason"),
        "failed_task": record.get("failed_task"),
    }
    return row


def axis_names(rows: list[dict]) -> list[str]:
    names: list[str] = []
    for row in rows:
        for name in row["axes"]:
            if name not in names:
                names.append(name)
    return names


def point_values(row: dict, axes: list[str], arg_of: dict) -> dict:
    """Axis values as the running server reported them (its resolved value where the point set none)."""
    out = {}
    for name in axes:
        arg = arg_of.get(name)
        reported = {**(row.get("resolved_args") or {}), **(row.get("running_args") or {})}
        if arg and arg in reported:
            out[name] = reported[arg]
        else:
            out[name] = row["axes"].get(name)
    return out


def summarise(rows: list[dict]) -> list[dict]:
    summary = []
    for host in sorted({r["host"] for r in rows}):
        mine = [r for r in rows if r["host"] == host]
        done = [
            r for r in mine if r["result"] == "verified" and r["metrics"].get("output_throughput") is not None
        ]
        base = next((r for r in done if r["baseline"]), None)
        best = max(done, key=lambda r: r["metrics"]["output_throughput"], default=None)
        entry = {
            "host": host,
            "verified": len(done),
            "failed": sum(r["result"] == "failed" for r in mine),
            "rejected": sum(r["result"] == "rejected" for r in mine),
            "pending": sum(r["result"] == "pending" for r in mine),
            "best": None,
            "baseline": None,
            "lead_percent": None,
        }
        if best:
            entry["best"] = {
                "point": best["point"],
                "invocation_id": best["invocation_id"],
                "output_throughput": best["metrics"]["output_throughput"],
            }
        if base:
            entry["baseline"] = {
                "point": base["point"],
                "invocation_id": base["invocation_id"],
                "output_throughput": base["metrics"]["output_throughput"],
            }
        if best and base and base["metrics"]["output_throughput"]:
            entry["lead_percent"] = round(
                100.0 * (best["metrics"]["output_throughput"] / base["metrics"]["output_throughput"] - 1.0), 2
            )
        summary.append(entry)
    return summary


def summary_lines(summary: list[dict], lab: bool) -> list[str]:
    lines = [LAB_NOTE] if lab else []
    for s in summary:
        head = (
            f"{s['host']}: {s['verified']} verified, {s['failed']} failed, {s['rejected']} rejected "
            f"(the build cannot honour them, not run), {s['pending']} pending."
        )
        if not s["best"]:
            lines.append(head + " No verified point with numbers.")
            continue
        text = (
            f"{head} Best: {s['best']['point']} at {s['best']['output_throughput']:.2f} output tok/s "
            f"(invocation {s['best']['invocation_id']})"
        )
        if s["lead_percent"] is not None:
            text += (
                f", {s['lead_percent']:+.2f} % over the baseline "
                f"{s['baseline']['output_throughput']:.2f} tok/s "
                f"(invocation {s['baseline']['invocation_id']})."
            )
        else:
            text += "; no baseline measured (sweep_baseline: false or the baseline failed)."
        lines.append(text)
    return lines


def first_line(text) -> str:
    return text.splitlines()[0][:400] if text else ""


def fmt(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def write_csv(path: str, rows: list[dict], axes: list[str], arg_of: dict) -> None:
    head = (
        ["lab_run", "host", "point", "result"]
        + axes
        + ["invocation_id"]
        + [m for m, _, _ in METRICS]
        + ["accept_length", "bench_accept_length", "sglang_version", "running_args", "settings", "workload"]
        + ["reason"]
    )
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(head)
        for r in rows:
            values = point_values(r, axes, arg_of)
            out.writerow(
                [r["lab_run"], r["host"], r["point"], r["result"]]
                + [values[a] for a in axes]
                + [r.get("invocation_id")]
                + [(r.get("metrics") or {}).get(m) for m, _, _ in METRICS]
                + [
                    r.get("accept_length"),
                    r.get("bench_accept_length"),
                    r.get("sglang_version"),
                    json.dumps(r.get("running_args"), sort_keys=True),
                    json.dumps(r["settings"], sort_keys=True),
                    json.dumps(r.get("workload"), sort_keys=True),
                    r.get("reason") or "",
                ]
            )


TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
MARKDOWN_TEMPLATE = "sweep_report.md.j2"


def markdown_cell(value) -> str:
    """A Markdown table cell: fmt() and `|` escaped."""
    return fmt(value).replace("|", "\\|")


def render_markdown(report: dict, templates: str = TEMPLATES) -> str:
    """sweep.md from the report written as sweep.json (its rows, axes, summary lines, stale records and
    plots), with templates/sweep_report.md.j2."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(cell=markdown_cell, first_line=first_line)
    axes, arg_of = report["axes"], report["axis_args"]
    rows = [
        dict(
            row,
            axis_values=point_values(row, axes, arg_of),
            metrics={m: (row.get("metrics") or {}).get(m) for m, _, _ in METRICS},
            invocation_id=row.get("invocation_id"),
            accept_length=row.get("accept_length"),
            reason=row.get("reason"),
            workload=row.get("workload"),
        )
        for row in report["rows"]
    ]
    return env.get_template(MARKDOWN_TEMPLATE).render(
        lab=report["lab_run"],
        summary_lines=report["summary_lines"],
        axes=axes,
        metric_keys=[m for m, _, _ in METRICS],
        metric_titles=[t for _, t, _ in METRICS],
        rows=rows,
        workloads=sorted({json.dumps(r["workload"], sort_keys=True) for r in rows if r.get("workload")}),
        stale=report["stale"],
        plots=report["plots"],
        accept_length_note=report.get("accept_length_note"),
    )


def plot(out_dir: str, rows: list[dict], lab: bool, axes: list[str], arg_of: dict) -> list[dict]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [
        r for r in rows if r["result"] == "verified" and r["metrics"].get("output_throughput") is not None
    ]
    labels = [
        f"{r['host']}\n{r['point']}" if len({x["host"] for x in rows}) > 1 else r["point"] for r in done
    ]
    suffix = " (LAB RUN: synthetic timings)" if lab else ""
    plots = []

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(done) + 2), 4.5))
    values = [r["metrics"]["output_throughput"] for r in done]
    bars = ax.bar(range(len(done)), values, color=["#888888" if r["baseline"] else "#1f77b4" for r in done])
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    ax.set_xticks(range(len(done)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("output tok/s")
    ax.set_title("Output throughput per verified point" + suffix, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "output_throughput.png"), dpi=100)
    plt.close(fig)
    plots.append(
        {
            "file": "output_throughput.png",
            "kind": "bar",
            "title": "Output throughput" + suffix,
            "series": {
                "output_throughput": [
                    [r["host"], r["point"], r["metrics"]["output_throughput"]] for r in done
                ]
            },
        }
    )

    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(done) + 2), 4.5))
    width = 0.8 / len(LATENCY_PLOT)
    titles = {m: t for m, t, _ in METRICS}
    for k, metric in enumerate(LATENCY_PLOT):
        ax.bar(
            [i + (k - (len(LATENCY_PLOT) - 1) / 2) * width for i in range(len(done))],
            [r["metrics"].get(metric) or 0.0 for r in done],
            width,
            label=titles[metric],
        )
    ax.set_xticks(range(len(done)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    ax.set_title("Time to first token and inter-token latency" + suffix, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "latency.png"), dpi=100)
    plt.close(fig)
    plots.append(
        {
            "file": "latency.png",
            "kind": "bar",
            "title": "TTFT and ITL" + suffix,
            "series": {m: [[r["host"], r["point"], r["metrics"].get(m)] for r in done] for m in LATENCY_PLOT},
        }
    )
    return plots + budget_plots(out_dir, rows, done, axes, arg_of, suffix, plt)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# (file, y: what is plotted, y-axis label, title)
BUDGET_PLOTS = (
    ("throughput_vs_budget.png", "output_throughput", "output tok/s", "Output throughput vs DDTree budget"),
    (
        "accept_length_vs_budget.png",
        "accept_length",
        "acceptance length (deploy's probe)",
        "Acceptance length vs DDTree budget",
    ),
)


def budget_plots(
    out_dir: str, rows: list[dict], done: list[dict], axes: list[str], arg_of: dict, suffix: str, plt
) -> list[dict]:
    """When the axes are `budget` and others: y vs budget, one line per value of the other axes that vary
    (e.g. one line per top-k). Matrix points only (the baseline and sweep_points have no budget axis)."""
    if "budget" not in axes or len(axes) < 2:
        return []
    others = [a for a in axes if a != "budget"]
    varying = [a for a in others if len({json.dumps(r["axes"].get(a)) for r in rows if r["axes"]}) > 1]
    by = varying or others[:1]
    hosts = len({r["host"] for r in rows}) > 1
    plots = []
    for file, metric, ylabel, title in BUDGET_PLOTS:
        lines: dict[tuple, list] = {}
        for r in done:
            if "budget" not in r["axes"]:
                continue
            values = point_values(r, axes, arg_of)
            y = r["metrics"].get(metric) if metric in r["metrics"] else r.get(metric)
            if not is_number(values["budget"]) or not is_number(y):
                continue
            key = ((r["host"],) if hosts else ()) + tuple(
                (0, values[a], "") if is_number(values[a]) else (1, 0, str(values[a])) for a in by
            )
            label = (f"{r['host']} " if hosts else "") + ", ".join(f"{a}={values[a]}" for a in by)
            lines.setdefault(key, [label, []])[1].append([r["host"], r["point"], values["budget"], y])
        ordered = {label: sorted(points, key=lambda p: p[2]) for _, (label, points) in sorted(lines.items())}
        fig, ax = plt.subplots(figsize=(7.0, 4.5))
        budgets = sorted({p[2] for points in ordered.values() for p in points})
        for label, points in ordered.items():
            ax.plot([p[2] for p in points], [p[3] for p in points], marker="o", label=label)
        if budgets and all(b > 0 for b in budgets):
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets, [fmt(b) for b in budgets])
            ax.minorticks_off()
        if not ordered:
            ax.text(0.5, 0.5, "no verified point", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("budget (speculative_ddtree_budget)")
        ax.set_ylabel(ylabel)
        if ordered:
            ax.legend(fontsize=8, title=", ".join(by), title_fontsize=8)
        ax.grid(alpha=0.3)
        ax.set_title(title + suffix, fontsize=10)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, file), dpi=100)
        plt.close(fig)
        plots.append(
            {
                "file": file,
                "kind": "line",
                "title": title + suffix,
                "x": "budget",
                "y": metric,
                "lines_by": by,
                "lines": ordered,
            }
        )
    return plots


def arg_names(state_dir: str, rows: list[dict]) -> dict:
    """axis name -> SGLang dest, from the plans' checks (an axis with `arg`)."""
    out = {}
    for path in glob.glob(os.path.join(state_dir, "hosts", "*", "plan.json")):
        for axis in load_json(path).get("axes", []):
            if axis.get("arg"):
                out[axis["name"]] = axis["arg"]
    return out


def plan_axis_order(state_dir: str) -> list[str]:
    """Axis names in the order of the plans (the point files store axes with sorted keys)."""
    out: list[str] = []
    for path in sorted(glob.glob(os.path.join(state_dir, "hosts", "*", "plan.json"))):
        for axis in load_json(path).get("axes", []):
            if axis.get("name") and axis["name"] not in out:
                out.append(axis["name"])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", required=True, help="sweep_state_dir of the sweep")
    parser.add_argument("--out", help="output directory (default: <state-dir>/report)")
    args = parser.parse_args(argv)
    out_dir = args.out or os.path.join(args.state_dir, "report")
    rows, stale, states = load_rows(args.state_dir)
    lab = any(r.get("lab_run") for r in rows) or any(s.get("lab_run") for s in states.values())
    arg_of = arg_names(args.state_dir, rows)
    order = plan_axis_order(args.state_dir)
    axes = sorted(axis_names(rows), key=lambda n: order.index(n) if n in order else len(order))
    summary = summarise(rows)
    lines = summary_lines(summary, lab)
    os.makedirs(out_dir, exist_ok=True)
    plots = plot(out_dir, rows, lab, axes, arg_of)
    write_csv(os.path.join(out_dir, "sweep.csv"), rows, axes, arg_of)
    report = {
        "lab_run": lab,
        "note": LAB_NOTE if lab else None,
        "accept_length_note": ACCEPT_LENGTH_NOTE,
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "axes": axes,
        "axis_args": arg_of,
        "summary": summary,
        "summary_lines": lines,
        "hosts": {
            h: {k: s.get(k) for k in ("status", "run_id", "updated", "invocation_id", "running_args")}
            for h, s in states.items()
        },
        "rows": rows,
        "stale": stale,
        "plots": plots,
    }
    with open(os.path.join(out_dir, "sweep.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=False)
        handle.write("\n")
    with open(os.path.join(out_dir, "sweep.md"), "w", encoding="utf-8") as handle:
        handle.write(render_markdown(report))
    print("\n".join(lines))
    print(f"report: {out_dir}/sweep.md, sweep.csv, sweep.json, " + ", ".join(p["file"] for p in plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
