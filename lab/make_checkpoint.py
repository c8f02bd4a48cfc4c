#!/usr/bin/env python3
"""Write tiny but real Hugging Face style checkpoints for the lab hosts.

Standard library only. A checkpoint directory gets:

- ``model-0000N-of-00002.safetensors``: real safetensors files (8-byte little-endian header
  length, JSON header, raw tensor bytes), BF16 tensors with deterministic contents;
- ``model.safetensors.index.json``: ``metadata.total_size`` and a ``weight_map`` over both shards;
- ``config.json``: the target (Llama) or DFlash draft configuration the project resolves against;
- ``tokenizer.json`` (a ``tokenizers`` WordLevel tokenizer), ``tokenizer_config.json``,
  ``generation_config.json``.

Writes are idempotent: a file whose bytes are already right is left untouched (same mtime). A file
written gets the fixed mtime CHECKPOINT_MTIME_NS, so the same checkpoint has the same (size, mtime) on
every lab host: the role's preflight cache keys the checkpoint's config.json by them
(library/sglang_preflight.py fingerprint), and lab/labctl carries those entries from host to host.

Usage: make_checkpoint.py {target,draft} DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile

# 2026-01-01T00:00:00Z: the mtime of every file written here (the bytes are fixed; so is the mtime).
CHECKPOINT_MTIME_NS = 1_767_225_600 * 10**9

# The configurations SGLang 0.5.23 resolves against in this project (same keys and values as the
# reference configs used for the parser/resolution checks).
TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
}

DRAFT_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 6,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "block_size": 16,
    "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
    "sliding_window": 2048,
}

KINDS = {"target": TARGET_CONFIG, "draft": DRAFT_CONFIG}

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)
NUM_SHARDS = 2
DTYPE = "BF16"
DTYPE_SIZE = 2


def tensor_shapes(kind: str, config: dict) -> list[tuple[str, list[int]]]:
    """Return (name, shape) of every tensor, in the order they are laid out."""
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = hidden // heads
    vocab = config["vocab_size"]
    shapes: list[tuple[str, list[int]]] = []
    if kind == "target":
        shapes.append(("model.embed_tokens.weight", [vocab, hidden]))
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", [hidden]),
            (p + "self_attn.q_proj.weight", [heads * head_dim, hidden]),
            (p + "self_attn.k_proj.weight", [kv_heads * head_dim, hidden]),
            (p + "self_attn.v_proj.weight", [kv_heads * head_dim, hidden]),
            (p + "self_attn.o_proj.weight", [hidden, heads * head_dim]),
            (p + "post_attention_layernorm.weight", [hidden]),
            (p + "mlp.gate_proj.weight", [inter, hidden]),
            (p + "mlp.up_proj.weight", [inter, hidden]),
            (p + "mlp.down_proj.weight", [hidden, inter]),
        ]
        if config["model_type"] == "qwen3":
            shapes += [
                (p + "self_attn.q_norm.weight", [head_dim]),
                (p + "self_attn.k_norm.weight", [head_dim]),
            ]
    if kind == "draft":
        # DFlash drafts share the target's embedding and LM head; they project the captured
        # target hidden states (here: 2 target layers) through fc + hidden_norm.
        target_layers = TARGET_CONFIG["num_hidden_layers"]
        shapes += [
            ("model.fc.weight", [hidden, hidden * target_layers]),
            ("model.hidden_norm.weight", [hidden]),
        ]
    shapes.append(("model.norm.weight", [hidden]))
    if kind == "target":
        shapes.append(("lm_head.weight", [vocab, hidden]))
    return shapes


def tensor_bytes(name: str, shape: list[int]) -> bytes:
    """Deterministic BF16 contents: norms are 1.0, weights small values derived from sha256."""
    count = 1
    for dim in shape:
        count *= dim
    if name.endswith("norm.weight"):
        return struct.pack("<H", 0x3F80) * count  # bf16 1.0
    out = bytearray()
    counter = 0
    seed = name.encode()
    while len(out) < count * DTYPE_SIZE:
        block = hashlib.sha256(seed + counter.to_bytes(8, "little")).digest()
        counter += 1
        for j in range(0, len(block), 2):
            # biased exponent 120 (2^-7), random sign and mantissa bits -> 0.0078 <= |x| < 0.0157
            raw = int.from_bytes(block[j : j + 2], "little")
            bits = (raw & 0x807F) | 0x3C00
            out += struct.pack("<H", bits)
    return bytes(out[: count * DTYPE_SIZE])


def safetensors_bytes(tensors: list[tuple[str, list[int], bytes]], metadata: dict) -> bytes:
    header: dict = {"__metadata__": metadata}
    offset = 0
    for name, shape, data in tensors:
        header[name] = {"dtype": DTYPE, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format allows trailing spaces; keeps data 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw + b"".join(data for _, _, data in tensors)


def read_safetensors_header(path: str) -> dict:
    """Parse a safetensors header with the standard library (used by the tests)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length))


def tokenizer_files(vocab_size: int) -> dict[str, dict]:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), vocab_size):
        vocab[f"w{i}"] = i
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, tok in enumerate(SPECIAL_TOKENS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": 4096,
        "chat_template": CHAT_TEMPLATE,
    }
    generation_config = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    return {
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": generation_config,
    }


def checkpoint_files(kind: str) -> dict[str, bytes]:
    """All files of a checkpoint: file name -> bytes."""
    config = KINDS[kind]
    shapes = tensor_shapes(kind, config)
    tensors = [(name, shape, tensor_bytes(name, shape)) for name, shape in shapes]
    per_shard = -(-len(tensors) // NUM_SHARDS)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(NUM_SHARDS):
        part = tensors[s * per_shard : (s + 1) * per_shard]
        fname = f"model-{s + 1:05d}-of-{NUM_SHARDS:05d}.safetensors"
        files[fname] = safetensors_bytes(part, {"format": "pt"})
        for name, _, data in part:
            weight_map[name] = fname
            total += len(data)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = _json(index)
    files["config.json"] = _json(config)
    for fname, content in tokenizer_files(config["vocab_size"]).items():
        files[fname] = _json(content)
    return files


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def write_checkpoint(kind: str, directory: str) -> list[str]:
    """Write (or refresh) a checkpoint; return the names of files that changed."""
    if kind not in KINDS:
        raise ValueError(f"checkpoint kind must be one of {sorted(KINDS)}, not {kind!r}")
    os.makedirs(directory, mode=0o755, exist_ok=True)
    changed = []
    for fname, content in checkpoint_files(kind).items():
        path = os.path.join(directory, fname)
        try:
            with open(path, "rb") as f:
                if f.read() == content:
                    continue
        except FileNotFoundError:
            pass
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{fname}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.chmod(tmp, 0o644)
            os.utime(tmp, ns=(CHECKPOINT_MTIME_NS, CHECKPOINT_MTIME_NS))
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        changed.append(fname)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("directory")
    args = parser.parse_args(argv)
    changed = write_checkpoint(args.kind, args.directory)
    print(
        f"{args.directory}: {len(changed)} file(s) written" + (f" ({', '.join(changed)})" if changed else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
