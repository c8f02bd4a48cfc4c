"""sglang_running_args: real main() on recorded systemctl/journalctl output and SGLang-built /server_info."""

from __future__ import annotations

import builtins
import json
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from ansible.module_utils import sglang_http, sglang_journal
from ansible.module_utils import sglang_running_args as running_args
from ansible.module_utils.basic import AnsibleModule
from conftest import FIXTURES

SENTINEL = "SENTINEL-SECRET-9f3c"
J = FIXTURES / "journal"
S = FIXTURES / "server_info"

EXPECTED_2048 = {
    "model_path": "/tmp/m",
    "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "/tmp/d",
    "speculative_draft_window_size": "2048",  # as sglang_argv's managed values: argv strings
    "port": "30000",
}


def show_text(name):
    """A recorded `systemctl show` plus the ActiveState the module also asks for (same file)."""
    return (J / name).read_text()


class FakeHost:
    """Answers the module's run_command / HTTP / /proc reads from recorded files."""

    def __init__(
        self,
        monkeypatch,
        show="show-2.txt",
        journal="inv-2.json",
        http=None,
        cmdline=S / "cmdline-dflash-2048.bin",
        sync_rc=0,
        environ=None,
        journal_dir=J,
        key=SENTINEL,
    ):
        self.calls = []
        self.streamed = 0  # journal lines handed to the reader
        self.show = (journal_dir / show).read_text()
        self.journal = (journal_dir / journal).read_text()
        self.environ = environ
        self.sync_rc = sync_rc
        self.http = (
            http if http is not None else {"/server_info": (200, (S / "dflash-2048.json").read_bytes())}
        )
        self.cmdline = cmdline
        # The recorded server ran with --api-key SENTINEL: like SGLang's auth middleware, the fake
        # refuses a request without that Bearer key (None: a server started without a key).
        self.key = key
        self.auth_seen = []
        monkeypatch.setattr(AnsibleModule, "run_command", self.run_command)
        monkeypatch.setattr(sglang_journal, "journal_lines", self.journal_lines)
        monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda _m, name, *a, **k: f"/usr/bin/{name}")
        # sglang_http.get builds the real headers and hands them to its one exchange with the server
        monkeypatch.setattr(sglang_http, "_exchange", self.exchange)
        real_open = builtins.open

        def fake_open(path, *args, **kwargs):
            if isinstance(path, str) and path.startswith("/proc/") and path.endswith("/environ"):
                if self.environ is None:
                    raise PermissionError(13, "Permission denied", path)
                return real_open(self.environ, *args, **kwargs)
            if isinstance(path, str) and path.startswith("/proc/") and path.endswith("/cmdline"):
                if self.cmdline is None:
                    raise FileNotFoundError(2, "No such file or directory", path)
                return real_open(self.cmdline, *args, **kwargs)
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", fake_open)

    def run_command(self, cmd, **_kw):
        self.calls.append(list(cmd))
        if cmd[0].endswith("systemctl"):
            assert cmd[1] == "show"
            return 0, self.show, ""
        # Only the sync goes through run_command: the journal itself is read streamed (journal_lines).
        if cmd[0].endswith("journalctl") and cmd[1:] == ["--sync"]:
            return (
                self.sync_rc,
                "",
                "Failed to connect to journald: Permission denied" if self.sync_rc else "",
            )
        raise AssertionError(f"unexpected command {cmd}")

    def journal_lines(self, cmd):
        """journalctl's output as sglang_journal streams it (the invocation's lines read from the oldest)."""
        self.calls.append(list(cmd))
        assert "-u" not in cmd, "journalctl -u must never be used as evidence"
        assert "--all" in cmd, "without --all, journalctl -o json drops fields > 4096 bytes"
        for line in self.journal.splitlines(keepends=True):
            self.streamed += 1
            yield line.encode()

    def exchange(self, url, headers, timeout):
        path = urlsplit(url).path
        self.auth_seen.append(headers.get("Authorization"))
        status, body = self.http.get(path, (404, b'{"detail":"Not Found"}'))
        if self.key and headers.get("Authorization") != f"Bearer {self.key}":
            status, body = 401, b'{"error": "Unauthorized"}'
        return status, body


