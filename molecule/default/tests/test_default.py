"""Testinfra checks of the lab host after the scenario's two deploys: the unit, the service, the
socket, and the proof that a CHANGED window reached the running server.

molecule.yml's sequence: converge deploys CONVERGE_WINDOW (converge.yml; neither the role default
nor the lab inventory's 2048), idempotence, then side_effect.yml records the converged invocation in
molecule's ephemeral directory and deploys NEW_WINDOW with deploy.yml. These checks read the new
window from the running server's /server_info, from the journal lines of the unit's CURRENT
InvocationID (the old invocation's lines, still in the unit's journal, say CONVERGE_WINDOW), a
NEW InvocationID, and both deploys in the host's deploy history.
"""

from __future__ import annotations

import ast
import json
import os
import re

import pytest

CONVERGE_WINDOW = 1024  # converge.yml
NEW_WINDOW = 4096  # side_effect.yml
UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
HISTORY = "/var/lib/sglang-deploy/history.jsonl"
PORT = 30000


def _show(host, *props):
    out = host.check_output("systemctl show sglang.service -p %s", ",".join(props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _get_json(host, path):
    script = (
        "import json,urllib.request;"
        f"print(urllib.request.urlopen('http://127.0.0.1:{PORT}{path}', timeout=5).read().decode())"
    )
    return json.loads(host.check_output("python3 -c %s", script))


def _invocation_lines(host, invocation_id):
    """The journal messages of one invocation of the unit (its _SYSTEMD_INVOCATION_ID), in order."""
    assert re.fullmatch(r"[0-9a-f]{32}", invocation_id), invocation_id
    host.check_output("journalctl --sync")
    return host.check_output(
        "journalctl --no-pager -o cat _SYSTEMD_UNIT=sglang.service _SYSTEMD_INVOCATION_ID=%s", invocation_id
    ).splitlines()


def _logged_window(lines):
    """The window of the one `server_args={...}` line (SGLang's own dump of its resolved arguments)."""
    dumps = [line.split("server_args=", 1)[1] for line in lines if "server_args=" in line]
    assert len(dumps) == 1, f"expected one server_args line, found {len(dumps)}"
    return ast.literal_eval(dumps[0])["speculative_draft_window_size"]


@pytest.fixture(scope="module")
def converged(inventory_hostname):
    """What side_effect.yml recorded about the converged invocation before it deployed NEW_WINDOW."""
    record_dir = os.environ.get("MOLECULE_EPHEMERAL_DIRECTORY", "")
    path = os.path.join(record_dir, f"converged-{inventory_hostname}.json")
    if not os.path.isfile(path):
        pytest.fail(f"{path} is missing: run the side_effect step (side_effect.yml) before verify")
    with open(path) as f:
        return json.load(f)


def test_unit_file_content(host):
    unit = host.file(UNIT)
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    text = unit.content_string
    assert f'"--speculative-draft-window-size" "{NEW_WINDOW}"' in text
    assert text.count('"--speculative-draft-window-size"') == 1
    assert '"--speculative-algorithm" "DFLASH"' in text
    assert "KillMode=control-group" in text
    assert f"EnvironmentFile={ENV_FILE}" in text
    assert "Restart=on-failure" in text


def test_environment_file_is_root_only(host):
    env = host.file(ENV_FILE)
    assert env.exists and env.user == "root" and env.mode == 0o600


def test_service_enabled_and_running_without_restarts(host):
    svc = host.service("sglang")
    assert svc.is_enabled
    # is_running is `systemctl is-active`, which passes a crash-looping unit: check more.
    first = _show(host, "ActiveState", "SubState", "NRestarts", "MainPID", "InvocationID", "NeedDaemonReload")
    assert first["ActiveState"] == "active" and first["SubState"] == "running"
    assert first["NRestarts"] == "0"
    assert first["NeedDaemonReload"] == "no"
    assert int(first["MainPID"]) > 0
    again = _show(host, "MainPID", "InvocationID")
    assert again["MainPID"] == first["MainPID"] and again["InvocationID"] == first["InvocationID"]


def test_port_listening_inside_the_unit_cgroup(host):
    assert host.socket(f"tcp://127.0.0.1:{PORT}").is_listening
    cgroup = _show(host, "ControlGroup")["ControlGroup"]
    assert cgroup.endswith("/sglang.service")
    pid = _show(host, "MainPID")["MainPID"]
    assert host.file(f"/proc/{pid}/cgroup").content_string.strip().endswith(cgroup)


def test_running_server_reports_the_new_window(host):
    info = _get_json(host, "/server_info")
    assert info["speculative_draft_window_size"] == NEW_WINDOW
    assert info["speculative_algorithm"] == "DFLASH"
    assert info["model_path"] == "/srv/models/lab-target"


def test_second_deploy_started_a_new_invocation(host, converged):
    now = _show(host, "InvocationID", "MainPID")
    assert re.fullmatch(r"[0-9a-f]{32}", converged["InvocationID"]), converged
    assert now["InvocationID"] != converged["InvocationID"]
    assert now["MainPID"] != converged["MainPID"]


def test_journal_of_this_invocation_shows_the_new_window(host, converged):
    current = _show(host, "InvocationID")["InvocationID"]
    lines = _invocation_lines(host, current)
    assert _logged_window(lines) == NEW_WINDOW
    # The DFLASH draft runner reports the window it actually applies.
    runner = [line for line in lines if "Initialized DFLASH draft runner" in line]
    assert len(runner) == 1 and f"draft_window_size={NEW_WINDOW}," in runner[0], runner
    # The unit's journal still holds the converged invocation's lines, with the scenario's window:
    # only the invocation filter tells the two runs apart.
    assert _logged_window(_invocation_lines(host, converged["InvocationID"])) == CONVERGE_WINDOW


def test_server_can_generate(host):
    script = (
        "import urllib.request;"
        f"print(urllib.request.urlopen('http://127.0.0.1:{PORT}/health_generate', timeout=30).status)"
    )
    out = host.run("python3 -c %s", script)
    assert out.rc == 0 and out.stdout.strip() == "200"


def test_history_shows_both_deploys(host, converged):
    records = [json.loads(line) for line in host.file(HISTORY).content_string.splitlines() if line]
    current = _show(host, "InvocationID")["InvocationID"]
    # Exactly the two deploys, both verified: converge's (idempotence and the checks add none) and
    # the side_effect's, each with the invocation it proved.
    assert [(r["result"], r["window"], r["invocation_id"]) for r in records] == [
        ("verified", CONVERGE_WINDOW, converged["InvocationID"]),
        ("verified", NEW_WINDOW, current),
    ]
