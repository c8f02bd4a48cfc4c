"""sglang_history module (real main()) and the sglang-history CLI."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_history import render_textfile
from conftest import REPO

SENTINEL = "SENTINEL-SECRET-9f3c"
CLI = REPO / "roles" / "sglang" / "files" / "sglang-history"
RECORD = {
    "invocation_id": "5f67eaa332b14ce095abdbeeeb5c0407",
    "unit_sha256": "ab12cd34ef56" * 5,
    "window": 2048,
    "budget": None,
    "topk": 1,
    "result": "verified",
    "settings": {"api_key": SENTINEL, "launch": f"--api-key {SENTINEL} --port 30000"},
}


def test_append_writes_one_redacted_line_with_mode_0640(run_module, tmp_path):
    path = tmp_path / "deploy" / "history.jsonl"
    result, failed = run_module(
        "sglang_history", {"path": str(path), "record": RECORD, "secret_values": [SENTINEL]}
    )
    assert not failed and result["changed"] is True
    assert SENTINEL not in run_module.last_output
    text = path.read_text()
    assert SENTINEL not in text
    assert text.count("\n") == 1
    line = json.loads(text)
    assert line["settings"] == {"api_key": "<redacted>", "launch": "--api-key <redacted> --port 30000"}
    assert line["window"] == 2048 and line["time"].endswith("Z")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    result2, _ = run_module(
        "sglang_history", {"path": str(path), "record": dict(RECORD, result="rolled-back")}
    )
    assert result2["changed"] is True
    assert [json.loads(x)["result"] for x in path.read_text().splitlines()] == ["verified", "rolled-back"]


def test_check_mode_reports_changed_and_writes_nothing(run_module, tmp_path):
    path = tmp_path / "history.jsonl"
    result, failed = run_module(
        "sglang_history", {"path": str(path), "record": RECORD, "_ansible_check_mode": True}
    )
    assert not failed and result["changed"] is True
    assert not path.exists()


def test_list_returns_last_n_and_counts_bad_lines(run_module, tmp_path):
    path = tmp_path / "history.jsonl"
    lines = [json.dumps({"time": f"t{i}", "result": "verified"}) for i in range(5)]
    path.write_text("\n".join(lines[:3] + ["{not json", "[1, 2]"] + lines[3:]) + "\n")
    result, failed = run_module("sglang_history", {"path": str(path), "limit": 2})
    assert not failed and result["changed"] is False
    assert [r["time"] for r in result["records"]] == ["t3", "t4"]
    assert result["skipped_lines"] == 2


def test_list_of_missing_file_is_empty(run_module, tmp_path):
    result, failed = run_module("sglang_history", {"path": str(tmp_path / "none.jsonl")})
    assert not failed and result["records"] == [] and result["changed"] is False


def test_negative_limit_fails_naming_the_option(run_module, tmp_path):
    result, failed = run_module("sglang_history", {"path": str(tmp_path / "h.jsonl"), "limit": -1})
    assert failed and "limit must be >= 0" in result["msg"]


def test_unwritable_path_fails_naming_the_file(run_module, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = blocker / "history.jsonl"
    result, failed = run_module("sglang_history", {"path": str(path), "record": RECORD})
    assert failed and str(path) in result["msg"]


def test_cli_table_and_json(run_module, tmp_path):
    path = tmp_path / "history.jsonl"
    run_module("sglang_history", {"path": str(path), "record": RECORD, "secret_values": [SENTINEL]})
    out = subprocess.run(
        [sys.executable, str(CLI), "--file", str(path)], capture_output=True, text=True, check=True
    )
    header, row = out.stdout.splitlines()
    assert header.split() == ["TIME", "INVOCATION", "UNIT", "WINDOW/BUDGET/TOPK", "RESULT"]
    assert "5f67eaa332b1" in row and "ab12cd34ef56" in row and "2048/-/1" in row and row.endswith("verified")
    js = subprocess.run(
        [sys.executable, str(CLI), "--file", str(path), "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(js.stdout)[0]["invocation_id"] == RECORD["invocation_id"]
    missing = subprocess.run(
        [sys.executable, str(CLI), "--file", str(tmp_path / "x")], capture_output=True, text=True
    )
    assert missing.returncode == 1 and "no history yet" in missing.stderr


def test_known_good_set_is_switched_by_one_rename_of_a_symlink(run_module, tmp_path):
    """Issue 14 item 3: the set is written into a new generation directory, then the known-good path becomes a
    symlink to it by one rename; the previous generation (and a real directory an older role kept) goes."""
    unit, env = tmp_path / "sglang.service", tmp_path / "sglang.env"
    state = tmp_path / "state"
    legacy = state / "known-good"
    legacy.mkdir(parents=True)
    (legacy / "sglang.env").write_text("OLD=1\n")  # the set an older version of the role kept

    def keep(window):
        unit.write_text(f"[Service]\nExecStart=/bin/true {window}\n")
        env.write_text(f"W={window}\n")
        args = {
            "path": str(tmp_path / "history.jsonl"),
            "record": {"result": "verified"},
            "known_good": {
                "dir": str(legacy),
                "files": {"unit": str(unit), "env": str(env)},
                "meta_name": "sglang.json",
                "meta": {"window": window},
                "api_key": "",
            },
        }
        result, failed = run_module("sglang_history", args)
        assert not failed, result
        return os.readlink(legacy)

    first = keep(2048)
    assert legacy.is_symlink() and first.startswith("known-good.") and "/" not in first
    assert sorted(p.name for p in state.iterdir()) == ["known-good", first]  # the legacy directory is gone
    assert (legacy / "sglang.env").read_text() == "W=2048\n"
    assert oct((state / first).stat().st_mode & 0o777) == "0o700"
    second = keep(4096)
    assert second != first and sorted(p.name for p in state.iterdir()) == ["known-good", second]
    assert json.loads((legacy / "sglang.json").read_text())["window"] == 4096
    assert (legacy / "sglang.service").read_text().endswith("4096\n")


def test_the_known_good_switch_of_one_service_keeps_the_other_services_sets(run_module, tmp_path):
    """Issue 37 item 10: one known-good directory serves every service of the host; switching the set of one
    carries the others' files into the new generation instead of deleting them."""
    state = tmp_path / "state"
    link = state / "known-good"

    def keep(service, window):
        unit, env = tmp_path / f"{service}.service", tmp_path / f"{service}.env"
        unit.write_text(f"[Service]\nExecStart=/bin/true {window}\n")
        env.write_text(f"W={window}\n")
        args = {
            "path": str(tmp_path / "history.jsonl"),
            "record": {"result": "verified", "unit": f"{service}.service"},
            "known_good": {
                "dir": str(link),
                "files": {"unit": str(unit), "env": str(env)},
                "meta_name": f"{service}.json",
                "meta": {"window": window},
                "api_key": "",
            },
        }
        result, failed = run_module("sglang_history", args)
        assert not failed, result

    keep("sglang", 2048)
    keep("sglang-b", 4096)
    assert sorted(p.name for p in link.iterdir()) == [
        "sglang-b.env",
        "sglang-b.json",
        "sglang-b.service",
        "sglang.env",
        "sglang.json",
        "sglang.service",
    ]
    keep("sglang", 1024)
    assert (link / "sglang.env").read_text() == "W=1024\n" and (
        link / "sglang-b.env"
    ).read_text() == "W=4096\n"
    assert json.loads((link / "sglang-b.json").read_text())["window"] == 4096
    assert len([p for p in state.iterdir() if p.name.startswith("known-good.")]) == 1