def args(**kw):
    base = {
        "port": 30000,
        "unit": "h3a-sglang.service",
        "expected": dict(EXPECTED_2048),
        "api_key": SENTINEL,
        "secret_values": [SENTINEL],
    }
    base.update(kw)
    return base


@pytest.fixture
def run(run_module):
    def _run(a):
        result, failed = run_module("sglang_running_args", a)
        # P13: the sentinel is in every recorded source (server_args line, /server_info api_key and
        # launch_command, cmdline); it must never reach the module result.
        assert SENTINEL not in run_module.last_output
        return result, failed

    return _run


def test_current_invocation_matches_in_all_three_sources(monkeypatch, run):
    host = FakeHost(monkeypatch)
    result, failed = run(args())
    assert not failed, result["msg"]
    assert result["changed"] is False
    assert result["diff"] == []
    assert result["source"] == "/server_info"
    assert set(result["reported"]) == {"server_info", "journal", "cmdline"}
    for src in ("server_info", "journal"):
        assert result["reported"][src]["speculative_draft_window_size"] == 2048
    assert result["reported"]["cmdline"]["speculative_draft_window_size"] == "2048"
    ev = result["evidence"]
    assert ev["invocation_id"] == "5f67eaa332b14ce095abdbeeeb5c0407"
    assert ev["main_pid"] == 98
    assert ev["server_args_form"] == "dict" and ev["server_args_partial"] is False
    assert ev["runner"] == {
        "runner": "DFLASH draft runner",
        "algorithm": "DFLASH",
        "attention_backend": "triton",
        "model": "DFlashDraftModel",
        "block_size": 16,
        "draft_window_size": 2048,
        "compact_cache": True,
    }
    assert result["read_from"]["speculative_draft_window_size"] == [
        "/server_info",
        "journal server_args",
        "/proc/98/cmdline",
        "DFLASH draft runner",
    ]
    # the second request, without the key, is the proof that the server requires that key (401)
    assert host.auth_seen == [f"Bearer {SENTINEL}", None]
    journal_cmd = [c for c in host.calls if c[0].endswith("journalctl") and c[1] != "--sync"][0]
    assert journal_cmd[-3:] == ["_SYSTEMD_INVOCATION_ID=5f67eaa332b14ce095abdbeeeb5c0407", "+", "_PID=98"]


def test_check_mode_runs_the_same_read_only_checks(monkeypatch, run):
    FakeHost(monkeypatch)
    result, failed = run(args(_ansible_check_mode=True))
    assert not failed and result["changed"] is False and result["diff"] == []
    assert result["evidence"]["runner"]["draft_window_size"] == 2048


def test_seed_incident_old_run_fails_although_unit_output_has_a_2048_line_later(monkeypatch, run):
    # Invocation 1 ran without the window; `journalctl -u` output also holds invocation 2's
    # 2048 line AFTER it. Only invocation 1's lines may count.
    FakeHost(
        monkeypatch,
        show="show-1.txt",
        journal="unit-all.json",
        http={"/server_info": (200, (S / "dflash-nowindow.json").read_bytes())},
    )
    result, failed = run(args())
    assert failed
    assert (
        "speculative_draft_window_size: expected 2048, running None "
        "(journal server_args, invocation 8a886876e13c4b869ed14adebc8adc35)"
    ) not in result["diff"]
    assert (
        "speculative_draft_window_size: expected 2048, running None "
        "(journal server_args, invocation d5e6d014036b4b5bb5567b6ccf223302)"
    ) in result["diff"]
    assert "speculative_draft_window_size: expected 2048, running None (/server_info)" in result["diff"]
    assert any("DFLASH draft runner reports draft_window_size=None" in d for d in result["diff"])
    assert result["evidence"]["runner"]["draft_window_size"] is None
    assert result["msg"].startswith("running SGLang arguments do not match the intended ones:\n")


