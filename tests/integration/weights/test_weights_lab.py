"""The model_weights role against a real lab host (systemd-nspawn, SSH), via ansible-playbook.

The lab host carries tiny real checkpoints (lab/make_checkpoint.py) at /srv/models/lab-target and
/srv/models/lab-dflash-draft. Damaged copies are made on the host under /srv/models/broken-* and removed
afterwards. The "full disk" case is real: a 300 KiB tmpfs mounted on the host over the copy's directory,
so the copy itself fails with ENOSPC and leaves a truncated shard behind.

Host: WEIGHTS_LAB_INVENTORY=<inventory.yml> (or LAB_REUSE_INVENTORY=<inventory.yml>, the variable the
integration tests use) uses running lab hosts (left running); otherwise the test starts lab80 with
`lab/labctl up --hosts 1 --first-index 80` and stops it at the end.

Not covered here (no network to the Hub from this machine or the lab hosts): a real `hf download`. The fetch
path of the role is run twice: with the REAL huggingface_hub up to its failed listing, and to the end
(download, post-download check, summary, check mode plan) with a stand-in venv whose bin/python prints the
listing of a lab checkpoint and whose bin/hf copies that checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from labtools import missing_lab_prerequisite

REPO = Path(__file__).resolve().parents[3]
PLAYBOOK = Path(__file__).resolve().parent / "weights.yml"
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
LABCTL = REPO / "lab" / "labctl"
TARGET = "/srv/models/lab-target"
DRAFT = "/srv/models/lab-dflash-draft"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture(scope="module")
def inventory():
    given = os.environ.get("WEIGHTS_LAB_INVENTORY") or os.environ.get("LAB_REUSE_INVENTORY")
    if given:
        yield Path(given)
        return
    missing = missing_lab_prerequisite()
    if missing:
        pytest.fail(missing)
    # A fixed path: a host an interrupted run of this test left behind is stopped first (only hosts of
    # this inventory), and a failed `up` is cleaned up too.
    path = REPO / ".lab" / "weights-lab" / "hosts.yml"
    subprocess.run([str(LABCTL), "down", "--inventory", str(path)], check=False, cwd=REPO)
    try:
        subprocess.run(
            [str(LABCTL), "up", "--hosts", "1", "--first-index", "80", "--inventory", str(path)],
            check=True,
            cwd=REPO,
        )
        yield path
    finally:
        subprocess.run([str(LABCTL), "down", "--inventory", str(path)], check=True, cwd=REPO)


@pytest.fixture(scope="module")
def host(inventory):
    data = yaml.safe_load(inventory.read_text())
    hosts = data["all"]["children"]["lab"]["hosts"]
    name = sorted(hosts)[0]
    hv = data["all"]["children"]["gpu_nodes"]["hosts"][name]
    return name, hv


def ssh(host, command: str, check=True) -> subprocess.CompletedProcess:
    _, hv = host
    argv = [
        "ssh",
        "-i",
        hv["ansible_ssh_private_key_file"],
        *hv["ansible_ssh_common_args"].split(),
        "-o",
        "BatchMode=yes",
        f"{hv['ansible_user']}@{hv['ansible_host']}",
        command,
    ]
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=120)


@pytest.fixture
def scratch(host):
    """Names of /srv/models/broken-* directories to remove (and unmount) after the test."""
    made: list[str] = []
    yield made
    for d in made:
        ssh(host, f"while mountpoint -q {d}; do umount {d} || break; done; rm -rf {d}", check=False)


def play(inventory, host, models, check_mode=False, extra=None, verbosity=0) -> subprocess.CompletedProcess:
    name, _ = host
    extra_vars = {"model_weights_models": models, **(extra or {})}
    argv = [
        str(ANSIBLE_PLAYBOOK),
        "-i",
        str(inventory),
        "--limit",
        name,
        str(PLAYBOOK),
        "-e",
        json.dumps(extra_vars),
    ]
    if check_mode:
        argv.append("--check")
    if verbosity:
        argv.append("-" + "v" * verbosity)
    env = dict(
        os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_CONFIG=str(REPO / "ansible.cfg")
    )
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    # The yaml result format folds long lines: compare against whitespace-normalised output.
    r.stdout = " ".join(r.stdout.split())
    return r


def recap(out: str) -> str:
    return out[out.index("PLAY RECAP") :]


def copy_checkpoint(host, scratch, src: str, dest: str) -> None:
    scratch.append(dest)
    ssh(host, f"rm -rf {dest} && mkdir -p {os.path.dirname(dest)} && cp -a {src} {dest}")


def models(target=TARGET, draft=DRAFT, **kw):
    t = {"name": "target", "path": target, "revision": None, "fetch": False, "require_tokenizer": True}
    d = {"name": "draft", "path": draft, "revision": None, "fetch": False, "require_tokenizer": False}
    t.update(kw.get("target_extra", {}))
    d.update(kw.get("draft_extra", {}))
    return [t, d]


def test_complete_checkpoints_pass(inventory, host):
    r = play(inventory, host, models())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"target {TARGET}: LlamaForCausalLM, 2 shard(s)" in r.stdout
    assert f"draft {DRAFT}: DFlashDraftModel, 2 shard(s)" in r.stdout
    assert "changed=0" in recap(r.stdout) and "failed=0" in recap(r.stdout)


def test_check_mode_passes_and_changes_nothing(inventory, host):
    r = play(inventory, host, models(), check_mode=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "changed=0" in recap(r.stdout)


def test_truncated_shard_fails_naming_it(inventory, host, scratch):
    dest = "/srv/models/broken-trunc"
    copy_checkpoint(host, scratch, TARGET, dest)
    ssh(host, f"truncate -s -100 {dest}/{SHARD2}")
    r = play(inventory, host, models(target=dest))
    assert r.returncode != 0
    assert f"target {dest}/{SHARD2}: truncated" in r.stdout and "100 bytes missing" in r.stdout, r.stdout
    assert "failed=1" in recap(r.stdout)


def test_missing_shard_fails_naming_it(inventory, host, scratch):
    dest = "/srv/models/broken-missing"
    copy_checkpoint(host, scratch, TARGET, dest)
    ssh(host, f"rm {dest}/{SHARD1}")
    r = play(inventory, host, models(target=dest))
    assert r.returncode != 0 and f"target {dest}/{SHARD1}: missing" in r.stdout, r.stdout


def test_corrupt_header_fails_naming_it(inventory, host, scratch):
    dest = "/srv/models/broken-header"
    copy_checkpoint(host, scratch, TARGET, dest)
    # overwrite the first bytes of the JSON header (after the 8-byte length) in place
    ssh(host, f"printf 'XXXX' | dd of={dest}/{SHARD1} bs=1 seek=8 conv=notrunc status=none")
    r = play(inventory, host, models(target=dest))
    assert r.returncode != 0
    assert f"target {dest}/{SHARD1}: corrupt: header is not valid JSON" in r.stdout, r.stdout


def test_both_checkpoints_broken_one_check_names_both(inventory, host, scratch):
    """All checkpoints are checked in ONE model_weights_check call: a broken target does not hide a
    broken draft."""
    target, draft = "/srv/models/broken-both-target", "/srv/models/broken-both-draft"
    copy_checkpoint(host, scratch, TARGET, target)
    copy_checkpoint(host, scratch, DRAFT, draft)
    ssh(host, f"truncate -s -100 {target}/{SHARD2} && rm {draft}/config.json")
    r = play(inventory, host, models(target=target, draft=draft))
    assert r.returncode != 0
    assert f"target {target}/{SHARD2}: truncated" in r.stdout, r.stdout
    assert f"draft {draft}/config.json: missing" in r.stdout, r.stdout
    assert r.stdout.count("TASK [model_weights : Check every checkpoint (one call)]") == 1
    assert "failed=1" in recap(r.stdout)


def test_missing_draft_config_fails_naming_it(inventory, host, scratch):
    dest = "/srv/models/broken-draft"
    copy_checkpoint(host, scratch, DRAFT, dest)
    ssh(host, f"rm {dest}/config.json")
    r = play(inventory, host, models(draft=dest))
    assert r.returncode != 0 and f"draft {dest}/config.json: missing" in r.stdout, r.stdout


def test_full_disk_copy_leaves_truncated_shard_and_fails(inventory, host, scratch):
    dest = "/srv/models/broken-full"
    scratch.append(dest)
    mounted = ssh(host, f"mkdir -p {dest} && mount -t tmpfs -o size=300k,mode=0755 tmpfs {dest}", check=False)
    if mounted.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs on the lab host: {mounted.stderr.strip()}")
    # small files first, then the shards: the second shard hits ENOSPC for real
    cp = ssh(
        host,
        f"cp -a {TARGET}/*.json {dest}/ && cp -a {TARGET}/{SHARD1} {TARGET}/{SHARD2} {dest}/",
        check=False,
    )
    assert cp.returncode != 0 and "No space left on device" in cp.stderr, cp.stderr
    df = ssh(host, f"df --output=avail -B1 {dest} | tail -1").stdout.strip()
    assert int(df) < 4096
    r = play(inventory, host, models(target=dest))
    assert r.returncode != 0
    assert f"target {dest}/{SHARD2}: truncated" in r.stdout, r.stdout


def test_revision_pin(inventory, host, scratch):
    dest = "/srv/models/broken-revision"
    copy_checkpoint(host, scratch, TARGET, dest)
    ssh(host, f"echo {'a' * 40} > {dest}/REVISION")
    ok = play(inventory, host, models(target=dest, target_extra={"revision": "a" * 40}))
    assert ok.returncode == 0, ok.stdout
    assert f"revision {'a' * 40}" in ok.stdout
    bad = play(inventory, host, models(target=dest, target_extra={"revision": "b" * 40}))
    assert bad.returncode != 0
    assert f"revision {'a' * 40} (from file:REVISION) is not expected_revision {'b' * 40}" in bad.stdout


@pytest.mark.parametrize(
    "item, needle",
    [
        ({"path": "srv/models/x"}, "path must be absolute"),
        ({"revision": "main"}, "revision must be null or a full 40-character"),
        ({"fetch": True, "revision": "a" * 40}, "fetch=true needs repo"),
        (
            {"fetch": True, "repo": "moonshotai/Kimi-K2.6", "revision": "a" * 40},
            "fetch=true writes into path, so path must be the revision's own directory",
        ),
    ],
)
def test_preflight_names_the_setting(inventory, host, item, needle):
    r = play(inventory, host, models(target_extra=item))
    assert r.returncode != 0 and needle in r.stdout, r.stdout
    assert "Assert each checkpoint" in r.stdout


HUB_WHEELS = [
    "huggingface_hub",
    "anyio",
    "certifi",
    "click",
    "filelock",
    "fsspec",
    "h11",
    "hf_xet",
    "httpcore",
    "httpx",
    "idna",
    "markdown_it_py",
    "mdurl",
    "packaging",
    "pygments",
    "pyyaml",
    "rich",
    "shellingham",
    "sniffio",
    "tqdm",
    "typer",
    "typing_extensions",
]
WHEELHOUSE = Path("/var/cache/sglang-lab/wheelhouse")
HUB_VENV = "/opt/weights-test-venv"
SENTINEL = "SENTINEL-HF-TOKEN-77ab"


@pytest.fixture(scope="module")
def hub_venv(host):
    """A venv on the lab host with the REAL huggingface_hub 1.33.0 (+ hf CLI) from the lab wheelhouse."""
    wheels = sorted(p for p in WHEELHOUSE.glob("*.whl") if p.name.split("-")[0] in HUB_WHEELS)
    if not any(p.name.startswith("huggingface_hub-") for p in wheels):
        pytest.fail(f"no huggingface_hub wheel in {WHEELHOUSE}: make wheelhouse")
    _, hv = host
    ssh(host, "rm -rf /tmp/weights-whl && mkdir -p /tmp/weights-whl")
    subprocess.run(
        [
            "scp",
            "-q",
            "-i",
            hv["ansible_ssh_private_key_file"],
            *hv["ansible_ssh_common_args"].split(),
            *map(str, wheels),
            f"{hv['ansible_user']}@{hv['ansible_host']}:/tmp/weights-whl/",
        ],
        check=True,
    )
    ssh(
        host,
        f"python3 -m venv {HUB_VENV} && {HUB_VENV}/bin/pip install -q --no-index "
        "--find-links /tmp/weights-whl huggingface_hub==1.33.0",
    )
    yield HUB_VENV
    ssh(host, f"rm -rf {HUB_VENV} /tmp/weights-whl /etc/model-weights-test", check=False)


def test_fetch_path_with_real_huggingface_hub_keeps_the_token_secret(inventory, host, scratch, hub_venv):
    """fetch=true on a damaged copy: the role writes the token file (0600), the module runs the host's real
    huggingface_hub listing, which fails (no route to the Hub from a lab host); the run fails naming the
    listing, and the token appears nowhere in the output, even at -vvv."""
    dest = f"/srv/models/broken-fetch/{'a' * 40}"
    copy_checkpoint(host, scratch, TARGET, dest)
    ssh(host, f"rm {dest}/{SHARD1}")
    r = play(
        inventory,
        host,
        models(
            target=dest, target_extra={"fetch": True, "repo": "moonshotai/Kimi-K2.6", "revision": "a" * 40}
        ),
        extra={
            "model_weights_sglang_venv": hub_venv,
            "model_weights_hf_token": SENTINEL,
            "model_weights_hf_token_file": "/etc/model-weights-test/hf_token",
        },
        verbosity=3,
    )
    assert r.returncode != 0
    assert f"target: listing moonshotai/Kimi-K2.6@{'a' * 40} through {hub_venv}/bin/python" in r.stdout, (
        r.stdout
    )
    assert "ConnectError" in r.stdout  # the real httpx error of the real huggingface_hub
    assert SENTINEL not in r.stdout and SENTINEL not in r.stderr
    st = ssh(host, "stat -c '%a %U' /etc/model-weights-test/hf_token && cat /etc/model-weights-test/hf_token")
    assert st.stdout.split("\n")[:2] == ["600 root", SENTINEL]


STANDIN_VENV = "/opt/weights-standin-venv"
STANDIN_PYTHON = """#!/usr/bin/python3
# Stand-in for <venv>/bin/python running model_weights_fetch's LIST_FILES_SCRIPT: prints the listing.
import sys
sys.stdout.write(open("%(venv)s/listing.json").read())
"""
STANDIN_HF = """#!/usr/bin/python3
# Stand-in for <venv>/bin/hf download: copies the lab checkpoint into --local-dir, records the revision.
import shutil, sys
argv = sys.argv[1:]
dest, rev = argv[argv.index("--local-dir") + 1], argv[argv.index("--revision") + 1]
open("%(venv)s/hf-argv", "w").write(" ".join(argv))
shutil.copytree("%(src)s", dest, dirs_exist_ok=True)
open(dest + "/REVISION", "w").write(rev + "\\n")
"""
LISTING = """import json, os, sys
src, sha = sys.argv[1], sys.argv[2]
files = [{"name": n, "size": os.path.getsize(os.path.join(src, n)), "blob_id": None, "lfs_sha256": None}
         for n in sorted(os.listdir(src)) if os.path.isfile(os.path.join(src, n))]