def test_a_switch_with_keep_replaced_keeps_the_set_it_replaces_until_the_next_such_switch(
    run_module, tmp_path
):
    """Issue 39 (revert the run): the rolling play's verified restart keeps the set it replaces
    (keep_replaced, a symlink beside the known-good one); every other switch spares it; the next keeping
    switch replaces it; a host with no verified set keeps none (an older kept set, even a directory an
    older role copied, goes)."""
    state = tmp_path / "state"
    link, before = state / "known-good", state / "before-run"
    before.mkdir(parents=True)
    (before / "sglang.json").write_text('{"window": 512}\n')  # kept by an earlier run of an older role

    def keep(service, window, keep_replaced=True):
        unit, env = tmp_path / f"{service}.service", tmp_path / f"{service}.env"
        unit.write_text(f"[Service]\nExecStart=/bin/true {window}\n")
        env.write_text(f"W={window}\n")
        known_good = {
            "dir": str(link),
            "files": {"unit": str(unit), "env": str(env)},
            "meta_name": f"{service}.json",
            "meta": {"window": window},
            "api_key": "",
        }
        if keep_replaced:
            known_good["keep_replaced"] = str(before)
        args = {
            "path": str(tmp_path / "history.jsonl"),
            "record": {"result": "verified"},
            "known_good": known_good,
        }
        return run_module("sglang_history", args)

    def generations():
        return sorted(p.name for p in state.iterdir() if p.name.startswith("known-good."))

    assert not keep("sglang", 2048)[1]
    assert not os.path.lexists(before)  # nothing was verified before: nothing to revert to
    first = os.readlink(link)
    assert not keep("sglang", 4096)[1]
    assert os.readlink(before) == first and json.loads((before / "sglang.json").read_text())["window"] == 2048
    second = os.readlink(link)
    assert generations() == sorted([first, second])
    # Another service's switch (no keep_replaced) spares the kept set; the generation it replaces goes.
    assert not keep("sglang-b", 1024, keep_replaced=False)[1]
    third = os.readlink(link)
    assert generations() == sorted([first, third]) and os.readlink(before) == first
    assert (link / "sglang.env").read_text() == "W=4096\n" and (
        before / "sglang.env"
    ).read_text() == "W=2048\n"
    # The next keeping switch keeps the set it replaces; the set kept before goes.
    assert not keep("sglang", 8192)[1]
    assert os.readlink(before) == third and generations() == sorted([third, os.readlink(link)])
    # A path not beside the known-good set is refused, nothing switched.
    current = os.readlink(link)
    args = {
        "path": str(tmp_path / "history.jsonl"),
        "record": {"result": "verified"},
        "known_good": {
            "dir": str(link),
            "files": {"unit": str(tmp_path / "sglang.service")},
            "meta_name": "sglang.json",
            "keep_replaced": str(tmp_path / "elsewhere" / "before-run"),
        },
    }
    result, failed = run_module("sglang_history", args)
    assert failed and "is not beside" in result["msg"] and "not recorded" in result["msg"], result
    assert os.readlink(link) == current and os.readlink(before) == third