def test_later_lines_of_other_invocations_are_ignored(monkeypatch, run):
    # Current = invocation 2 (DFLASH 2048); unit output ends with invocation 3's NGRAM line and
    # SGLang's "has no effect" warning: neither belongs to invocation 2.
    host = FakeHost(monkeypatch, show="show-2.txt", journal="unit-all.json")
    result, failed = run(args())
    assert not failed, result["msg"]
    assert result["evidence"]["window_messages"] == []
    # invocation 2's own lines plus systemd's lines about it (INVOCATION_ID=, _PID=1), nothing else, up to
    # its main process's ready line: the reader stops there (sglang_journal.stream_entries)
    lines = (J / "unit-all.json").read_text().splitlines()
    mine = [
        e
        for e in map(json.loads, lines)
        if "5f67eaa332b14ce095abdbeeeb5c0407" in (e.get("_SYSTEMD_INVOCATION_ID"), e.get("INVOCATION_ID"))
    ]
    ready = next(i for i, e in enumerate(mine) if e["_PID"] == "98" and "ready to roll" in e["MESSAGE"])
    assert (len(mine), ready) == (14, 9)
    assert result["evidence"]["journal_entries"] == len(mine[: ready + 1])
    assert host.streamed == 1 + lines.index(json.dumps(mine[ready], separators=(",", ":")))
    assert not any("read to its end" in n for n in result["evidence"]["notes"])


@pytest.mark.parametrize("ready_line", ["recorded", "a build without it"])
def test_left_over_process_line_with_new_invocation_id_is_ignored(monkeypatch, run, tmp_path, ready_line):
    # KillMode=process: PID 162 of the old run logs the window-None line AFTER the restart, and
    # journald tags it with the NEW invocation id (recorded). Only MainPID's line counts. As recorded, it
    # comes after MainPID's ready line, where the reader stops; for a build that logs no such line the
    # reader goes on to the end, and the PID check sets it aside.
    lines = (J / "stale-inv-2.json").read_text().splitlines(keepends=True)
    entries = [json.loads(x) for x in lines]
    stale = [e for e in entries if str(e["_PID"]) == "162"]
    assert stale and stale[0]["_SYSTEMD_INVOCATION_ID"] == "7639c897365042fe9cf56a91777d626c"
    assert "ready to roll" in entries[-2]["MESSAGE"] and entries[-1]["_PID"] == "162"
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "stale-show-2.txt").write_text((J / "stale-show-2.txt").read_text())
    if ready_line == "recorded":
        (journal / "inv.json").write_text("".join(lines))
    else:
        (journal / "inv.json").write_text("".join(lines[:-2] + lines[-1:]))
    host = FakeHost(monkeypatch, show="stale-show-2.txt", journal="inv.json", journal_dir=journal)
    result, failed = run(args(unit="h3a-stale.service"))
    assert not failed, result["msg"]
    assert result["reported"]["journal"]["speculative_draft_window_size"] == 2048
    read_to_end = any("read to its end" in n for n in result["evidence"]["notes"])
    if ready_line == "recorded":
        assert host.streamed == len(lines) - 1 and not read_to_end
        assert result["evidence"]["ignored"] == []
    else:
        assert host.streamed == len(lines) - 1 and read_to_end
        assert result["evidence"]["ignored"] == [
            "server_args line from PID 162 ignored: not MainPID 165 (left over from an older run?)"
        ]


def test_mismatch_fails_with_a_diff_line_per_source(monkeypatch, run):
    FakeHost(monkeypatch)
    expected = dict(EXPECTED_2048, speculative_draft_window_size=4096)
    result, failed = run(args(expected=expected))
    assert failed
    assert "speculative_draft_window_size: expected 4096, running 2048 (/server_info)" in result["diff"]
    assert (
        "speculative_draft_window_size: expected 4096, running 2048 "
        "(journal server_args, invocation 5f67eaa332b14ce095abdbeeeb5c0407)"
    ) in result["diff"]
    assert "speculative_draft_window_size: expected 4096, running 2048 (/proc/98/cmdline)" in result["diff"]
    assert any("DFLASH draft runner reports draft_window_size=2048" in d for d in result["diff"])
    for line in result["diff"]:
        assert line in result["msg"]


