"""Unit tests for library/model_weights_check.py, library/model_weights_fetch.py and
module_utils/sglang_safetensors.py.

They drive the modules' REAL main() (ansible-core >= 2.19 `patch_module_args`) on tiny but real safetensors
checkpoints that the tests write with the standard library (8-byte little-endian header length + JSON header +
tensor bytes). The hf download records come from tests/fixtures/weights/hf-local-dir (written by the real
huggingface_hub, see its SOURCE.md). The fetch module's child processes (`<venv>/bin/python` for the file
listing and `<venv>/bin/hf`) are small executables written by the tests into a fake venv: they record their
argv and environment, so the tests see exactly what the module passes, and the listing they print is the JSON
shape that the module's own LIST_FILES_SCRIPT prints.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import stat
import struct
import sys
import textwrap
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "weights"
SENTINEL = "SENTINEL-HF-TOKEN-77ab"
# The commit the recorded hf metadata fixture was written for (see tests/fixtures/weights/SOURCE.md).
FIXTURE_COMMIT = (FIXTURES / "hf-local-dir" / "COMMIT").read_text().strip()
OTHER_COMMIT = "1" * 40


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# The modules import their shared code as ansible.module_utils.sglang_safetensors
# (ansible.cfg's module_utils path).
st = _load("ansible.module_utils.sglang_safetensors", REPO / "module_utils" / "sglang_safetensors.py")
check_mod = _load("model_weights_check", REPO / "library" / "model_weights_check.py")
fetch_mod = _load("model_weights_fetch", REPO / "library" / "model_weights_fetch.py")


# ---------------------------------------------------------------- a standard-library safetensors writer


def safetensors_bytes(tensors: list[tuple[str, str, list[int]]]) -> bytes:
    """tensors: (name, dtype, shape). Contents: deterministic bytes of the right length."""
    header: dict = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, dtype, shape in tensors:
        n = st.tensor_nbytes(dtype, shape)
        blob = (hashlib.sha256(name.encode()).digest() * (n // 32 + 1))[:n]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + n]}
        data += blob
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


SHARDS = {
    "model-00001-of-00002.safetensors": [
        ("model.embed_tokens.weight", "BF16", [64, 16]),
        ("model.layers.0.self_attn.q_proj.weight", "BF16", [16, 16]),
        ("model.layers.0.input_layernorm.weight", "F32", [16]),
    ],
    "model-00002-of-00002.safetensors": [
        ("model.layers.1.self_attn.q_proj.weight", "BF16", [16, 16]),
        ("model.norm.weight", "F32", [16]),
        ("lm_head.weight", "BF16", [64, 16]),
    ],
}
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "vocab_size": 64,
    "torch_dtype": "bfloat16",
}
DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "block_size": 16,
    "vocab_size": 64,
}


def write_checkpoint(directory: Path, config=TARGET_CONFIG, tokenizer=True, shards=SHARDS) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for fname, tensors in shards.items():
        (directory / fname).write_bytes(safetensors_bytes(tensors))
        for name, dtype, shape in tensors:
            weight_map[name] = fname
            total += st.tensor_nbytes(dtype, shape)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (directory / "config.json").write_text(json.dumps(config))
    if tokenizer:
        (directory / "tokenizer.json").write_text(
            json.dumps({"version": "1.0", "model": {"type": "WordLevel"}})
        )
        (directory / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
        )
    return directory


def add_hf_records(directory: Path, commit_override: dict | None = None) -> None:
    """Copy the recorded hf download records in; make the files older than them (hf's validity rule)."""
    shutil.copytree(FIXTURES / "hf-local-dir" / ".cache", directory / ".cache")
    for meta in (directory / ".cache" / "huggingface" / "download").glob("*.metadata"):
        name = meta.name[: -len(".metadata")]
        lines = meta.read_text().splitlines()
        if commit_override and name in commit_override:
            lines[0] = commit_override[name]
            meta.write_text("\n".join(lines) + "\n")
        timestamp = float(lines[2])
        if (directory / name).exists():
            os.utime(directory / name, (timestamp - 60, timestamp - 60))


# ---------------------------------------------------------------- driving main()


def run_main(mod, args: dict, capsys, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        mod.main()
    out = capsys.readouterr().out
    result = json.loads(out)
    result["_rc"] = exc.value.code
    result["_raw"] = out
    return result


def check(path, capsys, **kw):
    return run_main(check_mod, dict(path=str(path), **kw), capsys)


# ---------------------------------------------------------------- model_weights_check


def test_complete_checkpoint_passes(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "target")
    r = check(d, capsys, role="target")
    assert r["_rc"] == 0 and r["ok"] is True and not r.get("failed")
    assert r["changed"] is False
    assert r["architectures"] == ["LlamaForCausalLM"] and r["model_type"] == "llama"
    assert r["format"] == "sharded"
    assert [s["status"] for s in r["shards"]] == ["ok", "ok"]
    assert r["tensor_count"] == 6
    expected_total = sum(f.stat().st_size for f in d.iterdir())
    assert r["total_size"] == expected_total
    assert r["total_size_human"] == st.human_size(expected_total)
    assert r["tokenizer_files"] == ["tokenizer_config.json", "tokenizer.json"]
    assert r["revision"] is None
    assert r["model_path"] == str(d)
    assert "size" not in r  # no file attributes added by Ansible (key is model_path, not path)


def test_check_mode_runs_fully(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "model-00002-of-00002.safetensors").unlink()
    r = run_main(check_mod, dict(path=str(d)), capsys, check_mode=True)
    assert r["failed"] is True and r["missing"] == ["model-00002-of-00002.safetensors"]


def test_single_file_checkpoint_without_index_passes(tmp_path, capsys):
    d = tmp_path / "single"
    d.mkdir()
    (d / "model.safetensors").write_bytes(safetensors_bytes(SHARDS["model-00001-of-00002.safetensors"]))
    (d / "config.json").write_text(json.dumps(DRAFT_CONFIG))
    r = check(d, capsys, role="draft", require_tokenizer=False)
    assert r["ok"] is True and r["format"] == "single" and r["tensor_count"] == 3
    assert any("no tokenizer" in w for w in r["warnings_found"])


def test_missing_shard_named(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "model-00002-of-00002.safetensors").unlink()
    r = check(d, capsys, role="target")
    assert r["failed"] is True and r["_rc"] == 1
    assert r["missing"] == ["model-00002-of-00002.safetensors"]
    assert "target" in r["msg"] and "model-00002-of-00002.safetensors: missing" in r["msg"]
    assert r["shards"][1]["status"] == "missing"


def test_dangling_symlink_shard_is_missing(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    shard = d / "model-00001-of-00002.safetensors"
    shard.unlink()
    shard.symlink_to(tmp_path / "blobs" / "nothing")
    r = check(d, capsys)
    assert r["missing"] == ["model-00001-of-00002.safetensors"]


@pytest.mark.parametrize("cut", [1, 100, 1500])
def test_truncated_shard_named_with_byte_counts(tmp_path, capsys, cut):
    d = write_checkpoint(tmp_path / "t")
    shard = d / "model-00002-of-00002.safetensors"
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - cut)
    r = check(d, capsys, role="target")
    assert r["failed"] is True
    assert r["truncated"] == ["model-00002-of-00002.safetensors"]
    assert f"{size - cut} bytes but the header describes {size}" in r["msg"]
    assert f"{cut} bytes missing" in r["msg"]


def test_truncated_inside_header(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    shard = d / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:40])
    r = check(d, capsys)
    assert r["truncated"] == ["model-00001-of-00002.safetensors"]
    assert "header length" in r["msg"]


def test_shorter_than_eight_bytes(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "model-00001-of-00002.safetensors").write_bytes(b"\x01\x02\x03")
    r = check(d, capsys)
    assert r["truncated"] == ["model-00001-of-00002.safetensors"]
    assert "shorter than the 8-byte" in r["msg"]


def _rewrite_header(shard: Path, mutate) -> None:
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    new = mutate(header)
    body = new if isinstance(new, bytes) else json.dumps(new).encode()
    shard.write_bytes(struct.pack("<Q", len(body)) + body + raw[8 + n :])


def _drop_last_tensor_keep_bytes(h):
    del h["model.norm.weight"]
    return h


CORRUPTIONS = {
    "not json": (lambda h: b"{not json" + b" " * 20, "header is not valid JSON"),
    "not utf-8": (lambda h: b"\xff\xfe" * 10, "header is not UTF-8"),
    "not an object": (lambda h: b"[1, 2, 3]", "header is not a JSON object"),
    "unknown dtype": (
        lambda h: {**h, "lm_head.weight": {**h["lm_head.weight"], "dtype": "Q4_K"}},
        "unknown dtype 'Q4_K'",
    ),
    "shape vs offsets": (
        lambda h: {**h, "lm_head.weight": {**h["lm_head.weight"], "shape": [64, 17]}},
        "needs 2176",
    ),
    "negative dim": (
        lambda h: {**h, "lm_head.weight": {**h["lm_head.weight"], "shape": [-64, 16]}},
        "is not a list of non-negative integers",
    ),
    "reversed offsets": (
        lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "data_offsets": [576, 512]}},
        "begin <= end",
    ),
    "hole": (_drop_last_tensor_keep_bytes, "leaves a hole"),
    "missing key": (
        lambda h: {
            **h,
            "lm_head.weight": {"dtype": "BF16", "data_offsets": h["lm_head.weight"]["data_offsets"]},
        },
        "lacks dtype, shape or data_offsets",
    ),
}


