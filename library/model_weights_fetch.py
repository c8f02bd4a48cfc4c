#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_weights_fetch
short_description: Download a pinned Hugging Face model revision with the installed SGLang environment's
  C(hf) CLI
description:
  - Lists the repository's files with their sizes for the pinned revision through the huggingface_hub
    installed in the SGLang virtualenv (C(HfApi().model_info(repo, revision=..., files_metadata=True))),
    subtracts what is already complete locally (same size and a valid C(.cache/huggingface/download) record
    for that revision - the record C(hf download) itself trusts), and refuses to start when the free space
    on the target filesystem is smaller than what is still needed plus O(margin_bytes).
  - Then runs C(<venv>/bin/hf download <repo> --revision <rev> --local-dir <dir> --max-workers N)
    - resumable, files already complete for that revision are skipped by C(hf) itself.
  - Afterwards checks the directory like M(model_weights_check) with O(revision) as the expected revision
    and fails naming every missing, truncated or corrupt file.
  - The Hugging Face token is read from O(hf_token_file) (owned by the connecting user or root, no
    group/other permissions) and passed ONLY as the C(HF_TOKEN) environment variable of the two child
    processes; it is never on a command line, never returned, and redacted from any child output that is
    returned.
version_added: "1.0.0"
author:
  - sglang-deploy contributors
options:
  repo:
    description: Hugging Face model repository id, e.g. C(moonshotai/Kimi-K2.6).
    type: str
    required: true
  revision:
    description: Full 40-character commit hash to download (a branch or tag is refused; pin the revision).
    type: str
    required: true
  local_dir:
    description: Absolute target directory (the model path given to SGLang).
    type: path
    required: true
  venv:
    description: The installed SGLang virtualenv; C(bin/hf) and C(bin/python) (with huggingface_hub) are
      used from it.
    type: path
    required: true
  hf_token_file:
    description: File holding the token (first line). Unset = anonymous access.
    type: path
  endpoint:
    description: Hub endpoint (C(HF_ENDPOINT)), for a mirror. Unset = huggingface_hub's default.
    type: str
  include:
    description: C(--include) glob patterns (same matching as C(hf)); the size arithmetic applies them too.
    type: list
    elements: str
    default: []
  exclude:
    description: C(--exclude) glob patterns.
    type: list
    elements: str
    default: []
  max_workers:
    description: C(--max-workers) for C(hf download).
    type: int
    default: 8
  margin_bytes:
    description: Free space that must remain after the download.
    type: int
    default: 10737418240
  require_tokenizer:
    description: Passed to the post-download check.
    type: bool
    default: true
  role:
    description: Label used in messages (target, draft).
    type: str
    default: model
attributes:
  check_mode:
    support: full
    description: Lists the files and computes the plan and the disk-space verdict; downloads nothing.
  diff_mode:
    support: none
notes:
  - Needs network access from the target host to the Hub (or O(endpoint)). Long downloads should run with
    C(async).
"""

EXAMPLES = r"""
- name: Fetch the pinned target checkpoint
  model_weights_fetch:
    repo: moonshotai/Kimi-K2.6
    revision: 0123456789abcdef0123456789abcdef01234567
    local_dir: /srv/models/Kimi-K2.6
    venv: /opt/sglang/venv
    hf_token_file: /etc/model-weights/hf_token
    role: target
  async: 86400
  poll: 30
"""

RETURN = r"""
plan:
  description: Disk-space arithmetic (bytes) - remote_total, complete_bytes, needed, margin, free, ok, and
    the files.
  returned: always
  type: dict
  sample: {remote_total: 1000, complete_bytes: 400, needed: 600, margin: 100, free: 5000, required: 700, ok:
    true,
           to_download: [model-00002-of-00002.safetensors], complete: [config.json]}
downloaded:
  description: True when C(hf download) ran.
  returned: always
  type: bool
  sample: true
command:
  description: The C(hf download) command line (contains no secret).
  returned: always
  type: list
  elements: str
  sample: [/opt/sglang/venv/bin/hf, download, moonshotai/Kimi-K2.6, --revision,
    0123456789abcdef0123456789abcdef01234567, --local-dir, /srv/models/Kimi-K2.6, --max-workers, "8"]
check:
  description: The post-download M(model_weights_check) result (absent in check mode).
  returned: when a download ran or nothing was left to download, outside check mode
  type: dict
  sample: {ok: true, revision: 0123456789abcdef0123456789abcdef01234567, total_size_human: 554.3 GiB}
"""

import json
import os
import stat
from fnmatch import fnmatchcase

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_redact import redact_text
from ansible.module_utils.sglang_safetensors import (
    COMMIT_HASH_RE,
    check_checkpoint,
    human_size,
    read_hf_download_metadata,
)

# Runs in the SGLang venv's python: the installed huggingface_hub lists the revision's files with sizes.
LIST_FILES_SCRIPT = r"""
import json, sys
from huggingface_hub import HfApi
repo, revision = sys.argv[1], sys.argv[2]
info = HfApi().model_info(repo, revision=revision, files_metadata=True)
files = []
for s in info.siblings or []:
    lfs = s.lfs
    sha256 = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
    files.append({"name": s.rfilename, "size": s.size, "blob_id": s.blob_id, "lfs_sha256": sha256})