def test_missing_server_args_line_fails(monkeypatch, run):
    # Recorded without --all: journalctl printed "MESSAGE": null for the 19 KB line.
    FakeHost(monkeypatch, journal="inv-2-without-all.json")
    result, failed = run(args())
    assert failed
    assert any(
        "no server_args= line from MainPID 98 in the journal of invocation "
        "5f67eaa332b14ce095abdbeeeb5c0407" in f
        for f in result["failures"]
    )


def test_old_server_falls_back_to_get_server_info(monkeypatch, run):
    FakeHost(monkeypatch, http={"/get_server_info": (200, (S / "dflash-2048.json").read_bytes())})
    result, failed = run(args())
    assert not failed, result["msg"]
    assert result["source"] == "/get_server_info"
    assert result["evidence"]["http_attempts"] == ["/server_info -> 404", "/get_server_info -> 200"]


def test_401_without_api_key_names_the_missing_key(monkeypatch, run):
    # SGLang's middleware answers {"error": "Unauthorized"} (srt/utils/auth.py).
    host = FakeHost(monkeypatch, http={"/server_info": (401, b'{"error": "Unauthorized"}')})
    a = args()
    del a["api_key"]
    result, failed = run(a)
    assert failed
    assert host.auth_seen == [None]
    assert (
        "GET /server_info returned 401: no api_key was given but the server requires one (--api-key)"
        in result["failures"]
    )
    # the journal and cmdline sources are still reported
    assert result["reported"]["journal"]["speculative_draft_window_size"] == 2048


def test_window_ignored_warning_fails(monkeypatch, run):
    FakeHost(
        monkeypatch,
        show="show-3.txt",
        journal="inv-3.json",
        http={"/server_info": (200, (S / "ngram-window.json").read_bytes())},
        cmdline=None,
    )
    expected = {
        "model_path": "/tmp/m",
        "speculative_algorithm": "NGRAM",
        "speculative_draft_window_size": 2048,
    }
    result, failed = run(args(expected=expected))
    assert failed
    warning = (
        "--speculative-draft-window-size has no effect with speculative_algorithm=NGRAM (honored by DFLASH, "
        "Llama EAGLE-3, and the EAGLE/MTP/NEXTN draft-decode path on the Triton/FlashInfer draft backends)."
    )
    assert any(
        warning in d and d.startswith("speculative_draft_window_size: SGLang reports it ignores")
        for d in result["diff"]
    )
    assert any("has no effect with speculative_algorithm=NGRAM (SGLang honours" in d for d in result["diff"])
    assert "cannot read /proc/103/cmdline: No such file or directory" in result["failures"]


def test_require_window_passes_when_runner_line_confirms(monkeypatch, run):
    FakeHost(monkeypatch)
    result, failed = run(args(require_window=True))
    assert not failed, result["msg"]


def test_require_window_without_window_in_expected_fails(monkeypatch, run):
    FakeHost(monkeypatch)
    expected = {k: v for k, v in EXPECTED_2048.items() if k != "speculative_draft_window_size"}
    result, failed = run(args(expected=expected, require_window=True))
    assert failed
    assert "require_window is set but expected has no speculative_draft_window_size" in result["diff"]


def test_restarted_since_verification_fails(monkeypatch, run):
    FakeHost(monkeypatch)
    result, failed = run(args(invocation_id="d5e6d014036b4b5bb5567b6ccf223302"))
    assert failed
    assert (
        "now runs invocation 5f67eaa332b14ce095abdbeeeb5c0407, not d5e6d014036b4b5bb5567b6ccf223302"
        in result["msg"]
    )


def test_journal_sync_failure_is_tolerated_and_noted(monkeypatch, run):
    FakeHost(monkeypatch, sync_rc=1)
    result, failed = run(args())
    assert not failed, result["msg"]
    assert result["evidence"]["notes"][0].startswith("journalctl --sync failed (rc=1)")


def test_not_running_unit_fails(monkeypatch, run):
    FakeHost(monkeypatch, show="bytes-show.txt")
    result, failed = run(args())
    assert failed
    assert "has no running main process (InvocationID=none, MainPID=0" in result["msg"]


def test_alias_spelling_in_reported_source_satisfies_canonical_key():
    assert running_args.managed_view(
        {"speculative_dflash_draft_window_size": 2048}, {"speculative_draft_window_size": 2048}
    ) == {"speculative_draft_window_size (as speculative_dflash_draft_window_size)": 2048}


