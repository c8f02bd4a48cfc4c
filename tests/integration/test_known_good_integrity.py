"""Known-good is exactly what was verified (issue 14, item 3), against the shared lab host.

Order (one module, top to bottom; each test leaves the baseline deployed):
  1. a deploy whose server loads until the test lets it (SGLANG_LAB_LOAD_UNTIL, at most 8 s) runs in a
     thread; while it is in its verified restart (the deploy lock says "restarting"), the environment file
     is changed by hand, then the load ends. The restart proves the server it started, but the record finds
     the env file is not the one that restart ran: the run fails naming it, the known-good set and its
     metadata are unchanged, no "verified" record is written, and the rollback puts the known-good files
     back (the hand edit kept in previous/);
  2. the known-good env copy is tampered with, then a change that crashes after start
     (SGLANG_LAB_CRASH_AFTER) is deployed: the rollback refuses the tampered copy naming it and writes
     nothing (the crashing env file stays on disk), the run fails. The test puts the copy back and the
     baseline in a finally.
"""

from __future__ import annotations

import base64
import json
import shlex
import threading
import time

ENV_PATH = "/etc/sglang/sglang.env"
KNOWN_GOOD = "/var/lib/sglang-deploy/known-good"
KNOWN_GOOD_ENV = f"{KNOWN_GOOD}/sglang.env"
KNOWN_GOOD_META = f"{KNOWN_GOOD}/sglang.json"
PREVIOUS_ENV = "/var/lib/sglang-deploy/previous/sglang.env.previous"
LOCK_FILE = "/run/sglang-deploy/sglang.lock"
PLAY = "playbooks/sglang.yml"
FAST = {"sglang_stable_seconds": 6, "sglang_health_count": 2}
HAND_EDIT = "# changed by hand during the stability window\n"
# The test ends the restart's slow load (SGLANG_LAB_LOAD_UNTIL) once its hand edit is on disk.
LOAD_GATE = "/run/sglang-lab-load-gate"


def flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def around(text: str, phrase: str) -> str:
    at = text.find(phrase)
    return text[-3000:] if at < 0 else text[max(at - 300, 0) : at + 1200]


def write_bytes(lab_host, path: str, data: bytes) -> None:
    encoded = base64.b64encode(data).decode()
    lab_host.ssh(f"echo {encoded} | base64 -d > {shlex.quote(path)}")


def lock_doing(lab_host) -> str:
    text = lab_host.ssh(f"cat {LOCK_FILE} 2>/dev/null || true").stdout
    return json.loads(text).get("doing", "") if text.strip() else ""


def test_file_changed_during_the_stability_window_is_not_recorded(lab_host):
    meta_before = lab_host.read_bytes(KNOWN_GOOD_META)
    env_copy_before = lab_host.read_bytes(KNOWN_GOOD_ENV)
    history_before = len(lab_host.history())
    good = lab_host.state()
    # A restart that takes a few seconds to become ready, then 6 s of stability: the window for the edit.
    extra = dict(
        FAST, sglang_environment={"SGLANG_LAB_LOAD_SECONDS": "8", "SGLANG_LAB_LOAD_UNTIL": LOAD_GATE}
    )
    lab_host.ssh(f"rm -f {LOAD_GATE}")
    result = {}
    run = threading.Thread(
        target=lambda: result.update(r=lab_host.playbook("-e", "window=2048", extra=extra, playbook=PLAY))
    )
    try:
        run.start()
        deadline = time.monotonic() + 240
        while not lock_doing(lab_host).startswith("restarting"):
            assert run.is_alive(), "the deploy ended before its verified restart"
            assert time.monotonic() < deadline, "the deploy never reached its verified restart"
            time.sleep(0.5)
        lab_host.ssh(f"printf %s {shlex.quote(HAND_EDIT)} >> {ENV_PATH}")
        edited = lab_host.read_bytes(ENV_PATH)
        lab_host.ssh(f"touch {LOAD_GATE}")  # edited: the load may end now
        run.join(timeout=600)
        r = result["r"]
        text = flat(r)
        assert r.returncode != 0, "a file changed after the restart must fail the run"
        failure = around(text, "not kept as known-good")
        assert (
            f"not kept as known-good, not recorded: changed since the verified restart started it: {ENV_PATH}"
            in (text)
        ), failure
        assert "NOTHING was recorded as known-good" in text, failure
        assert "/etc/systemd/system/sglang.service (sha256" not in text, failure
        # Nothing became known-good; no verified record; the rollback restored the known-good set, whose
        # metadata now names the rollback's verified invocation (what drift compares with, P17) and only that.
        meta_after = json.loads(lab_host.read_bytes(KNOWN_GOOD_META))
        assert meta_after.pop("invocation_id") == lab_host.state().invocation_id
        assert meta_after == {k: v for k, v in json.loads(meta_before).items() if k != "invocation_id"}
        assert lab_host.read_bytes(KNOWN_GOOD_ENV) == env_copy_before
        records = lab_host.history()[history_before:]
        assert [rec["result"] for rec in records] == ["rolled_back"], records
        assert "ROLLED BACK to the known-good configuration" in text, around(text, "ROLLED BACK")
        after = lab_host.state()
        assert after.active_state == "active" and after.env_sha256 == good.env_sha256
        assert lab_host.read_bytes(ENV_PATH) == env_copy_before
        assert lab_host.read_bytes(PREVIOUS_ENV) == edited  # the hand edit is kept, not lost
    finally:
        lab_host.ssh(f"touch {LOAD_GATE}")
        run.join(timeout=600)
        lab_host.ssh(f"rm -f {LOAD_GATE}")
        lab_host.restore_baseline()


def test_tampered_known_good_env_makes_the_rollback_refuse(lab_host):
    original = lab_host.read_bytes(KNOWN_GOOD_ENV)
    try:
        write_bytes(lab_host, KNOWN_GOOD_ENV, original + b"SGLANG_LAB_TAMPERED=1\n")
        history_before = len(lab_host.history())
        crash = dict(FAST, sglang_environment={"SGLANG_LAB_CRASH_AFTER": "3"})
        r = lab_host.playbook("-e", "window=2048", extra=crash, playbook=PLAY)
        text = flat(r)
        assert r.returncode != 0
        refusal = around(text, "rollback of sglang.service refused")
        assert "ROLLBACK FAILED as well" in text, refusal
        assert (
            "rollback of sglang.service refused: the known-good copies are not the ones that were verified"
            in (text)
        ), refusal
        assert f"{KNOWN_GOOD_ENV} (sha256" in text and "Refused: nothing was written" in text, refusal
        assert f"{KNOWN_GOOD}/sglang.service (sha256" not in text, refusal
        # Nothing was written: the crashing env file the failed deploy wrote is still there.
        env = lab_host.read_bytes(ENV_PATH).decode()
        assert "SGLANG_LAB_CRASH_AFTER" in env and "SGLANG_LAB_TAMPERED" not in env
        records = lab_host.history()[history_before:]
        assert [rec["result"] for rec in records] == ["rollback_failed"], records
    finally:
        write_bytes(lab_host, KNOWN_GOOD_ENV, original)
        lab_host.restore_baseline()
    assert lab_host.state().active_state == "active"