print(json.dumps({"sha": sha, "files": files}))
"""


@pytest.fixture
def standin_venv(host):
    sha = "c" * 40
    script = (
        f"set -e; rm -rf {STANDIN_VENV} && mkdir -p {STANDIN_VENV}/bin && "
        f"cat > {STANDIN_VENV}/bin/python <<'EOF'\n{STANDIN_PYTHON % {'venv': STANDIN_VENV}}EOF\n"
        f"cat > {STANDIN_VENV}/bin/hf <<'EOF'\n{STANDIN_HF % {'venv': STANDIN_VENV, 'src': TARGET}}EOF\n"
        f"chmod 755 {STANDIN_VENV}/bin/python {STANDIN_VENV}/bin/hf && "
        f"python3 - {TARGET} {sha} > {STANDIN_VENV}/listing.json <<'EOF'\n{LISTING}EOF\n"
    )
    ssh(host, script)
    yield STANDIN_VENV, sha
    ssh(host, f"rm -rf {STANDIN_VENV}", check=False)


def test_fetch_path_to_the_end_with_a_stand_in_hub(inventory, host, scratch, standin_venv):
    """fetch=true on a copy without its first shard, the draft complete: only the target is fetched.
    --check plans (would fetch) and changes nothing; the real run downloads (stand-in hf), checks again at
    the pinned revision and reports it; the next run finds everything complete and fetches nothing."""
    venv, sha = standin_venv
    dest = f"/srv/models/broken-fetch-standin/{sha}"
    copy_checkpoint(host, scratch, TARGET, dest)
    ssh(host, f"rm {dest}/{SHARD1}")
    pin = {"fetch": True, "repo": "moonshotai/Kimi-K2.6", "revision": sha}
    chosen = models(target=dest, target_extra=pin)
    extra = {"model_weights_sglang_venv": venv, "model_weights_free_space_margin_bytes": 0}

    planned = play(inventory, host, chosen, check_mode=True, extra=extra)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "Plan the download in check mode target" in planned.stdout
    assert "Show why the checkpoint is fetched draft" not in planned.stdout
    assert f"target {dest}/{SHARD1}: missing" in planned.stdout  # why it is fetched
    assert f"target {dest}: LlamaForCausalLM, 2 shard(s)" in planned.stdout
    assert ", check mode: would fetch " in planned.stdout, planned.stdout
    assert f"draft {DRAFT}: DFlashDraftModel, 2 shard(s)" in planned.stdout
    assert ssh(host, f"test -e {dest}/{SHARD1}", check=False).returncode != 0  # nothing written

    fetched = play(inventory, host, chosen, extra=extra)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert "changed=1" in recap(fetched.stdout)
    line = f"target {dest}: LlamaForCausalLM, 2 shard(s), 434.4 KiB, revision {sha}, fetched "
    assert line in fetched.stdout, fetched.stdout
    assert f"draft {DRAFT}: DFlashDraftModel, 2 shard(s)" in fetched.stdout
    argv = ssh(host, f"cat {venv}/hf-argv").stdout
    assert f"download moonshotai/Kimi-K2.6 --revision {sha} --local-dir {dest}" in argv

    again = play(inventory, host, chosen, extra=extra)
    assert again.returncode == 0, again.stdout
    assert "changed=0" in recap(again.stdout)
    assert "Show why the checkpoint is fetched" not in again.stdout
    assert f"target {dest}: LlamaForCausalLM, 2 shard(s), 434.4 KiB, revision {sha}" in again.stdout
    assert ", fetched " not in again.stdout