# --------------------------------------------------------------------- DDTREE (the lab DDTree build)
# Recorded on lab host lab1 from the verified deploy of `-e @inventory/lab/ddtree.yml -e budget=8 -e topk=4
# -e window=4096` (tests/fixtures/ddtree/lab-run/SOURCE.md).
DD = FIXTURES / "ddtree" / "lab-run"
DD_EXPECTED = {
    "model_path": "/srv/models/lab-target",
    "speculative_algorithm": "DDTREE",
    "speculative_draft_model_path": "/srv/models/lab-dflash-draft",
    "speculative_draft_window_size": 4096,
    "speculative_ddtree_budget": 8,
    "page_size": 1,
    "port": 30001,
}
DD_RUNNERS = {"window": "DFLASH draft runner", "budget": "DDTree worker"}


def ddtree_host(monkeypatch, environ=DD / "environ.bin"):
    return FakeHost(
        monkeypatch,
        show="show.txt",
        journal="inv.json",
        journal_dir=DD,
        cmdline=DD / "cmdline.bin",
        http={"/server_info": (200, (DD / "server_info.json").read_bytes())},
        environ=environ,
        key=None,  # the recorded DDTree server ran without --api-key
    )


def ddtree_args(**kw):
    base = dict(
        port=30001,
        unit="sglang-k26-ddtree.service",
        expected=DD_EXPECTED,
        require_window=True,
        runner_lines=DD_RUNNERS,
        expected_env={"SGLANG_DDTREE_MAX_TOPK": "4"},
    )
    base.update(kw)
    return base


def test_ddtree_deploy_verifies_window_budget_and_env_topk(monkeypatch, run):
    ddtree_host(monkeypatch)
    result, failed = run(ddtree_args())
    assert not failed, result["msg"]
    assert result["summary"]["SGLANG_DDTREE_MAX_TOPK"] == "4 (from /proc/949/environ)"
    assert result["read_from"]["speculative_ddtree_budget"][-1] == "DDTree worker"
    assert result["read_from"]["speculative_draft_window_size"][-1] == "DFLASH draft runner"
    assert result["evidence"]["runner"]["draft_window_size"] == 4096
    # the build's resolution-time warning is contradicted by its running worker: recorded, not fatal
    assert any("has no effect with speculative_algorithm=DDTREE" in w for w in result["evidence"]["warnings"])


def test_ddtree_wrong_env_topk_or_unreadable_environ_fails(monkeypatch, run):
    ddtree_host(monkeypatch)
    result, failed = run(ddtree_args(expected_env={"SGLANG_DDTREE_MAX_TOPK": "2"}))
    assert failed and "SGLANG_DDTREE_MAX_TOPK: expected 2, running 4 (/proc/949/environ)" in result["diff"]
    ddtree_host(monkeypatch, environ=None)
    result, failed = run(ddtree_args())
    assert failed and "cannot read /proc/949/environ: Permission denied (needs root)" in result["failures"]


def test_nccl_p2p_disable_is_read_from_the_running_process(monkeypatch, run, tmp_path):
    """Issue 18, item 6: the role passes NCCL_P2P_DISABLE=1 in expected_env when the inventory decided
    nvidia_nccl_p2p_disable: true (roles/sglang/vars/main.yml __sglang_expected_env); it is proven from
    /proc/<MainPID>/environ of the running process, and a process started without it fails."""
    environ = tmp_path / "environ.bin"
    environ.write_bytes((DD / "environ.bin").read_bytes() + b"NCCL_P2P_DISABLE=1\0")
    expected_env = {"SGLANG_DDTREE_MAX_TOPK": "4", "NCCL_P2P_DISABLE": "1"}
    ddtree_host(monkeypatch, environ=environ)
    result, failed = run(ddtree_args(expected_env=expected_env))
    assert not failed, result["msg"]
    assert result["summary"]["NCCL_P2P_DISABLE"] == "1 (from /proc/949/environ)"
    assert result["read_from"]["NCCL_P2P_DISABLE"] == ["/proc/949/environ"]
    ddtree_host(monkeypatch)  # the recorded process: started without NCCL_P2P_DISABLE
    result, failed = run(ddtree_args(expected_env=expected_env))
    assert failed
    assert (
        "NCCL_P2P_DISABLE: expected 1, not in the environment of MainPID 949 (/proc/949/environ)"
        in (result["diff"])
    )