def test_extra_tensor_keys_are_accepted_like_safetensors(tmp_path, capsys):
    # The safetensors library (serde) ignores unknown keys in a tensor entry; so does the check.
    d = write_checkpoint(tmp_path / "t")
    _rewrite_header(
        d / "model-00002-of-00002.safetensors",
        lambda h: {**h, "lm_head.weight": {**h["lm_head.weight"], "offset": 0}},
    )
    assert check(d, capsys)["ok"] is True


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_header_named(tmp_path, capsys, case):
    mutate, needle = CORRUPTIONS[case]
    d = write_checkpoint(tmp_path / "t")
    _rewrite_header(d / "model-00002-of-00002.safetensors", mutate)
    r = check(d, capsys, role="target")
    assert r["failed"] is True
    assert r["corrupt"] == ["model-00002-of-00002.safetensors"], r["msg"]
    assert needle in r["msg"]


def test_header_length_absurd(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    shard = d / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 2**40) + raw[8:])
    r = check(d, capsys)
    assert r["corrupt"] == ["model-00001-of-00002.safetensors"] and "not a safetensors file" in r["msg"]


def test_trailing_bytes_are_corrupt(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    with open(d / "model-00001-of-00002.safetensors", "ab") as f:
        f.write(b"\0" * 8)
    r = check(d, capsys)
    assert r["corrupt"] == ["model-00001-of-00002.safetensors"] and "8 trailing bytes" in r["msg"]


def test_shard_from_other_revision_lacks_indexed_tensor(tmp_path, capsys):
    shards = {k: list(v) for k, v in SHARDS.items()}
    d = write_checkpoint(tmp_path / "t", shards=shards)
    # the shard on disk is an "older" one: one tensor the index places there is absent from its header
    (d / "model-00002-of-00002.safetensors").write_bytes(
        safetensors_bytes(SHARDS["model-00002-of-00002.safetensors"][:2])
    )
    r = check(d, capsys)
    assert r["corrupt"] == ["model-00002-of-00002.safetensors"]
    assert "lacks (first: lm_head.weight)" in r["msg"]


def test_index_without_weight_map(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}}))
    r = check(d, capsys)
    assert r["corrupt"] == ["model.safetensors.index.json"] and "weight_map" in r["msg"]


