"""What deploy.yml prints and keeps per host (issue 18, item 5), on the shared lab host: one no-change deploy.

The default output ends with the MANAGED running arguments as THIS invocation reported them (the values the
running server's own /server_info holds) and the path of the full report on the controller; that report
holds the whole /server_info the assertion read and the assertion's result. No key of /server_info outside
the managed ones is printed (with -v Ansible prints the module results, the whole body included).
"""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SERVER_INFO = (
    'python3 -c "import urllib.request; '
    "print(urllib.request.urlopen('http://127.0.0.1:30000/server_info', timeout=10).read().decode())\""
)
# playbooks/tasks/deploy_report.yml: one task per host writes the report and returns the summary's lines.
TASK = "Show the verified running arguments and write the full report"
SUMMARY_LINE = re.compile(r"^ {2}(?P<key>[a-z_]+): (?P<value>.*) \(from (?P<sources>[^)]*)\)$")


def summary_result(stdout: str) -> dict:
    """The result of the task that shows the summary and writes the report, as the YAML callback printed
    it (the default callback prints it without -v, as a debug task's), or {} when it printed none."""
    if f"TASK [{TASK}]" not in stdout:
        return {}
    block = stdout.split(f"TASK [{TASK}]", 1)[1].split("\n\n", 1)[0]
    return yaml.safe_load(textwrap.dedent(block.split("=>", 1)[1].split("\n", 1)[1]))


@pytest.fixture(scope="module")
def run(lab_host):
    # From the baseline whatever ran before on this shared host (once, in a full run, the deploy below
    # restarted: a leftover of an earlier file, not found; a restart here is printed with its record).
    start = lab_host.state()
    lab_host.restore_baseline()
    before = lab_host.state()
    if before.invocation_id != start.invocation_id:
        print("the baseline restore restarted the server:", lab_host.history()[-1:])
    r = lab_host.playbook("-e", "window=2048")
    printed = summary_result(r.stdout) if r.returncode == 0 else {}
    lines = printed.get("msg", [])
    last = lines[-1] if lines else ""
    found = re.fullmatch(r"Full report \(the whole /server_info and the assertion\): (\S+\.json)", last)
    report = Path(found.group(1)) if found else None
    try:
        yield {
            "r": r,
            "printed": printed,
            "lines": lines,
            "before": before,
            "after": lab_host.state(),
            "report": report,
            "server_info": json.loads(lab_host.ssh(SERVER_INFO).stdout),
        }
    finally:
        if report is not None and report.parent.parent == REPO / "out" / "deploy":
            shutil.rmtree(report.parent, ignore_errors=True)


def test_the_summary_shows_the_managed_running_arguments_as_the_server_reports_them(lab_host, run):
    r, server_info = run["r"], run["server_info"]
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    # A no-change run; if it restarted, the host's last record says why.
    assert run["after"].invocation_id == run["before"].invocation_id, lab_host.history()[-1:]
    report = json.loads(run["report"].read_text())
    managed = set(report["intended"])
    lines = run["lines"]
    assert lines, f"deploy.yml printed no summary (task {TASK!r})"
    # the task's whole result, printed without -v: the lines and the report's path, not the report
    assert run["printed"] == {"changed": False, "msg": lines, "path": str(run["report"])}, run["printed"]
    assert lines[0] == (
        f"{lab_host.name}: sglang.service runs the intended arguments, invocation "
        f"{run['after'].invocation_id} (not restarted: it already ran them)"
    )
    assert lines[-1] == f"Full report (the whole /server_info and the assertion): {run['report']}"
    shown = {m["key"]: (m["value"], m["sources"]) for m in map(SUMMARY_LINE.match, lines) if m}
    assert set(shown) == managed, (sorted(shown), sorted(managed))
    pid = run["after"].main_pid
    for key, (value, sources) in shown.items():
        running = server_info[key]
        assert value == (running if isinstance(running, str) else json.dumps(running)), key
        assert sources.startswith(f"/server_info, journal server_args, /proc/{pid}/cmdline"), (key, sources)
    assert shown["speculative_draft_window_size"] == (
        "2048",
        f"/server_info, journal server_args, /proc/{pid}/cmdline, DFLASH draft runner",
    )


def test_no_unmanaged_server_info_key_is_printed(run):
    r, server_info = run["r"], run["server_info"]
    assert r.returncode == 0 and run["report"] is not None, r.stdout[-6000:]
    report = json.loads(run["report"].read_text())
    unmanaged = set(server_info) - set(report["intended"])
    assert len(unmanaged) > 400
    # a dict printed by the YAML callback: `key: value` lines (with -v the module results hold them all)
    printed = [k for k in unmanaged if re.search(rf"^[ \t-]*[\"']?{re.escape(k)}[\"']?:", r.stdout, re.M)]
    assert printed == []
    assert len(r.stdout) < len(json.dumps(server_info))


def test_the_report_on_the_controller_holds_the_whole_server_info_and_the_assertion(lab_host, run):
    path, server_info = run["report"], run["server_info"]
    assert run["r"].returncode == 0, run["r"].stdout[-6000:]
    assert path is not None and path.parent.parent == REPO / "out" / "deploy", run["r"].stdout[-3000:]
    assert path.name == f"{lab_host.name}.json" and re.fullmatch(r"\d{8}T\d{6}Z", path.parent.name)
    report = json.loads(path.read_text())
    assert (report["host"], report["unit"], report["invocation_id"], report["restarted"]) == (
        lab_host.name,
        "sglang.service",
        run["after"].invocation_id,
        False,
    )
    assert set(report["server_info"]) == set(server_info)
    for key in report["intended"]:
        assert report["server_info"][key] == server_info[key], key
    assertion = report["assertion"]
    assert assertion["diff"] == [] and assertion["source"] == "/server_info"
    assert assertion["evidence"]["invocation_id"] == run["after"].invocation_id
    assert assertion["read_from"]["speculative_draft_window_size"][-1] == "DFLASH draft runner"
