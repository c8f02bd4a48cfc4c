"""lab/make_checkpoint.py: the files are re-read with the standard library only."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SPEC = importlib.util.spec_from_file_location("make_checkpoint", REPO / "lab" / "make_checkpoint.py")
make_checkpoint = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(make_checkpoint)


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header_bytes = raw[8 : 8 + length]
    assert header_bytes[:1] == b"{", "safetensors header must start with '{'"
    return json.loads(header_bytes), raw[8 + length :]


@pytest.mark.parametrize("kind", ["target", "draft"])
def test_checkpoint_is_real_safetensors(tmp_path: Path, kind: str) -> None:
    changed = make_checkpoint.write_checkpoint(kind, str(tmp_path))
    assert set(changed) == {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]

    total = 0
    seen = {}
    for shard in shards:
        header, data = read_safetensors(tmp_path / shard)
        assert header.pop("__metadata__") == {"format": "pt"}
        assert header, f"{shard} holds no tensors"
        end = 0
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            start, stop = info["data_offsets"]
            assert start == end, f"{shard}:{name} is not contiguous"
            count = 1
            for dim in info["shape"]:
                count *= dim
            assert info["dtype"] == "BF16"
            assert stop - start == 2 * count
            end = stop
            seen[name] = shard
        assert end == len(data), f"{shard}: byte buffer is {len(data)} bytes, tensors cover {end}"
        total += end
    assert seen == index["weight_map"]
    assert index["metadata"]["total_size"] == total

    config = json.loads((tmp_path / "config.json").read_text())
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    header, data = read_safetensors(tmp_path / seen["model.norm.weight"])
    norm = header["model.norm.weight"]
    assert norm["shape"] == [hidden]
    start, stop = norm["data_offsets"]
    assert set(struct.unpack(f"<{hidden}H", data[start:stop])) == {0x3F80}  # bf16 1.0

    if kind == "target":
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert config["model_type"] == "llama"
        header, _ = read_safetensors(tmp_path / seen["model.embed_tokens.weight"])
        assert header["model.embed_tokens.weight"]["shape"] == [vocab, hidden]
        assert "lm_head.weight" in seen
    else:
        assert config["architectures"] == ["DFlashDraftModel"]
        assert config["block_size"] == 16
        assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"]
        assert config["sliding_window"] == 2048
        assert len(config["layer_types"]) == config["num_hidden_layers"]
        assert "model.fc.weight" in seen and "lm_head.weight" not in seen
    layers = {name.split(".")[2] for name in seen if name.startswith("model.layers.")}
    assert layers == {str(i) for i in range(config["num_hidden_layers"])}


def test_tokenizer_files_match_config(tmp_path: Path) -> None:
    make_checkpoint.write_checkpoint("target", str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "WordLevel"
    assert sorted(vocab.values()) == list(range(config["vocab_size"]))
    assert {t["content"]: t["id"] for t in tok["added_tokens"]} == {
        "<unk>": 0,
        "<s>": 1,
        "</s>": 2,
        "<pad>": 3,
    }
    tcfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert vocab[tcfg["bos_token"]] == gen["bos_token_id"]
    assert vocab[tcfg["eos_token"]] == gen["eos_token_id"]
    assert "chat_template" in tcfg


def test_rewrite_is_idempotent(tmp_path: Path) -> None:
    make_checkpoint.write_checkpoint("draft", str(tmp_path))
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()}
    assert make_checkpoint.write_checkpoint("draft", str(tmp_path)) == []
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in tmp_path.iterdir()}
    assert after == before
    # A damaged file is repaired, and only that one.
    shard = tmp_path / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\0" * 8)
    assert make_checkpoint.write_checkpoint("draft", str(tmp_path)) == [shard.name]
    assert shard.read_bytes() == before[shard.name][1]
    # Same bytes, same mtime, wherever and whenever written (the preflight cache keys config.json by it).
    assert {p.stat().st_mtime_ns for p in tmp_path.iterdir()} == {make_checkpoint.CHECKPOINT_MTIME_NS}
    assert sorted(os.listdir(tmp_path)) == sorted(before)  # no temp files left behind


def test_unknown_kind_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint kind must be one of"):
        make_checkpoint.write_checkpoint("eagle", str(tmp_path))


def test_cli_writes_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert make_checkpoint.main(["target", str(tmp_path / "m")]) == 0
    assert "7 file(s) written" in capsys.readouterr().out
    header = make_checkpoint.read_safetensors_header(str(tmp_path / "m" / "model-00001-of-00002.safetensors"))
    assert header["model.embed_tokens.weight"]["dtype"] == "BF16"