def test_no_weights_at_all(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    for f in d.glob("model*"):
        f.unlink()
    r = check(d, capsys)
    assert r["missing"] == ["model.safetensors.index.json"] and "no weights" in r["msg"]


def test_missing_draft_config_named(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "draft", config=DRAFT_CONFIG, tokenizer=False)
    (d / "config.json").unlink()
    r = check(d, capsys, role="draft", require_tokenizer=False)
    assert r["failed"] is True and r["missing"] == ["config.json"]
    assert r["msg"].startswith("draft weights at ") and f"draft {d}/config.json: missing" in r["msg"]


def test_checkpoints_checks_every_item_in_one_call(tmp_path, capsys):
    target = write_checkpoint(tmp_path / "target")
    draft = write_checkpoint(tmp_path / "draft", config=DRAFT_CONFIG, tokenizer=False)
    items = [
        {"path": str(target), "role": "target"},
        {"path": str(draft), "role": "draft", "require_tokenizer": False},
    ]
    r = run_main(check_mod, {"checkpoints": items}, capsys)
    assert r["_rc"] == 0 and r["ok"] is True and not r.get("failed")
    assert [x["role"] for x in r["results"]] == ["target", "draft"] and all(x["ok"] for x in r["results"])
    assert r["results"][1]["model_path"] == str(draft) and "model_path" not in r
    # A broken target does not hide a broken draft: both are named, each in its own entry.
    shard = target / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    (draft / "config.json").unlink()
    r = run_main(check_mod, {"checkpoints": items}, capsys)
    assert r["failed"] is True and r["ok"] is False
    assert [x["ok"] for x in r["results"]] == [False, False]
    assert f"target weights at {target} are not usable" in r["msg"] and "100 bytes missing" in r["msg"]
    assert f"draft {draft}/config.json: missing" in r["msg"]
    assert r["results"][1]["missing"] == ["config.json"]


def test_checkpoints_options_fail_before_any_read(tmp_path, capsys):
    same_role = [{"path": "rel/x", "role": "a"}, {"path": "/x", "role": "a"}]
    r = run_main(check_mod, {"checkpoints": same_role}, capsys)
    assert r["failed"] is True and r["msg"] == "checkpoints: every role label must be unique; repeated: a"
    bad = [{"path": "rel/x", "role": "target"}, {"path": "/x", "role": "draft", "expected_revision": "abc"}]
    r = run_main(check_mod, {"checkpoints": bad}, capsys)
    assert r["failed"] is True
    assert r["msg"] == (
        "target: path must be absolute, got 'rel/x'; draft: expected_revision must be a full"
        " 40-character lowercase commit hash, got 'abc'"
    )
    r = run_main(check_mod, {"checkpoints": [], "path": "/x"}, capsys)
    assert r["failed"] is True and "mutually exclusive" in r["msg"]


def test_config_not_json(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "config.json").write_text('{"architectures": [')
    r = check(d, capsys)
    assert r["corrupt"] == ["config.json"] and "does not parse as JSON" in r["msg"]


def test_missing_directory(tmp_path, capsys):
    r = check(tmp_path / "nope", capsys, role="draft")
    assert r["failed"] is True and "does not exist" in r["msg"] and "draft" in r["msg"]


def test_relative_path_refused(capsys):
    r = run_main(check_mod, dict(path="models/x"), capsys)
    assert r["failed"] is True and "path must be absolute" in r["msg"]


def test_tokenizer_required_or_warned(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t", tokenizer=False)
    r = check(d, capsys, role="target")
    assert (
        r["failed"] is True and r["missing"] == ["tokenizer.json"] and "require_tokenizer is true" in r["msg"]
    )
    r = check(d, capsys, role="target", require_tokenizer=False)
    assert r["ok"] is True and any("require_tokenizer is false" in w for w in r["warnings_found"])


def test_tokenizer_json_corrupt(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    (d / "tokenizer.json").write_text("{")
    r = check(d, capsys)
    assert r["corrupt"] == ["tokenizer.json"]


def test_remote_code_tokenizer_needs_its_vocab_files(tmp_path, capsys):
    # Remote-code tokenizer (Kimi K2 style): tokenizer_config.json auto_map -> tokenization_kimi.py, whose
    # VOCAB_FILES_NAMES names tiktoken.model. No tokenizer.json.
    d = write_checkpoint(
        tmp_path / "t",
        tokenizer=False,
        config={**TARGET_CONFIG, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}},
    )
    (d / "configuration_deepseek.py").write_text("class DeepseekV3Config: pass\n")
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                "tokenizer_class": "TikTokenTokenizer",
            }
        )
    )
    (d / "tokenization_kimi.py").write_text(
        textwrap.dedent("""\
        VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
        class TikTokenTokenizer: pass
        """)
    )
    r = check(d, capsys, role="target")
    assert r["failed"] is True and r["missing"] == ["tiktoken.model"] and "VOCAB_FILES_NAMES" in r["msg"]
    (d / "tiktoken.model").write_text("IQ== 0\n")
    r = check(d, capsys, role="target")
    assert r["ok"] is True, r["msg"]
    assert set(r["tokenizer_files"]) == {"tokenizer_config.json", "tokenization_kimi.py", "tiktoken.model"}
    assert r["remote_code_files"] == ["configuration_deepseek.py"]
    (d / "configuration_deepseek.py").unlink()
    r = check(d, capsys, role="target")
    assert r["missing"] == ["configuration_deepseek.py"] and "auto_map references it" in r["msg"]