print(json.dumps({"sha": info.sha, "files": files}))
"""

HF_QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",
    "LANG": "C",
    "LC_ALL": "C",
}


def hf_download_argv(
    hf: str, repo: str, revision: str, local_dir: str, include=(), exclude=(), max_workers: int = 8
) -> list[str]:
    """The `hf download` command line. The token is never part of it (HF_TOKEN env only)."""
    argv = [
        hf,
        "download",
        repo,
        "--revision",
        revision,
        "--local-dir",
        local_dir,
        "--max-workers",
        str(max_workers),
    ]
    for pattern in include:
        argv += ["--include", pattern]
    for pattern in exclude:
        argv += ["--exclude", pattern]
    return argv


def _pattern(p: str) -> str:
    # huggingface_hub.utils._paths: "\" -> "/", and a trailing "/" means the whole directory.
    p = p.replace("\\", "/")
    return p + "*" if p.endswith("/") else p


def select_files(names, include=(), exclude=()) -> list[str]:
    """Same selection as huggingface_hub's filter_repo_objects (fnmatchcase, allow then ignore)."""
    allow = [_pattern(p) for p in include] or None
    ignore = [_pattern(p) for p in exclude]
    return [
        n
        for n in names
        if (allow is None or any(fnmatchcase(n, p) for p in allow))
        and not any(fnmatchcase(n, p) for p in ignore)
    ]


def download_plan(remote_files: list[dict], local: dict, free: int, margin: int) -> dict:
    """Disk-space arithmetic.

    remote_files: [{name, size}] of the selected files of the revision; local: name -> {size, commit_ok}
    for files present locally (commit_ok: a valid hf download record for the pinned revision). A file counts
    as complete when its size matches and commit_ok holds; everything else
    is downloaded again in full (hf writes a new .incomplete file and moves it into place), so its
    whole size is needed.
    """
    if free < 0 or margin < 0:
        raise ValueError("free and margin must be >= 0")
    complete, to_download = [], []
    remote_total = complete_bytes = needed = 0
    for f in remote_files:
        size = f["size"]
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"no size for {f['name']!r} in the file listing")
        remote_total += size
        have = local.get(f["name"])
        if have is not None and have["size"] == size and have["commit_ok"]:
            complete.append(f["name"])
            complete_bytes += size
        else:
            to_download.append(f["name"])
            needed += size
    required = needed + margin if needed else 0
    return {
        "remote_total": remote_total,
        "complete_bytes": complete_bytes,
        "needed": needed,
        "margin": margin,
        "required": required,
        "free": free,
        "ok": free >= required,
        "complete": sorted(complete),
        "to_download": sorted(to_download),
    }


def refusal_message(label: str, repo: str, revision: str, local_dir: str, fs_path: str, plan: dict) -> str:
    return (
        f"{label}: refusing to download {repo}@{revision} into {local_dir}: "
        f"{len(plan['to_download'])} file(s) "
        f"still need {human_size(plan['needed'])} ({plan['needed']} bytes) + margin_bytes "
        f"{human_size(plan['margin'])} = {plan['required']} bytes, but only {human_size(plan['free'])} "
        f"({plan['free']} bytes) is free on the filesystem of {fs_path}"
    )


