#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_weights_check
short_description: Check that a model checkpoint directory is present and complete, from its own manifest
description:
  - Reads C(config.json) (must parse; reports C(architectures) and C(model_type)), and, when C(config.json)
    has an C(auto_map), checks that the remote-code C(.py) files it names are present.
  - Reads C(model.safetensors.index.json) and checks every shard file its C(weight_map) names; a single-file
    C(model.safetensors) without an index is accepted too.
  - For each shard reads ONLY the safetensors header (8-byte length + JSON, one seek); never the tensor
    data. A shard must be present, its header length sane, its header valid JSON with a known dtype, a shape
    and C(data_offsets) consistent with each other and tiling the data buffer, and its size must equal C(8 +
    header_len + max(end of data_offsets)), which detects truncation exactly. Every tensor the index places
    in a shard must be in that shard's header.
  - Checks the tokenizer files the model uses - C(tokenizer_config.json), its C(auto_map) tokenizer module
    and that module's literal C(VOCAB_FILES_NAMES) (e.g. C(tiktoken.model) for Kimi K2), or
    C(tokenizer.json), C(tokenizer.model), C(vocab.json) + C(merges.txt), C(vocab.txt).
  - Reports the revision the directory records - a Hugging Face cache path C(snapshots/<sha>), the per-file
    records C(.cache/huggingface/download/<file>.metadata) that C(hf download --local-dir) writes (first
    line = commit hash; honoured only while the file is not newer than the record, as huggingface_hub does),
    or a C(REVISION) / C(.revision) file - and optionally asserts it.
  - Fails naming every missing, truncated or corrupt file. Never changes anything.
version_added: "1.0.0"
author:
  - sglang-deploy contributors
options:
  path:
    description:
      - Absolute path of the model directory (what is given to SGLang as C(--model-path)).
      - Exactly one of O(path) and O(checkpoints) is required.
    type: path
  checkpoints:
    description:
      - Several checkpoints checked in ONE module call (the role passes the target and the draft together, so
        there is one remote call instead of one per checkpoint). Each item takes the single-checkpoint options
        O(path), O(expected_revision), O(require_tokenizer) and O(role); O(role) labels (unique) name the
        items in every message.
      - Every item is checked (a failing one does not stop the others); RV(results) has one entry per item,
        in order, each shaped like the single-checkpoint return plus its own C(msg). The module fails when
        any item fails, its C(msg) joining the failing items' messages.
      - Mutually exclusive with O(path); the top-level O(expected_revision), O(require_tokenizer) and
        O(role) do not apply to the items.
    type: list
    elements: dict
    suboptions:
      path:
        description: Absolute path of the model directory.
        type: path
        required: true
      expected_revision:
        description: As the top-level O(expected_revision).
        type: str
      require_tokenizer:
        description: As the top-level O(require_tokenizer).
        type: bool
        default: true
      role:
        description: Label of this checkpoint (unique within O(checkpoints)).
        type: str
        default: model
  expected_revision:
    description:
      - Full 40-character commit hash the directory must record. Unset = report the revision, assert
        nothing.
      - When set and the revision comes from C(hf download) records, every checked file must have a valid
        record.
    type: str
  require_tokenizer:
    description: Fail (instead of warn) when the tokenizer files are missing or do not parse. Drafts usually
      have none.
    type: bool
    default: true
  role:
    description: Label used in every message, e.g. C(target) or C(draft).
    type: str
    default: model
attributes:
  check_mode:
    support: full
    description: Read-only; runs fully in check mode.
  diff_mode:
    support: none
notes:
  - Stand-alone use from the repository root, e.g. C(ansible -i host, all -m model_weights_check -a
    "path=/srv/models/Kimi-K2.6 role=target").
"""

EXAMPLES = r"""
- name: Check the target checkpoint
  model_weights_check:
    path: /srv/models/Kimi-K2.6
    expected_revision: 0123456789abcdef0123456789abcdef01234567
    role: target

- name: Check the DFlash draft (it has no tokenizer of its own)
  model_weights_check:
    path: /srv/models/Kimi-K2.6-DFlash
    require_tokenizer: false
    role: draft