def test_known_good_keeps_the_verified_files_and_records_their_hashes(run_module, tmp_path):
    import hashlib

    unit = tmp_path / "sglang.service"
    env = tmp_path / "sglang.env"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    env.write_text(f"SGLANG_API_KEY={SENTINEL}\n")
    good = tmp_path / "known-good"
    history = tmp_path / "history.jsonl"
    args = {
        "path": str(history),
        "record": {"result": "verified", "window": 2048},
        "known_good": {
            "dir": str(good),
            "files": {"unit": str(unit), "env": str(env)},
            "meta_name": "sglang.json",
            "meta": {"unit": "sglang.service", "expected": {"speculative_draft_window_size": 2048}},
            "api_key": SENTINEL,
        },
    }
    result, failed = run_module("sglang_history", args)
    assert not failed, result
    assert SENTINEL not in run_module.last_output
    sha = {name: hashlib.sha256(p.read_bytes()).hexdigest() for name, p in (("unit", unit), ("env", env))}
    line = json.loads(history.read_text())
    assert line["unit_sha256"] == sha["unit"] and line["env_sha256"] == sha["env"]
    assert SENTINEL not in history.read_text()
    assert (good / "sglang.service").read_bytes() == unit.read_bytes()
    assert (good / "sglang.env").read_bytes() == env.read_bytes()
    meta = json.loads((good / "sglang.json").read_text())
    assert (
        meta["api_key"] == SENTINEL
        and meta["unit_sha256"] == sha["unit"]
        and meta["env_sha256"] == sha["env"]
    )
    assert meta["expected"] == {"speculative_draft_window_size": 2048}
    assert stat.S_IMODE(os.stat(good).st_mode) == 0o700
    for name in ("sglang.service", "sglang.env", "sglang.json"):
        assert stat.S_IMODE(os.stat(good / name).st_mode) == 0o600, name
    assert sorted(p.name for p in good.iterdir()) == ["sglang.env", "sglang.json", "sglang.service"]