def test_ddtree_wrong_window_or_budget_is_caught_by_the_worker_lines(monkeypatch, run):
    ddtree_host(monkeypatch)
    result, failed = run(ddtree_args(expected=dict(DD_EXPECTED, speculative_draft_window_size=2048)))
    assert failed
    assert any(
        "expected 2048, DFLASH draft runner reports draft_window_size=4096" in d for d in result["diff"]
    )
    result, failed = run(ddtree_args(expected=dict(DD_EXPECTED, speculative_ddtree_budget=16)))
    assert failed and any("DDTree worker reports tree_budget=8" in d for d in result["diff"])


def test_ddtree_with_a_window_is_not_refused_as_an_algorithm_without_one(monkeypatch, run):
    # the bug of issue 13: every DDTREE deploy with a window failed AFTER the restart
    ddtree_host(monkeypatch)
    result, _ = run(ddtree_args())
    assert not any(
        "has no effect with speculative_algorithm=DDTREE (SGLang honours" in d for d in result["diff"]
    )


def test_the_key_is_proven_by_a_refusal_without_it(monkeypatch, run):
    """The server answers with the intended key and refuses the same request without one (401): it runs
    with THAT key (read from its --config file, never on a command line), and the key is never shown."""
    host = FakeHost(monkeypatch)
    result, failed = run(args())
    assert not failed, result["msg"]
    assert host.auth_seen[:2] == [f"Bearer {SENTINEL}", None]
    assert result["evidence"]["key_required"] == (
        "required: GET /server_info answered 200 with the intended key, 401 without a key"
    )


def test_a_server_that_answers_without_the_key_fails(monkeypatch, run):
    """A server started without the key (its --config file lost, say) answers anyone: not the intended
    configuration, although the request with the key succeeds."""
    FakeHost(monkeypatch, key=None)
    result, failed = run(args())
    assert failed
    assert (
        "GET /server_info without the API key returned 200, not 401: the running server does not require "
        "the intended API key (it was started without --api-key, or its --config file lacks it)"
        in result["failures"]
    )


# ---- the whole command line (expected_argv) --------------------------------------------------------
# cmdline-dflash-2048.bin as a list: the lab launcher and the argv SGLang got (server_info/SOURCE.md).
RECORDED_ARGV = [a.decode() for a in (S / "cmdline-dflash-2048.bin").read_bytes().split(b"\0")[:-1]]


def test_the_whole_command_line_as_rendered_passes(monkeypatch, run):
    FakeHost(monkeypatch)
    assert RECORDED_ARGV[:2] == ["/opt/sglang/venv/bin/python", "/opt/sglang-lab/sglang_lab_server.py"]
    result, failed = run(args(expected_argv=RECORDED_ARGV))
    assert not failed, result["msg"]
    assert result["argv_diff"] == [] and result["diff"] == []


def test_a_flag_the_role_did_not_render_fails_naming_the_flag(monkeypatch, run):
    """The process runs --device cuda, which the rendered argv lacks (a drop-in's ExecStart): every managed
    key still agrees, only the whole-argv comparison sees it."""
    FakeHost(monkeypatch)
    rendered = [
        a
        for i, a in enumerate(RECORDED_ARGV)
        if a != "--device" and not (i and RECORDED_ARGV[i - 1] == "--device")
    ]
    result, failed = run(args(expected_argv=rendered))
    assert failed
    assert result["argv_diff"] == [
        "--device: a flag the role did not render is in /proc/98/cmdline (unmanaged, value cuda)"
    ]
    assert result["argv_diff"][0] in result["msg"]


