"""Testinfra checks of a converged lab host: the unit, the service, the socket, and the
running server's own report of its configuration."""

from __future__ import annotations

import json

UNIT = "/etc/systemd/system/sglang.service"
ENV_FILE = "/etc/sglang/sglang.env"
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


def test_unit_file_content(host):
    unit = host.file(UNIT)
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    text = unit.content_string
    assert '"--speculative-draft-window-size" "2048"' in text
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


def test_running_server_reports_window_2048(host):
    info = _get_json(host, "/server_info")
    assert info["speculative_draft_window_size"] == 2048
    assert info["speculative_algorithm"] == "DFLASH"
    assert info["model_path"] == "/srv/models/lab-target"


def test_server_can_generate(host):
    script = (
        "import urllib.request;"
        f"print(urllib.request.urlopen('http://127.0.0.1:{PORT}/health_generate', timeout=30).status)"
    )
    out = host.run("python3 -c %s", script)
    assert out.rc == 0 and out.stdout.strip() == "200"


def test_history_records_the_running_invocation(host):
    text = host.file("/var/lib/sglang-deploy/history.jsonl").content_string
    records = [json.loads(line) for line in text.splitlines() if line]
    assert records, "no deploy history"
    assert records[-1]["invocation_id"] == _show(host, "InvocationID")["InvocationID"]
    assert records[-1]["result"] == "verified"