- name: Check the target and the draft in one call
  model_weights_check:
    checkpoints:
      - path: /srv/models/Kimi-K2.6
        role: target
      - path: /srv/models/Kimi-K2.6-DFlash
        require_tokenizer: false
        role: draft
  register: weights
  # weights.results[0].ok, weights.results[1].problems, ...
"""

RETURN = r"""
results:
  description:
    - With O(checkpoints) only - one entry per item, in order. Each entry has every key the
      single-checkpoint form returns (RV(model_path), RV(role), RV(ok), RV(architectures), ...
      RV(warnings_found)) plus C(msg), the one-line summary or that checkpoint's failure message.
    - With O(checkpoints) the single-checkpoint keys are not returned at the top level, except RV(ok)
      (true when every item is ok).
  returned: when O(checkpoints) is given
  type: list
  elements: dict
  sample: [{role: target, model_path: /srv/models/lab-target, ok: true,
            msg: "target /srv/models/lab-target: LlamaForCausalLM (llama), 2 shard(s), ..."}]
model_path:
  description: The checked directory (named C(model_path), not C(path), so Ansible does not add file
    attributes).
  returned: always
  type: str
  sample: /srv/models/lab-target
role:
  description: The label given in O(role).
  returned: always
  type: str
  sample: target
ok:
  description: True when nothing is missing, truncated or corrupt and the revision assertion (if any) holds
    (with O(checkpoints) - for every item).
  returned: always
  type: bool
  sample: true
architectures:
  description: C(architectures) from C(config.json).
  returned: always
  type: list
  elements: str
  sample: [LlamaForCausalLM]
model_type:
  description: C(model_type) from C(config.json) (null when absent).
  returned: always
  type: str
  sample: llama
format:
  description: C(sharded) (index + shards), C(single) (model.safetensors) or null (no weights found).
  returned: always
  type: str
  sample: sharded
shards:
  description: One entry per shard file - file, status (ok, missing, truncated, corrupt), size, tensors,
    problem.
  returned: always
  type: list
  elements: dict
  sample: [{file: model-00001-of-00002.safetensors, status: ok, size: 212424, tensors: 10, header_len: 1096,
            dtypes: {BF16: 10}}]
tensor_count:
  description: Number of tensors over all readable shards.
  returned: always
  type: int
  sample: 21
tokenizer_files:
  description: Tokenizer files found (and checked).
  returned: always
  type: list
  elements: str
  sample: [tokenizer_config.json, tokenizer.json]
remote_code_files:
  description: C(.py) files the C(config.json) auto_map needs.
  returned: always
  type: list
  elements: str
  sample: [configuration_deepseek.py, modeling_deepseek.py]
total_size:
  description: Bytes of all checked files (config, index, shards, tokenizer, remote code).
  returned: always
  type: int
  sample: 424360
total_size_human:
  description: O(total_size) in IEC units.
  returned: always
  type: str
  sample: 414.4 KiB
revision:
  description: Commit hash the directory records, or null.
  returned: always
  type: str
  sample: 0123456789abcdef0123456789abcdef01234567
revision_source:
  description: Where the revision came from (hf-cache-snapshot, hf-local-dir-metadata, file:REVISION,
    file:.revision).
  returned: always
  type: str
  sample: hf-local-dir-metadata
revision_unattributed:
  description: Checked files without a valid C(hf download) record, when the directory has such records at
    all.
  returned: always
  type: list
  elements: str
  sample: []
missing:
  description: Names of missing files.
  returned: always
  type: list
  elements: str
  sample: [model-00002-of-00002.safetensors]
truncated:
  description: Names of truncated files.
  returned: always
  type: list
  elements: str
  sample: []
corrupt:
  description: Names of files that are present but unusable.
  returned: always
  type: list
  elements: str
  sample: []