def test_known_good_in_check_mode_and_with_a_missing_file(run_module, tmp_path):
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\n")
    good = tmp_path / "known-good"
    spec = {"dir": str(good), "files": {"unit": str(unit)}, "meta_name": "m.json"}
    result, failed = run_module(
        "sglang_history",
        {
            "path": str(tmp_path / "h.jsonl"),
            "record": {"result": "verified"},
            "known_good": spec,
            "_ansible_check_mode": True,
        },
    )
    assert not failed and not good.exists() and not (tmp_path / "h.jsonl").exists()
    spec["files"]["env"] = str(tmp_path / "missing.env")
    result, failed = run_module(
        "sglang_history",
        {"path": str(tmp_path / "h.jsonl"), "record": {"result": "verified"}, "known_good": spec},
    )
    assert failed and "missing.env" in result["msg"] and "known-good" in result["msg"]
    assert not good.exists() and not (tmp_path / "h.jsonl").exists()


def _verified_files(tmp_path):
    unit = tmp_path / "sglang.service"
    env = tmp_path / "sglang.env"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    env.write_text(f"SGLANG_API_KEY={SENTINEL}\nHF_HOME=/var/lib/sglang/hf\n")
    return unit, env


def _sha(path):
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_known_good_with_the_restarts_hashes_records_them(run_module, tmp_path):
    unit, env = _verified_files(tmp_path)
    good, history = tmp_path / "known-good", tmp_path / "history.jsonl"
    sha = {"unit": _sha(unit), "env": _sha(env)}
    spec = {
        "dir": str(good),
        "files": {"unit": str(unit), "env": str(env)},
        "meta_name": "m.json",
        "sha256": sha,
    }
    result, failed = run_module(
        "sglang_history", {"path": str(history), "record": {"result": "verified"}, "known_good": spec}
    )
    assert not failed, result
    meta = json.loads((good / "m.json").read_text())
    assert (meta["unit_sha256"], meta["env_sha256"]) == (sha["unit"], sha["env"])
    assert meta["sha256_checked"] == ["env", "unit"]
    line = json.loads(history.read_text())
    assert (line["unit_sha256"], line["env_sha256"]) == (sha["unit"], sha["env"])


def test_a_file_changed_after_the_restart_fails_and_records_nothing(run_module, tmp_path):
    """The env file the restart ran was hashed before it; changed by hand during the stability window."""
    unit, env = _verified_files(tmp_path)
    good, history = tmp_path / "known-good", tmp_path / "history.jsonl"
    sha = {"unit": _sha(unit), "env": _sha(env)}
    env.write_text(env.read_text() + "EXTRA=by-hand\n")
    spec = {
        "dir": str(good),
        "files": {"unit": str(unit), "env": str(env)},
        "meta_name": "m.json",
        "sha256": sha,
    }
    result, failed = run_module(
        "sglang_history", {"path": str(history), "record": {"result": "verified"}, "known_good": spec}
    )
    assert failed, result
    assert str(env) in result["msg"] and str(unit) not in result["msg"]
    assert "NOTHING was recorded as known-good" in result["msg"]
    assert sha["env"][:12] in result["msg"] and result["recorded"] is False
    assert not good.exists() and not history.exists()
    assert SENTINEL not in run_module.last_output
    # An earlier known-good set is left exactly as it was.
    good.mkdir()
    (good / "m.json").write_text("{}\n")
    result, failed = run_module(
        "sglang_history", {"path": str(history), "record": {"result": "verified"}, "known_good": spec}
    )
    assert failed and sorted(p.name for p in good.iterdir()) == ["m.json"]
    assert (good / "m.json").read_text() == "{}\n" and not history.exists()