# ------------------------------------------------------------------------------------------- revisions


def test_revision_from_hf_download_records(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    add_hf_records(d)
    r = check(d, capsys, expected_revision=FIXTURE_COMMIT)
    assert r["ok"] is True, r["msg"]
    assert r["revision"] == FIXTURE_COMMIT and r["revision_source"] == "hf-local-dir-metadata"
    r = check(d, capsys, expected_revision=OTHER_COMMIT)
    assert r["failed"] is True and f"is not expected_revision {OTHER_COMMIT}" in r["msg"]


def test_mixed_revisions_fail(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    add_hf_records(d, commit_override={"model-00002-of-00002.safetensors": OTHER_COMMIT})
    r = check(d, capsys)
    assert r["failed"] is True and "2 different revisions" in r["msg"]
    assert "model-00002-of-00002.safetensors" in r["msg"]


def test_file_modified_after_download_is_unattributed(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    add_hf_records(d)
    os.utime(d / "config.json", None)  # now: newer than its record -> huggingface_hub ignores the record too
    r = check(d, capsys)
    assert r["ok"] is True and r["revision_unattributed"] == ["config.json"]
    r = check(d, capsys, expected_revision=FIXTURE_COMMIT)
    assert r["failed"] is True and "not proven to be revision" in r["msg"] and "config.json" in r["msg"]


def test_revision_from_hf_cache_snapshot_path(tmp_path, capsys):
    sha = "a" * 40
    snap = tmp_path / "hub" / "models--org--name" / "snapshots" / sha
    blobs = tmp_path / "hub" / "models--org--name" / "blobs"
    src = write_checkpoint(blobs / "src")
    snap.mkdir(parents=True)
    for f in src.iterdir():
        (snap / f.name).symlink_to(f)
    r = check(snap, capsys, expected_revision=sha)
    assert r["ok"] is True and r["revision"] == sha and r["revision_source"] == "hf-cache-snapshot"


@pytest.mark.parametrize("fname", ["REVISION", ".revision"])
def test_revision_file(tmp_path, capsys, fname):
    d = write_checkpoint(tmp_path / "t")
    (d / fname).write_text("b" * 40 + "\n")
    r = check(d, capsys, expected_revision="b" * 40)
    assert r["ok"] is True and r["revision_source"] == f"file:{fname}"


def test_revision_sources_disagree(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    add_hf_records(d)
    (d / "REVISION").write_text(OTHER_COMMIT)
    r = check(d, capsys)
    assert r["failed"] is True and "revision records disagree" in r["msg"]


def test_expected_revision_but_none_recorded(tmp_path, capsys):
    d = write_checkpoint(tmp_path / "t")
    r = check(d, capsys, expected_revision="c" * 40)
    assert r["failed"] is True and "records no revision" in r["msg"]


@pytest.mark.parametrize("bad", ["main", "v1.0", "A" * 40, "a" * 39])
def test_expected_revision_format(tmp_path, capsys, bad):
    d = write_checkpoint(tmp_path / "t")
    r = check(d, capsys, expected_revision=bad)
    assert r["failed"] is True and "expected_revision must be a full 40-character" in r["msg"]


def test_headers_only_are_read(tmp_path, capsys, monkeypatch):
    """A shard whose data region is a sparse hole of 64 GiB is checked by reading only its header."""
    d = write_checkpoint(tmp_path / "t")
    big = [("w", "BF16", [2**17, 2**18])]  # 64 GiB of data
    raw = safetensors_bytes([("w", "BF16", [1])])
    (n,) = struct.unpack("<Q", raw[:8])
    header = {"w": {"dtype": "BF16", "shape": big[0][2], "data_offsets": [0, 2 * 2**35]}}
    body = json.dumps(header).encode()
    shard = d / "model-00001-of-00002.safetensors"
    with open(shard, "wb") as f:
        f.write(struct.pack("<Q", len(body)) + body)
        f.truncate(8 + len(body) + 2 * 2**35)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != shard.name} | {
        "w": shard.name
    }
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    reads = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def fileno(self):
            return self.f.fileno()

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

    def counting_open(path, mode="r", *a, **kw):
        f = real_open(path, mode, *a, **kw)
        return Counting(f) if str(path) == str(shard) else f

    monkeypatch.setattr("builtins.open", counting_open)
    r = check(d, capsys)
    assert r["ok"] is True, r["msg"]
    assert sum(reads) == 8 + len(body)
    assert r["total_size"] > 64 * 2**30


# ------------------------------------------------------------------------------------------- fetch: pure


def test_hf_download_argv():
    argv = fetch_mod.hf_download_argv(
        "/opt/sglang/venv/bin/hf",
        "moonshotai/Kimi-K2.6",
        "d" * 40,
        "/srv/models/Kimi-K2.6",
        include=["*.safetensors", "*.json"],
        exclude=["original/"],
        max_workers=16,
    )
    assert argv == [
        "/opt/sglang/venv/bin/hf",
        "download",
        "moonshotai/Kimi-K2.6",
        "--revision",
        "d" * 40,
        "--local-dir",
        "/srv/models/Kimi-K2.6",
        "--max-workers",
        "16",
        "--include",
        "*.safetensors",
        "--include",
        "*.json",
        "--exclude",
        "original/",
    ]
    assert not any("token" in a.lower() for a in argv)


def test_select_files_like_hf():
    names = ["config.json", "model-1.safetensors", "original/consolidated.pth", "docs/x.md", ".gitattributes"]
    assert fetch_mod.select_files(names) == names
    assert fetch_mod.select_files(names, include=["*.json", "*.safetensors"]) == [
        "config.json",
        "model-1.safetensors",
    ]
    assert fetch_mod.select_files(names, exclude=["original/", "docs/"]) == [
        "config.json",
        "model-1.safetensors",
        ".gitattributes",
    ]


GIB = 1024**3

PLAN_CASES = [
    # id, remote sizes, local state, free, margin -> needed, required, ok
    ("fresh fits", {"a": 100 * GIB, "b": 50 * GIB}, {}, 200 * GIB, 10 * GIB, 150 * GIB, 160 * GIB, True),
    ("fresh exactly", {"a": 100}, {}, 110, 10, 100, 110, True),
    ("fresh short by one", {"a": 100}, {}, 109, 10, 100, 110, False),
    ("half present", {"a": 100, "b": 50}, {"a": {"size": 100, "commit_ok": True}}, 60, 10, 50, 60, True),
    (
        "present but other revision",
        {"a": 100},
        {"a": {"size": 100, "commit_ok": False}},
        60,
        10,
        100,
        110,
        False,
    ),
    ("present but wrong size", {"a": 100}, {"a": {"size": 40, "commit_ok": True}}, 60, 10, 100, 110, False),
    ("all present, full disk", {"a": 100}, {"a": {"size": 100, "commit_ok": True}}, 0, 10, 0, 0, True),
]


@pytest.mark.parametrize("case", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_download_plan(case):
    _, remote, local, free, margin, needed, required, ok = case
    plan = fetch_mod.download_plan([{"name": n, "size": s} for n, s in remote.items()], local, free, margin)
    assert (plan["needed"], plan["required"], plan["ok"]) == (needed, required, ok)
    assert plan["remote_total"] == sum(remote.values())
    assert plan["complete_bytes"] + plan["needed"] == plan["remote_total"]


def test_download_plan_requires_sizes():
    with pytest.raises(ValueError, match="no size for 'a'"):
        fetch_mod.download_plan([{"name": "a", "size": None}], {}, 10, 0)


# ------------------------------------------------------------------------------------------- fetch: main()


def make_venv(
    root: Path, listing: dict, hf_writes: Path | None = None, hf_rc: int = 0, list_rc: int = 0
) -> Path:
    """A fake venv: bin/python prints `listing` (the LIST_FILES_SCRIPT output shape), bin/hf copies
    `hf_writes` into --local-dir. Both record argv + environment into calls.jsonl."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = root / "calls.jsonl"
    (root / "listing.json").write_text(json.dumps(listing))
    common = textwrap.dedent(f"""\
        #!{sys.executable}
        import json, os, shutil, sys
        with open({str(calls)!r}, "a") as f:
            f.write(json.dumps({{"argv": sys.argv, "env": dict(os.environ)}}) + "\\n")
        """)
    (venv / "bin" / "python").write_text(
        common
        + textwrap.dedent(f"""\
        if {list_rc}:
            sys.stderr.write("401 Client Error for token " + os.environ.get("HF_TOKEN", "") + "\\n")
            sys.exit({list_rc})
        print(open({str(root / "listing.json")!r}).read())
        """)
    )
    (venv / "bin" / "hf").write_text(
        common
        + textwrap.dedent(f"""\
        dest = sys.argv[sys.argv.index("--local-dir") + 1]
        src = {str(hf_writes) if hf_writes else ""!r}
        if src:
            shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)
        sys.exit({hf_rc})
        """)
    )
    for exe in ("python", "hf"):
        (venv / "bin" / exe).chmod(0o755)
    return venv


def listing_of(directory: Path, sha: str) -> dict:
    return {
        "sha": sha,
        "files": [
            {
                "name": str(f.relative_to(directory)),
                "size": f.stat().st_size,
                "blob_id": None,
                "lfs_sha256": None,
            }
            for f in sorted(directory.rglob("*"))
            if f.is_file() and ".cache" not in f.parts
        ],
    }


def calls_of(root: Path) -> list[dict]:
    path = root / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "hf_token"
    path.write_text(SENTINEL + "\n")
    path.chmod(0o600)
    return path


def fetch_args(venv, local_dir, token_file, **kw):
    return dict(
        repo="moonshotai/Kimi-K2.6",
        revision=FIXTURE_COMMIT,
        local_dir=str(local_dir),
        venv=str(venv),
        hf_token_file=str(token_file),
        role="target",
        **kw,
    )


def test_fetch_refuses_on_full_disk_and_never_starts_hf(tmp_path, capsys, token_file, monkeypatch):
    src = write_checkpoint(tmp_path / "src")
    listing = listing_of(src, FIXTURE_COMMIT)
    # pretend it is a 600 GB checkpoint (sizes come only from the listing)
    listing["files"] = [dict(f, size=f["size"] * 2**20) for f in listing["files"]]
    venv = make_venv(tmp_path, listing, hf_writes=src)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda path: 5 * GIB)
    dest = tmp_path / "models" / "Kimi-K2.6"
    r = run_main(fetch_mod, fetch_args(venv, dest, token_file, margin_bytes=10 * GIB), capsys)
    assert r["failed"] is True and r["plan"]["ok"] is False
    needed = sum(f["size"] for f in listing["files"])
    assert r["plan"]["needed"] == needed and r["plan"]["required"] == needed + 10 * GIB
    assert "refusing to download moonshotai/Kimi-K2.6@" in r["msg"] and str(dest) in r["msg"]
    assert f"only {st.human_size(5 * GIB)}" in r["msg"] and "margin_bytes" in r["msg"]
    assert [Path(c["argv"][0]).name for c in calls_of(tmp_path)] == ["python"]  # hf never ran
    assert not dest.exists()
    assert SENTINEL not in r["_raw"]


def test_fetch_check_mode_plans_only(tmp_path, capsys, token_file, monkeypatch):
    src = write_checkpoint(tmp_path / "src")
    venv = make_venv(tmp_path, listing_of(src, FIXTURE_COMMIT), hf_writes=src)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda path: 100 * GIB)
    dest = tmp_path / "dest"
    r = run_main(fetch_mod, fetch_args(venv, dest, token_file), capsys, check_mode=True)
    assert r["_rc"] == 0 and r["changed"] is True and r["downloaded"] is False
    assert len(r["plan"]["to_download"]) == 6 and not dest.exists()
    assert [Path(c["argv"][0]).name for c in calls_of(tmp_path)] == ["python"]


def _records_for(directory: Path, commit: str) -> None:
    """What hf download leaves: per-file records (real format, from the fixture), for `commit`."""
    add_hf_records(directory, commit_override={n: commit for n in os.listdir(directory)})


def test_fetch_downloads_then_checks_and_keeps_token_secret(tmp_path, capsys, token_file, monkeypatch):
    src = write_checkpoint(tmp_path / "src")
    _records_for(src, FIXTURE_COMMIT)
    venv = make_venv(tmp_path, listing_of(src, FIXTURE_COMMIT), hf_writes=src)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda path: 100 * GIB)
    dest = tmp_path / "models" / "t"
    r = run_main(fetch_mod, fetch_args(venv, dest, token_file, margin_bytes=0), capsys)
    assert r["_rc"] == 0, r["msg"]
    assert r["changed"] is True and r["downloaded"] is True and r["check"]["ok"] is True
    assert r["check"]["revision"] == FIXTURE_COMMIT
    calls = calls_of(tmp_path)
    assert [Path(c["argv"][0]).name for c in calls] == ["python", "hf"]
    assert calls[1]["argv"][1:] == [
        "download",
        "moonshotai/Kimi-K2.6",
        "--revision",
        FIXTURE_COMMIT,
        "--local-dir",
        str(dest),
        "--max-workers",
        "8",
    ]
    for c in calls:
        assert c["env"]["HF_TOKEN"] == SENTINEL  # passed by environment only
        assert SENTINEL not in " ".join(c["argv"])
        assert c["env"]["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    assert SENTINEL not in r["_raw"]

    # second run: everything complete for the revision -> hf does not run, nothing changes
    r2 = run_main(fetch_mod, fetch_args(venv, dest, token_file, margin_bytes=0), capsys)
    assert r2["_rc"] == 0 and r2["changed"] is False and r2["downloaded"] is False
    assert r2["plan"]["needed"] == 0 and len(r2["plan"]["complete"]) == 6
    assert [Path(c["argv"][0]).name for c in calls_of(tmp_path)] == ["python", "hf", "python"]


def test_fetch_fails_when_download_leaves_a_truncated_shard(tmp_path, capsys, token_file, monkeypatch):
    src = write_checkpoint(tmp_path / "src")
    listing = listing_of(src, FIXTURE_COMMIT)
    shard = src / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    _records_for(src, FIXTURE_COMMIT)
    venv = make_venv(tmp_path, listing, hf_writes=src)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda path: 100 * GIB)
    r = run_main(fetch_mod, fetch_args(venv, tmp_path / "dest", token_file), capsys)
    assert r["failed"] is True and r["downloaded"] is True
    assert "fails the weights check after download" in r["msg"]
    assert r["check"]["truncated"] == ["model-00002-of-00002.safetensors"]


def test_fetch_listing_error_is_redacted(tmp_path, capsys, token_file):
    venv = make_venv(tmp_path, {}, list_rc=1)
    r = run_main(fetch_mod, fetch_args(venv, tmp_path / "dest", token_file), capsys)
    assert (
        r["failed"] is True and "listing moonshotai/Kimi-K2.6@" in r["msg"] and "401 Client Error" in r["msg"]
    )
    assert SENTINEL not in r["_raw"]


def test_fetch_hf_failure_reported(tmp_path, capsys, token_file, monkeypatch):
    src = write_checkpoint(tmp_path / "src")
    venv = make_venv(tmp_path, listing_of(src, FIXTURE_COMMIT), hf_rc=3)
    monkeypatch.setattr(fetch_mod, "free_bytes", lambda path: 100 * GIB)
    r = run_main(fetch_mod, fetch_args(venv, tmp_path / "dest", token_file), capsys)
    assert r["failed"] is True and "(rc=3)" in r["msg"] and r["rc"] == 3
    assert SENTINEL not in r["_raw"]


def test_fetch_resolved_sha_must_match(tmp_path, capsys, token_file):
    venv = make_venv(tmp_path, {"sha": OTHER_COMMIT, "files": []})
    r = run_main(fetch_mod, fetch_args(venv, tmp_path / "dest", token_file), capsys)
    assert (
        r["failed"] is True
        and f"resolved moonshotai/Kimi-K2.6@{FIXTURE_COMMIT} to '{OTHER_COMMIT}'" in r["msg"]
    )


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_token_file_must_be_private(tmp_path, capsys, token_file, mode):
    venv = make_venv(tmp_path, {})
    token_file.chmod(mode)
    r = run_main(fetch_mod, fetch_args(venv, tmp_path / "dest", token_file), capsys)
    assert r["failed"] is True and f"hf_token_file {token_file}: mode {mode:04o}" in r["msg"]
    assert SENTINEL not in r["_raw"] and calls_of(tmp_path) == []


def test_fetch_revision_must_be_pinned(tmp_path, capsys, token_file):
    venv = make_venv(tmp_path, {})
    r = run_main(fetch_mod, dict(fetch_args(venv, tmp_path / "d", token_file), revision="main"), capsys)
    assert r["failed"] is True and "revision must be a full 40-character" in r["msg"]


def test_fetch_needs_installed_venv(tmp_path, capsys, token_file):
    r = run_main(fetch_mod, fetch_args(tmp_path / "no-venv", tmp_path / "d", token_file), capsys)
    assert r["failed"] is True and "not found or not executable" in r["msg"] and "venv" in r["msg"]


def test_existing_ancestor(tmp_path):
    assert fetch_mod.existing_ancestor(str(tmp_path / "a" / "b" / "c")) == str(tmp_path)
    assert stat.S_ISDIR(os.stat(fetch_mod.existing_ancestor("/nonexistent-xyz/q")).st_mode)
