"""Check mode, awkward-but-legal values, secrets and rollback, against the shared lab host.

Order (one module, tests depend on the module fixtures, run top to bottom):
  1. one real deploy with awkward values (a model path with spaces and %, a served name with $ and
     quotes) and a sentinel API key: the argv systemd runs (/proc/<MainPID>/cmdline) equals the intended
     argv, the sentinel appears nowhere but in SGLang's --config file (0640 root:sglang), no local user
     reads it from any process's /proc/<pid>/cmdline, the verifier works with the key;
  2. `-e window=4096 --check --diff -vvvv` with the key: shows 2048 -> 4096 in the unit diff and in the
     argument diff, no sentinel, and changes nothing;
  3. on top of that verified configuration, a change that crashes after start (SGLANG_LAB_CRASH_AFTER):
     the run fails, says what failed and what was restored, the host is back on the good files with a
     new verified invocation, and history has a rolled_back record;
  4. the module's finalizer deploys the baseline again and removes the model copy.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

SENTINEL = "SENTINEL-SECRET-9f3c"
AWKWARD_MODEL = "/srv/models/lab target 100%"
AWKWARD_NAME = "lab \"$HOME\" 'q' 100%"
# The lab launcher (inventory/lab/group_vars/lab/lab.yml) with the role's default venv: the release's python
# (/opt/sglang/releases/0.5.23-...) runs the redacting launcher, which runs the lab server.
LAB_SERVER = [
    "/usr/local/lib/sglang-deploy/sglang_launch.py",
    "--script",
    "/opt/sglang-lab/sglang_lab_server.py",
]
CONFIG_PATH = "/etc/sglang/sglang.yaml"


def flat(r) -> str:
    """Output with whitespace normalised (the yaml result format folds long lines)."""
    return " ".join((r.stdout + r.stderr).split())


def recap(text: str) -> str:
    return text[text.rindex("PLAY RECAP") :]


def value_after(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


@pytest.fixture(scope="module")
def awkward_secret(lab_host):
    """A verified deploy with awkward values and the sentinel key; the baseline is restored after."""
    copy = shlex.quote(AWKWARD_MODEL)
    lab_host.ssh(f"rm -rf {copy} && cp -a /srv/models/lab-target {copy}")
    extra = {
        "sglang_model_path": AWKWARD_MODEL,
        "sglang_served_model_name": AWKWARD_NAME,
        "sglang_api_key": SENTINEL,
        "sglang_stable_seconds": 6,
        "sglang_health_count": 2,
    }
    before = lab_host.state()
    r = lab_host.playbook("-e", "window=2048", extra=extra)
    try:
        yield {"extra": extra, "deploy": r, "before": before, "after": lab_host.state()}
    finally:
        lab_host.restore_baseline()
        lab_host.ssh(f"rm -rf {shlex.quote(AWKWARD_MODEL)}")


def test_awkward_values_round_trip_to_the_process(lab_host, awkward_secret):
    r = awkward_secret["deploy"]
    assert r.returncode == 0, (r.stdout + r.stderr)[-8000:]
    state = awkward_secret["after"]
    assert state.active_state == "active"
    assert state.invocation_id != awkward_secret["before"].invocation_id, "the change was not restarted"
    argv = lab_host.cmdline(state.main_pid)
    record = lab_host.history()[-1]
    assert record["result"] == "verified" and record["invocation_id"] == state.invocation_id
    # The intended argv as the role recorded it: the key is not in it, SGLang reads it from --config.
    release = lab_host.ssh("ls -d /opt/sglang/releases/0.5.23-*").stdout.split()
    assert len(release) == 1, release
    intended = [f"{release[0]}/bin/python", *LAB_SERVER] + shlex.split(record["argv"])
    assert argv == intended
    assert "--api-key" not in argv and value_after(argv, "--config") == CONFIG_PATH
    assert value_after(argv, "--model-path") == AWKWARD_MODEL
    assert value_after(argv, "--served-model-name") == AWKWARD_NAME
    # And the server reports the awkward name back (the verifier compared it too).
    body = lab_host.ssh(
        "python3 -c "
        + shlex.quote(
            "import json,sys,urllib.request as u;"
            "r=u.Request('http://127.0.0.1:30000/v1/models',headers={'Authorization':'Bearer '+sys.argv[1]});"
            "print(json.dumps([m['id'] for m in json.load(u.urlopen(r,timeout=10))['data']]))"
        )
        + " "
        + shlex.quote(SENTINEL)
    ).stdout
    assert json.loads(body) == [AWKWARD_NAME]


def test_secret_appears_nowhere_but_sglangs_config_file(lab_host, awkward_secret):
    r = awkward_secret["deploy"]
    assert r.returncode == 0
    assert SENTINEL not in r.stdout + r.stderr
    unit = lab_host.read_bytes("/etc/systemd/system/sglang.service").decode()
    assert SENTINEL not in unit and "--api-key" not in unit
    assert f'"--config" "{CONFIG_PATH}"' in unit
    show = lab_host.ssh("systemctl show -p Environment -p ExecStart sglang.service").stdout
    assert f"--config {CONFIG_PATH}" in show and SENTINEL not in show
    history = lab_host.ssh("cat /var/lib/sglang-deploy/history.jsonl").stdout
    assert SENTINEL not in history
    # The journal (readable by adm and systemd-journal, shipped wherever logs go): the launcher redacts the
    # key in the server's own process, and the server_args= line the assertion reads is still there.
    journal = lab_host.ssh("journalctl -u sglang.service --no-pager -o cat").stdout
    assert SENTINEL not in journal
    assert "server_args=" in journal and "<redacted>" in journal, journal[-3000:]
    assert SENTINEL not in lab_host.read_bytes("/etc/sglang/sglang.env").decode()
    # SGLang's --config file carries it: readable by root and the service's group only.
    assert lab_host.ssh(f"stat -c '%a %U %G' {CONFIG_PATH}").stdout.split() == ["640", "root", "sglang"]
    assert f'api-key: "{SENTINEL}"' in lab_host.read_bytes(CONFIG_PATH).decode().splitlines()


def test_no_local_user_reads_the_key_from_any_cmdline(lab_host, awkward_secret):
    """Issue 16, item 7: what every local user can read of every process (/proc/<pid>/cmdline, what ps
    shows), read as the unprivileged user nobody, never holds the key; the server runs with it anyway."""
    # The scan runs as nobody and sends every cmdline it could read back here: the key never goes to the
    # host on a command line of its own (a `bash -c` holding it would be found, rightly).
    scan = (
        "import json, os\n"
        "out = {'uid': os.getuid(), 'cmdlines': {}}\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        out['cmdlines'][pid] = open(f'/proc/{pid}/cmdline', 'rb').read().decode('latin-1')\n"
        "    except OSError:\n"
        "        pass\n"
        "print(json.dumps(out))\n"
    )
    main_pid = lab_host.state().main_pid
    seen = json.loads(lab_host.ssh(f"runuser -u nobody -- python3 -c {shlex.quote(scan)}").stdout)
    assert seen["uid"] != 0
    cmdlines = seen["cmdlines"]
    assert len(cmdlines) > 10, f"only {len(cmdlines)} processes were readable as nobody"
    # The server's own process was read (nothing hides it from other users) and runs from --config.
    assert "--config" in cmdlines[str(main_pid)].split("\0"), cmdlines.get(str(main_pid))
    holding = sorted(pid for pid, text in cmdlines.items() if SENTINEL in text)
    assert not holding, f"the API key is in the cmdline of pid(s) {holding}"


def test_verifier_and_server_require_the_key(lab_host, awkward_secret):
    probe = (
        "import sys,urllib.request as u,urllib.error as e\n"
        "def get(h):\n"
        "    try:\n"
        "        return u.urlopen(u.Request('http://127.0.0.1:30000/server_info',headers=h),timeout=10).status\n"
        "    except e.HTTPError as x:\n"
        "        return x.code\n"
        "b='Bearer '\n"
        "print(get({}), get({'Authorization': b+'wrong'}), get({'Authorization': b+sys.argv[1]}))\n"
    )
    codes = lab_host.ssh(f"python3 -c {shlex.quote(probe)} {shlex.quote(SENTINEL)}").stdout.split()
    assert codes == ["401", "401", "200"]
    # The verifier used the key: the deploy's running-arguments assertion (in the verified restart's call)
    # read /server_info (Bearer); the deploy summary names it as a source of the managed arguments.
    # (A no-change re-run with the key is at the end of the rollback test.)
    text = flat(awkward_secret["deploy"])
    assert "speculative_draft_window_size: 2048 (from /server_info" in text, text[-3000:]
    assert "Bearer" not in text or "Bearer <redacted>" in text


@pytest.fixture(scope="module")
def check_run(lab_host, awkward_secret):
    """ONE `-e window=4096 --check --diff -vvvv` run on the verified deploy with the key."""
    before = lab_host.state()
    unit_before = lab_host.read_bytes("/etc/systemd/system/sglang.service")
    r = lab_host.playbook("-e", "window=4096", "--check", "--diff", "-vvvv", extra=awkward_secret["extra"])
    return {
        "run": r,
        "before": before,
        "after": lab_host.state(),
        "unit_before": unit_before,
        "unit_after": lab_host.read_bytes("/etc/systemd/system/sglang.service"),
    }


def test_check_mode_shows_window_change_and_changes_nothing(check_run):
    r = check_run["run"]
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    # The unit diff: the ExecStart line that carries the window, old and new (one line per flag).
    assert '-    "--speculative-draft-window-size" "2048" \\' in out, out[-6000:]
    assert '+    "--speculative-draft-window-size" "4096" \\' in out, out[-6000:]
    # The argument diff of the verifier: running 2048, intended 4096.
    text = flat(r)
    assert "Would restart sglang.service" in text
    shown = text.index("TASK [sglang : Show how the running arguments differ from the intended ones]")
    diff_text = text[shown : text.index("TASK [", shown + 10)]
    assert "speculative_draft_window_size" in diff_text, diff_text
    assert "2048" in diff_text and "4096" in diff_text, diff_text
    # Nothing changed on the host.
    assert check_run["after"] == check_run["before"]
    assert check_run["unit_after"] == check_run["unit_before"]


def test_check_diff_at_vvvv_shows_no_secret(check_run):
    out = check_run["run"].stdout + check_run["run"].stderr
    # -vvvv really printed module arguments and results (the run is not silently quiet).
    assert "sglang_running_args" in out and "module_args" in out
    assert SENTINEL not in out


def test_crash_after_start_rolls_back_to_the_verified_configuration(lab_host, awkward_secret):
    good = lab_host.state()
    crash = dict(awkward_secret["extra"], sglang_environment={"SGLANG_LAB_CRASH_AFTER": "3"})
    r = lab_host.playbook("-e", "window=2048", extra=crash)
    text = flat(r)
    assert r.returncode != 0, "a crashing change must fail the run even though the rollback succeeded"
    assert SENTINEL not in r.stdout + r.stderr
    after = lab_host.state()
    # What failed, why the restart happened, and what was restored, in the one failure message.
    assert "Deploy of sglang.service on " + lab_host.name + " FAILED (the environment file changed)" in text
    assert "ROLLED BACK to the known-good configuration" in text
    start = text.index("Deploy of sglang.service")
    print("rollback message:", text[start : text.index("known-good", text.index("ROLLED BACK") + 40) + 60])
    assert f"verified again: invocation {after.invocation_id}" in text
    # Back on the good files, with a NEW invocation that was verified.
    assert after.active_state == "active"
    assert (after.unit_sha256, after.env_sha256) == (good.unit_sha256, good.env_sha256)
    assert after.invocation_id != good.invocation_id
    records = lab_host.history()
    assert records[-1]["result"] == "rolled_back"
    assert records[-1]["invocation_id"] == after.invocation_id
    assert records[-1]["restored_invocation_id"] == good.invocation_id
    # The rollback's verified invocation is the last verified one now: the one drift compares with (P17).
    meta = json.loads(lab_host.read_bytes("/var/lib/sglang-deploy/known-good/sglang.json"))
    assert meta["invocation_id"] == after.invocation_id and meta["env_sha256"] == good.env_sha256
    assert records[-1]["env_sha256"] == good.env_sha256
    assert "SGLANG_LAB_CRASH_AFTER" not in lab_host.read_bytes("/etc/sglang/sglang.env").decode()
    # The --config file (the key) belongs to the known-good set: kept with it, restored with it.
    config = lab_host.read_bytes(CONFIG_PATH)
    assert lab_host.read_bytes("/var/lib/sglang-deploy/known-good/sglang.yaml") == config
    assert records[-1].get("config_sha256") is None or len(records[-1]["config_sha256"]) == 64
    # The restored server is exactly what the role renders for the good settings: a re-run of them
    # (with the key) changes nothing and verifies the running invocation.
    r = lab_host.playbook("-e", "window=2048", extra=awkward_secret["extra"])
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    assert "changed=0" in recap(r.stdout)
    assert SENTINEL not in r.stdout + r.stderr
    assert lab_host.state() == after


def test_acceptance_length_is_recorded_and_under_the_minimum_the_deploy_rolls_back(lab_host, awkward_secret):
    """P25: the verified restart measures speculative decoding's acceptance length (one /generate after the
    proof); the deploy's history record and its report carry it, labelled as the lab stand-in's. With
    sglang_min_accept_length above what the server gives (SGLANG_LAB_ACCEPT_LENGTH=1.5: 64 tokens in 43
    verify forwards), the deploy records nothing as known-good, rolls back and fails naming the figure."""
    deployed = awkward_secret["after"].invocation_id
    history = lab_host.history()
    [record] = [h for h in history if h.get("invocation_id") == deployed and h["result"] == "verified"]
    spec = record["speculation"]
    assert spec["stand_in"] is True and spec["completion_tokens"] == 64 and spec["spec_verify_ct"] > 0
    assert spec["accept_length"] == round(64 / spec["spec_verify_ct"], 3) > 1.5
    printed = flat(awkward_secret["deploy"])
    assert (
        f"Speculative decoding acceptance length {spec['accept_length']} (completion_tokens 64 / "
        f"spec_verify_ct {spec['spec_verify_ct']}, one /generate after the proof): measured on the lab "
        "stand-in server, not a model"
    ) in printed
    report = re.search(r"Full report \(the whole /server_info and the assertion\): (\S+\.json)", printed)
    assert json.loads(Path(report.group(1)).read_text())["speculation"] == spec
    good, known = lab_host.state(), len(lab_host.history())
    low = dict(
        awkward_secret["extra"],
        sglang_environment={"SGLANG_LAB_ACCEPT_LENGTH": "1.5"},
        sglang_min_accept_length=2.5,
    )
    r = lab_host.playbook("-e", "window=2048", extra=low)
    text = flat(r)
    assert r.returncode != 0, "an acceptance length under the minimum must fail the run"
    assert SENTINEL not in r.stdout + r.stderr
    assert (
        "But its speculative decoding acceptance length 1.488 (completion_tokens 64 / spec_verify_ct 43) is "
        "under sglang_min_accept_length 2.5"
    ) in text
    assert "ROLLED BACK to the known-good configuration" in text
    after = lab_host.state()
    assert after.active_state == "active" and after.invocation_id != good.invocation_id
    assert (after.unit_sha256, after.env_sha256) == (good.unit_sha256, good.env_sha256)
    new = lab_host.history()[known:]
    assert new[-1]["result"] == "rolled_back" and new[-1]["invocation_id"] == after.invocation_id
    # Nothing of the low invocation was recorded as verified or kept as known-good.
    assert "verified" not in [h["result"] for h in new], new
    assert "SGLANG_LAB_ACCEPT_LENGTH" not in lab_host.read_bytes("/etc/sglang/sglang.env").decode()
    meta = json.loads(lab_host.read_bytes("/var/lib/sglang-deploy/known-good/sglang.json"))
    assert meta["env_sha256"] == good.env_sha256