def test_a_hash_for_a_file_not_kept_is_refused(run_module, tmp_path):
    unit, _ = _verified_files(tmp_path)
    spec = {
        "dir": str(tmp_path / "kg"),
        "files": {"unit": str(unit)},
        "meta_name": "m.json",
        "sha256": {"unit": _sha(unit), "config": "0" * 64},
    }
    result, failed = run_module(
        "sglang_history", {"path": str(tmp_path / "h.jsonl"), "record": {"result": "x"}, "known_good": spec}
    )
    assert failed and "config" in result["msg"] and not (tmp_path / "h.jsonl").exists()


def test_clear_pending_removes_the_marker_after_the_record_and_keeps_it_in_the_record(run_module, tmp_path):
    path, marker = tmp_path / "history.jsonl", tmp_path / "sglang.pending.json"
    pending = {"unit": "sglang.service", "pid": 4242, "files": {"unit": {"path": "/etc/x", "sha256": "ab"}}}
    marker.write_text(json.dumps(pending))
    args = {"path": str(path), "record": {"result": "verified"}, "clear_pending": str(marker)}
    result, failed = run_module("sglang_history", dict(args, _ansible_check_mode=True))
    assert not failed and result["pending_cleared"] and marker.exists() and not path.exists()
    result, failed = run_module("sglang_history", args)
    assert not failed and result["pending_cleared"] is True
    assert not marker.exists()
    assert json.loads(path.read_text())["pending"] == pending
    # No marker (the normal case): the record has none and nothing fails.
    result, failed = run_module("sglang_history", args)
    assert not failed and result["pending_cleared"] is False and "pending" not in result["record"]
    # A marker a crash truncated is still cleared, and says it was unreadable.
    marker.write_text('{"unit": "sglang.serv')
    result, failed = run_module("sglang_history", dict(args, record={"result": "rolled_back"}))
    assert not failed and result["record"]["pending"]["unreadable"].startswith("not JSON")
    assert not marker.exists()


# ------------------------------------------------------------------ node_exporter's textfile
HELP_INFO = (
    "# HELP sglang_deploy_info The SGLang configuration the last deploy of the service left running"
    " (its history record).\n# TYPE sglang_deploy_info gauge\n"
)
HELP_TIME = (
    "# HELP sglang_deploy_timestamp_seconds When the last deploy of the service was recorded.\n"
    "# TYPE sglang_deploy_timestamp_seconds gauge\n"
)
# 2026-12-02T16:40:00.250Z
STAMP, SECONDS = "2026-12-02T16:40:00.250000Z", "1796229600.250"


def textfile(labels):
    info = f"sglang_deploy_info{{{labels}}} 1\n"
    return f"{HELP_INFO}{info}{HELP_TIME}sglang_deploy_timestamp_seconds{{{labels}}} {SECONDS}\n"


