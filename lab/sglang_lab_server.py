#!/usr/bin/env python3
# Lab tooling of the sglang deployment project; never installed on GPU hosts.
"""Stand-in for `sglang serve` on lab hosts (no GPU) -- the project's ONE stand-in.

    <venv>/bin/python /opt/sglang-lab/sglang_lab_server.py <argv exactly as `sglang serve` gets it>

Real (the INSTALLED SGLang does it): argument parsing (`prepare_server_args`; argparse errors print
SGLang's usage and exit 2), resolution (`resolve_once`, `check_server_args`, `resolve_auto_parsers`;
semantic errors print SGLang's traceback and exit 1) with SGLang's own warnings, the log format
(`configure_logger`), the startup line `server_args={...}` (NOT redacted, as SGLang logs it), the API-key
decision (`sglang.srt.utils.auth.decide_request_auth`), the OpenAI response models, `startup_time`.
Without `--device` the raw record gets device `cuda` before resolution (exactly what `--device cuda`
sets: what a GPU host resolves to); `launch_command` stays the argv as given.

Synthetic: load phases (SGLang's log texts, lab numbers; a 94.97 GB GPU), generated text (words; a
prompt's tokens are its words and punctuation), timings. Deterministic speculative-decoding model:
    D = speculative_num_draft_tokens (else speculative_num_steps + 1), W = draft window,
    k = speculative_eagle_topk, b = speculative_ddtree_budget (fork builds only, else 0)
    q = min(0.95, 0.25 * (min(W, 4096) / 4096) ** 0.25   [1 if W unset]
                       * (1 + 0.1 * log2(k)) * (1 + 0.1 * log2(b / D))   [1 if b <= D])
    accept length L = 1 + (D - 1) * q                    (L = 1, D = 1 without speculative decoding)
    step_ms = 4 + 0.25 * (D - 1) + 0.5 * min(W, 32768) / 32768   [0.5 if W unset] + 0.01 * b
    forwards = ceil(new_tokens / L); latency = 10 ms + 0.01 ms * prompt_tokens + forwards * step_ms,
    really slept; a stream sends one SSE chunk per forward (cumulative text, as SGLang by default).

Environment: SGLANG_LAB_LOAD_SECONDS (default 2: load time before the port opens),
SGLANG_LAB_LOG_FORMAT=dict|dataclass (dataclass: the older `server_args=ServerArgs(...)` line, window
key spelled `speculative_dflash_draft_window_size`), SGLANG_LAB_OLD_API=1 (an older server: only
/get_server_info and /get_model_info, no deprecation warnings, old window key in the JSON),
SGLANG_LAB_CRASH_AFTER=<s> (scheduler traceback, exit 1, that many seconds after start),
SGLANG_LAB_HANG=1 (never opens the port; a stuck shard-load line every 3 s),
SGLANG_LAB_SPAWN_CHILD=1 (forks a "scheduler" child that outlives its parent, as under KillMode=process).
/metrics exists only with --enable-metrics, as in SGLang. SIGTERM: drain, exit 0.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_FORMAT, DATE_FORMAT = "[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"  # SGLang's configure_logger
GB = 1 << 30
LAB_GPU_MEM_GB = 94.97
OLD_WINDOW_KEY, NEW_WINDOW_KEY = "speculative_dflash_draft_window_size", "speculative_draft_window_size"
KV_DTYPES = {"fp8_e4m3": "torch.float8_e4m3fn", "fp8_e5m2": "torch.float8_e5m2"}
WORDS = ("the", "lab", "server", "answers", "with", "synthetic", "tokens", "for", "a", "deployment",
         "test", "of", "speculative", "decoding", "on", "systemd", ".", ",")

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


def spec_profile(d: dict) -> dict:
    """The synthetic speculative-decoding model documented in the module docstring."""
    algo = d.get("speculative_algorithm")
    if not algo:
        return {"algo": None, "D": 1, "L": 1.0, "step_ms": 4.0}
    draft = d.get("speculative_num_draft_tokens") or (d.get("speculative_num_steps") or 1) + 1
    window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
    topk, budget = max(1, d.get("speculative_eagle_topk") or 1), d.get("speculative_ddtree_budget") or 0
    f_window = (min(window, 4096) / 4096) ** 0.25 if window else 1.0
    f_budget = 1 + 0.1 * math.log2(budget / draft) if budget > draft else 1.0
    q = min(0.95, 0.25 * f_window * (1 + 0.1 * math.log2(topk)) * f_budget)
    step_ms = 4 + 0.25 * (draft - 1) + (0.5 * min(window, 32768) / 32768 if window else 0.5) + 0.01 * budget
    return {"algo": algo, "D": draft, "L": 1 + (draft - 1) * q, "step_ms": step_ms}


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


class Lab:
    """One lab server process: resolved args, phase, counters."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.load_seconds = env_float("SGLANG_LAB_LOAD_SECONDS", 2.0)
        self.crash_after = env_float("SGLANG_LAB_CRASH_AFTER", None)
        self.hang, self.old_api = env_flag("SGLANG_LAB_HANG"), env_flag("SGLANG_LAB_OLD_API")
        self.spawn_child = env_flag("SGLANG_LAB_SPAWN_CHILD")
        self.log_format = os.environ.get("SGLANG_LAB_LOG_FORMAT") or "dict"
        if self.log_format not in ("dict", "dataclass"):
            raise LabConfigError(f"SGLANG_LAB_LOG_FORMAT must be dict or dataclass, got {self.log_format!r}")
        self.resolved: dict = {}
        self.sched = scheduler_logger({})
        self.httpd: ThreadingHTTPServer | None = None
        self.up = self.gracefully_exit = False
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.inflight: dict[str, float] = {}
        self.stats = {"prompt": 0, "generation": 0, "forwards": 0}

    # ------------------------------------------------------------------------------------ start-up
    def parse_and_resolve(self, argv: list[str]) -> None:
        from sglang.srt.server_args import prepare_server_args

        try:  # what `sglang serve` does before prepare_server_args: argv normalised, plugins loaded
            from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path
            from sglang.srt.plugins import load_plugins

            argv = _normalize_positional_model_path(_extract_model_type_override(argv)[1])[0]
            load_plugins()
        except ImportError:
            pass
        server_args = prepare_server_args(argv)  # argparse error: SGLang's usage text, exit 2
        if server_args.device is None:  # no accelerator here; a GPU host resolves to cuda
            server_args.device = "cuda"
        from sglang.srt.parser.template_detection import resolve_auto_parsers
        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
        from sglang.srt.utils.common import configure_logger
        from sglang.version import __version__

        configure_logger(server_args)
        server_args.resolve_once()  # semantic errors propagate: traceback, exit 1, as `sglang serve`
        server_args.check_server_args()
        resolve_auto_parsers(server_args)
        self.server_args, self.version = server_args, __version__
        # = engine._server_args_for_logging(server_args), without importing the whole engine
        self.resolved = d = redact_watermark_secrets(server_args.resolved_dict())
        self.sched, self.spec = scheduler_logger(d), spec_profile(d)
        self.model_cfg = read_config(d["model_path"])
        self.context_len = d.get("context_length") or self.model_cfg.get("max_position_embeddings") or 4096

    def log_server_args(self) -> None:
        if self.log_format == "dict":
            engine_log.info(f"server_args={self.resolved}")
            return
        hidden = {"watermark_key", "watermark_key_b", "watermark_config"}  # as ServerArgs.__repr__
        fields = ", ".join(f"{OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k}={v!r}"
                           for k, v in self.resolved.items() if k not in hidden)
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
        time.sleep(5 * share)
        avail -= weight_gb
        s.info(f"Load weight end. elapsed={5 * share:.2f} s, type={(cfg.get('architectures') or ['?'])[0]}, "
               f"avail mem={avail:.2f} GB, mem usage={weight_gb:.2f} GB.")
        heads = cfg.get("num_attention_heads", 32)
        head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
        per_layer = cfg.get("num_key_value_heads", heads) * head_dim * 2  # bytes of K (or V) per token, bf16
        layers, page = cfg.get("num_hidden_layers", 32), d.get("page_size") or 1
        budget = max(0.0, LAB_GPU_MEM_GB * (d.get("mem_fraction_static") or 0.9) - weight_gb)
        self.max_total_num_tokens = int(budget * GB / (2 * layers * per_layer)) // page * page
        kv_gb = self.max_total_num_tokens * layers * per_layer / GB
        time.sleep(share)
        s.info(f"KV Cache is allocated. dtype: {KV_DTYPES.get(d.get('kv_cache_dtype'), 'torch.bfloat16')}, "
               f"#tokens: {self.max_total_num_tokens}, K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB")
        avail -= 2 * kv_gb
        s.info(f"Memory pool end. avail mem={avail:.2f} GB")
        decode = (d.get("cuda_graph_config") or {}).get("decode") or {}
        name = "target verify" if self.spec["algo"] else "target decode"
        s.info(f"Capture {name} CUDA graph begin. backend={decode.get('backend')}, "
               f"num_tokens_per_req={self.spec['D']}, avail mem={avail:.2f} GB")
        time.sleep(3 * share)
        s.info(f"Capture {name} CUDA graph end. bs={decode.get('bs')}, elapsed={3 * share:.2f} s, "
               f"mem usage=0.00 GB, avail mem={avail:.2f} GB.")
        if self.spec["algo"]:
            s.info(f"Load weight begin. avail mem={avail:.2f} GB")
            time.sleep(share)
            draft_arch = (read_config(d.get("speculative_draft_model_path")).get("architectures") or ["?"])[0]
            s.info(f"Load weight end. elapsed={share:.2f} s, type={draft_arch}, avail mem={avail:.2f} GB, "
                   "mem usage=0.00 GB.")
            if str(self.spec["algo"]).upper() == "DFLASH":  # format string of dflash_worker_v2.py
                window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
                s.info("Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s, "
                       "draft_window_size=%s, compact_cache=%s",
                       d.get("speculative_draft_attention_backend") or d.get("attention_backend"),
                       draft_arch, d.get("speculative_num_draft_tokens"), window, window is not None)
        self.max_req_input_len = min(self.context_len - 1, self.max_total_num_tokens - 1)
        s.info(f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size="
               f"{d.get('chunked_prefill_size')}, max_prefill_tokens={d.get('max_prefill_tokens')}, "
               f"max_running_requests={d.get('max_running_requests')}, context_len={self.context_len}, "
               f"available_gpu_mem={avail:.2f} GB")
        from sglang.srt.observability import startup_time

        self.scheduler_startup = startup_time.build_scheduler_startup_time(
            target_load_weight=5 * share, draft_load_weight=share if self.spec["algo"] else 0.0,
            kv_cache_allocation=share, scheduler_e2e=self.load_seconds, draft_cuda_graph=None,
            target_cuda_graph={"target_verify" if self.spec["algo"] else "decode": 3 * share})
        self.startup_time = startup_time.build_engine_startup_time(
            [self.scheduler_startup], tokenizer_e2e=time.monotonic() - self.t0)

    def hang_forever(self) -> None:
        start = time.monotonic()
        while True:  # tqdm's line of a shard load that never finishes (SGLang's BAR_FORMAT)
            time.sleep(3)
            elapsed = time.strftime("%M:%S", time.gmtime(time.monotonic() - start))
            sys.stderr.write(f"Loading safetensors checkpoint shards:   1% Completed | 1/163 "
                             f"[{elapsed}<?, ?it/s]\n")

    def open_port(self) -> None:
        host, port = str(self.resolved.get("host") or "127.0.0.1"), int(self.resolved["port"])
        server_cls = ThreadingHTTPServer
        if ":" in host:
            server_cls = type("V6Server", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
        try:
            self.httpd = server_cls((host, port), make_handler(self))
        except OSError as exc:  # as uvicorn reports it, after the whole load (SGLang checks no port first)
            emit_uvicorn("ERROR", f"[Errno {exc.errno}] error while attempting to bind on address "
                                  f"{(host, port)}: {(exc.strerror or str(exc)).lower()}")
            raise SystemExit(1) from None
        self.httpd.daemon_threads = True
        for line in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                     "Application startup complete.",
                     f"Uvicorn running on http://{f'[{host}]' if ':' in host else host}:{port} "
                     "(Press CTRL+C to quit)"):
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
        body = json.dumps({"text": "The capital city of France is",
                           "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
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
            log.info(f"Gracefully exiting... Remaining number of requests {len(rids)}. "
                     f"Remaining requests remaining_rids={rids}.")
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
        from sglang.srt.runtime_context import describe_kv_events_publisher

        d = self.resolved
        state = dict(d, world_size=d.get("tp_size", 1) * d.get("dp_size", 1) * d.get("pp_size", 1),
                     startup_time=self.scheduler_startup, last_gen_throughput=0.0, lab_server=True,
                     effective_max_running_requests_per_dp=d.get("max_running_requests"))
        if self.spec["algo"] and self.stats["forwards"]:
            state["avg_spec_accept_length"] = self.stats["generation"] / self.stats["forwards"]
        info = dict(d, launch_command=self.server_args.launch_command, status="ready",
                    max_total_num_tokens=self.max_total_num_tokens, max_req_input_len=self.max_req_input_len,
                    hicache_object_layout={"enabled": False, "backend": None, "page_size": d.get("page_size"),
                                           "hicache_object_layout": {"pools": []},
                                           "reason": "Hierarchical cache is disabled"},
                    kv_events=describe_kv_events_publisher(self.server_args), startup_time=self.startup_time,
                    internal_states=[state], version=self.version, frontend="python")
        if self.old_api:  # an older server: the window key's old spelling
            state[OLD_WINDOW_KEY] = state.pop(NEW_WINDOW_KEY, None)
            info = {(OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k): v for k, v in info.items()}
        return info

    def model_info(self) -> dict:
        d, cfg = self.resolved, self.model_cfg
        keys = ("tokenizer_path", "preferred_sampling_params", "load_format", "reasoning_parser",
                "tool_call_parser", "disaggregation_mode")
        return {"model_path": d["model_path"], "served_model_name": d.get("served_model_name"),
                "is_generation": True, "weight_version": d.get("weight_version") or "default",
                **{k: d.get(k) for k in keys}, "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": cfg.get("model_type"),
                "architectures": cfg.get("architectures")}

    def generate(self, prompt: str, prompt_tokens: int, max_new: int, rid: str, stream: bool):
        """Yield (text so far, meta_info) per synthetic forward (only the final one unless streaming)."""
        spec, n = self.spec, max(0, max_new)
        forwards = math.ceil(n / spec["L"]) if n else 0
        tokens, start, done = synth_tokens(prompt, n), time.monotonic(), 0
        with self.lock:
            self.inflight[rid] = start
        try:
            time.sleep(0.010 + 0.00001 * prompt_tokens)
            for k in range(1, forwards + 1):
                time.sleep(spec["step_ms"] / 1000)
                done = n if k == forwards else max(done + 1, min(n, int(k * spec["L"])))
                if stream or k == forwards:
                    yield "".join(tokens[:done]), self.meta(rid, prompt_tokens, done, k, k == forwards, start)
            if not forwards:
                yield "", self.meta(rid, prompt_tokens, 0, 0, True, start)
            with self.lock:
                for key, value in (("prompt", prompt_tokens), ("generation", n), ("forwards", forwards)):
                    self.stats[key] += value
        finally:
            with self.lock:
                self.inflight.pop(rid, None)

    def meta(self, rid: str, prompt_tokens: int, done: int, verify_ct: int, final: bool, start: float):
        meta = {"id": rid, "finish_reason": {"type": "length", "length": done} if final else None,
                "prompt_tokens": prompt_tokens, "weight_version": "default", "num_retractions": 0,
                "reasoning_tokens": 0, "completion_tokens": done, "cached_tokens": 0}
        if final:
            meta["e2e_latency"] = time.monotonic() - start
            if self.spec["algo"] and verify_ct:  # as TokenizerManager._calculate_spec_decoding_metrics
                proposed = verify_ct * (self.spec["D"] - 1)
                meta.update(spec_accept_rate=(done - verify_ct) / proposed if proposed else 0.0,
                            spec_accept_length=done / verify_ct, spec_num_correct_drafts=done - verify_ct,
                            spec_num_proposed_drafts=proposed, spec_verify_ct=verify_ct)
        meta["lab_server"] = True
        return meta

    def metrics(self) -> str:
        tok = f'model_name="{self.resolved.get("served_model_name")}",engine_type="unified"'
        sched = tok + ',tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        stats, tok_s = self.stats, tok + ',is_streaming="false"'
        lines = ["# sglang-lab-server: synthetic values"]
        for metric, kind, labels, value in (
                ("sglang:prompt_tokens_total", "counter", tok_s, stats["prompt"]),
                ("sglang:generation_tokens_total", "counter", tok_s, stats["generation"]),
                ("sglang:num_running_reqs", "gauge", sched, len(self.inflight)),
                ("sglang:spec_accept_length", "gauge", sched,
                 stats["generation"] / stats["forwards"] if stats["forwards"] else 0)):
            lines += [f"# HELP {metric} lab server synthetic value",
                      f"# TYPE {metric[:-6] if kind == 'counter' else metric} {kind}",
                      f"{metric}{{{labels}}} {float(value)}"]
        return "\n".join(lines) + "\n"


def make_handler(lab: Lab):
    from sglang.srt.entrypoints.openai.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatCompletionStreamResponse,
        ChatMessage,
        ModelCard,
        ModelList,
        UsageInfo,
    )
    from sglang.srt.entrypoints.openai.sse_utils import build_sse_content
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    phrases = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
               405: "Method Not Allowed", 503: "Service Unavailable"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version, server_version, sys_version = "HTTP/1.1", "sglang-lab-server", ""

        def log_message(self, *_: object) -> None:  # replaced by uvicorn's access line
            pass

        def access(self, status: int) -> None:
            emit_uvicorn("INFO", f'{self.client_address[0]}:{self.client_address[1]} - "{self.command} '
                                 f'{self.path} HTTP/1.1" {status} {phrases.get(status, "")}'.rstrip())

        def send(self, status: int, body: object = b"", ctype: str = "application/json") -> None:
            if not isinstance(body, bytes):
                body = json.dumps(body, default=str, allow_nan=False).encode()
            self.send_response(status)
            if body:
                self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.access(status)

        def body(self) -> dict:
            return json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0]
            decision = decide_request_auth(  # SGLang's own decision; /health*, /ready, /metrics are exempt
                method=self.command, path=path, authorization_header=self.headers.get("Authorization"),
                api_key=lab.resolved.get("api_key"), admin_api_key=lab.resolved.get("admin_api_key"),
                auth_level=AuthLevel.ADMIN_OPTIONAL if path == "/flush_cache" else AuthLevel.NORMAL)
            if not decision.allowed:
                code = decision.error_status_code
                self.send(code, {"error": "Unauthorized" if code == 401 else "Forbidden"})
                return
            route = routes.get(path)
            if route is None and path.startswith("/v1/models/"):
                route = (("GET",), Handler.one_model)
            try:
                if route is None:
                    self.send(404, {"detail": "Not Found"})
                elif self.command not in route[0]:
                    self.send(405, {"detail": "Method Not Allowed"})
                else:
                    route[1](self)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                self.send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})
            except ConnectionError:  # the client went away mid-stream
                pass

        do_POST = do_PUT = do_GET  # noqa: N815

        def health(self) -> None:
            if lab.gracefully_exit:
                log.info("Health check request received during shutdown. Returning 503.")
            self.send(200 if lab.up and not lab.gracefully_exit else 503)

        def ready(self) -> None:
            self.send(200 if lab.up and not lab.gracefully_exit else 503)

        def deprecated(self, old: str, new: str) -> None:
            if not lab.old_api:  # an older server has only the old name and does not warn
                log.warning(f"Endpoint '{old}' is deprecated and will be removed in a future version. "
                            f"Please use '{new}' instead.")

        def server_info(self) -> None:
            if self.path.startswith("/get_"):
                self.deprecated("/get_server_info", "/server_info")
            self.send(200, lab.server_info())

        def model_info(self) -> None:
            if self.path.startswith("/get_"):
                self.deprecated("/get_model_info", "/model_info")
            self.send(200, lab.model_info())

        def card(self, name: str) -> ModelCard:
            return ModelCard(id=name, root=name, max_model_len=lab.context_len)

        def models(self) -> None:
            self.send(200, ModelList(data=[self.card(lab.resolved.get("served_model_name"))]).model_dump())

        def one_model(self) -> None:
            wanted = self.path.split("?", 1)[0][len("/v1/models/"):]
            if wanted == lab.resolved.get("served_model_name"):
                self.send(200, self.card(wanted).model_dump())
                return
            self.send(404, {"error": {"message": f"The model '{wanted}' does not exist", "param": "model",
                                      "type": "invalid_request_error", "code": "model_not_found"}})

        def flush_cache(self) -> None:
            self.send(200, b"Cache flushed.\nPlease check backend logs for more details. (When there are "
                           b"running or waiting requests, the operation will not be performed.)\n",
                      "text/plain; charset=utf-8")

        def metrics(self) -> None:
            self.send(200, lab.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")

        def stream(self, chunks) -> None:
            """text/event-stream with chunked transfer encoding, as uvicorn sends a StreamingResponse."""
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            def then_done():  # lazily: unpacking (*chunks, ...) would wait for the last forward
                yield from chunks
                yield "data: [DONE]\n\n"

            for data in then_done():
                raw = data.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.access(200)

        def generate(self) -> None:
            req = self.body()
            max_new = int((req.get("sampling_params") or {}).get("max_new_tokens", 128))
            text, ids = req.get("text"), req.get("input_ids")
            if text is None and ids is None:
                raise ValueError("Either text, input_ids or input_embeds should be provided.")
            batch = isinstance(text, list) if text is not None else bool(ids) and isinstance(ids[0], list)
            if text is not None:
                prompts = [(str(t), count_tokens(str(t))) for t in (text if batch else [text])]
            else:
                prompts = [(str(i), len(i)) for i in (ids if batch else [ids])]
            if req.get("stream") and len(prompts) == 1:
                outs = lab.generate(*prompts[0], max_new, req.get("rid") or uuid.uuid4().hex, True)
                self.stream("data: " + json.dumps({"text": out, "output_ids": [], "meta_info": meta}) + "\n\n"
                            for out, meta in outs)
                return
            results = [{"text": out, "output_ids": [], "meta_info": meta} for prompt in prompts
                       for out, meta in lab.generate(*prompt, max_new, uuid.uuid4().hex, False)]
            self.send(200, results if batch else results[0])

        def chat(self) -> None:
            if (self.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
                message = "Unsupported Media Type: Only 'application/json' is allowed"
                self.send(400, {"object": "error", "message": message, "type": "Bad Request", "param": None,
                                "code": 400})
                return
            req = self.body()
            model, messages = req.get("model") or "default", req.get("messages") or []
            prompt = " ".join(str(m.get("content")) for m in messages)
            ptok, rid, created = count_tokens(prompt), "chatcmpl-" + uuid.uuid4().hex, int(time.time())
            max_new = int(req.get("max_completion_tokens") or req.get("max_tokens") or 128)
            if not req.get("stream"):
                out, meta = list(lab.generate(prompt, ptok, max_new, rid, False))[-1]
                done = meta["completion_tokens"]
                message = ChatMessage(role="assistant", content=out)
                choice = ChatCompletionResponseChoice(index=0, message=message, finish_reason="length")
                self.send(200, ChatCompletionResponse(
                    id=rid, created=created, model=model, choices=[choice],
                    usage=UsageInfo(prompt_tokens=ptok, completion_tokens=done, total_tokens=ptok + done),
                    metadata={"weight_version": "default", "lab_server": True}).model_dump())
                return

            def sse(**kwargs) -> str:
                return build_sse_content(chunk_id=rid, created=created, model=model, index=0, **kwargs)

            def chunks():
                yield sse(role="assistant", content="")
                sent = done = 0
                for out, meta in lab.generate(prompt, ptok, max_new, rid, True):
                    yield sse(content=out[sent:])
                    sent, done = len(out), meta["completion_tokens"]
                yield sse(finish_reason="length")
                if (req.get("stream_options") or {}).get("include_usage"):
                    usage = UsageInfo(prompt_tokens=ptok, completion_tokens=done, total_tokens=ptok + done)
                    last = ChatCompletionStreamResponse(id=rid, created=created, model=model, choices=[],
                                                        usage=usage)
                    yield f"data: {last.model_dump_json()}\n\n"

            self.stream(chunks())

    get, post = ("GET",), ("POST", "PUT")
    routes = {"/health": (get, Handler.health), "/health_generate": (get, Handler.health),
              "/ready": (get, Handler.ready), "/get_server_info": (get, Handler.server_info),
              "/get_model_info": (get, Handler.model_info), "/v1/models": (get, Handler.models),
              "/generate": (post, Handler.generate), "/v1/chat/completions": (("POST",), Handler.chat),
              "/flush_cache": (("GET", "POST"), Handler.flush_cache)}
    if not lab.old_api:
        routes.update({"/server_info": (get, Handler.server_info), "/model_info": (get, Handler.model_info)})
    if lab.resolved.get("enable_metrics"):
        routes["/metrics"] = (get, Handler.metrics)
    return Handler


def spawn_scheduler_child() -> None:
    """SGLANG_LAB_SPAWN_CHILD: a "scheduler" process that outlives its parent (KillMode=process)."""
    if os.fork():
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stderr.write(f"[{time.strftime(DATE_FORMAT)}] Scheduler process started (lab server child "
                         f"pid={os.getpid()}, parent={os.getppid()}, SGLANG_LAB_SPAWN_CHILD=1)\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def crash_later(lab: Lab) -> None:
    """SGLANG_LAB_CRASH_AFTER: a scheduler exception, then the launcher gives up (exit 1)."""
    time.sleep(max(0.0, lab.crash_after - (time.monotonic() - lab.t0)))
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by the lab "
                           f"server: SGLANG_LAB_CRASH_AFTER={lab.crash_after:g})")
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
