# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Checkpoint manifest and safetensors header checks (standard library only).

Used by ``library/model_weights_check.py`` and ``library/model_weights_fetch.py``.

Only safetensors HEADERS are read (one seek + read of ``8 + header_len`` bytes per shard); the tensor data is
never read, so a 600 GB checkpoint is checked in the time it takes to read a few MB of JSON.

Format (https://github.com/huggingface/safetensors): 8 bytes little-endian unsigned header length N,
N bytes of UTF-8 JSON (an object: tensor name -> {dtype, shape, data_offsets: [begin, end]}, plus an optional
``__metadata__`` str->str map), then the data buffer. The rules below are the ones the safetensors library
enforces when it opens a file (``Metadata::validate``): offsets are relative to the buffer, tensors tile the
buffer without holes or overlaps, ``end - begin`` equals the tensor's byte size, and the buffer ends
exactly at the end of the file. Hence ``file size == 8 + N + max(end)`` for a complete file; smaller
means truncated.

Over 500 lines on purpose: one reading of a checkpoint directory (the shard headers, then the
checkpoint's manifest, remote code, tokenizer and revision, each a named step of ``_CheckpointCheck``),
which both weights modules call whole.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import struct

# safetensors refuses headers larger than this (MAX_HEADER_SIZE in the Rust crate).
MAX_HEADER_SIZE = 100_000_000

# Element size in BITS of every dtype the safetensors format defines (22 variants in safetensors 0.6/0.7).
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

COMMIT_HASH_RE = re.compile(r"^[0-9a-f]{40}$")

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
# Files that carry a tokenizer's vocabulary, by the tokenizer families Hugging Face models ship.
TOKENIZER_VOCAB_FILES = (
    "tokenizer.json",  # tokenizers (fast) format
    "tokenizer.model",  # sentencepiece
    "tiktoken.model",  # tiktoken BPE ranks (e.g. Kimi K2)
    "vocab.json",  # GPT-2 style BPE (with merges.txt)
    "vocab.txt",  # WordPiece
)
# Where `hf download --local-dir` records, per file, "<commit_hash>\n<etag>\n<timestamp>\n"
# (huggingface_hub/_local_folder.py, get_local_download_paths / write_download_metadata).
HF_LOCAL_DIR_METADATA = os.path.join(".cache", "huggingface", "download")
REVISION_FILES = ("REVISION", ".revision")


class ShardError(Exception):
    """A shard is unusable. ``kind`` is one of missing, truncated, corrupt."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
        self.message = message


def human_size(num: int) -> str:
    """IEC units, one decimal: 1536 -> '1.5 KiB'."""
    value = float(num)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def tensor_nbytes(dtype: str, shape: list) -> int:
    """Byte size of a tensor; raises ValueError for an unknown dtype, a bad shape or sub-byte misalignment."""
    if dtype not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ValueError(f"shape {shape!r} is not a list of non-negative integers")
    count = 1
    for dim in shape:
        count *= dim
    bits = count * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype} tensor of shape {shape} does not end on a byte boundary")
    return bits // 8


def parse_header(raw_len: bytes, file_size: int) -> int:
    """Validate the 8-byte header length against the file size; return it."""
    if len(raw_len) < 8:
        raise ShardError("truncated", f"{file_size} bytes: shorter than the 8-byte safetensors header length")
    (header_len,) = struct.unpack("<Q", raw_len)
    if header_len == 0 or header_len > MAX_HEADER_SIZE:
        raise ShardError(
            "corrupt", f"header length {header_len} is not in 1..{MAX_HEADER_SIZE} (not a safetensors file?)"
        )
    if 8 + header_len > file_size:
        raise ShardError(
            "truncated",
            f"header length {header_len} needs {8 + header_len} bytes but the file has {file_size}",
        )
    return header_len


def validate_header(header_bytes: bytes, header_len: int, file_size: int) -> dict:
    """Check a decoded header against the file size.

    Returns {'tensors': n, 'data_size': bytes, 'dtypes': {dtype: count}, 'names': [...]}."""
    try:
        text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ShardError("corrupt", f"header is not UTF-8 ({exc})") from None
    try:
        header = json.loads(text)
    except ValueError as exc:
        raise ShardError("corrupt", f"header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ShardError("corrupt", "header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise ShardError("corrupt", "__metadata__ is not a map of strings")
    spans = []
    dtypes: dict[str, int] = {}
    for name, info in header.items():
        # safetensors (serde) ignores unknown keys; it requires these three.
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ShardError("corrupt", f"tensor {name!r}: entry lacks dtype, shape or data_offsets")
        offsets = info["data_offsets"]
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise ShardError(
                "corrupt", f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with begin <= end"
            )
        try:
            nbytes = tensor_nbytes(info["dtype"], info["shape"])
        except ValueError as exc:
            raise ShardError("corrupt", f"tensor {name!r}: {exc}") from None
        if offsets[1] - offsets[0] != nbytes:
            raise ShardError(
                "corrupt",
                f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes but "
                f"{info['dtype']}{info['shape']} needs {nbytes}",
            )
        spans.append((offsets[0], offsets[1], name))
        dtypes[info["dtype"]] = dtypes.get(info["dtype"], 0) + 1
    spans.sort()
    position = 0
    for begin, end, name in spans:
        if begin != position:
            what = "overlaps the previous tensor" if begin < position else f"leaves a hole at byte {position}"
            raise ShardError("corrupt", f"tensor {name!r} at data offset {begin} {what}")
        position = end
    expected = 8 + header_len + position
    if file_size < expected:
        raise ShardError(
            "truncated",
            f"{file_size} bytes but the header describes {expected} "
            f"(8 + {header_len} header + {position} data): "
            f"{expected - file_size} bytes missing",
        )
    if file_size > expected:
        raise ShardError(
            "corrupt",
            f"{file_size} bytes but the header describes {expected}: {file_size - expected} trailing bytes "
            "(safetensors refuses such a file)",
        )
    return {"tensors": len(spans), "data_size": position, "dtypes": dtypes, "names": [s[2] for s in spans]}


def check_shard(path: str) -> dict:
    """Read only the header of one shard. Return its facts; raise ShardError naming what is wrong."""
    try:
        with open(path, "rb") as f:
            file_size = os.fstat(f.fileno()).st_size
            header_len = parse_header(f.read(8), file_size)
            header_bytes = f.read(header_len)
    except FileNotFoundError:
        raise ShardError("missing", "file does not exist (or is a dangling symlink)") from None
    except IsADirectoryError:
        raise ShardError("corrupt", "is a directory") from None
    except PermissionError as exc:
        raise ShardError("corrupt", f"cannot be read ({exc.strerror})") from None
    if len(header_bytes) != header_len:
        raise ShardError("truncated", f"header cut short: read {len(header_bytes)} of {header_len} bytes")
    facts = validate_header(header_bytes, header_len, file_size)
    facts["size"] = file_size
    facts["header_len"] = header_len
    return facts


def _load_json(path: str):
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8"))


def _auto_map_modules(auto_map) -> list[str]:
    """Files of the 'module.Class' references of an auto_map (str or [slow, fast] values).

    References into other repositories ('org/repo--module.Class') are skipped."""
    refs = []
    if not isinstance(auto_map, dict):
        return refs
    for value in auto_map.values():
        for ref in value if isinstance(value, list) else [value]:
            if isinstance(ref, str) and "--" not in ref and "." in ref:
                refs.append(ref.rsplit(".", 1)[0].replace(".", "/") + ".py")
    return sorted(set(refs))


def _vocab_files_of_module(path: str) -> list[str]:
    """Literal VOCAB_FILES_NAMES = {...} of a remote-code tokenizer module (parsed, never executed)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "VOCAB_FILES_NAMES" for t in node.targets
        ):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return []
            if isinstance(value, dict):
                return sorted(v for v in value.values() if isinstance(v, str))
    return []


def _read_revision_file(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return line.strip()
    except (OSError, UnicodeDecodeError):
        return None
    return None


def read_hf_download_metadata(directory: str, filename: str) -> dict | None:
    """huggingface_hub's per-file record under .cache/huggingface/download, with its own validity rule.

    Mirrors ``read_download_metadata``: the record counts only when the file exists and was not modified after
    the record was written (``st_mtime - 1 <= timestamp``).
    Returns {'commit_hash', 'etag', 'timestamp'} or None.
    """
    meta_path = os.path.join(directory, HF_LOCAL_DIR_METADATA, *filename.split("/")) + ".metadata"
    try:
        with open(meta_path, encoding="utf-8") as f:
            commit_hash = f.readline().strip()
            etag = f.readline().strip()
            timestamp = float(f.readline().strip())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    try:
        st = os.stat(os.path.join(directory, *filename.split("/")))
    except OSError:
        return None
    if st.st_mtime - 1 > timestamp:
        return None
    return {"commit_hash": commit_hash, "etag": etag, "timestamp": timestamp}


def detect_revision(directory: str, files: list[str]) -> dict:
    """Where the directory records its revision. Returns sources, per-file commits and a verdict."""
    sources: dict[str, str] = {}
    real = os.path.realpath(directory)
    parent, base = os.path.split(real)
    if os.path.basename(parent) == "snapshots" and COMMIT_HASH_RE.match(base):
        sources["hf-cache-snapshot"] = base
    for name in REVISION_FILES:
        value = _read_revision_file(os.path.join(directory, name))
        if value:
            sources[f"file:{name}"] = value
    per_file: dict[str, str] = {}
    unattributed: list[str] = []
    any_metadata = os.path.isdir(os.path.join(directory, HF_LOCAL_DIR_METADATA))
    if any_metadata:
        for name in files:
            record = read_hf_download_metadata(directory, name)
            if record is None:
                unattributed.append(name)
            else:
                per_file[name] = record["commit_hash"]
        commits = sorted(set(per_file.values()))
        if len(commits) == 1:
            sources["hf-local-dir-metadata"] = commits[0]
    else:
        commits = []
    return {
        "sources": sources,
        "metadata_commits": commits,
        "per_file": per_file,
        "unattributed": unattributed if any_metadata else [],
        "has_metadata": any_metadata,
    }


def check_checkpoint(
    directory: str, require_tokenizer: bool = True, expected_revision: str | None = None, label: str = "model"
) -> dict:
    """Check a checkpoint directory from its own manifest. Returns a result dict; result['problems'] lists
    every failure as a sentence naming the file; result['ok'] is True when there is none.

    Steps, in order (each a method of _CheckpointCheck): config.json and its remote code, the shards
    (from the index or the single-file layout), the tokenizer, the revision."""
    check = _CheckpointCheck(directory, require_tokenizer, expected_revision, label)
    if not os.path.isdir(directory):
        check.problems.append(f"{label} model directory {directory} does not exist or is not a directory")
        check.missing.append(directory)
        return check.finish(total_size=False)
    check.config()
    check.shards()
    check.tokenizer()
    check.revision()
    return check.finish()


class _CheckpointCheck:
    """The state of one check_checkpoint call: what was found, and every problem and warning."""

    def __init__(self, directory: str, require_tokenizer: bool, expected_revision: str | None, label: str):
        self.directory, self.label = directory, label
        self.require_tokenizer, self.expected_revision = require_tokenizer, expected_revision
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.missing: list[str] = []
        self.truncated: list[str] = []
        self.corrupt: list[str] = []
        self.checked_files: list[str] = []
        self.total = 0
        self.result: dict = {
            "path": directory,
            "role": label,
            "architectures": [],
            "model_type": None,
            "format": None,
            "shards": [],
            "tokenizer_files": [],
            "remote_code_files": [],
            "total_size": 0,
            "total_size_human": human_size(0),
            "tensor_count": 0,
            "revision": None,
            "revision_source": None,
        }

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def fail(self, kind_list, name, message):
        if kind_list is not None and name not in kind_list:
            kind_list.append(name)
        self.problems.append(f"{self.label} {self.path(name)}: {message}")

    def account(self, name):
        """Count a file that was checked (its size into total_size)."""
        try:
            self.total += os.stat(self.path(name)).st_size
        except OSError:
            return
        self.checked_files.append(name)

    def config(self) -> None:
        """config.json: present, a JSON object; its architectures, model type and auto_map remote code."""
        result, config = self.result, None
        if not os.path.exists(self.path(CONFIG_FILE)):
            self.fail(
                self.missing,
                CONFIG_FILE,
                "missing (every Hugging Face checkpoint has one; SGLang reads it first)",
            )
        else:
            try:
                config = _load_json(self.path(CONFIG_FILE))
            except (OSError, ValueError) as exc:
                self.fail(self.corrupt, CONFIG_FILE, f"does not parse as JSON ({exc})")
            else:
                if not isinstance(config, dict):
                    self.fail(self.corrupt, CONFIG_FILE, "is not a JSON object")
                    config = None
            self.account(CONFIG_FILE)
        if config is None:
            return
        archs = config.get("architectures")
        result["architectures"] = archs if isinstance(archs, list) else []
        result["model_type"] = config.get("model_type") if isinstance(config.get("model_type"), str) else None
        if not result["architectures"]:
            self.warnings.append(
                f"{self.label} {CONFIG_FILE}: no 'architectures' list (SGLang picks the model class from it)"
            )
        for module_file in _auto_map_modules(config.get("auto_map")):
            result["remote_code_files"].append(module_file)
            if not os.path.isfile(self.path(module_file)):
                self.fail(
                    self.missing,
                    module_file,
                    f"missing: {CONFIG_FILE} auto_map references it (--trust-remote-code loads it)",
                )
            else:
                self.account(module_file)

    def shard_layout(self) -> tuple[list[str], dict | None]:
        """(shard file names, the index's weight_map or None) from the index, or the single-file layout."""
        if os.path.exists(self.path(INDEX_FILE)):
            self.result["format"] = "sharded"
            try:
                index = _load_json(self.path(INDEX_FILE))
                weight_map = index.get("weight_map") if isinstance(index, dict) else None
                if (
                    not isinstance(weight_map, dict)
                    or not weight_map
                    or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
                ):
                    raise ValueError("no non-empty 'weight_map' of tensor name -> shard file")
            except (OSError, ValueError) as exc:
                self.fail(self.corrupt, INDEX_FILE, f"unusable ({exc})")
                weight_map = None
            self.account(INDEX_FILE)
            return (sorted(set(weight_map.values())) if weight_map else []), weight_map
        if os.path.exists(self.path(SINGLE_FILE)):
            self.result["format"] = "single"
            return [SINGLE_FILE], None
        self.fail(
            self.missing, INDEX_FILE, f"missing, and there is no single-file {SINGLE_FILE} either: no weights"
        )
        return [], None

    def shards(self) -> None:
        """Every shard's safetensors header, and the index's tensors against each header."""
        names, weight_map = self.shard_layout()
        for name in names:
            if os.path.isabs(name) or ".." in name.split("/"):
                self.fail(
                    self.corrupt, INDEX_FILE, f"weight_map names shard {name!r} outside the model directory"
                )
                continue
            entry = self.shard(name, weight_map)
            if entry["size"] is not None:
                self.account(name)
            self.result["shards"].append(entry)

    def shard(self, name: str, weight_map: dict | None) -> dict:
        entry = {"file": name, "status": "ok", "size": None, "tensors": 0}
        try:
            facts = check_shard(self.path(name))
        except ShardError as exc:
            entry["status"] = exc.kind
            entry["problem"] = exc.message
            kinds = {"missing": self.missing, "truncated": self.truncated, "corrupt": self.corrupt}
            self.fail(kinds[exc.kind], name, f"{exc.kind}: {exc.message}")
            with contextlib.suppress(OSError):
                entry["size"] = os.stat(self.path(name)).st_size
            return entry
        entry.update(
            size=facts["size"],
            tensors=facts["tensors"],
            header_len=facts["header_len"],
            dtypes=facts["dtypes"],
        )
        self.result["tensor_count"] += facts["tensors"]
        if weight_map is None:
            return entry
        listed = {t for t, f in weight_map.items() if f == name}
        present = set(facts["names"])
        absent = sorted(listed - present)
        if absent:
            entry["status"] = "corrupt"
            entry["problem"] = f"{len(absent)} tensor(s) the index places here are not in its header"
            self.fail(
                self.corrupt,
                name,
                f"{INDEX_FILE} places {len(absent)} tensor(s) in this shard that its header "
                f"lacks (first: {absent[0]}); shard from another revision?",
            )
        extra = sorted(present - listed)
        if extra:
            self.warnings.append(
                f"{self.label} {name}: {len(extra)} tensor(s) not in {INDEX_FILE} (first: {extra[0]})"
            )
        return entry

    def tokenizer(self) -> None:
        """tokenizer_config.json, its auto_map code and the vocabulary files; problems are errors only
        with require_tokenizer (else warnings)."""
        result, missing, corrupt = self.result, self.missing, self.corrupt
        tok_config = None
        tokenizer_problems: list[tuple] = []
        if os.path.exists(self.path(TOKENIZER_CONFIG_FILE)):
            try:
                tok_config = _load_json(self.path(TOKENIZER_CONFIG_FILE))
                if not isinstance(tok_config, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as exc:
                tokenizer_problems.append((corrupt, TOKENIZER_CONFIG_FILE, f"does not parse as JSON ({exc})"))
                tok_config = None
            self.account(TOKENIZER_CONFIG_FILE)
            result["tokenizer_files"].append(TOKENIZER_CONFIG_FILE)
        required_vocab: list[str] = []
        if tok_config is not None:
            for module_file in _auto_map_modules(tok_config.get("auto_map")):
                if not os.path.isfile(self.path(module_file)):
                    tokenizer_problems.append(
                        (missing, module_file, f"missing: {TOKENIZER_CONFIG_FILE} auto_map references it")
                    )
                    continue
                if module_file not in self.checked_files:
                    self.account(module_file)
                    result["tokenizer_files"].append(module_file)
                required_vocab += _vocab_files_of_module(self.path(module_file))
        for name in sorted(set(required_vocab)):
            if not os.path.isfile(self.path(name)):
                tokenizer_problems.append(
                    (missing, name, "missing: the tokenizer class's VOCAB_FILES_NAMES lists it")
                )
        vocab_present = [n for n in TOKENIZER_VOCAB_FILES if os.path.isfile(self.path(n))]
        for name in sorted(set(vocab_present) | {n for n in required_vocab if os.path.isfile(self.path(n))}):
            if name not in result["tokenizer_files"]:
                result["tokenizer_files"].append(name)
                self.account(name)
        if "tokenizer.json" in vocab_present:
            try:
                _load_json(self.path("tokenizer.json"))
            except (OSError, ValueError) as exc:
                tokenizer_problems.append((corrupt, "tokenizer.json", f"does not parse as JSON ({exc})"))
        if (
            "vocab.json" in vocab_present
            and "tokenizer.json" not in vocab_present
            and not os.path.isfile(self.path("merges.txt"))
        ):
            tokenizer_problems.append((missing, "merges.txt", "missing: vocab.json (BPE) needs it"))
        if not vocab_present and not required_vocab:
            tokenizer_problems.append(
                (
                    missing,
                    "tokenizer.json",
                    "no tokenizer: none of " + ", ".join(TOKENIZER_VOCAB_FILES) + " is present",
                )
            )
        for kind_list, name, message in tokenizer_problems:
            if self.require_tokenizer:
                self.fail(kind_list, name, message + " (require_tokenizer is true)")
            else:
                self.warnings.append(
                    f"{self.label} {name}: {message} (require_tokenizer is false: not an error)"
                )

    def revision(self) -> None:
        """The revision the files record (one, agreeing), against expected_revision when one is set."""
        result, label, directory, problems = self.result, self.label, self.directory, self.problems
        rev = detect_revision(directory, self.checked_files)
        values = sorted(set(rev["sources"].values()))
        if len(rev["metadata_commits"]) > 1:
            by_commit: dict[str, list[str]] = {}
            for name, commit in rev["per_file"].items():
                by_commit.setdefault(commit, []).append(name)
            detail = "; ".join(
                f"{c[:12]}: {', '.join(sorted(n)[:3])}{' ...' if len(n) > 3 else ''}"
                for c, n in sorted(by_commit.items())
            )
            problems.append(
                f"{label} {directory}: files come from {len(by_commit)} different revisions ({detail}) "
                f"according to {HF_LOCAL_DIR_METADATA}"
            )
        if len(values) > 1:
            problems.append(
                f"{label} {directory}: revision records disagree: "
                + ", ".join(f"{k}={v}" for k, v in sorted(rev["sources"].items()))
            )
        elif values:
            result["revision"] = values[0]
            result["revision_source"] = ", ".join(sorted(rev["sources"]))
        result["revision_unattributed"] = rev["unattributed"]
        expected = self.expected_revision
        if not expected:
            return
        if result["revision"] is None and len(values) <= 1 and len(rev["metadata_commits"]) <= 1:
            problems.append(
                f"{label} {directory}: expected_revision {expected} but the directory records "
                "no revision "
                f"(no snapshots/<sha> path, no REVISION/.revision file, no {HF_LOCAL_DIR_METADATA} records)"
            )
        elif result["revision"] is not None and result["revision"] != expected:
            problems.append(
                f"{label} {directory}: revision {result['revision']} (from {result['revision_source']}) "
                f"is not expected_revision {expected}"
            )
        if rev["unattributed"] and rev["sources"].keys() == {"hf-local-dir-metadata"}:
            problems.append(
                f"{label} {directory}: {len(rev['unattributed'])} file(s) have no valid "
                f"{HF_LOCAL_DIR_METADATA} record "
                f"(missing, or the file changed after download), so they are not proven to be revision "
                f"{expected}: {', '.join(rev['unattributed'][:5])}"
            )

    def finish(self, total_size: bool = True) -> dict:
        result = self.result
        if total_size:
            result["total_size"] = self.total
            result["total_size_human"] = human_size(self.total)
        result.update(
            problems=self.problems,
            warnings=self.warnings,
            missing=self.missing,
            truncated=self.truncated,
            corrupt=self.corrupt,
            ok=not self.problems,
        )
        return result