def existing_ancestor(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def local_state(local_dir: str, names, revision: str) -> dict:
    state = {}
    for name in names:
        try:
            size = os.stat(os.path.join(local_dir, *name.split("/"))).st_size
        except OSError:
            continue
        record = read_hf_download_metadata(local_dir, name)
        state[name] = {"size": size, "commit_ok": record is not None and record["commit_hash"] == revision}
    return state


def read_token(module: AnsibleModule, path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        module.fail_json(msg=f"hf_token_file {path}: cannot be read ({exc.strerror})")
    if not stat.S_ISREG(st.st_mode):
        module.fail_json(msg=f"hf_token_file {path}: not a regular file")
    if st.st_mode & 0o077:
        module.fail_json(
            msg=f"hf_token_file {path}: mode {stat.S_IMODE(st.st_mode):04o} gives group/other access; "
            "it must be 0600 (or 0400)"
        )
    if st.st_uid not in (0, os.geteuid()):
        module.fail_json(
            msg=f"hf_token_file {path}: owned by uid {st.st_uid}, must be root or the connecting user"
        )
    with open(path, encoding="utf-8") as f:
        token = f.readline().strip()
    if not token:
        module.fail_json(msg=f"hf_token_file {path}: is empty")
    return token


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def redact(text: str, secret: str | None) -> str:
    return redact_text(text, [secret] if secret else [])


def run_module() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            repo=dict(type="str", required=True),
            revision=dict(type="str", required=True),
            local_dir=dict(type="path", required=True),
            venv=dict(type="path", required=True),
            hf_token_file=dict(type="path", no_log=False),
            endpoint=dict(type="str"),
            include=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            max_workers=dict(type="int", default=8),
            margin_bytes=dict(type="int", default=10 * 1024**3),
            require_tokenizer=dict(type="bool", default=True),
            role=dict(type="str", default="model"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    label, repo, revision, local_dir = p["role"], p["repo"], p["revision"], p["local_dir"]
    if not COMMIT_HASH_RE.match(revision):
        module.fail_json(
            msg=f"{label}: revision must be a full 40-character lowercase commit hash, got {revision!r}"
        )
    if not os.path.isabs(local_dir):
        module.fail_json(msg=f"{label}: local_dir must be absolute, got {local_dir!r}")
    if p["margin_bytes"] < 0 or p["max_workers"] < 1:
        module.fail_json(msg=f"{label}: margin_bytes must be >= 0 and max_workers >= 1")
    hf = os.path.join(p["venv"], "bin", "hf")
    python = os.path.join(p["venv"], "bin", "python")
    for exe, what in ((python, "python"), (hf, "hf (huggingface_hub's CLI, which replaced huggingface-cli)")):
        if not os.access(exe, os.X_OK):
            module.fail_json(
                msg=f"{label}: {exe} not found or not executable: the SGLang virtualenv (venv) must be "
                f"installed and provide {what}"
            )

    token = read_token(module, p["hf_token_file"]) if p["hf_token_file"] else None
    if token:
        module.no_log_values.add(token)
    env = dict(HF_QUIET_ENV)
    if token:
        env["HF_TOKEN"] = token
    if p["endpoint"]:
        env["HF_ENDPOINT"] = p["endpoint"]

    rc, out, err = module.run_command([python, "-c", LIST_FILES_SCRIPT, repo, revision], environ_update=env)
    if rc != 0:
        module.fail_json(
            msg=f"{label}: listing {repo}@{revision} through {python} (huggingface_hub) failed "
            f"(rc={rc}): {redact(last_line(err), token)}",
            rc=rc,
            stderr=redact(err[-4000:], token),
        )
    try:
        listing = json.loads(out.strip().splitlines()[-1])
        remote = {f["name"]: f for f in listing["files"]}
    except (ValueError, KeyError, IndexError, TypeError):
        module.fail_json(msg=f"{label}: unexpected file listing from {python}: {redact(out[-500:], token)!r}")
    if listing.get("sha") != revision:
        module.fail_json(msg=f"{label}: the Hub resolved {repo}@{revision} to {listing.get('sha')!r}")
    selected = select_files(sorted(remote), p["include"], p["exclude"])
    if not selected:
        module.fail_json(msg=f"{label}: include/exclude select no file of {repo}@{revision}")

    fs_path = existing_ancestor(local_dir)
    try:
        plan = download_plan(
            [remote[n] for n in selected],
            local_state(local_dir, selected, revision),
            free_bytes(fs_path),
            p["margin_bytes"],
        )
    except ValueError as exc:
        module.fail_json(msg=f"{label}: {exc}")
    argv = hf_download_argv(hf, repo, revision, local_dir, p["include"], p["exclude"], p["max_workers"])
    result = dict(plan=plan, command=argv, downloaded=False, changed=bool(plan["to_download"]))
    if not plan["ok"]:
        module.fail_json(msg=refusal_message(label, repo, revision, local_dir, fs_path, plan), **result)
    if module.check_mode:
        module.exit_json(
            msg=f"{label}: would download {len(plan['to_download'])} file(s), {human_size(plan['needed'])}",
            **result,
        )

    if plan["to_download"]:
        os.makedirs(local_dir, mode=0o755, exist_ok=True)
        rc, out, err = module.run_command(argv, environ_update=env)
        result["downloaded"] = True
        if rc != 0:
            module.fail_json(
                msg=f"{label}: {' '.join(argv)} failed (rc={rc}): {redact(last_line(err), token)}",
                rc=rc,
                stderr=redact(err[-4000:], token),
                **result,
            )

    check = check_checkpoint(
        local_dir, require_tokenizer=p["require_tokenizer"], expected_revision=revision, label=label
    )
    result["check"] = check
    if not check["ok"]:
        module.fail_json(
            msg=f"{label}: {repo}@{revision} in {local_dir} fails the weights check after download: "
            + "; ".join(check["problems"]),
            **result,
        )
    module.exit_json(
        msg=f"{label}: {repo}@{revision} complete in {local_dir} ({check['total_size_human']}"
        f"{', downloaded ' + human_size(plan['needed']) if plan['to_download'] else ''})",
        **result,
    )


def main() -> None:
    run_module()


if __name__ == "__main__":
    main()
