#!/usr/bin/env python3
# Lab tooling of the sglang deployment project; never installed on GPU hosts.
"""Stand-in for `sglang serve` on lab hosts (no GPU) -- the project's ONE stand-in.

    <venv>/bin/python /opt/sglang-lab/sglang_lab_server.py <argv exactly as `sglang serve` gets it>

One file on purpose: lab/labctl (install_payload) copies exactly this file to /opt/sglang-lab/ on every
host at every `up`, and the lab inventory's sglang_launcher runs it there as a script with the SGLang
venv's python (no package of ours on the host's path); the parse cache's key pins this file's sha256
(THIS_FILE), so any change to the server invalidates what it stored. Split into modules, both would have
to learn every part.

Real (the INSTALLED SGLang does it): argument parsing (`prepare_server_args`; argparse errors print
SGLang's usage and exit 2), resolution (`resolve_once`, `check_server_args`, `resolve_auto_parsers`;
semantic errors print SGLang's traceback and exit 1) with SGLang's own warnings, the log format
(`configure_logger`), the startup line `server_args={...}` (NOT redacted, as SGLang logs it), the API-key
decision (`sglang.srt.utils.auth.decide_request_auth`), the OpenAI response models, `startup_time`.
Without `--device` the raw record gets device `cuda` before resolution (exactly what `--device cuda`
sets: what a GPU host resolves to); `launch_command` stays the argv as given.

Parse cache (ParseCache): a successful parse + resolution is stored, keyed by the installed SGLang's
identity (as module_utils/sglang_venv.py's probe computes it) and every installed distribution, the exact
argv, the python, this file's sha256 and the environment (all but SGLANG_LAB_* and systemd's per-start
variables); the entry also pins the files SGLang read (the model's and draft's config.json, ...). A
restart with the same key and unchanged files replays SGLang's result (resolved args, launch_command,
version, kv_events) and what it printed meanwhile (its warnings, in order, timestamps of now) without
importing torch. A failing argv is never stored: it fails through SGLang every time. Directory (0700,
entries 0600): /var/cache/sglang-lab-server as root, else ~/.cache/sglang-lab-server of the service
user; a corrupt entry is reported in one line and parsed anew.

Synthetic: load phases (SGLang's log texts, lab numbers; a 94.97 GB GPU), generated text (words; a
prompt's tokens are its words and punctuation), timings. Deterministic speculative-decoding model:
    D = speculative_num_draft_tokens (else speculative_num_steps + 1), W = draft window,
    k = speculative_eagle_topk, b = speculative_ddtree_budget (fork builds only, else 0); for DDTREE
        k = the tree width of PR #29907's ddtree_utils.py: min(max(b // (D - 1) + 1, 2),
        SGLANG_DDTREE_MAX_TOPK [default 6]) in full-tree mode (b > D - 1), else 1 (a chain)
    q = min(0.95, 0.25 * (min(W, 4096) / 4096) ** 0.25   [1 if W unset]
                       * (1 + 0.1 * log2(k)) * (1 + 0.1 * log2(b / D))   [1 if b <= D])
    accept length L = 1 + (D - 1) * q                    (L = 1, D = 1 without speculative decoding)
    step_ms = 4 + 0.25 * (D - 1) + 0.5 * min(W, 32768) / 32768   [0.5 if W unset] + 0.01 * b
    forwards = ceil(new_tokens / L); latency = 10 ms + 0.01 ms * prompt_tokens + forwards * step_ms,
    really slept; a stream sends one SSE chunk per forward (cumulative text, as SGLang by default).

Environment: SGLANG_LAB_LOAD_SECONDS (default 2: load time before the port opens),
SGLANG_LAB_LOAD_UNTIL=<path> (the weight load lasts until <path> exists, polled every 0.2 s, at most
SGLANG_LAB_LOAD_SECONDS; the rest of the start-up then takes ~0.5 s: a test ends a slow load when it is done
with it instead of waiting out a fixed time),
SGLANG_LAB_LOG_FORMAT=dict|dataclass (dataclass: the older `server_args=ServerArgs(...)` line, window
key spelled `speculative_dflash_draft_window_size`), SGLANG_LAB_OLD_API=1 (an older server: only
/get_server_info and /get_model_info, no deprecation warnings, old window key in the JSON),
SGLANG_LAB_CRASH_AFTER=<s> (scheduler traceback, exit 1, that many seconds after start),
SGLANG_LAB_HANG=1 (never opens the port; a stuck shard-load line every 3 s),
SGLANG_LAB_SPAWN_CHILD=1 (forks a "scheduler" child that outlives its parent, as under KillMode=process),
SGLANG_LAB_PARSE_CACHE=0 (no parse cache), SGLANG_LAB_PARSE_CACHE_DIR=<dir> (another cache directory),
SGLANG_LAB_ACCEPT_LENGTH=<L> (with a speculative algorithm: L tokens per verify forward instead of the
model's, so a /generate answer's completion_tokens / spec_verify_ct is about L; at least 1),
SGLANG_LAB_SLOW=<f> (every forward and prefill takes f times as long; at least 1),
SGLANG_LAB_ERROR_RATE=<r> (that fraction of generation requests, 0..1, evenly spread, is answered 500).
/metrics exists only with --enable-metrics, as in SGLang (synthetic values; --extra-metric-labels on every
collector's metric, as SGLang's collectors add them), under SGLang 0.5.23's names, types and buckets
(observability/metrics_collector.py, http_request_metrics.py): the token and request counters, aborted
requests (a client gone mid-stream), spec_verify_calls_total, the time-to-first-token and inter-token
histograms (each forward's interval over its new tokens), and http_responses_total per endpoint and status.
SIGTERM: drain, exit 0 (as SGLang: /health 503, generation
requests still accepted meanwhile).

Drain endpoints, as SGLang 0.5.23 serves them (not on OLD_API or replay builds): `GET /v1/loads`
(entrypoints/v1_loads.py: `include=`, `dp_rank=`, `format=prometheus`; SGLang's own LoadSnapshot per DP
rank, counting this server's in-flight requests: running up to max_running_requests, the rest waiting)
and `POST|GET /flush_cache?timeout=T` (scheduler_components/flush_wrapper.py: 200 when idle; else 400
`Flush cache failed.` at once with T = 0, or `Timed out waiting for idle state.` after T; 400 `Another
flush_cache is already in progress.` while one waits).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import datetime
import hashlib
import importlib
import importlib.util
import json
import logging
import math
import os
import random
import re
import signal
import socket
import stat
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import types
import urllib.parse
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_FORMAT, DATE_FORMAT = "[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"  # SGLang's configure_logger
GB = 1 << 30
LAB_GPU_MEM_GB = 94.97
LAB_GPU_NAME = "NVIDIA H100 NVL"  # synthetic: what get_device_name() reports for a 94.97 GB GPU
FLUSH_OK = (
    b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
    b"requests, the operation will not be performed.)\n"
)
OLD_WINDOW_KEY, NEW_WINDOW_KEY = "speculative_dflash_draft_window_size", "speculative_draft_window_size"
KV_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}
WORDS = (
    "the",
    "lab",
    "server",
    "answers",
    "with",
    "synthetic",
    "tokens",
    "for",
    "a",
    "deployment",
    "test",
    "of",
    "speculative",
    "decoding",
    "on",
    "systemd",
    ".",
    ",",
)

log = logging.getLogger("sglang.srt.entrypoints.http_server")
engine_log = logging.getLogger("sglang.srt.entrypoints.engine")


class LabConfigError(Exception):
    """A SGLANG_LAB_* variable is malformed."""


def env_float(name: str, default: float | None) -> float | None:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LabConfigError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value < 0 or not math.isfinite(value):
        raise LabConfigError(f"{name} must be a finite number >= 0, got {raw!r}")
    return value


def env_factor(name: str, low: float, high: float | None) -> float:
    """A SGLANG_LAB_* number within [low, high] (default: low, the fault switched off)."""
    value = env_float(name, low)
    if value < low or (high is not None and value > high):
        raise LabConfigError(
            f"{name} must be within [{low:g}, {high if high is not None else 'inf'}], got {value:g}"
        )
    return value


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


def emit_uvicorn(level: str, message: str) -> None:
    """Uvicorn's line with SGLang's set_uvicorn_logging_configs: `[ts] INFO:     message`."""
    if logging.getLogger().isEnabledFor(getattr(logging, level)):
        sys.stderr.write(f"[{time.strftime(DATE_FORMAT)}] {level + ':':<9} {message}\n")


def scheduler_logger(resolved: dict) -> logging.Logger:
    """Scheduler lines carry SGLang's rank prefix (`[ts TP0] ...`) when dp/tp > 1."""
    ranks = (("dp_size", " DP0"), ("tp_size", " TP0"))
    prefix = "".join(tag for key, tag in ranks if resolved.get(key, 1) > 1)
    logger = logging.getLogger("sglang.srt.managers.scheduler")
    logger.propagate = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", DATE_FORMAT))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.getLogger().level)
    return logger