@pytest.mark.parametrize(
    ("service", "entry", "labels"),
    [
        (
            "sglang",
            {
                "result": "verified",
                "config_hash": "3f2a9c0d41be",
                "invocation_id": "5f67eaa332b14ce095abdbeeeb5c0407",
                "window": 2048,
                "budget": None,
                "topk": None,
                "algorithm": "DFLASH",
                "sglang_version": "0.5.23",
                "args": {"speculative_draft_window_size": 2048},
            },
            'service="sglang",config_hash="3f2a9c0d41be",invocation="5f67eaa332b14ce095abdbeeeb5c0407",'
            'window="2048",budget="",topk="",algorithm="DFLASH",sglang_version="0.5.23",result="verified"',
        ),
        (
            "sglang-k26-ddtree",
            {
                "result": "rolled_back",
                "config_hash": "0a1b2c3d4e5f",
                "invocation_id": "aa",
                "window": 2048.0,
                "budget": 8,
                "topk": 4,
                "algorithm": "DDTREE",
                "sglang_version": "0.0.0.dev0+labreplay.ddtree.pr29907",
            },
            'service="sglang-k26-ddtree",config_hash="0a1b2c3d4e5f",invocation="aa",window="2048",budget="8",'
            'topk="4",algorithm="DDTREE",sglang_version="0.0.0.dev0+labreplay.ddtree.pr29907",result="rolled_back"',
        ),
        # A failed rollback knows only its result: every other label is empty (to Prometheus, absent).
        (
            "sglang",
            {"result": "rollback_failed", "failure": "boom"},
            'service="sglang",config_hash="",invocation="",window="",budget="",topk="",algorithm="",'
            'sglang_version="",result="rollback_failed"',
        ),
        # Escaped as the exposition format wants: backslash, double quote, newline.
        (
            'a"b',
            {"result": "verified", "sglang_version": 'x\\y"z\nw', "algorithm": True},
            'service="a\\"b",config_hash="",invocation="",window="",budget="",topk="",algorithm="true",'
            'sglang_version="x\\\\y\\"z\\nw",result="verified"',
        ),
    ],
)
def test_the_textfile_says_what_runs_and_when_it_was_deployed(service, entry, labels):
    assert render_textfile(dict(entry, time=STAMP), service) == textfile(labels)


def test_the_textfile_is_written_atomically_with_the_record_and_not_in_check_mode(run_module, tmp_path):
    history = tmp_path / "history.jsonl"
    path = tmp_path / "textfile_collector" / "sglang_deploy.prom"
    record = dict(RECORD, config_hash="3f2a9c0d41be", algorithm="DFLASH", sglang_version="0.5.23")
    spec = {"path": str(path), "service": "sglang"}
    result, failed = run_module(
        "sglang_history",
        {"path": str(history), "record": record, "textfile": spec, "_ansible_check_mode": True},
    )
    assert not failed and result["textfile"] == {"path": str(path), "written": False}
    assert not path.parent.exists()
    result, failed = run_module(
        "sglang_history",
        {"path": str(history), "record": record, "textfile": spec, "secret_values": [SENTINEL]},
    )
    assert not failed and result["textfile"] == {"path": str(path), "written": True}
    written = json.loads(history.read_text())
    assert path.read_text() == render_textfile(written, "sglang")
    assert 'config_hash="3f2a9c0d41be"' in path.read_text() and 'result="verified"' in path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o755
    # Only the textfile in its directory: the temporary file was renamed over it.
    assert os.listdir(path.parent) == ["sglang_deploy.prom"]


def test_a_textfile_that_cannot_be_written_is_a_warning_and_the_record_stands(
    run_module, tmp_path, monkeypatch
):
    warned = []
    monkeypatch.setattr(AnsibleModule, "warn", lambda _self, text: warned.append(text))
    history = tmp_path / "history.jsonl"
    (tmp_path / "not-a-dir").write_text("")
    spec = {"path": str(tmp_path / "not-a-dir" / "sglang_deploy.prom"), "service": "sglang"}
    result, failed = run_module("sglang_history", {"path": str(history), "record": RECORD, "textfile": spec})
    assert not failed and result["changed"] is True
    assert result["textfile"]["error"].startswith(f"cannot write {spec['path']}: ")
    assert warned == [f"recorded, but the node_exporter textfile is not: {result['textfile']['error']}"]
    assert json.loads(history.read_text())["result"] == "verified"