problems:
  description: One sentence per failure, each naming the file.
  returned: always
  type: list
  elements: str
  sample: ["target /srv/models/x/model-00002-of-00002.safetensors: truncated: 1000 bytes but the header
    describes 2048"]
warnings_found:
  description: Findings that are not failures (e.g. missing tokenizer with require_tokenizer=false).
  returned: always
  type: list
  elements: str
  sample: []
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_safetensors import COMMIT_HASH_RE, check_checkpoint


def summary(result: dict) -> str:
    """One line for the operator."""
    arch = ",".join(result["architectures"]) or "?"
    rev = result["revision"] or "unrecorded"
    return (
        f"{result['role']} {result['model_path']}: {arch} ({result['model_type']}), "
        f"{len(result['shards'])} shard(s), "
        f"{result['tensor_count']} tensors, {result['total_size_human']}, revision {rev}"
    )


def option_error(path: str, expected: str | None, where: str = "") -> str | None:
    """What is wrong with one checkpoint's options (None: nothing). `where` prefixes the message."""
    if not os.path.isabs(path):
        return f"{where}path must be absolute, got {path!r}"
    if expected is not None and not COMMIT_HASH_RE.match(expected):
        return f"{where}expected_revision must be a full 40-character lowercase commit hash, got {expected!r}"
    return None


def check_one(module: AnsibleModule, path: str, expected: str | None, require_tokenizer: bool, role: str):
    """Check one checkpoint (options already valid). Returns (result, error): error is the failure
    message, None when the checkpoint is usable."""
    result = check_checkpoint(
        path,
        require_tokenizer=require_tokenizer,
        expected_revision=expected,
        label=role,
    )
    result["warnings_found"] = result.pop("warnings")
    result["model_path"] = result.pop("path")
    for line in result["warnings_found"]:
        module.warn(line)
    if not result["ok"]:
        return result, f"{role} weights at {path} are not usable: " + "; ".join(result["problems"])
    return result, None


def run_single(module: AnsibleModule) -> None:
    params = module.params
    expected = params["expected_revision"] or None
    error = option_error(params["path"], expected)
    if error is not None:
        module.fail_json(msg=error)
    result, error = check_one(module, params["path"], expected, params["require_tokenizer"], params["role"])
    if error is not None:
        module.fail_json(msg=error, changed=False, **result)
    module.exit_json(changed=False, msg=summary(result), **result)


def run_many(module: AnsibleModule) -> None:
    items = module.params["checkpoints"]
    if not items:
        module.fail_json(msg="checkpoints must list at least one checkpoint")
    roles = [item["role"] for item in items]
    repeated = sorted({r for r in roles if roles.count(r) > 1})
    if repeated:
        module.fail_json(msg=f"checkpoints: every role label must be unique; repeated: {', '.join(repeated)}")
    for item in items:
        item["expected_revision"] = item["expected_revision"] or None
    # Every item's options first: a wrong option fails before any directory is read, naming the item.
    option_errors = [
        e
        for e in (option_error(i["path"], i["expected_revision"], f"{i['role']}: ") for i in items)
        if e is not None
    ]
    if option_errors:
        module.fail_json(msg="; ".join(option_errors))
    results, errors = [], []
    for item in items:
        result, error = check_one(
            module, item["path"], item["expected_revision"], item["require_tokenizer"], item["role"]
        )
        result["msg"] = summary(result) if error is None else error
        results.append(result)
        if error is not None:
            errors.append(error)
    if errors:
        module.fail_json(msg=" | ".join(errors), changed=False, ok=False, results=results)
    module.exit_json(changed=False, msg=" | ".join(r["msg"] for r in results), ok=True, results=results)


def run_module() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            checkpoints=dict(
                type="list",
                elements="dict",
                options=dict(
                    path=dict(type="path", required=True),
                    expected_revision=dict(type="str"),
                    require_tokenizer=dict(type="bool", default=True),
                    role=dict(type="str", default="model"),
                ),
            ),
            expected_revision=dict(type="str"),
            require_tokenizer=dict(type="bool", default=True),
            role=dict(type="str", default="model"),
        ),
        mutually_exclusive=[("path", "checkpoints")],
        required_one_of=[("path", "checkpoints")],
        supports_check_mode=True,
    )
    if module.params["checkpoints"] is None:
        run_single(module)
    else:
        run_many(module)


def main() -> None:
    run_module()


if __name__ == "__main__":
    main()