def spec_profile(d: dict, accept_length: float | None = None) -> dict:
    """The synthetic speculative-decoding model documented in the module docstring; ``accept_length``
    (SGLANG_LAB_ACCEPT_LENGTH) replaces its tokens per verify forward."""
    algo = d.get("speculative_algorithm")
    if not algo:
        return {"algo": None, "D": 1, "L": 1.0, "step_ms": 4.0}
    draft = d.get("speculative_num_draft_tokens") or (d.get("speculative_num_steps") or 1) + 1
    window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
    topk, budget = max(1, d.get("speculative_eagle_topk") or 1), d.get("speculative_ddtree_budget") or 0
    if str(algo).upper() == "DDTREE":
        cap = int(os.environ.get("SGLANG_DDTREE_MAX_TOPK") or 6)
        topk = min(max(budget // max(draft - 1, 1) + 1, 2), max(cap, 1)) if budget > draft - 1 else 1
    f_window = (min(window, 4096) / 4096) ** 0.25 if window else 1.0
    f_budget = 1 + 0.1 * math.log2(budget / draft) if budget > draft else 1.0
    q = min(0.95, 0.25 * f_window * (1 + 0.1 * math.log2(topk)) * f_budget)
    step_ms = 4 + 0.25 * (draft - 1) + (0.5 * min(window, 32768) / 32768 if window else 0.5) + 0.01 * budget
    return {"algo": algo, "D": draft, "L": accept_length or 1 + (draft - 1) * q, "step_ms": step_ms}


def env_accept_length() -> float | None:
    """SGLANG_LAB_ACCEPT_LENGTH: the tokens per verify forward asked for (None: the model decides)."""
    length = env_float("SGLANG_LAB_ACCEPT_LENGTH", None)
    if length is not None and length < 1:
        raise LabConfigError(
            f"SGLANG_LAB_ACCEPT_LENGTH must be >= 1 (tokens per verify forward), got {length}"
        )
    return length


def count_tokens(text: str) -> int:
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


def synth_tokens(seed: str, n: int) -> list[str]:
    digest = hashlib.sha256(seed.encode()).digest()
    return [" " + WORDS[(digest[i % 32] + i * 7) % len(WORDS)] for i in range(n)]


def read_config(directory) -> dict:
    try:
        with open(os.path.join(str(directory), "config.json"), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------------------------ parse cache
# SGLang's parse + resolution imports torch (~7-10 s of CPU on a 2-core host). A restart whose key and
# recorded inputs are unchanged replays the stored result instead (ParseCache).
PARSE_CACHE_FORMAT = 1
PARSE_CACHE_ROOT_DIR = "/var/cache/sglang-lab-server"
# Entries lab/labctl puts into every host at `up` (root's, read-only; kept from earlier hosts' caches, none
# with an API key): looked up when the server's own directory has no entry for the key.
PARSE_CACHE_SEED_DIR = "/var/cache/sglang-lab-server-seed"
PARSE_CACHE_SEED_OWNER = 0
PARSE_CACHE_MAX_ENTRIES = 64
HASH_LIMIT = 64 << 20  # a larger file read during resolution is compared by size, mtime and inode
# Set anew for every start by systemd or a shell, read by no parser: not part of the key.
PER_START_ENV = frozenset(
    (
        "INVOCATION_ID",
        "JOURNAL_STREAM",
        "SYSTEMD_EXEC_PID",
        "MANAGERPID",
        "NOTIFY_SOCKET",
        "WATCHDOG_PID",
        "WATCHDOG_USEC",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "OLDPWD",
        "SHLVL",
        "_",
    )
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
STREAMS = ("stdout", "stderr")
STYLES = {"%": logging.PercentStyle, "{": logging.StrFormatStyle, "$": logging.StringTemplateStyle}
RECORD_FIELDS = (
    "name",
    "msg",
    "levelname",
    "levelno",
    "pathname",
    "filename",
    "module",
    "lineno",
    "funcName",
    "exc_text",
    "stack_info",
    "threadName",
    "processName",
)
REPLAYABLE_HANDLERS = (logging.StreamHandler, type(logging.lastResort))  # the latter: no handler at all
# Defaults SGLang draws at random when the argv leaves them unset (serving_hook.py): a replay draws anew.
RANDOM_DEFAULTS = {"random_seed": lambda: random.randint(0, 1 << 30)}
THIS_FILE = os.path.abspath(__file__)
cache_log = logging.getLogger("sglang_lab_server.parse_cache")


def one_line(value: object, limit: int = 300) -> str:
    return " ".join(str(value).split())[:limit]


def file_digest(path: str) -> str | None:
    """sha256 of a regular file (size, mtime and inode above HASH_LIMIT); None: no such regular file."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > HASH_LIMIT:
            return f"stat:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def dir_listing(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root.rstrip(os.sep) or path.startswith(root) for root in roots)


def sglang_identity() -> dict | None:
    """The installed SGLang as module_utils/sglang_venv.py's PROBE_SCRIPT identifies it (this file is
    deployed alone, without module_utils): the first sys.path entry holding a sglang dist-info, its
    METADATA version, sha256 over RECORD and direct_url.json. None: no SGLang installed."""
    found = None
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in sorted(names):
            if name.startswith("sglang-") and name.endswith(".dist-info"):
                found = os.path.join(entry, name)
                break
        if found:
            break
    if found is None:
        return None
    version = None
    try:
        with open(os.path.join(found, "METADATA"), encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    version = line.split(":", 1)[1].strip()
                    break
                if not line.strip():
                    break
    except OSError:
        return None
    digest, editable = hashlib.sha256(), False
    for name in ("RECORD", "direct_url.json"):
        try:
            with open(os.path.join(found, name), "rb") as handle:
                data = handle.read()
        except OSError:
            data = b""
        digest.update(name.encode() + b"\0" + data + b"\0")
        if name == "direct_url.json" and data:
            try:
                editable = bool(json.loads(data).get("dir_info", {}).get("editable"))
            except (ValueError, AttributeError):
                editable = True  # unreadable: treat as a tree that may change under the same RECORD
    return {"version": version, "record_sha256": digest.hexdigest(), "dist_info": found, "editable": editable}


def installed_distributions() -> list[list]:
    """Every distribution (sha256 of its RECORD) and .pth file on sys.path: plugins, torch and
    transformers take part in parsing too, and installing or upgrading one rewrites its RECORD."""
    found = []
    for entry in sys.path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            path = os.path.join(entry or ".", name)
            if name.endswith((".dist-info", ".egg-info")) and os.path.isdir(path):
                candidates = (os.path.join(path, f) for f in ("RECORD", "METADATA", "PKG-INFO"))
                found.append([entry, name, next(filter(None, map(file_digest, candidates)), None)])
            elif name.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")):
                found.append([entry, name, file_digest(path)])
    return found


def host_facts() -> list:
    """What resolution may size defaults by: kernel, CPUs, memory."""
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as handle:
            memory = next((line.split()[1:2] for line in handle if line.startswith("MemTotal:")), None)
    except OSError:
        memory = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    uname = os.uname()
    return [uname.sysname, uname.release, uname.machine, os.cpu_count(), affinity, memory]


def parse_cache_key(argv: list[str], identity: dict) -> str:
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    environment = sorted(
        (name, value)
        for name, value in os.environ.items()
        if name not in PER_START_ENV and not name.startswith("SGLANG_LAB_")
    )
    doc = {
        "format": PARSE_CACHE_FORMAT,
        "argv": list(argv),
        "sglang": [identity["version"], identity["record_sha256"], identity["dist_info"]],
        "distributions": installed_distributions(),
        "lab_server": file_digest(THIS_FILE),
        "python": [
            sys.executable,
            sys.version,
            sys.path,
            sys.warnoptions,
            sys.flags.dev_mode,
            sys.flags.optimize,
        ],
        "cwd": cwd,
        "environment": environment,
        "host": host_facts(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def parse_cache_dir() -> str:
    """SGLANG_LAB_PARSE_CACHE_DIR; else /var/cache/sglang-lab-server as root; else ~/.cache/sglang-lab-server
    of the user the server runs as (the unit's User=: its home stays writable under ProtectSystem=strict)."""
    configured = os.environ.get("SGLANG_LAB_PARSE_CACHE_DIR", "")
    if configured:
        return os.path.abspath(configured)
    if os.geteuid() == 0:
        return PARSE_CACHE_ROOT_DIR
    import pwd

    return os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "sglang-lab-server")


def seed_entry(key: str) -> tuple[str, bytes] | None:
    """(path, content) of the seed entry of ``key``; None unless PARSE_CACHE_SEED_DIR is root's, root-only."""
    path = os.path.join(PARSE_CACHE_SEED_DIR, key + ".json")
    try:
        st = os.lstat(PARSE_CACHE_SEED_DIR)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != PARSE_CACHE_SEED_OWNER or st.st_mode & 0o022:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as handle:
            if os.fstat(handle.fileno()).st_uid != PARSE_CACHE_SEED_OWNER:
                return None
            return path, handle.read()
    except OSError:
        return None


def ensure_private_dir(path: str) -> None:
    """Create `path` 0700; refuse one that is not a directory of this user closed to everyone else."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path} is not a directory")
    if st.st_uid != os.geteuid():
        raise OSError(f"{path} is owned by uid {st.st_uid}, not {os.geteuid()}")
    if st.st_mode & 0o077:
        raise OSError(f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700")


def installation_roots() -> tuple[str, ...]:
    """Where reads are covered by the key rather than by content: the python installation and sys.path
    (the distributions' RECORDs), this file's directory (its sha256), and the kernel's /proc, /sys, /dev."""
    paths = sysconfig.get_paths()
    roots = {sys.prefix, sys.exec_prefix, os.path.dirname(THIS_FILE), "/proc", "/sys", "/dev"}
    roots.update(paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if name in paths)
    roots.update(entry for entry in sys.path if entry and os.path.abspath(entry) != os.sep)  # python311.zip
    return tuple(os.path.join(os.path.abspath(root), "") for root in roots)


def audit_reads(event: str, args: tuple) -> None:
    """Audit hook: while a ResolutionRecorder records, the files opened for reading and dirs listed."""
    recorder = ResolutionRecorder.active
    if recorder is None or event not in ("open", "os.listdir", "os.scandir"):
        return
    try:
        path = "." if args[0] is None else args[0]
        if isinstance(path, int) or (event == "open" and args[2] & WRITE_FLAGS):
            return
        (recorder.opened if event == "open" else recorder.listed)[os.fsdecode(path)] = None
    except Exception:  # an audit hook must never break the operation it watches
        pass


class TeeStream:
    """sys.stdout / sys.stderr while SGLang parses: passes everything on, records what is not logging."""

    def __init__(self, recorder: ResolutionRecorder, name: str, real) -> None:
        self.recorder, self.name, self.real = recorder, name, real

    def write(self, text: str) -> int:
        self.recorder.on_write(self.name, text)
        return self.real.write(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


class ResolutionRecorder:
    """What SGLang emits and reads while it parses and resolves (the cache-miss path), for ParseCache:
    - its output, in order: log records as records plus the handler's format (a replay renders them with
      its own time), other writes to sys.stdout/sys.stderr (warnings) as text, and the root logging
      set-up of configure_logger (logger_configured);
    - the files it opens for reading and the directories it lists (an audit hook).
    Output a replay could not reproduce exactly (a file handler, a custom formatter, a logging config
    file) makes the result uncacheable. Disabled, it changes nothing."""

    active: ResolutionRecorder | None = None  # the one the audit hook reports to
    hooked = False

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.problem = enabled, None
        self.drawn: list[str] = []  # RANDOM_DEFAULTS that SGLang drew (the argv left them unset)
        self.events: list[list] = []
        self.opened: dict[str, None] = {}
        self.listed: dict[str, None] = {}
        self.local = threading.local()

    def __enter__(self) -> ResolutionRecorder:
        if not self.enabled:
            return self
        self.real = {"stdout": sys.stdout, "stderr": sys.stderr}
        sys.stdout, sys.stderr = TeeStream(self, "stdout", sys.stdout), TeeStream(self, "stderr", sys.stderr)
        self.orig_handle, recorder = logging.Handler.handle, self

        def handle(handler: logging.Handler, record: logging.LogRecord):
            recorder.local.depth = getattr(recorder.local, "depth", 0) + 1
            try:
                emitted = recorder.orig_handle(handler, record)
            finally:
                recorder.local.depth -= 1
            if emitted:
                try:
                    recorder.on_record(handler, record)
                except Exception as exc:  # recording must never break SGLang's logging
                    recorder.refuse(f"a log record could not be recorded: {exc!r}")
            return emitted

        logging.Handler.handle = handle
        if not ResolutionRecorder.hooked:  # an audit hook cannot be removed: one, idle unless recording
            sys.addaudithook(audit_reads)
            ResolutionRecorder.hooked = True
        ResolutionRecorder.active = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self.enabled:
            return
        ResolutionRecorder.active = None
        logging.Handler.handle = self.orig_handle
        sys.stdout, sys.stderr = self.real["stdout"], self.real["stderr"]
        loggers = [
            logging.getLogger(),
            *(
                logger
                for logger in logging.Logger.manager.loggerDict.values()
                if isinstance(logger, logging.Logger)
            ),
        ]
        for handler in (h for logger in loggers for h in logger.handlers):
            if type(handler) is logging.StreamHandler and isinstance(handler.stream, TeeStream):
                handler.setStream(handler.stream.real)  # handlers made meanwhile write straight again

    def refuse(self, reason: str) -> None:
        self.problem = self.problem or reason

    def stream_of(self, handler: logging.Handler) -> str | None:
        if type(handler) not in REPLAYABLE_HANDLERS:
            return None
        stream = handler.stream
        if isinstance(stream, TeeStream):
            return stream.name
        return next((name for name, real in self.real.items() if stream is real), None)

    def on_write(self, stream: str, text: str) -> None:
        if ResolutionRecorder.active is not self or getattr(self.local, "depth", 0):
            return  # recording is over, or a handler writes the record it was given (recorded as such)
        frame = sys._getframe(2)
        while frame is not None:
            if frame.f_code.co_filename == logging.__file__:
                self.refuse("logging output that bypassed Handler.handle")
                return
            frame = frame.f_back
        if self.events and self.events[-1][:2] == ["text", stream]:
            self.events[-1][2] += str(text)
        else:
            self.events.append(["text", stream, str(text)])

    def on_record(self, handler: logging.Handler, record: logging.LogRecord) -> None:
        stream, formatter = self.stream_of(handler), handler.formatter or logging.Formatter()
        style = next((name for name, cls in STYLES.items() if type(formatter._style) is cls), None)
        if stream is None or type(formatter) is not logging.Formatter or style is None:
            self.refuse(f"a log record went to {handler!r}")
            return
        fields = {name: getattr(record, name, None) for name in RECORD_FIELDS}
        fields["msg"] = record.getMessage()
        fmt = {
            "fmt": formatter._fmt,
            "datefmt": formatter.datefmt,
            "style": style,
            "terminator": handler.terminator,
        }
        self.events.append(["log", stream, fmt, fields])

    def logger_configured(self) -> None:
        """Right after SGLang's configure_logger: its root set-up, which a replay redoes."""
        if not self.enabled:
            return
        root = logging.getLogger()
        handler = root.handlers[0] if len(root.handlers) == 1 else None
        if (
            handler is None
            or type(handler) is not logging.StreamHandler
            or self.stream_of(handler) != "stderr"
            or type(handler.formatter) is not logging.Formatter
            or type(handler.formatter._style) is not logging.PercentStyle
            or handler.filters
            or root.filters
            or handler.level != logging.NOTSET
        ):
            self.refuse("SGLang's logging set-up is not basicConfig on stderr (SGLANG_LOGGING_CONFIG_PATH?)")
            return
        if isinstance(handler.stream, TeeStream):
            handler.setStream(handler.stream.real)
        self.events.append(
            [
                "configure",
                {"level": root.level, "fmt": handler.formatter._fmt, "datefmt": handler.formatter.datefmt},
            ]
        )

    def dependencies(self, resolved: dict) -> tuple[list, list]:
        """The files SGLang read and the directories it listed or resolved to (the model's, the draft's),
        outside installation_roots(), with their sha256 / listing now."""
        skip = installation_roots()
        files = {
            path: None
            for path in map(os.path.abspath, self.opened)
            if not under(path, skip) and "__pycache__" not in path.split(os.sep)
        }
        dirs = {path: None for path in map(os.path.abspath, self.listed) if not under(path, skip)}
        dirs.update(
            (os.path.abspath(value), None)
            for value in resolved.values()
            if isinstance(value, str) and value and os.path.isdir(value)
        )
        return (
            [[path, file_digest(path)] for path in sorted(files)],
            [[path, dir_listing(path)] for path in sorted(dirs)],
        )

    def entry(self, key: str, resolved: dict, launch_command: object, version: object, kv_events: object):
        """The document ParseCache stores; None (a debug line says why) when a replay could not be exact."""
        problem, texts = self.problem, {}
        for name, value in (("resolved", resolved), ("kv_events", kv_events)):
            texts[name] = repr(value)
            try:
                exact = repr(ast.literal_eval(texts[name])) == texts[name]
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                exact = False
            if not exact:
                problem = problem or f"{name} is not made of Python literals"
        if not isinstance(launch_command, str) or not isinstance(version, str):
            problem = problem or "launch_command or version is not a string"
        if problem:
            cache_log.debug(f"sglang-lab-server: parse cache: result not stored: {problem}")
            return None
        files, dirs = self.dependencies(resolved)
        return {
            "format": PARSE_CACHE_FORMAT,
            "key": key,
            "resolved": texts["resolved"],
            "kv_events": texts["kv_events"],
            "launch_command": launch_command,
            "version": version,
            "drawn": self.drawn,
            "events": self.events,
            "files": files,
            "dirs": dirs,
        }


def valid_event(event: object) -> bool:
    if not isinstance(event, list) or not event:
        return False
    kind, rest = event[0], event[1:]
    if kind == "configure":
        cfg = rest[0] if len(rest) == 1 and isinstance(rest[0], dict) else {}
        return (
            isinstance(cfg.get("level"), int)
            and isinstance(cfg.get("fmt"), str)
            and isinstance(cfg.get("datefmt"), (str, type(None)))
        )
    if kind == "text":
        return len(rest) == 2 and rest[0] in STREAMS and isinstance(rest[1], str)
    if kind == "log" and len(rest) == 3 and rest[0] in STREAMS and isinstance(rest[2], dict):
        fmt, fields = rest[1], rest[2]
        return (
            isinstance(fmt, dict)
            and isinstance(fmt.get("fmt"), str)
            and fmt.get("style") in STYLES
            and isinstance(fmt.get("datefmt"), (str, type(None)))
            and isinstance(fmt.get("terminator"), str)
            and isinstance(fields.get("msg"), str)
            and isinstance(fields.get("levelno"), int)
        )
    return False


def render(fmt: dict, fields: dict) -> str:
    """A recorded log record as its handler wrote it, with the time of now."""
    record = logging.makeLogRecord({name: fields.get(name) for name in RECORD_FIELDS})
    formatter = logging.Formatter(fmt["fmt"], fmt["datefmt"], fmt["style"])
    return formatter.format(record) + fmt["terminator"]


class CachedResolution:
    """One stored parse + resolve (ParseCache): SGLang's results, its output, the inputs it read."""

    def __init__(self, doc: object, key: str) -> None:
        if not isinstance(doc, dict) or doc.get("format") != PARSE_CACHE_FORMAT or doc.get("key") != key:
            raise ValueError("not an entry of this format and key")
        self.resolved, self.kv_events = ast.literal_eval(doc["resolved"]), ast.literal_eval(doc["kv_events"])
        self.launch_command, self.version, self.drawn = doc["launch_command"], doc["version"], doc["drawn"]
        self.events, self.files, self.dirs = doc["events"], doc["files"], doc["dirs"]
        lists = isinstance(self.files, list) and isinstance(self.dirs, list)
        pairs = [*self.files, *self.dirs] if lists else [None]
        if not (
            isinstance(self.resolved, dict)
            and "model_path" in self.resolved
            and "port" in self.resolved
            and isinstance(self.kv_events, (dict, type(None)))
            and isinstance(self.launch_command, str)
            and isinstance(self.version, str)
            and isinstance(self.events, list)
            and isinstance(self.drawn, list)
            and all(name in RANDOM_DEFAULTS for name in self.drawn)
            and all(map(valid_event, self.events))
            and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs)
        ):
            raise ValueError("malformed entry")
        for event in self.events:  # a format that cannot render fails here, before anything is written
            if event[0] == "log":
                render(event[2], event[3])

    def resolution(self) -> dict:
        """The stored resolved args, with the defaults SGLang draws at random drawn anew, as it would."""
        return {**self.resolved, **{name: RANDOM_DEFAULTS[name]() for name in self.drawn}}

    def changed_input(self) -> str | None:
        """The first file or directory SGLang read whose content or listing differs now, if any."""
        for path, digest in self.files:
            if file_digest(path) != digest:
                return path
        for path, listing in self.dirs:
            if dir_listing(path) != listing:
                return path + os.sep
        return None

    def replay(self) -> None:
        """What SGLang printed while it parsed and resolved, in order, and its logging set-up."""
        for event in self.events:
            if event[0] == "configure":
                cfg = event[1]
                logging.basicConfig(level=cfg["level"], format=cfg["fmt"], datefmt=cfg["datefmt"], force=True)
                continue
            stream = sys.stdout if event[1] == "stdout" else sys.stderr
            stream.write(event[2] if event[0] == "text" else render(event[2], event[3]))
            stream.flush()


class CachedServerArgs:
    """`Lab.server_args` after a cache hit: what the lab server reads of SGLang's ServerArgs once start-up
    resolution is over (launch_command). Reading more of it later means storing that in the entry too."""

    def __init__(self, launch_command: str) -> None:
        self.launch_command = launch_command


class ParseCache:
    """SGLang's parse + resolve result, kept so that a restart with the same argv does not import torch.

    Key (sha256; the entry's file name): the installed SGLang's identity (sglang_identity: version + sha256
    of RECORD and direct_url.json, as module_utils/sglang_venv.py's probe computes it) and every installed
    distribution's RECORD, the exact argv, the python (executable, version, sys.path, warning options),
    the working directory, this file's sha256, the whole environment except SGLANG_LAB_* and
    PER_START_ENV, and kernel/CPUs/memory. The entry also lists every file SGLang read and directory it
    listed outside the python installation (the model's and draft's config.json, generation_config.json,
    the model directories) with sha256 / listing: any difference is a miss. Only a resolution that
    succeeded is stored; a failing argv fails through SGLang every time. An editable SGLang install is
    never cached (its code changes under the same RECORD).
    Directory: parse_cache_dir(), 0700, of the user the server runs as (an entry holds the resolved
    arguments, the API key among them, as the startup line does); entries 0600, written atomically, at
    most PARSE_CACHE_MAX_ENTRIES (the least recently used go). An entry that cannot be read or parsed is
    reported in one log line, and the start parses with SGLang (and rewrites it).
    Seed: without an entry of its own, the same key in PARSE_CACHE_SEED_DIR (lab/labctl's, owned by root and
    writable by root only, else ignored; not with SGLANG_LAB_PARSE_CACHE_DIR), checked the same way.
    SGLANG_LAB_PARSE_CACHE=0: no cache. SGLANG_LAB_PARSE_CACHE_DIR: another directory."""

    def __init__(self, directory: str, key: str) -> None:
        self.directory, self.key = directory, key
        self.path = os.path.join(directory, key + ".json")
        self.seed = None if os.environ.get("SGLANG_LAB_PARSE_CACHE_DIR") else seed_entry(key)

    @classmethod
    def open(cls, argv: list[str]) -> ParseCache | None:
        """None: disabled, no (or an editable) SGLang, or a directory it must not use (one log line)."""
        if os.environ.get("SGLANG_LAB_PARSE_CACHE", "").strip().lower() in ("0", "false", "no", "off"):
            return None
        identity = sglang_identity()
        if identity is None or identity["editable"]:
            return None
        try:
            directory = parse_cache_dir()
            ensure_private_dir(directory)
        except (OSError, KeyError) as exc:
            cache_log.warning(f"sglang-lab-server: parse cache not used: {one_line(exc)}")
            return None
        return cls(directory, parse_cache_key(argv, identity))

    def reject(self, reason: str) -> None:
        cache_log.warning(
            f"sglang-lab-server: parse cache entry {self.path} ignored ({one_line(reason)}); "
            "parsing with SGLang"
        )

    def lookup(self) -> CachedResolution | None:
        source = self.path
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            if self.seed is None:
                return None
            source, raw = self.seed  # a miss of the seed is parsed anew and stored in self.path
        except OSError as exc:
            return self.reject(f"unreadable: {exc}")
        try:
            cached = CachedResolution(json.loads(raw), self.key)
        except (ValueError, TypeError, KeyError, IndexError, SyntaxError, MemoryError, RecursionError) as exc:
            seed = "" if source == self.path else f" (seed {source})"
            return self.reject(f"corrupt{seed}: {type(exc).__name__}: {exc}")
        changed = cached.changed_input()
        if changed:
            cache_log.debug(f"sglang-lab-server: parse cache miss: {changed} changed since {source}")
            return None
        if source == self.path:
            with contextlib.suppress(OSError):
                os.utime(self.path)  # recently used: pruned last
        cache_log.debug(f"sglang-lab-server: parse cache hit: {source}")
        return cached

    def store(self, entry: dict) -> None:
        data = json.dumps(entry, sort_keys=True).encode()
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=".entry-", suffix=".tmp", dir=self.directory)  # 0600
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            cache_log.warning(
                f"sglang-lab-server: parse cache entry {self.path} not written: {one_line(exc)}"
            )
            return
        self.prune()

    def prune(self) -> None:
        try:
            with os.scandir(self.directory) as scan:
                entries = [
                    (e.stat().st_mtime, e.path, e.name) for e in scan if e.is_file(follow_symlinks=False)
                ]
        except OSError:
            return
        now = time.time()
        stale = [path for mtime, path, name in entries if name.endswith(".tmp") and now - mtime > 3600]
        kept = sorted((mtime, path) for mtime, path, name in entries if name.endswith(".json"))
        for path in stale + [path for _, path in kept[:-PARSE_CACHE_MAX_ENTRIES]]:
            with contextlib.suppress(OSError):
                os.unlink(path)


class LazyPackage(types.ModuleType):
    """A package whose __init__.py runs only when a name it defines itself is asked for (a submodule is
    imported without it). After a cache hit, `sglang` and `sglang.srt.utils` (both __init__ import torch)
    are these, so the lab server's later imports (startup_time, the OpenAI protocol, sse_utils, auth)
    run only their own modules' code."""

    def __getattr__(self, name: str):
        for directory in self.__path__:
            path = os.path.join(directory, name)
            if os.path.isfile(path + ".py") or os.path.isdir(path):
                return importlib.import_module(f"{self.__name__}.{name}")
        spec = self.__dict__.pop("_lab_init_spec", None)
        if spec is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        spec.loader.exec_module(self)  # the real __init__, into this module: torch comes with it
        return getattr(self, name)


def use_light_sglang_imports() -> None:
    from importlib.machinery import PathFinder
    from importlib.util import spec_from_file_location

    spec = PathFinder.find_spec("sglang")
    if "sglang" in sys.modules or spec is None or not spec.submodule_search_locations:
        return
    root = list(spec.submodule_search_locations)[0]
    for name, directory in (("sglang", root), ("sglang.srt.utils", os.path.join(root, "srt", "utils"))):
        init = os.path.join(directory, "__init__.py")
        if not os.path.isfile(init):
            continue
        package = LazyPackage(name)
        package.__spec__ = package._lab_init_spec = spec_from_file_location(
            name, init, submodule_search_locations=[directory]
        )
        package.__path__, package.__package__, package.__file__ = [directory], name, init
        package.__loader__ = package.__spec__.loader
        sys.modules[name] = package
    if "sglang.srt.utils" in sys.modules:
        importlib.import_module("sglang.srt").utils = sys.modules["sglang.srt.utils"]


# ------------------------------------------------------------------------------- LAB REPLAY builds
# A build CI cannot download (a DDTree fork) runs in the lab as a LAB REPLAY (lab/replay/): a package
# `sglang` with the recorded build's parser and resolution only. Its startup line form and draft-worker
# lines come from its recording; what it lacks of SGLang's serving code (logging set-up, response
# models, auth, startup_time) the lab server does itself, in the shapes of SGLang 0.5.23.
def replay_recording() -> dict | None:
    """The recording of the installed LAB REPLAY build, or None for a real SGLang (found without
    importing the package: a real SGLang's __init__ imports torch)."""
    spec = importlib.util.find_spec("sglang")
    for location in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(location, "lab_replay_recording.json")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as handle:
                return json.load(handle)
    return None


class PlainModel:
    """Stand-in for SGLang's pydantic response models (OpenAI shapes) on a replay build."""

    defaults: dict = {}

    def __init__(self, **fields: object) -> None:
        self.fields = dict(self.defaults, **fields)

    def model_dump(self) -> dict:
        def plain(value):
            if isinstance(value, PlainModel):
                return value.model_dump()
            return [plain(v) for v in value] if isinstance(value, list) else value

        return {key: plain(value) for key, value in self.fields.items()}

    def model_dump_json(self) -> str:
        return json.dumps(self.model_dump())


def plain_model(name: str, **defaults: object) -> type:
    return type(name, (PlainModel,), {"defaults": defaults})


def replay_serving_api() -> types.SimpleNamespace:
    """What make_handler takes from SGLang's serving code, for a build that has none."""
    exempt = ("/health", "/health_generate", "/ready", "/metrics")

    def decide_request_auth(method, path, authorization_header, api_key, admin_api_key, auth_level):
        ok = not api_key or path in exempt or authorization_header == f"Bearer {api_key}"
        return types.SimpleNamespace(allowed=ok, error_status_code=None if ok else 401)

    def build_sse_content(chunk_id, created, model, index, role=None, content=None, finish_reason=None):
        delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
        chunk = {
            "id": chunk_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(chunk)}\n\n"

    return types.SimpleNamespace(
        ChatCompletionResponse=plain_model("ChatCompletionResponse", object="chat.completion"),
        ChatCompletionResponseChoice=plain_model("ChatCompletionResponseChoice"),
        ChatCompletionStreamResponse=plain_model(
            "ChatCompletionStreamResponse", object="chat.completion.chunk"
        ),
        ChatMessage=plain_model("ChatMessage"),
        ModelCard=plain_model("ModelCard", object="model", owned_by="sglang"),
        ModelList=plain_model("ModelList", object="list"),
        UsageInfo=plain_model("UsageInfo"),
        build_sse_content=build_sse_content,
        AuthLevel=types.SimpleNamespace(ADMIN_OPTIONAL="admin_optional", NORMAL="normal"),
        decide_request_auth=decide_request_auth,
    )


def runner_fields(d: dict, draft_arch: str) -> dict:
    """What a draft worker's start-up line reports, from the resolved args."""
    window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
    budget = d.get("speculative_ddtree_budget")
    return dict(
        d,
        speculative_draft_attention_backend=d.get("speculative_draft_attention_backend")
        or d.get("attention_backend"),
        speculative_draft_window_size=window,
        draft_model=draft_arch,
        compact_cache=window is not None,
        max_tree_nodes=None if budget is None else budget + 1,
    )


class Lab:
    """One lab server process: resolved args, phase, counters."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.load_seconds = env_float("SGLANG_LAB_LOAD_SECONDS", 2.0)
        self.load_until = os.environ.get("SGLANG_LAB_LOAD_UNTIL") or None
        self.crash_after = env_float("SGLANG_LAB_CRASH_AFTER", None)
        self.hang, self.old_api = env_flag("SGLANG_LAB_HANG"), env_flag("SGLANG_LAB_OLD_API")
        self.spawn_child = env_flag("SGLANG_LAB_SPAWN_CHILD")
        self.accept_length = env_accept_length()
        self.slow = env_factor("SGLANG_LAB_SLOW", 1.0, None)
        self.error_rate = env_factor("SGLANG_LAB_ERROR_RATE", 0.0, 1.0)
        self.generation_requests = 0
        self.http: dict[tuple[str, str, str], int] = {}  # (endpoint, status_code, method) -> responses
        self.requests = {"false": 0, "true": 0}  # finished requests by is_streaming
        self.ttft = {"false": Histogram(TTFT_BUCKETS), "true": Histogram(TTFT_BUCKETS)}
        self.itl = Histogram(ITL_BUCKETS)
        self.aborted = self.verify_calls = 0
        self.replay = replay_recording()
        self.log_format = os.environ.get("SGLANG_LAB_LOG_FORMAT") or (
            self.replay["server_args_form"] if self.replay else "dict"
        )
        if self.log_format not in ("dict", "dataclass"):
            raise LabConfigError(f"SGLANG_LAB_LOG_FORMAT must be dict or dataclass, got {self.log_format!r}")
        self.resolved: dict = {}
        self.sched = scheduler_logger({})
        self.httpd: ThreadingHTTPServer | None = None
        self.up = self.gracefully_exit = False
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.inflight: dict[str, float] = {}
        self.flush_pending = False  # SchedulerFlushWrapper._pending: one deferred flush at a time
        self.stats = {"prompt": 0, "generation": 0, "forwards": 0}

    # ------------------------------------------------------------------------------------ start-up
    def parse_and_resolve(self, argv: list[str]) -> None:
        cache = ParseCache.open(argv)  # None: SGLANG_LAB_PARSE_CACHE=0, or no usable cache (one log line)
        cached = cache.lookup() if cache else None
        if cached is not None:  # same key and inputs as a start before: SGLang's result without torch
            cached.replay()  # SGLang's warnings and its logging set-up, in order, timestamps of now
            self.server_args, self.version = CachedServerArgs(cached.launch_command), cached.version
            self.kv_events, d = cached.kv_events, cached.resolution()
            use_light_sglang_imports()
        else:
            with ResolutionRecorder(enabled=cache is not None) as recorder:
                d = self.resolve_with_sglang(argv, recorder)
            entry = cache and recorder.entry(
                cache.key, d, self.server_args.launch_command, self.version, self.kv_events
            )
            if entry:
                cache.store(entry)
        self.resolved = d
        self.sched, self.spec = scheduler_logger(d), spec_profile(d, self.accept_length)
        self.model_cfg = read_config(d["model_path"])
        self.context_len = d.get("context_length") or self.model_cfg.get("max_position_embeddings") or 4096

    def resolve_with_sglang(self, argv: list[str], recorder: ResolutionRecorder) -> dict:
        """SGLang's own parse and resolution (imports torch); sets server_args, version, kv_events."""
        from sglang.srt.server_args import prepare_server_args

        try:  # what `sglang serve` does before prepare_server_args: argv normalised, plugins loaded
            from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path
            from sglang.srt.plugins import load_plugins

            argv = _normalize_positional_model_path(_extract_model_type_override(argv)[1])[0]
            load_plugins()
        except ImportError:
            pass
        server_args = prepare_server_args(argv)  # argparse error: SGLang's usage text, exit 2
        if self.replay is not None:  # its resolution ran in prepare_server_args (dataclass __post_init__)
            if server_args.device is None:
                server_args.device = "cuda"
            recorder.logger_configured()
            recorder.drawn = []
            self.server_args, self.version, self.kv_events = server_args, self.replay["version"], None
            return dataclasses.asdict(server_args)
        if server_args.device is None:  # no accelerator here; a GPU host resolves to cuda
            server_args.device = "cuda"
        from sglang.srt.parser.template_detection import resolve_auto_parsers
        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
        from sglang.srt.utils.common import configure_logger
        from sglang.version import __version__

        configure_logger(server_args)
        recorder.logger_configured()
        recorder.drawn = [name for name in RANDOM_DEFAULTS if getattr(server_args, name, 0) is None]
        server_args.resolve_once()  # semantic errors propagate: traceback, exit 1, as `sglang serve`
        server_args.check_server_args()
        resolve_auto_parsers(server_args)
        from sglang.srt.runtime_context import describe_kv_events_publisher

        self.server_args, self.version = server_args, __version__
        self.kv_events = describe_kv_events_publisher(server_args)  # a function of the resolved args alone
        # = engine._server_args_for_logging(server_args), without importing the whole engine
        return redact_watermark_secrets(server_args.resolved_dict())

    def log_server_args(self) -> None:
        if self.log_format == "dict":
            engine_log.info(f"server_args={self.resolved}")
            return
        if self.replay is not None:  # the recorded build's own dataclass repr: its fields, its spellings
            fields = ", ".join(f"{k}={v!r}" for k, v in self.resolved.items())
            engine_log.info(f"server_args=ServerArgs({fields})")
            return
        hidden = {"watermark_key", "watermark_key_b", "watermark_config"}  # as ServerArgs.__repr__
        fields = ", ".join(
            f"{OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k}={v!r}"
            for k, v in self.resolved.items()
            if k not in hidden
        )
        engine_log.info(f"server_args=ServerArgs({fields})")

    def load(self) -> None:
        """Scheduler start-up with SGLang's log texts; takes SGLANG_LAB_LOAD_SECONDS in all."""
        d, s, cfg, share = self.resolved, self.sched, self.model_cfg, self.load_seconds / 10
        if self.spawn_child:
            spawn_scheduler_child()
        path = str(d["model_path"])
        files = os.listdir(path) if os.path.isdir(path) else []
        weight_gb = sum(os.path.getsize(os.path.join(path, f)) for f in files if f.endswith(".safetensors"))
        weight_gb /= GB
        avail = LAB_GPU_MEM_GB
        s.info(f"Load weight begin. avail mem={avail:.2f} GB")
        if self.hang:
            self.hang_forever()
        elapsed = self.load_weights(5 * share)
        if self.load_until:  # the gate ended the load: the remaining phases take ~0.5 s in all
            share = min(share, 0.1)
        avail -= weight_gb
        s.info(
            f"Load weight end. elapsed={elapsed:.2f} s, type={(cfg.get('architectures') or ['?'])[0]}, "
            f"avail mem={avail:.2f} GB, mem usage={weight_gb:.2f} GB."
        )
        heads = cfg.get("num_attention_heads", 32)
        head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
        per_layer = cfg.get("num_key_value_heads", heads) * head_dim * 2  # bytes of K (or V) per token, bf16
        layers, page = cfg.get("num_hidden_layers", 32), d.get("page_size") or 1
        budget = max(0.0, LAB_GPU_MEM_GB * (d.get("mem_fraction_static") or 0.9) - weight_gb)
        self.max_total_num_tokens = int(budget * GB / (2 * layers * per_layer)) // page * page
        kv_gb = self.max_total_num_tokens * layers * per_layer / GB
        time.sleep(share)
        s.info(
            f"KV Cache is allocated. dtype: {KV_DTYPES.get(d.get('kv_cache_dtype'), 'torch.bfloat16')}, "
            f"#tokens: {self.max_total_num_tokens}, K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB"
        )
        avail -= 2 * kv_gb
        self.weight_gb, self.kv_gb = weight_gb, 2 * kv_gb
        s.info(f"Memory pool end. avail mem={avail:.2f} GB")
        decode = (d.get("cuda_graph_config") or {}).get("decode") or {}
        name = "target verify" if self.spec["algo"] else "target decode"
        s.info(
            f"Capture {name} CUDA graph begin. backend={decode.get('backend')}, "
            f"num_tokens_per_req={self.spec['D']}, avail mem={avail:.2f} GB"
        )
        time.sleep(3 * share)
        s.info(
            f"Capture {name} CUDA graph end. bs={decode.get('bs')}, elapsed={3 * share:.2f} s, "
            f"mem usage=0.00 GB, avail mem={avail:.2f} GB."
        )
        if self.spec["algo"]:
            s.info(f"Load weight begin. avail mem={avail:.2f} GB")
            time.sleep(share)
            draft_arch = (read_config(d.get("speculative_draft_model_path")).get("architectures") or ["?"])[0]
            s.info(
                f"Load weight end. elapsed={share:.2f} s, type={draft_arch}, avail mem={avail:.2f} GB, "
                "mem usage=0.00 GB."
            )
            fields = runner_fields(d, draft_arch)
            if self.replay is not None:  # the recorded build's worker lines (lab/replay/<build>.json)
                for line in self.replay["runner_line"].get(str(self.spec["algo"]).upper(), []):
                    s.info(line.format(**fields))
            elif str(self.spec["algo"]).upper() == "DFLASH":  # format string of dflash_worker_v2.py
                s.info(
                    "Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s, "
                    "draft_window_size=%s, compact_cache=%s",
                    fields["speculative_draft_attention_backend"],
                    draft_arch,
                    d.get("speculative_num_draft_tokens"),
                    fields["speculative_draft_window_size"],
                    fields["compact_cache"],
                )
        self.max_req_input_len = min(self.context_len - 1, self.max_total_num_tokens - 1)
        s.info(
            f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size="
            f"{d.get('chunked_prefill_size')}, max_prefill_tokens={d.get('max_prefill_tokens')}, "
            f"max_running_requests={d.get('max_running_requests')}, context_len={self.context_len}, "
            f"available_gpu_mem={avail:.2f} GB"
        )
        if self.replay is not None:  # a replay build has no observability module: the phases, plainly
            self.scheduler_startup = {
                "target_load_weight": 5 * share,
                "kv_cache_allocation": share,
                "scheduler_e2e": self.load_seconds,
            }
            self.startup_time = {
                "schedulers": [self.scheduler_startup],
                "tokenizer_e2e": time.monotonic() - self.t0,
            }
            return
        from sglang.srt.observability import startup_time

        self.scheduler_startup = startup_time.build_scheduler_startup_time(
            target_load_weight=5 * share,
            draft_load_weight=share if self.spec["algo"] else 0.0,
            kv_cache_allocation=share,
            scheduler_e2e=self.load_seconds,
            draft_cuda_graph=None,
            target_cuda_graph={"target_verify" if self.spec["algo"] else "decode": 3 * share},
        )
        self.startup_time = startup_time.build_engine_startup_time(
            [self.scheduler_startup], tokenizer_e2e=time.monotonic() - self.t0
        )

    def load_weights(self, seconds: float) -> float:
        """The weight load: ``seconds``; with SGLANG_LAB_LOAD_UNTIL until that path exists (polled), at most
        SGLANG_LAB_LOAD_SECONDS. -> the seconds it took."""
        if not self.load_until:
            time.sleep(seconds)
            return seconds
        start = time.monotonic()
        deadline = start + self.load_seconds
        while not os.path.exists(self.load_until) and time.monotonic() < deadline:
            time.sleep(0.2)
        return time.monotonic() - start

    def hang_forever(self) -> None:
        start = time.monotonic()
        while True:  # tqdm's line of a shard load that never finishes (SGLang's BAR_FORMAT)
            time.sleep(3)
            elapsed = time.strftime("%M:%S", time.gmtime(time.monotonic() - start))
            sys.stderr.write(
                f"Loading safetensors checkpoint shards:   1% Completed | 1/163 [{elapsed}<?, ?it/s]\n"
            )

    def open_port(self) -> None:
        host, port = str(self.resolved.get("host") or "127.0.0.1"), int(self.resolved["port"])
        server_cls = ThreadingHTTPServer
        if ":" in host:
            server_cls = type("V6Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        try:
            self.httpd = server_cls((host, port), make_handler(self))
        except OSError as exc:  # as uvicorn reports it, after the whole load (SGLang checks no port first)
            emit_uvicorn(
                "ERROR",
                f"[Errno {exc.errno}] error while attempting to bind on address "
                f"{(host, port)}: {(exc.strerror or str(exc)).lower()}",
            )
            raise SystemExit(1) from None
        self.httpd.daemon_threads = True
        for line in (
            f"Started server process [{os.getpid()}]",
            "Waiting for application startup.",
            "Application startup complete.",
            f"Uvicorn running on http://{f'[{host}]' if ':' in host else host}:{port} (Press CTRL+C to quit)",
        ):
            emit_uvicorn("INFO", line)
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()

    def warmup(self) -> None:
        """As SGLang's _execute_server_warmup: 1 s, GET the model info, an 8-token /generate, over HTTP."""
        time.sleep(1)  # SGLang sleeps before its first request: /health is 503 meanwhile
        host = str(self.resolved.get("host") or "127.0.0.1")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        base = f"http://{f'[{host}]' if ':' in host else host}:{self.resolved['port']}"
        headers = {"Content-Type": "application/json"}
        if self.resolved.get("api_key"):
            headers["Authorization"] = f"Bearer {self.resolved['api_key']}"
        body = json.dumps(
            {
                "text": "The capital city of France is",
                "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            }
        ).encode()
        for path, data in (("/get_model_info" if self.old_api else "/model_info", None), ("/generate", body)):
            request = urllib.request.Request(base + path, data, headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        self.up = True
        log.info("The server is fired up and ready to roll!")

    # ------------------------------------------------------------------------------------ shutdown
    def on_sigterm(self, *_: object) -> None:
        signum = frame = None  # SGLang's loop.add_signal_handler calls sigterm_handler() without arguments
        log.warning(f"SIGTERM received. {signum=} {frame=}. Draining requests and shutting down...")
        self.gracefully_exit = True
        if self.httpd is None:  # still loading: nothing to drain
            sys.stderr.flush()
            os._exit(0)
        self.stop.set()

    def drain_and_exit(self) -> None:
        while True:
            with self.lock:
                rids = list(self.inflight)
            if env_flag("SGL_FORCE_SHUTDOWN"):
                log.error("Signal SIGTERM received while force shutdown flag set. Force exiting.")
                break
            log.info(
                f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                f"Remaining requests remaining_rids={rids}."
            )
            if not rids:
                break
            time.sleep(1)
        emit_uvicorn("INFO", "Shutting down")
        emit_uvicorn("INFO", f"Finished server process [{os.getpid()}]")
        sys.stderr.flush()
        os._exit(0)

    # ----------------------------------------------------------------------------------- endpoints
    def server_info(self) -> dict:
        """Composition of http_server.server_info(): resolved args + scheduler info + live state."""
        d = self.resolved
        state = dict(
            d,
            world_size=d.get("tp_size", 1) * d.get("dp_size", 1) * d.get("pp_size", 1),
            startup_time=self.scheduler_startup,
            last_gen_throughput=0.0,
            lab_server=True,
            effective_max_running_requests_per_dp=d.get("max_running_requests"),
        )
        if self.spec["algo"] and self.stats["forwards"]:
            state["avg_spec_accept_length"] = self.stats["generation"] / self.stats["forwards"]
        info = dict(
            d,
            launch_command=self.server_args.launch_command,
            status="ready",
            max_total_num_tokens=self.max_total_num_tokens,
            max_req_input_len=self.max_req_input_len,
            hicache_object_layout={
                "enabled": False,
                "backend": None,
                "page_size": d.get("page_size"),
                "hicache_object_layout": {"pools": []},
                "reason": "Hierarchical cache is disabled",
            },
            kv_events=self.kv_events,
            startup_time=self.startup_time,
            internal_states=[state],
            version=self.version,
            frontend="python",
        )
        if self.old_api:  # an older server: the window key's old spelling
            state[OLD_WINDOW_KEY] = state.pop(NEW_WINDOW_KEY, None)
            info = {(OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k): v for k, v in info.items()}
        return info

    def model_info(self) -> dict:
        d, cfg = self.resolved, self.model_cfg
        keys = (
            "tokenizer_path",
            "preferred_sampling_params",
            "load_format",
            "reasoning_parser",
            "tool_call_parser",
            "disaggregation_mode",
        )
        return {
            "model_path": d["model_path"],
            "served_model_name": d.get("served_model_name"),
            "is_generation": True,
            "weight_version": d.get("weight_version") or "default",
            **{k: d.get(k) for k in keys},
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": cfg.get("model_type"),
            "architectures": cfg.get("architectures"),
        }

    def dp_ranks(self) -> int:
        return max(1, int(self.resolved.get("dp_size") or 1))

    def load_snapshots(self, dp_rank: int | None) -> list:
        """TokenizerManager.get_loads: one SGLang LoadSnapshot per DP rank (in-flight requests spread
        over the ranks in arrival order); an unknown dp_rank gives none."""
        from sglang.srt.managers.load_snapshot import (
            DisaggregationMetrics,
            LoadSnapshot,
            MemoryMetrics,
            QueueMetrics,
            SpeculativeMetrics,
        )

        ranks, d = self.dp_ranks(), self.resolved
        if dp_rank is not None and not 0 <= dp_rank < ranks:
            return []
        with self.lock:
            count = [0] * ranks
            for i, _ in enumerate(self.inflight):
                count[i % ranks] += 1
            stats = dict(self.stats)
        cap = d.get("max_running_requests") or 0
        snapshots = []
        for rank in range(ranks) if dp_rank is None else (dp_rank,):
            running = min(count[rank], cap) if cap else count[rank]
            spec = None
            if self.spec["algo"] and stats["forwards"]:
                accept = stats["generation"] / stats["forwards"]
                spec = SpeculativeMetrics(
                    accept_length=accept, accept_rate=(accept - 1) / max(self.spec["D"] - 1, 1)
                )
            snapshots.append(
                LoadSnapshot(
                    timestamp=time.time(),
                    dp_rank=rank,
                    num_running_reqs=running,
                    num_waiting_reqs=count[rank] - running,
                    max_total_num_tokens=self.max_total_num_tokens,
                    max_running_requests=cap,
                    utilization=round(running / cap, 4) if cap else 0.0,
                    memory=MemoryMetrics(
                        weight_gb=round(self.weight_gb, 3),
                        kv_cache_gb=round(self.kv_gb, 3),
                        graph_gb=0.0,
                        token_capacity=int(self.max_total_num_tokens),
                    ),
                    speculative=spec,
                    disaggregation=DisaggregationMetrics(mode="null"),  # set even unused
                    queues=QueueMetrics(
                        waiting=count[rank] - running, grammar=0, paused=0, retracted=0, prealloc_ready=0
                    ),
                )
            )
        return snapshots

    def num_accelerators(self) -> int:
        """v1_loads._num_accelerators_per_dp_rank."""
        d = self.resolved
        n = int(d.get("tp_size") or 1) * int(d.get("pp_size") or 1)
        return n // self.dp_ranks() if d.get("enable_dp_attention") else n

    def flush_cache(self, timeout: float) -> tuple[bool, str | None]:
        """SchedulerFlushWrapper.handle/check_pending: (success, message) once idle or at the deadline."""

        def idle() -> bool:
            with self.lock:
                return not self.inflight

        with self.lock:
            if self.flush_pending:
                return False, "Another flush_cache is already in progress."
            if timeout <= 0.0 or not self.inflight:
                success = not self.inflight
                if success:
                    self.sched.info("Cache flushed successfully!")
                else:
                    self.sched.warning(
                        "Cache not flushed because there are pending requests. "
                        f"#queue-req: 0, #running-req: {len(self.inflight)}"
                    )
                return success, None
            self.flush_pending = True
        deadline = time.monotonic() + timeout
        try:
            while not idle():
                if time.monotonic() >= deadline:
                    logging.warning("Deferred flush_cache timed out while waiting for idle state.")
                    return False, "Timed out waiting for idle state."
                time.sleep(0.005)
            self.sched.info("Cache flushed successfully!")
            return True, None
        finally:
            with self.lock:
                self.flush_pending = False

    def generate(self, prompt: str, prompt_tokens: int, max_new: int, rid: str, stream: bool):
        """Yield (text so far, meta_info) per synthetic forward (only the final one unless streaming)."""
        spec, n = self.spec, max(0, max_new)
        forwards = math.ceil(n / spec["L"]) if n else 0
        tokens, start, done = synth_tokens(prompt, n), time.monotonic(), 0
        with self.lock:
            self.inflight[rid] = start
        try:
            time.sleep((0.010 + 0.00001 * prompt_tokens) * self.slow)
            last = start
            for k in range(1, forwards + 1):
                time.sleep(spec["step_ms"] * self.slow / 1000)
                before, done = done, n if k == forwards else max(done + 1, min(n, int(k * spec["L"])))
                self.observe_forward(k == 1, stream, time.monotonic() - last, done - before)
                last = time.monotonic()
                if stream or k == forwards:
                    yield "".join(tokens[:done]), self.meta(rid, prompt_tokens, done, k, k == forwards, start)
            if not forwards:
                yield "", self.meta(rid, prompt_tokens, 0, 0, True, start)
            with self.lock:
                for key, value in (("prompt", prompt_tokens), ("generation", n), ("forwards", forwards)):
                    self.stats[key] += value
                self.requests["true" if stream else "false"] += 1
                self.verify_calls += forwards if spec["algo"] else 0
        finally:
            with self.lock:
                self.inflight.pop(rid, None)

    def observe_forward(self, first: bool, stream: bool, interval: float, new_tokens: int) -> None:
        """As TokenizerManager: the first forward's time is the time to first token, every later one an
        inter-token interval spread over its new tokens (observe_inter_token_latency)."""
        with self.lock:
            if first:
                self.ttft["true" if stream else "false"].observe(interval)
            elif new_tokens > 0:
                self.itl.observe(interval / new_tokens, new_tokens)

    def fail_this_request(self) -> bool:
        """SGLANG_LAB_ERROR_RATE: whether this generation request is answered 500 (evenly spread)."""
        with self.lock:
            self.generation_requests += 1
            n = self.generation_requests
        return math.floor(n * self.error_rate) > math.floor((n - 1) * self.error_rate)

    def count_response(self, path: str, status: int, method: str) -> None:
        with self.lock:
            key = (path, str(status), method)
            self.http[key] = self.http.get(key, 0) + 1

    def meta(self, rid: str, prompt_tokens: int, done: int, verify_ct: int, final: bool, start: float):
        meta = {
            "id": rid,
            "finish_reason": {"type": "length", "length": done} if final else None,
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": done,
            "cached_tokens": 0,
        }
        if final:
            meta["e2e_latency"] = time.monotonic() - start
            if self.spec["algo"] and verify_ct:  # as TokenizerManager._calculate_spec_decoding_metrics
                proposed = verify_ct * (self.spec["D"] - 1)
                meta.update(
                    spec_accept_rate=(done - verify_ct) / proposed if proposed else 0.0,
                    spec_accept_length=done / verify_ct,
                    spec_num_correct_drafts=done - verify_ct,
                    spec_num_proposed_drafts=proposed,
                    spec_verify_ct=verify_ct,
                )
        meta["lab_server"] = True
        return meta

    def metrics(self) -> str:
        # As SGLang's collectors: --extra-metric-labels after each collector's own labels (scheduler_metrics_
        # collector, tokenizer_metric_labels), before a metric's own (is_streaming); values escaped as
        # prometheus_client writes them.
        extra = "".join(
            f',{name}="{exposition_escape(value)}"'
            for name, value in (self.resolved.get("extra_metric_labels") or {}).items()
        )
        tok = f'model_name="{self.resolved.get("served_model_name")}",engine_type="unified"'
        sched = tok + ',tp_rank="0",pp_rank="0",moe_ep_rank="0"' + extra
        stats, tok_x = self.stats, tok + extra
        with self.lock:
            requests, http, ttft, itl = dict(self.requests), dict(self.http), dict(self.ttft), self.itl.copy()
            aborted, verify_calls = self.aborted, self.verify_calls
        lines = ["# sglang-lab-server: synthetic values"]
        for metric, kind, labels, value in (
            ("sglang:prompt_tokens_total", "counter", tok_x + ',is_streaming="false"', stats["prompt"]),
            (
                "sglang:generation_tokens_total",
                "counter",
                tok_x + ',is_streaming="false"',
                stats["generation"],
            ),
            ("sglang:num_running_reqs", "gauge", sched, len(self.inflight)),
            (
                "sglang:spec_accept_length",
                "gauge",
                sched,
                stats["generation"] / stats["forwards"] if stats["forwards"] else 0,
            ),
        ):
            lines += [
                f"# HELP {metric} lab server synthetic value",
                f"# TYPE {metric} {kind}",  # prometheus_client names a counter's family with _total
                f"{metric}{{{labels}}} {float(value)}",
            ]
        lines += counter_lines(
            "sglang:num_requests_total",
            [(tok_x + f',is_streaming="{k}"', v) for k, v in requests.items() if v],
        )
        lines += counter_lines("sglang:num_aborted_requests_total", [(tok_x, aborted)])
        if self.spec["algo"]:
            lines += counter_lines("sglang:spec_verify_calls_total", [(tok_x, verify_calls)])
        lines += histogram_lines(
            "sglang:time_to_first_token_seconds",
            [(tok_x + f',is_streaming="{k}"', h) for k, h in ttft.items() if h.count],
        )
        lines += histogram_lines("sglang:inter_token_latency_seconds", [(tok_x, itl)])
        lines += counter_lines(
            "sglang:http_responses_total",
            [
                (f'endpoint="{exposition_escape(p)}",method="{m}",status_code="{c}"', v)
                for (p, c, m), v in sorted(http.items())
            ],
        )
        return "\n".join(lines) + "\n"


def serving_api() -> types.SimpleNamespace:
    """SGLang's own response models, SSE encoder and API-key decision."""
    from sglang.srt.entrypoints.openai import protocol
    from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    names = (
        "ChatCompletionResponse",
        "ChatCompletionResponseChoice",
        "ChatCompletionStreamResponse",
        "ChatMessage",
        "ModelCard",
        "ModelList",
        "UsageInfo",
    )
    return types.SimpleNamespace(
        **{n: getattr(protocol, n) for n in names},
        AuthLevel=AuthLevel,
        build_sse_content=build_sse_content,
        decide_request_auth=decide_request_auth,
    )


PHRASES = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def route_table(lab: Lab) -> dict[tuple[str, str], str]:
    """(method, path) -> the LabHandler method answering it: the endpoints of this build, era and flags."""
    get, post = ("GET",), ("POST", "PUT")
    paths = {
        "/health": (get, "health"),
        "/health_generate": (get, "health"),
        "/ready": (get, "ready"),
        "/get_server_info": (get, "server_info"),
        "/get_model_info": (get, "model_info"),
        "/v1/models": (get, "models"),
        "/generate": (post, "generate"),
        "/v1/chat/completions": (("POST",), "chat"),
        "/flush_cache": (("GET", "POST"), "flush_cache"),
    }
    if not lab.old_api:
        paths.update({"/server_info": (get, "server_info"), "/model_info": (get, "model_info")})
    if not lab.old_api and lab.replay is None:  # SGLang 0.5.23's load report (entrypoints/v1_loads.py)
        paths["/v1/loads"] = (get, "loads")
    if lab.resolved.get("enable_metrics"):
        paths["/metrics"] = (get, "metrics")
    return {(method, path): name for path, (methods, name) in paths.items() for method in methods}


def make_handler(lab: Lab) -> type[LabHandler]:
    """The request handler class of `lab`'s HTTP server: LabHandler bound to the lab, its API and routes."""
    api = replay_serving_api() if lab.replay is not None else serving_api()
    return type("Handler", (LabHandler,), {"lab": lab, "api": api, "routes": route_table(lab)})


def prompts_of(req: dict) -> tuple[list[tuple[str, int]], bool]:
    """/generate's prompts as (prompt, its token count), and whether the request is a batch."""
    text, ids = req.get("text"), req.get("input_ids")
    if text is None and ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    batch = isinstance(text, list) if text is not None else bool(ids) and isinstance(ids[0], list)
    if text is not None:
        return [(str(t), count_tokens(str(t))) for t in (text if batch else [text])], batch
    return [(str(i), len(i)) for i in (ids if batch else [ids])], batch


class ChatTurn:
    """One /v1/chat/completions request, as the lab answers it."""

    def __init__(self, req: dict) -> None:
        self.req = req
        self.model, messages = req.get("model") or "default", req.get("messages") or []
        self.prompt = " ".join(str(m.get("content")) for m in messages)
        self.prompt_tokens, self.rid = count_tokens(self.prompt), "chatcmpl-" + uuid.uuid4().hex
        self.created = int(time.time())
        self.max_new = int(req.get("max_completion_tokens") or req.get("max_tokens") or 128)


class LabHandler(BaseHTTPRequestHandler):
    """SGLang's HTTP server as the lab serves it. make_handler binds `lab`, `api` (SGLang's response models,
    SSE encoder and API-key decision) and `routes` (route_table); do_GET/do_POST/do_PUT check the API key,
    then dispatch to one method per endpoint."""

    protocol_version, server_version, sys_version = "HTTP/1.1", "sglang-lab-server", ""
    lab: Lab
    api: types.SimpleNamespace
    routes: dict[tuple[str, str], str]

    # ------------------------------------------------------------------------------------ plumbing
    def log_message(self, *_: object) -> None:  # replaced by uvicorn's access line
        pass

    def access(self, status: int) -> None:
        emit_uvicorn(
            "INFO",
            f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} '
            f'{self.path} HTTP/1.1" {status} {PHRASES.get(status, "")}'.rstrip(),
        )

    def send(self, status: int, body: object = b"", ctype: str | None = "application/json") -> None:
        if not isinstance(body, bytes):
            body = json.dumps(body, default=str, allow_nan=False).encode()
        self.send_response(status)
        self.lab.count_response(self.path.split("?", 1)[0], status, self.command)
        if body and ctype:
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.access(status)  # as uvicorn: at the response's start, so before the client can read the body
        self.wfile.write(body)

    def body(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")

    def query(self) -> dict[str, str]:
        """FastAPI's scalar query parameters: the last value of each name."""
        pairs = urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        return dict(pairs)

    def invalid(self, name: str, msg: str, raw: str) -> None:
        """SGLang's RequestValidationError handler: 400, the legacy ErrorResponse envelope (the message
        names the parameter as pydantic's error list does; its exact wording is FastAPI's)."""
        errors = [{"loc": ("query", name), "msg": msg, "input": raw}]
        self.send(
            400,
            {"object": "error", "message": str(errors), "type": "Bad Request", "param": None, "code": 400},
        )

    def stream(self, chunks) -> None:
        """text/event-stream with chunked transfer encoding, as uvicorn sends a StreamingResponse."""
        self.send_response(200)
        self.lab.count_response(self.path.split("?", 1)[0], 200, self.command)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self.access(200)  # as uvicorn: when the response starts, not when the stream ends

        def then_done():  # lazily: unpacking (*chunks, ...) would wait for the last forward
            yield from chunks
            yield "data: [DONE]\n\n"

        for data in then_done():
            raw = data.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    # ------------------------------------------------------------------------------------ dispatch
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        if not self.authorized(path):
            return
        try:
            self.dispatch(path)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
        except ConnectionError:  # the client went away mid-stream: SGLang aborts the request
            with self.lab.lock:
                self.lab.aborted += 1

    do_POST = do_PUT = do_GET  # noqa: N815

    def authorized(self, path: str) -> bool:
        """SGLang's own decision (False: 401/403 answered); /health*, /ready, /metrics are exempt."""
        api, resolved = self.api, self.lab.resolved
        decision = api.decide_request_auth(
            method=self.command,
            path=path,
            authorization_header=self.headers.get("Authorization"),
            api_key=resolved.get("api_key"),
            admin_api_key=resolved.get("admin_api_key"),
            auth_level=api.AuthLevel.ADMIN_OPTIONAL if path == "/flush_cache" else api.AuthLevel.NORMAL,
        )
        if not decision.allowed:
            code = decision.error_status_code
            self.send(code, {"error": "Unauthorized" if code == 401 else "Forbidden"})
        return decision.allowed

    def dispatch(self, path: str) -> None:
        """The endpoint's method; 404 for a path this server lacks, 405 for a method the path refuses."""
        name = self.routes.get((self.command, path))
        known = path.startswith("/v1/models/") or any(path == served for _, served in self.routes)
        if name is None and path.startswith("/v1/models/") and self.command == "GET":
            name = "one_model"
        if name is not None:
            getattr(self, name)()
        elif not known:
            self.send(404, {"detail": "Not Found"})
        else:
            self.send(405, {"detail": "Method Not Allowed"})

    # ------------------------------------------------------------------------------------ endpoints
    def health(self) -> None:  # /health, /health_generate
        if self.lab.gracefully_exit:
            log.info("Health check request received during shutdown. Returning 503.")
        self.send(200 if self.lab.up and not self.lab.gracefully_exit else 503)

    def ready(self) -> None:
        self.send(200 if self.lab.up and not self.lab.gracefully_exit else 503)

    def deprecated(self, old: str, new: str) -> None:
        if not self.lab.old_api:  # an older server has only the old name and does not warn
            log.warning(
                f"Endpoint '{old}' is deprecated and will be removed in a future version. "
                f"Please use '{new}' instead."
            )

    def server_info(self) -> None:  # /server_info, /get_server_info
        if self.path.startswith("/get_"):
            self.deprecated("/get_server_info", "/server_info")
        self.send(200, self.lab.server_info())

    def model_info(self) -> None:  # /model_info, /get_model_info
        if self.path.startswith("/get_"):
            self.deprecated("/get_model_info", "/model_info")
        self.send(200, self.lab.model_info())

    def card(self, name: str) -> object:
        return self.api.ModelCard(id=name, root=name, max_model_len=self.lab.context_len)

    def models(self) -> None:  # /v1/models
        cards = [self.card(self.lab.resolved.get("served_model_name"))]
        self.send(200, self.api.ModelList(data=cards).model_dump())

    def one_model(self) -> None:  # /v1/models/<name>
        wanted = self.path.split("?", 1)[0][len("/v1/models/") :]
        if wanted == self.lab.resolved.get("served_model_name"):
            self.send(200, self.card(wanted).model_dump())
            return
        self.send(
            404,
            {
                "error": {
                    "message": f"The model '{wanted}' does not exist",
                    "param": "model",
                    "type": "invalid_request_error",
                    "code": "model_not_found",
                }
            },
        )

    def flush_cache(self) -> None:  # http_server.flush_cache: timeout = Query(0.0, ge=0.0)
        raw = self.query().get("timeout", "0")
        try:
            timeout = float(raw)
        except ValueError:
            timeout = None
        if timeout is None or not math.isfinite(timeout):
            self.invalid("timeout", "Input should be a valid number", raw)
            return
        if timeout < 0:
            self.invalid("timeout", "Input should be greater than or equal to 0", raw)
            return
        success, message = self.lab.flush_cache(timeout)
        # Response(content=str) without a media type: no content-type header
        self.send(
            200 if success else 400,
            FLUSH_OK if success else (message or "Flush cache failed.\n").encode(),
            None,
        )

    def loads(self) -> None:  # entrypoints/v1_loads.get_loads
        q = self.query()
        dp_rank = None
        if "dp_rank" in q:
            try:
                dp_rank = int(q["dp_rank"])
            except ValueError:
                self.invalid("dp_rank", "Input should be a valid integer", q["dp_rank"])
                return
        include = q.get("include") or None
        include_list = [part.strip() for part in include.split(",")] if include else None
        include_set = set(include_list) if include_list else None
        snapshots = self.lab.load_snapshots(dp_rank)
        try:
            if q.get("format") == "prometheus":
                self.send(200, loads_prometheus(snapshots, include_set).encode(), PROMETHEUS_TYPE)
                return
            loads = [snapshot.to_dict(include_set) for snapshot in snapshots]
        except ValueError:  # raised outside get_loads' try in SGLang: Starlette's plain 500
            log.error("Exception in ASGI application\n" + traceback.format_exc().rstrip())
            self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return
        self.send(
            200,
            {
                "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "version": self.lab.version,
                "accelerator": LAB_GPU_NAME,
                "num_accelerators": self.lab.num_accelerators(),
                "loads": loads,
            },
        )

    def metrics(self) -> None:  # /metrics (--enable-metrics)
        self.send(200, self.lab.metrics().encode(), PROMETHEUS_TYPE)

    def injected_error(self) -> bool:
        """SGLANG_LAB_ERROR_RATE: answer this generation request 500, as SGLang an internal error."""
        if not self.lab.fail_this_request():
            return False
        message = f"injected by the lab server: SGLANG_LAB_ERROR_RATE={self.lab.error_rate:g}"
        self.body()
        self.send(
            500,
            {
                "object": "error",
                "message": message,
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            },
        )
        return True

    def generate(self) -> None:  # /generate: one prompt or a batch, a single prompt may stream
        if self.injected_error():
            return
        req = self.body()
        max_new = int((req.get("sampling_params") or {}).get("max_new_tokens", 128))
        prompts, batch = prompts_of(req)
        if req.get("stream") and len(prompts) == 1:
            outs = self.lab.generate(*prompts[0], max_new, req.get("rid") or uuid.uuid4().hex, True)
            self.stream(
                "data: " + json.dumps({"text": out, "output_ids": [], "meta_info": meta}) + "\n\n"
                for out, meta in outs
            )
            return
        results = [
            {"text": out, "output_ids": [], "meta_info": meta}
            for prompt in prompts
            for out, meta in self.lab.generate(*prompt, max_new, uuid.uuid4().hex, False)
        ]
        self.send(200, results if batch else results[0])

    def chat(self) -> None:  # /v1/chat/completions
        if (self.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            message = "Unsupported Media Type: Only 'application/json' is allowed"
            self.send(
                400,
                {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
            )
            return
        if self.injected_error():
            return
        turn = ChatTurn(self.body())
        if turn.req.get("stream"):
            self.stream(self.chat_chunks(turn))
        else:
            self.chat_reply(turn)

    def chat_reply(self, turn: ChatTurn) -> None:
        """The whole completion in one ChatCompletionResponse."""
        api, ptok = self.api, turn.prompt_tokens
        out, meta = list(self.lab.generate(turn.prompt, ptok, turn.max_new, turn.rid, False))[-1]
        done = meta["completion_tokens"]
        message = api.ChatMessage(role="assistant", content=out)
        choice = api.ChatCompletionResponseChoice(index=0, message=message, finish_reason="length")
        self.send(
            200,
            api.ChatCompletionResponse(
                id=turn.rid,
                created=turn.created,
                model=turn.model,
                choices=[choice],
                usage=api.UsageInfo(prompt_tokens=ptok, completion_tokens=done, total_tokens=ptok + done),
                metadata={"weight_version": "default", "lab_server": True},
            ).model_dump(),
        )

    def chat_chunks(self, turn: ChatTurn):
        """The SSE chunks of a streamed completion: role, one delta per forward, finish, usage if asked."""
        api, ptok = self.api, turn.prompt_tokens

        def sse(**kwargs) -> str:
            return api.build_sse_content(
                chunk_id=turn.rid, created=turn.created, model=turn.model, index=0, **kwargs
            )

        yield sse(role="assistant", content="")
        sent = done = 0
        for out, meta in self.lab.generate(turn.prompt, ptok, turn.max_new, turn.rid, True):
            yield sse(content=out[sent:])
            sent, done = len(out), meta["completion_tokens"]
        yield sse(finish_reason="length")
        if (turn.req.get("stream_options") or {}).get("include_usage"):
            usage = api.UsageInfo(prompt_tokens=ptok, completion_tokens=done, total_tokens=ptok + done)
            last = api.ChatCompletionStreamResponse(
                id=turn.rid, created=turn.created, model=turn.model, choices=[], usage=usage
            )
            yield f"data: {last.model_dump_json()}\n\n"


# SGLang 0.5.23's default buckets (metrics_collector.py, TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
    0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip


class Histogram:
    """A Prometheus histogram's state: per-bucket counts (cumulated when written), count, sum."""

    def __init__(self, buckets: tuple) -> None:
        self.buckets, self.counts, self.count, self.sum = buckets, [0] * len(buckets), 0, 0.0

    def observe(self, value: float, times: int = 1) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += times
                break
        self.count += times
        self.sum += value * times

    def copy(self) -> Histogram:
        other = Histogram(self.buckets)
        other.counts, other.count, other.sum = list(self.counts), self.count, self.sum
        return other


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString for a finite bound: 1 -> 1.0, 0.1 -> 0.1."""
    return repr(float(value))


def counter_lines(metric: str, samples: list) -> list[str]:
    """A counter as prometheus_client writes it: HELP and TYPE name the _total family."""
    lines = [f"# HELP {metric} lab server synthetic value", f"# TYPE {metric} counter"]
    return lines + [f"{metric}{{{labels}}} {float(value)}" for labels, value in samples]


def histogram_lines(metric: str, samples: list) -> list[str]:
    """A histogram as prometheus_client writes it: cumulative _bucket lines with le, +Inf, _count, _sum."""
    lines = [f"# HELP {metric} lab server synthetic value", f"# TYPE {metric} histogram"]
    for labels, hist in samples:
        running = 0
        for bound, n in zip(hist.buckets, hist.counts):
            running += n
            lines.append(f'{metric}_bucket{{{labels},le="{go_float(bound)}"}} {float(running)}')
        lines.append(f'{metric}_bucket{{{labels},le="+Inf"}} {float(hist.count)}')
        lines.append(f"{metric}_count{{{labels}}} {float(hist.count)}")
        lines.append(f"{metric}_sum{{{labels}}} {hist.sum!r}")
    return lines


def exposition_escape(value) -> str:
    """A label value as prometheus_client's exposition writes it (backslash, newline, double quote)."""
    return str(value).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def loads_prometheus(load_results: list, include: set[str] | None) -> str:
    """v1_loads._format_loads_prometheus (SGLang 0.5.23), for the lab's LoadSnapshots."""
    section_prefixes = {"speculative": "spec", "disaggregation": "disagg"}
    metric_samples: dict[str, list] = {}
    for load in load_results:
        load_dict = load.to_dict(include)
        dp_rank = load_dict.pop("dp_rank")
        for key, value in load_dict.items():
            if isinstance(value, dict):
                prefix = section_prefixes.get(key, key)
                for sub_key, sub_value in value.items():
                    if isinstance(sub_value, (int, float)):
                        name = f"sglang_{prefix}_{sub_key}"
                        metric_samples.setdefault(name, []).append((dp_rank, sub_value))
            elif isinstance(value, (int, float)):
                metric_samples.setdefault(f"sglang_{key}", []).append((dp_rank, value))
    lines = []
    for metric_name, samples in metric_samples.items():
        lines.append(f"# TYPE {metric_name} gauge")
        lines += [f'{metric_name}{{dp_rank="{dp_rank}"}} {value}' for dp_rank, value in samples]
    return "\n".join(lines) + "\n"


def spawn_scheduler_child() -> None:
    """SGLANG_LAB_SPAWN_CHILD: a "scheduler" process that outlives its parent (KillMode=process)."""
    if os.fork():
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stderr.write(
            f"[{time.strftime(DATE_FORMAT)}] Scheduler process started (lab server child "
            f"pid={os.getpid()}, parent={os.getppid()}, SGLANG_LAB_SPAWN_CHILD=1)\n"
        )
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def crash_later(lab: Lab) -> None:
    """SGLANG_LAB_CRASH_AFTER: a scheduler exception, then the launcher gives up (exit 1)."""
    time.sleep(max(0.0, lab.crash_after - (time.monotonic() - lab.t0)))
    try:
        raise RuntimeError(
            "CUDA error: an illegal memory access was encountered (injected by the lab "
            f"server: SGLANG_LAB_CRASH_AFTER={lab.crash_after:g})"
        )
    except RuntimeError:
        lab.sched.error(f"Scheduler hit an exception: {traceback.format_exc()}")
    engine_log.error("Received sigquit from a child process. It usually means the child failed.")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def main() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, datefmt=DATE_FORMAT)
    try:
        lab = Lab()
    except LabConfigError as exc:
        sys.stderr.write(f"sglang_lab_server: {exc}\n")
        raise SystemExit(1) from None
    signal.signal(signal.SIGTERM, lab.on_sigterm)
    if lab.crash_after is not None:
        threading.Thread(target=crash_later, args=(lab,), name="crash", daemon=True).start()
    lab.parse_and_resolve(sys.argv[1:])
    lab.log_server_args()
    lab.load()
    lab.open_port()
    try:
        lab.warmup()
    except OSError as exc:
        log.error(f"Initialization failed. warmup error: {exc}")
        raise SystemExit(1) from None
    lab.stop.wait()
    lab.drain_and_exit()


if __name__ == "__main__":
    main()
