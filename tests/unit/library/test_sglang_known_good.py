"""library/sglang_known_good.py (the rollback's restore): real main(). The known-good set is kept by the real
sglang_history (as a verified deploy keeps it); ``systemd-analyze verify`` is the real one, systemctl is
faked (only daemon-reload is called)."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.basic import AnsibleModule
from conftest import FIXTURES

SENTINEL = "sk-sentinel-known-good-31"
UNIT = """[Unit]
Description=SGLang

[Service]
Type=simple
EnvironmentFile=/etc/sglang/sglang.env
ExecStart=/usr/bin/python3 -m sglang.launch_server "--config" "/etc/sglang/sglang.yaml" "--window" "{window}"
KillMode=control-group

[Install]
WantedBy=multi-user.target
"""
GOOD = {
    "unit": UNIT.format(window=2048),
    "env": "HF_HOME=/var/lib/sglang/hf\n",
    "config": f'api-key: "{SENTINEL}"\n',
}
# What the failed deploy left on the host (the stand-in's crash switch in the env file).
FAILED = {
    "unit": UNIT.format(window=4096),
    "env": "HF_HOME=/var/lib/sglang/hf\nSGLANG_LAB_CRASH_AFTER=3\n",
    "config": f'api-key: "{SENTINEL}-new"\n',
}


@pytest.fixture
def host(tmp_path, monkeypatch, run_module):
    calls = []

    def fake(self, cmd, **kwargs):
        name = os.path.basename(cmd[0])
        if name == "systemd-analyze":
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, **kwargs.get("environ_update", {})}
            )
            calls.append(["systemd-analyze", cmd[1], proc.returncode])
            return proc.returncode, proc.stdout, proc.stderr
        assert name == "systemctl" and cmd[1:] == ["daemon-reload"], cmd
        calls.append(cmd[1:])
        return 0, "", ""

    monkeypatch.setattr(AnsibleModule, "run_command", fake)
    monkeypatch.setattr(
        AnsibleModule,
        "get_bin_path",
        lambda self, name, required=False, opt_dirs=None: shutil.which(name) or f"/usr/bin/{name}",
    )
    (tmp_path / "system").mkdir()
    (tmp_path / "etc").mkdir()
    paths = {
        "unit": tmp_path / "system" / "sglang.service",
        "env": tmp_path / "etc" / "sglang.env",
        "config": tmp_path / "etc" / "sglang.yaml",
    }
    known_good = tmp_path / "known-good"

    def keep(contents, meta=None):
        """Write ``contents`` to the live paths and keep them as known-good, as a verified deploy does."""
        for name, path in paths.items():
            path.write_text(contents[name])
        sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in paths.items()}
        result, failed = run_module(
            "sglang_history",
            {
                "path": str(tmp_path / "history.jsonl"),
                "record": {"result": "verified"},
                "known_good": {
                    "dir": str(known_good),
                    "files": {name: str(path) for name, path in paths.items()},
                    "meta_name": "sglang.json",
                    "meta": dict({"unit": "sglang.service"}, **(meta or {})),
                    "api_key": SENTINEL,
                    "sha256": sha,
                },
            },
        )
        assert not failed, result
        return sha

    args = {
        "name": "sglang.service",
        "dir": str(known_good),
        "meta_name": "sglang.json",
        "unit_path": str(paths["unit"]),
        "env_path": str(paths["env"]),
        "config_path": str(paths["config"]),
        "config_group": grp.getgrgid(os.getgid()).gr_name,
        "previous_dir": str(tmp_path / "previous"),
    }
    return {"calls": calls, "paths": paths, "dir": known_good, "keep": keep, "args": args, "tmp": tmp_path}


def live(host):
    return {name: path.read_text() for name, path in host["paths"].items()}


def leave_failed_deploy(host):
    for name, path in host["paths"].items():
        path.write_text(FAILED[name])


def test_valid_known_good_set_is_restored_with_one_reload(run_module, host):
    sha = host["keep"](GOOD)
    leave_failed_deploy(host)
    result, failed = run_module("sglang_known_good", host["args"])
    assert not failed, result
    assert result["changed"] and result["restored"] == ["env", "config", "unit"]
    assert result["sha256"] == sha and result["daemon_reloaded"] is True
    assert live(host) == GOOD
    assert host["calls"] == [["systemd-analyze", "verify", 0], ["daemon-reload"]]
    modes = {name: stat.S_IMODE(os.stat(path).st_mode) for name, path in host["paths"].items()}
    assert modes == {"unit": 0o644, "env": 0o600, "config": 0o640}
    # What it replaced is kept; no temporary file is left beside the targets.
    previous = host["tmp"] / "previous"
    assert (previous / "sglang.env.previous").read_text() == FAILED["env"]
    assert (previous / "sglang.service.previous").read_text() == FAILED["unit"]
    assert sorted(p.name for p in host["paths"]["env"].parent.iterdir()) == ["sglang.env", "sglang.yaml"]
    assert SENTINEL not in run_module.last_output


def test_tampered_known_good_env_is_refused_and_nothing_is_written(run_module, host):
    host["keep"](GOOD)
    leave_failed_deploy(host)
    copy = host["dir"] / "sglang.env"
    copy.write_text(GOOD["env"] + "LD_PRELOAD=/tmp/evil.so\n")
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed, result
    assert "rollback of sglang.service refused" in result["msg"]
    assert str(copy) in result["msg"] and "Refused: nothing was written" in result["msg"]
    assert str(host["dir"] / "sglang.service") not in result["msg"]
    assert result["restored"] == []
    assert live(host) == FAILED
    assert host["calls"] == []  # neither validated nor reloaded
    assert not (host["tmp"] / "previous").exists()


def test_known_good_release_removed_or_rebuilt_is_refused_and_nothing_is_written(run_module, host):
    """The known-good unit names its SGLang release (issue 14 item 1): the rollback restores it only while the
    release directory and its marker (the recorded lab install marker) are what was verified."""
    release = host["tmp"] / "releases" / "0.5.23-py3.11-0123456789ab"
    release.mkdir(parents=True)
    marker = release / "sglang-deploy-install.json"
    shutil.copy(FIXTURES / "host_probe" / "marker-lab.json", marker)
    recorded = {
        "path": str(release),
        "marker": str(marker),
        "marker_sha256": hashlib.sha256(marker.read_bytes()).hexdigest(),
    }
    host["keep"](GOOD, {"release": recorded})
    leave_failed_deploy(host)
    marker.write_text(marker.read_text().replace("0.5.23", "0.5.24"))  # rebuilt in place
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed and f"the release {release} ({marker}: sha256" in result["msg"], result
    marker.unlink()  # removed
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed and f"the release {release} ({marker}: No such file or directory)" in result["msg"]
    assert live(host) == FAILED and host["calls"] == []
    shutil.copy(FIXTURES / "host_probe" / "marker-lab.json", marker)  # as verified: restored
    result, failed = run_module("sglang_known_good", host["args"])
    assert not failed and live(host) == GOOD, result


def test_half_written_known_good_set_is_refused(run_module, host):
    """A known-good unit copy that is not the one the metadata recorded (e.g. an interrupted record)."""
    host["keep"](GOOD)
    leave_failed_deploy(host)
    (host["dir"] / "sglang.service").write_text(UNIT.format(window=1024))
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed and str(host["dir"] / "sglang.service") in result["msg"]
    assert live(host) == FAILED


def test_known_good_unit_systemd_refuses_is_not_written(run_module, host):
    bad = dict(GOOD, unit=GOOD["unit"].replace("KillMode=control-group", "ExecStartPre=relative/path"))
    host["keep"](bad)
    leave_failed_deploy(host)
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed, result
    assert "systemd-analyze verify refused the known-good unit" in result["msg"]
    assert "relative/path" in result["msg"]
    assert host["calls"] == [["systemd-analyze", "verify", 1]]
    assert live(host) == FAILED


def test_check_mode_checks_and_writes_nothing(run_module, host):
    host["keep"](GOOD)
    leave_failed_deploy(host)
    result, failed = run_module("sglang_known_good", dict(host["args"], _ansible_check_mode=True))
    assert not failed and result["changed"] and result["restored"] == ["env", "config", "unit"]
    assert live(host) == FAILED and host["calls"] == [["systemd-analyze", "verify", 0]]


def test_set_kept_before_the_config_file_leaves_the_config_as_is(run_module, host):
    host["keep"](GOOD)
    leave_failed_deploy(host)
    meta_path = host["dir"] / "sglang.json"
    meta = json.loads(meta_path.read_text())
    del meta["config_sha256"]
    meta_path.write_text(json.dumps(meta))
    (host["dir"] / "sglang.yaml").unlink()
    result, failed = run_module("sglang_known_good", host["args"])
    assert not failed, result
    assert result["restored"] == ["env", "unit"]
    assert live(host) == dict(GOOD, config=FAILED["config"])


def test_missing_metadata_is_refused(run_module, host):
    leave_failed_deploy(host)
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed and "cannot read the known-good metadata" in result["msg"]
    assert live(host) == FAILED and Path(host["args"]["dir"]).exists() is False


def test_a_built_release_recorded_by_the_old_role_still_rolls_back_and_only_that(run_module, host):
    """Issue 37 item 9: a release the role BUILT was recorded with the sha256 of its marker text followed by a
    backslash and an 'n' (the role's Jinja '\\n' inside a YAML folded scalar is not a newline), while the
    marker on disk ends in a newline. That record names exactly one file (the marker as written, whose last
    newline it spells out), so the rollback of a host deployed by that role is not refused; any other
    marker still is."""
    release = host["tmp"] / "releases" / "0.5.23-py3.11-0123456789ab"
    release.mkdir(parents=True)
    marker = release / "sglang-deploy-install.json"
    shutil.copy(FIXTURES / "host_probe" / "marker-lab.json", marker)
    written = marker.read_bytes()
    assert written.endswith(b"}\n")
    recorded = {
        "path": str(release),
        "marker": str(marker),
        "marker_sha256": hashlib.sha256(written[:-1] + b"\\n").hexdigest(),
    }
    host["keep"](GOOD, {"release": recorded})
    leave_failed_deploy(host)
    marker.write_bytes(written[:-1] + b" \n")  # another file whose last newline is there too
    result, failed = run_module("sglang_known_good", host["args"])
    assert failed and f"the release {release} ({marker}: sha256" in result["msg"], result
    assert live(host) == FAILED and host["calls"] == []
    marker.write_bytes(written)  # the marker the build wrote
    result, failed = run_module("sglang_known_good", host["args"])
    assert not failed and live(host) == GOOD, result
