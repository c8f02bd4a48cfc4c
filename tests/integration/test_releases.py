"""Releases (issue 14 items 1 and 6): two real SGLang releases on the shared lab host, one service.

Release A is SGLang 0.5.23 (in the host's SGLang layer: the release the baseline runs). Release B is the lab
DDTree build (inventory/lab/ddtree.yml: the LAB REPLAY wheel of PR sgl-project/sglang#29907, its own small
wheelhouse, dependencies resolved by pip: another version AND another dependency set, so another key),
deployed as sglang.service on port 30000. Tests run top to bottom, sharing the deploys:
  1. an upgrade A -> B whose server dies (SGLANG_LAB_CRASH_AFTER): B is built beside A, the unit switches to
     it, the server crashes, the run rolls back to A and FAILS; /server_info reports 0.5.23, MainPID runs
     from A, and A's files are unchanged (SGLang's own files byte-identical, every entry's inode, size, mtime
     and ctime as before);
  2. the upgrade A -> B that verifies (B is there already: nothing is installed): MainPID's python is B's,
     /server_info reports B's version, the known-good record names B, sglang_venv links to B;
  3. a weights revision change: the target checkpoint's new revision in its own directory
     (<name>/<revision>/, REVISION file, pinned in model_weights_models): the weights play checks it, the
     server restarts onto it (/server_info model_path), the old directory stays;
  4. back to the baseline (A, the old model directory), then sglang_releases_keep: 1 in a pass with nothing
     else to do: B is removed, A stays (the running and known-good one, although the oldest);
  5. A's marker moved away by hand: the run refuses to rebuild the release the server runs from.
The module fixture restores the baseline if a test stopped half-way.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RELEASES = "/opt/sglang/releases"
MARKER = "sglang-deploy-install.json"
KNOWN_GOOD_META = "/var/lib/sglang-deploy/known-good/sglang.json"
FAST = {"sglang_stable_seconds": 3, "sglang_health_count": 2}
# Release B: the DDTree lab build's settings, deployed as the baseline's service (its name, port and venv).
DDTREE = {
    k: v
    for k, v in yaml.safe_load((REPO / "inventory" / "lab" / "ddtree.yml").read_text()).items()
    if k not in ("sglang_service_name", "sglang_port", "sglang_venv")
}
B_KNOBS = ("-e", "budget=8", "-e", "topk=4", "-e", "window=2048")
OLD_MODEL, NEW_REVISION = "/srv/models/lab-target", "b" * 40
NEW_MODEL = f"/srv/models/lab-target-revisions/{NEW_REVISION}"
# A release unchanged: every entry's inode, size, mtime, ctime (no write, rename or chmod leaves ctime as
# it was: it cannot be set from user space), mode and symlink target, and the sha256 of every file of
# SGLang's own package and dist-info (what an upgrade replaces). ~4 s for the 57 796 entries of the 6.3 GB
# lab release; the sha256 of every file takes 35 s (measured on lab160).
TREE_HASH = (
    "set -o pipefail; cd {} && find . -printf '%p %i %s %T@ %C@ %m %l\\n' | sort | sha256sum && "
    "find lib/python3*/site-packages/sglang lib/python3*/site-packages/sglang-*.dist-info -type f -print0 "
    "| sort -z | xargs -0 sha256sum | sha256sum"
)
SERVER_INFO = (
    'python3 -c "import urllib.request as u; '
    "print(u.urlopen('http://127.0.0.1:30000/server_info', timeout=10).read().decode())\""
)


def flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def running(host) -> dict:
    """MainPID, its argv[0], and what /server_info reports (version, model_path)."""
    pid = int(host.ssh("systemctl show -p MainPID --value sglang.service").stdout.strip())
    info = json.loads(host.ssh(SERVER_INFO).stdout)
    return {
        "pid": pid,
        "argv0": host.cmdline(pid)[0],
        "version": info["version"],
        "model": info["model_path"],
    }


def releases(host) -> list[str]:
    return host.ssh(f"ls {RELEASES}").stdout.split()


def release_of(host, version_prefix: str) -> str:
    names = [n for n in releases(host) if n.startswith(version_prefix)]
    assert len(names) == 1, names
    return f"{RELEASES}/{names[0]}"


def timed(host, *args, extra=None):
    started = time.monotonic()
    r = host.playbook(*args, extra=extra, playbook="playbooks/sglang.yml")
    return r, time.monotonic() - started


@pytest.fixture(scope="module")
def shared(lab_host):
    state = {"a": release_of(lab_host, "0.5.23-")}
    try:
        yield state
    finally:
        if not state.get("done"):  # a test stopped half-way: the next file starts from the baseline
            lab_host.restore_baseline()
            lab_host.ssh(f"rm -rf {Path(NEW_MODEL).parent}", check=False)


def release_b(shared) -> str:
    """Release B as the first test of this file built it; the tests after it build on it (chained)."""
    if not shared.get("b"):
        pytest.fail(
            "release B was not built: the first test of this file (test_upgrade_whose_server_dies_rolls_back_"
            "to_the_previous_release_untouched) failed or did not run; run the file whole"
        )
    return shared["b"]


def test_upgrade_whose_server_dies_rolls_back_to_the_previous_release_untouched(lab_host, shared):
    a = shared["a"]
    before = lab_host.ssh(TREE_HASH.format(a), timeout=600).stdout.strip()
    empty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of no input
    assert len(before.splitlines()) == 2 and empty not in before, before
    assert running(lab_host)["argv0"] == f"{a}/bin/python"
    crash = dict(DDTREE, **FAST, sglang_environment={"SGLANG_LAB_CRASH_AFTER": "3"})
    r, seconds = timed(lab_host, *B_KNOBS, extra=crash)
    text = flat(r)
    print(f"failed upgrade (build of B, crash, rollback to A): {seconds:.1f} s")
    assert r.returncode != 0, "a crashing upgrade must fail the run although the rollback succeeded"
    assert "ROLLED BACK to the known-good configuration of 0.5.23 (release " + a in text, text[-4000:]
    b = release_of(lab_host, "0.0.0.dev0+labreplay")
    # B was built to the end (its marker names its key) and stays for the next deploy.
    assert json.loads(lab_host.read_bytes(f"{b}/{MARKER}"))["release"] == Path(b).name
    now = running(lab_host)
    assert now["version"] == "0.5.23" and now["argv0"] == f"{a}/bin/python", now
    assert lab_host.history()[-1]["result"] == "rolled_back"
    assert lab_host.ssh(TREE_HASH.format(a), timeout=600).stdout.strip() == before, "release A changed"
    shared["b"] = b


def test_upgrade_that_verifies_runs_the_new_release(lab_host, shared):
    b = release_b(shared)
    stat = f"stat -c '%i %Y' {b}/{MARKER} {b}/bin/python"
    marker_before = lab_host.ssh(stat).stdout
    r, seconds = timed(lab_host, *B_KNOBS, extra=dict(DDTREE, **FAST))
    text = flat(r)
    assert r.returncode == 0, text[-6000:]
    # B exists: nothing is installed, its marker is the one the build wrote.
    assert (
        "Install SGLang into the new release" not in r.stdout and lab_host.ssh(stat).stdout == marker_before
    )
    now = running(lab_host)
    assert now["argv0"] == f"{b}/bin/python" and now["version"] == "0.0.0.dev0+labreplay.ddtree.pr29907", now
    record = lab_host.history()[-1]
    assert record["result"] == "verified" and record["release"] == Path(b).name
    meta = json.loads(lab_host.read_bytes(KNOWN_GOOD_META))
    assert meta["release"]["path"] == b
    assert lab_host.ssh("readlink /opt/sglang/venv").stdout.strip() == b
    timings = record["timings"]
    print(
        f"release switch A -> B: deploy {seconds:.1f} s, verified restart timings {json.dumps(timings)}; "
        f"disk per release: {lab_host.ssh(f'du -sh {RELEASES}/*').stdout.strip()}"
    )


def test_weights_revision_change_restarts_onto_the_new_directory(lab_host, shared):
    release_b(shared)
    lab_host.ssh(
        f"mkdir -p {Path(NEW_MODEL).parent} && rm -rf {NEW_MODEL} && cp -a {OLD_MODEL} {NEW_MODEL} "
        f"&& echo {NEW_REVISION} > {NEW_MODEL}/REVISION"
    )
    pinned = [
        {
            "name": "target",
            "path": NEW_MODEL,
            "revision": NEW_REVISION,
            "fetch": False,
            "require_tokenizer": True,
        },
        {
            "name": "draft",
            "path": "/srv/models/lab-dflash-draft",
            "revision": None,
            "fetch": False,
            "require_tokenizer": False,
        },
    ]
    before = running(lab_host)
    extra = dict(DDTREE, **FAST, sglang_model_path=NEW_MODEL, model_weights_models=pinned)
    r = lab_host.playbook(*B_KNOBS, extra=extra)  # deploy.yml: the weights play, then SGLang
    text = flat(r)
    assert r.returncode == 0, text[-6000:]
    assert f"revision {NEW_REVISION}" in text, "the weights play did not check the pinned revision"
    now = running(lab_host)
    assert now["pid"] != before["pid"] and now["model"] == NEW_MODEL, now
    assert lab_host.ssh(f"test -f {OLD_MODEL}/config.json && echo kept").stdout.strip() == "kept"


def test_keep_one_release_removes_the_old_one_never_the_running_one(lab_host, shared):
    b = release_b(shared)
    a = shared["a"]
    # Back to the baseline (A, the old model directory): B stays (sglang_releases_keep 3).
    r = lab_host.playbook("-e", "window=2048", extra=FAST, playbook="playbooks/sglang.yml")
    assert r.returncode == 0, flat(r)[-6000:]
    now = running(lab_host)
    assert now["argv0"] == f"{a}/bin/python" and now["version"] == "0.5.23" and now["model"] == OLD_MODEL
    assert sorted(releases(lab_host)) == sorted([Path(a).name, Path(b).name])
    # sglang_releases_keep 1 on that host: nothing to write or restart, yet the pass goes on to the releases
    # (a host ends the role early only when they are tidy: roles/sglang/vars/main.yml __sglang_converged).
    invocation = lab_host.state().invocation_id
    r = lab_host.playbook(
        "-e", "window=2048", extra=dict(FAST, sglang_releases_keep=1), playbook="playbooks/sglang.yml"
    )
    assert r.returncode == 0, flat(r)[-6000:]
    assert lab_host.state().invocation_id == invocation, "nothing to restart"
    assert releases(lab_host) == [Path(a).name], "B (neither running nor known-good) must be gone, A kept"
    assert lab_host.ssh(f"test -e {b} || echo gone").stdout.strip() == "gone"
    lab_host.ssh(f"rm -rf {Path(NEW_MODEL).parent}")
    shared["done"] = True


def test_the_running_release_without_its_marker_is_never_rebuilt(lab_host, shared):
    """The marker of the running release removed by hand: the release looks like an interrupted build, but
    the server runs from it, so the run refuses (naming it) instead of deleting and rebuilding it; host
    untouched."""
    a, before = shared["a"], lab_host.state()
    lab_host.ssh(f"mv {a}/{MARKER} /root/{MARKER}.aside")
    try:
        r = lab_host.playbook("-e", "window=2048", extra=FAST, playbook="playbooks/sglang.yml")
        text = flat(r)
        assert r.returncode != 0 and "the role never rebuilds a running release" in text, text[-4000:]
        assert f"The SGLang release {a} has no valid marker" in text
        assert (
            lab_host.state() == before and lab_host.ssh(f"test -x {a}/bin/python && echo ok").stdout == "ok\n"
        )
    finally:
        lab_host.ssh(f"mv /root/{MARKER}.aside {a}/{MARKER}")