def test_the_running_release_is_asserted_by_server_info_version_and_cmdline_path(monkeypatch, run):
    """The recorded server runs SGLang 0.5.23 from /opt/sglang/venv: that release passes; another release
    directory or version fails naming what runs (issue 14 item 1: the running version after every restart)."""
    FakeHost(monkeypatch)
    result, failed = run(args(expected_release={"path": "/opt/sglang/venv", "version": "0.5.23"}))
    assert not failed, result["msg"]
    assert result["reported"]["release"] == {"version": "0.5.23", "argv0": "/opt/sglang/venv/bin/python"}
    FakeHost(monkeypatch)
    want = {"path": "/opt/sglang/releases/0.5.24-py3.11-0123456789ab", "version": "0.5.24"}
    result, failed = run(args(expected_release=want))
    assert failed
    assert [d for d in result["diff"] if d.startswith(("version:", "release:"))] == [
        "version: expected SGLang 0.5.24 (release /opt/sglang/releases/0.5.24-py3.11-0123456789ab), "
        "/server_info reports '0.5.23'",
        "release: expected a process of the release /opt/sglang/releases/0.5.24-py3.11-0123456789ab, "
        "/proc/98/cmdline starts with '/opt/sglang/venv/bin/python'",
    ]
    # /opt/sglang/venv-old is not inside /opt/sglang/venv.
    FakeHost(monkeypatch)
    result, failed = run(args(expected_release={"path": "/opt/sglang/ven", "version": "0.5.23"}))
    assert failed and "release: expected a process of the release /opt/sglang/ven," in result["msg"]


def test_a_missing_flag_another_value_and_another_launcher_are_named_and_the_key_never_shown(
    monkeypatch, run
):
    FakeHost(monkeypatch)
    rendered = ["/opt/sglang/venv/bin/sglang", "serve"] + RECORDED_ARGV[2:] + ["--enable-metrics"]
    rendered[rendered.index("--port") + 1] = "30001"
    rendered[rendered.index("--api-key") + 1] = "another-key-0000"
    # A caller that renders a key into the argv names it in secret_values (no_log: masked everywhere).
    result, failed = run(args(expected_argv=rendered, secret_values=[SENTINEL, "another-key-0000"]))
    assert failed
    assert result["argv_diff"] == [
        "launcher: expected /opt/sglang/venv/bin/sglang serve, running /opt/sglang/venv/bin/python "
        "/opt/sglang-lab/sglang_lab_server.py (/proc/98/cmdline)",
        "--enable-metrics: rendered by the role, missing from /proc/98/cmdline",
        "the value of --api-key, a secret, is not the rendered one (/proc/98/cmdline)",
        "--port: expected 30001, running 30000 (/proc/98/cmdline)",
    ]
    assert "another-key-0000" not in json.dumps(result)


def test_a_systemd_variable_reference_matches_any_value(monkeypatch, run):
    FakeHost(monkeypatch)
    rendered = list(RECORDED_ARGV)
    rendered[rendered.index("--api-key") + 1] = "${SGLANG_API_KEY}"
    result, failed = run(args(expected_argv=rendered))
    assert not failed, result["msg"]


def test_a_console_script_launcher_runs_under_its_shebang_interpreter(monkeypatch, run, tmp_path):
    """ExecStart=<venv>/bin/sglang serve ...: the kernel execs the #! interpreter with the script's path in
    front of the arguments. A real process is started here and its real /proc/<pid>/cmdline read."""
    script = tmp_path / "sglang"
    script.write_text("#!/usr/bin/python3\nimport time\ntime.sleep(30)\n")
    script.chmod(0o755)
    rendered = [str(script), "serve"] + RECORDED_ARGV[2:]
    proc = subprocess.Popen(rendered)
    try:
        deadline = time.monotonic() + 10
        while True:
            raw = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
            if raw.startswith(b"/usr/bin/python3\0") or time.monotonic() > deadline:
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    (tmp_path / "cmdline.bin").write_bytes(raw)
    assert raw.split(b"\0")[:2] == [b"/usr/bin/python3", str(script).encode()]
    FakeHost(monkeypatch, cmdline=tmp_path / "cmdline.bin")
    result, failed = run(args(expected_argv=rendered))
    assert not failed, result["msg"]
    result, failed = run(args(expected_argv=rendered + ["--enable-metrics"]))
    assert failed
    assert result["argv_diff"] == ["--enable-metrics: rendered by the role, missing from /proc/98/cmdline"]
