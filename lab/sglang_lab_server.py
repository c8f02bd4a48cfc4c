#!/usr/bin/env python3
# Copyright: the sglang deployment project. Lab tooling, not shipped to GPU hosts.
"""Stand-in for `sglang serve` on lab hosts (no GPU): the ONE lab stand-in.

Run with the venv's python so it imports the INSTALLED SGLang:
    <venv>/bin/python /opt/sglang-lab/sglang_lab_server.py <argv exactly as `sglang serve` gets it>

What is real: argument parsing (`prepare_server_args`: argparse errors exit 2 with SGLang's
usage text), resolution (`resolve_once`, `check_server_args`, `resolve_auto_parsers`:
semantic errors print SGLang's traceback, exit 1), SGLang's own warnings, the logging
format (`configure_logger`), the startup line `server_args={...}` (unredacted, as SGLang
logs it), API-key decisions (`sglang.srt.utils.auth.decide_request_auth`), and the
OpenAI response models. Without `--device` the record is resolved with device `cuda`
(set on the raw record before resolution, exactly what `--device cuda` does; what a GPU
host resolves to); `launch_command` stays the argv that was given.

What is synthetic: load phases (real SGLang log texts, lab numbers), generated text and
timings, and the memory figures (a 94.97 GB GPU is assumed).  Synthetic speculative
decoding (deterministic, so a sweep gets distinct numbers):
    D = speculative_num_draft_tokens (else speculative_num_steps + 1), W = draft window,
    k = speculative_eagle_topk, b = speculative_ddtree_budget (fork builds only)
    q = min(0.95, 0.25 * (min(W, 4096) / 4096) ** 0.25 [1 if W unset]
                       * (1 + 0.1 * log2(k)) * (1 + 0.1 * log2(b / D)) [1 if b <= D])
    accept length L = 1 + (D - 1) * q          (L = 1 without speculative decoding)
    step_ms = 4 + 0.25 * (D - 1) + 0.5 * min(W, 32768) / 32768 [0.5 if W unset] + 0.01 * b
    forwards = ceil(completion_tokens / L);  latency = 10 ms + 0.01 ms * prompt_tokens
               + forwards * step_ms  (really slept, streamed one SSE chunk per forward)
Tokens are words (prompt tokens = words and punctuation of the prompt).

Environment: SGLANG_LAB_LOAD_SECONDS (default 2), SGLANG_LAB_LOG_FORMAT=dict|dataclass
(dataclass: the older `server_args=ServerArgs(...)` line, window key spelled
`speculative_dflash_draft_window_size`), SGLANG_LAB_OLD_API=1 (only /get_server_info and
/get_model_info, no deprecation warnings, old window key in the JSON),
SGLANG_LAB_CRASH_AFTER=<s> (scheduler traceback, exit 1, that many seconds after start),
SGLANG_LAB_HANG=1 (never opens the port, logs a stuck load every 3 s),
SGLANG_LAB_SPAWN_CHILD=1 (forks a "scheduler" child that outlives the parent).
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
import sys
import threading
import time
import traceback
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG_FORMAT = "[%(asctime)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
GB = 1 << 30
LAB_GPU_MEM_GB = 94.97
OLD_WINDOW_KEY = "speculative_dflash_draft_window_size"
NEW_WINDOW_KEY = "speculative_draft_window_size"
WORDS = ("the", "lab", "server", "answers", "with", "synthetic", "tokens", "for", "a",
         "deployment", "test", "of", "speculative", "decoding", "on", "systemd", ".", ",")

log = logging.getLogger("sglang.srt.entrypoints.http_server")


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
        raise LabConfigError(f"{name} must be >= 0, got {raw!r}")
    return value


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


def emit_uvicorn(level: str, message: str) -> None:
    """Uvicorn's line as SGLang configures it: `[ts] INFO:     message`."""
    if logging.getLogger().isEnabledFor(getattr(logging, level)):
        stamp = time.strftime(DATE_FORMAT)
        sys.stderr.write(f"[{stamp}] {level + ':':<9} {message}\n")


def scheduler_logger(resolved: dict | None) -> logging.Logger:
    """Scheduler lines carry SGLang's rank prefix (`[ts TP0] ...`) when tp/dp > 1."""
    prefix = ""
    if resolved and resolved.get("dp_size", 1) > 1:
        prefix += " DP0"
    if resolved and resolved.get("tp_size", 1) > 1:
        prefix += " TP0"
    logger = logging.getLogger("sglang.srt.managers.scheduler")
    logger.propagate = False
    logger.handlers[:] = []
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"[%(asctime)s{prefix}] %(message)s", DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(logging.getLogger().level)
    return logger


def spec_profile(d: dict) -> dict:
    """The documented synthetic speculative-decoding model (see module docstring)."""
    algo = d.get("speculative_algorithm")
    if not algo:
        return {"algo": None, "D": 1, "L": 1.0, "step_ms": 4.0}
    draft = d.get("speculative_num_draft_tokens") or (d.get("speculative_num_steps") or 1) + 1
    window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
    topk = max(1, d.get("speculative_eagle_topk") or 1)
    budget = d.get("speculative_ddtree_budget") or 0
    f_window = (min(window, 4096) / 4096) ** 0.25 if window else 1.0
    f_budget = 1 + 0.1 * math.log2(budget / draft) if budget > draft else 1.0
    q = min(0.95, 0.25 * f_window * (1 + 0.1 * math.log2(topk)) * f_budget)
    step_ms = 4 + 0.25 * (draft - 1) + (0.5 * min(window, 32768) / 32768 if window else 0.5)
    return {"algo": algo, "D": draft, "L": 1 + (draft - 1) * q,
            "step_ms": step_ms + 0.01 * budget}


def count_tokens(text: str) -> int:
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


def synth_tokens(seed: str, n: int) -> list[str]:
    digest = hashlib.sha256(seed.encode()).digest()
    return [" " + WORDS[(digest[i % 32] + i * 7) % len(WORDS)] for i in range(n)]


def read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


class Lab:
    """State of one lab server process: resolved args, phase, counters."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.load_seconds = env_float("SGLANG_LAB_LOAD_SECONDS", 2.0)
        self.crash_after = env_float("SGLANG_LAB_CRASH_AFTER", None)
        self.hang = env_flag("SGLANG_LAB_HANG")
        self.old_api = env_flag("SGLANG_LAB_OLD_API")
        self.spawn_child = env_flag("SGLANG_LAB_SPAWN_CHILD")
        self.log_format = os.environ.get("SGLANG_LAB_LOG_FORMAT", "dict") or "dict"
        if self.log_format not in ("dict", "dataclass"):
            raise LabConfigError(
                f"SGLANG_LAB_LOG_FORMAT must be dict or dataclass, got {self.log_format!r}")
        self.server_args = None
        self.resolved: dict = {}
        self.up = False
        self.gracefully_exit = False
        self.httpd: ThreadingHTTPServer | None = None
        self.lock = threading.Lock()
        self.inflight: dict[str, float] = {}
        self.stats = {"prompt": 0, "generation": 0, "forwards": 0, "accepted": 0, "reqs": 0}
        self.startup_time: dict = {}
        self.scheduler_startup: dict = {}
        self.sched = scheduler_logger(None)
        self.stop = threading.Event()

    # ----------------------------------------------------------------- startup
    def parse_and_resolve(self, argv: list[str]) -> None:
        from sglang.srt.server_args import prepare_server_args

        try:  # what `sglang serve` does before prepare_server_args
            from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path

            argv = _normalize_positional_model_path(_extract_model_type_override(argv)[1])[0]
        except ImportError:
            pass
        server_args = prepare_server_args(argv)  # argparse error: SGLang's usage, exit 2
        if server_args.device is None:
            # No accelerator here; `--device cuda` is what a GPU host resolves to.
            server_args.device = "cuda"
        from sglang.srt.parser.template_detection import resolve_auto_parsers
        from sglang.srt.sampling.watermarking.core import redact_watermark_secrets
        from sglang.srt.utils.common import configure_logger

        configure_logger(server_args)
        server_args.resolve_once()  # semantic error: traceback, exit 1 (uncaught)
        server_args.check_server_args()
        resolve_auto_parsers(server_args)
        self.server_args = server_args
        # engine._server_args_for_logging(server_args), without importing the engine
        self.resolved = redact_watermark_secrets(server_args.resolved_dict())
        self.sched = scheduler_logger(self.resolved)
        self.spec = spec_profile(self.resolved)
        self.model_cfg = read_json(os.path.join(str(self.resolved["model_path"]), "config.json"))

    def log_server_args(self) -> None:
        engine_log = logging.getLogger("sglang.srt.entrypoints.engine")
        if self.log_format == "dict":
            engine_log.info(f"server_args={self.resolved}")
            return
        hidden = {"watermark_key", "watermark_key_b", "watermark_config"}
        fields = ", ".join(f"{OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k}={v!r}"
                           for k, v in self.resolved.items() if k not in hidden)
        engine_log.info(f"server_args=ServerArgs({fields})")

    def wait(self, seconds: float) -> None:
        if self.stop.wait(seconds):
            raise SystemExit(0)

    def load(self) -> None:
        """Scheduler start-up with SGLang's log texts; takes SGLANG_LAB_LOAD_SECONDS."""
        d, s, share = self.resolved, self.sched, self.load_seconds / 10
        if self.spawn_child:
            spawn_scheduler_child()
        cfg = self.model_cfg
        weight_gb = sum(os.path.getsize(os.path.join(d["model_path"], f))
                        for f in os.listdir(d["model_path"])
                        if f.endswith((".safetensors", ".bin"))) / GB \
            if os.path.isdir(str(d["model_path"])) else 0.0
        avail = LAB_GPU_MEM_GB
        s.info(f"Load weight begin. avail mem={avail:.2f} GB")
        if self.hang:
            self.hang_forever()
        self.wait(5 * share)
        arch = (cfg.get("architectures") or ["LlamaForCausalLM"])[0]
        avail -= weight_gb
        s.info(f"Load weight end. elapsed={5 * share:.2f} s, type={arch}, "
               f"avail mem={avail:.2f} GB, mem usage={weight_gb:.2f} GB.")
        heads = cfg.get("num_attention_heads", 32)
        head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
        per_layer = cfg.get("num_key_value_heads", heads) * head_dim * 2
        layers = cfg.get("num_hidden_layers", 32)
        budget = max(0.0, LAB_GPU_MEM_GB * (d.get("mem_fraction_static") or 0.9) - weight_gb)
        page = d.get("page_size") or 1
        self.max_total_num_tokens = int(budget * GB / (2 * layers * per_layer)) // page * page
        kv_gb = self.max_total_num_tokens * layers * per_layer / GB
        self.wait(share)
        s.info(f"KV Cache is allocated. dtype: torch.bfloat16, #tokens: "
               f"{self.max_total_num_tokens}, K size: {kv_gb:.2f} GB, V size: {kv_gb:.2f} GB")
        avail -= 2 * kv_gb
        s.info(f"Memory pool end. avail mem={avail:.2f} GB")
        graph = d.get("cuda_graph_config") or {}
        decode = graph.get("decode") or {}
        name = "target verify" if self.spec["algo"] else "target decode"
        s.info(f"Capture {name} CUDA graph begin. backend={decode.get('backend')}, "
               f"num_tokens_per_req={self.spec['D']}, avail mem={avail:.2f} GB")
        self.wait(3 * share)
        s.info(f"Capture {name} CUDA graph end. bs={decode.get('bs')}, elapsed={3 * share:.2f} s, "
               f"mem usage=0.00 GB, avail mem={avail:.2f} GB.")
        graph_times = {"target_verify" if self.spec["algo"] else "decode": 3 * share}
        if self.spec["algo"]:
            s.info(f"Load weight begin. avail mem={avail:.2f} GB")
            self.wait(share)
            draft_cfg = read_json(os.path.join(str(d.get("speculative_draft_model_path")),
                                               "config.json"))
            draft_arch = (draft_cfg.get("architectures") or ["unknown"])[0]
            s.info(f"Load weight end. elapsed={share:.2f} s, type={draft_arch}, "
                   f"avail mem={avail:.2f} GB, mem usage=0.00 GB.")
            if str(self.spec["algo"]).upper() == "DFLASH":
                window = d.get(NEW_WINDOW_KEY, d.get(OLD_WINDOW_KEY))
                s.info(
                    "Initialized DFLASH draft runner. attention_backend=%s, model=%s, "
                    "block_size=%s, draft_window_size=%s, compact_cache=%s",
                    d.get("speculative_draft_attention_backend") or d.get("attention_backend"),
                    draft_arch, d.get("speculative_num_draft_tokens"), window, window is not None)
        context_len = d.get("context_length") or cfg.get("max_position_embeddings") or 4096
        self.context_len = context_len
        self.max_req_input_len = min(context_len - 1, self.max_total_num_tokens - 1)
        s.info(f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size="
               f"{d.get('chunked_prefill_size')}, max_prefill_tokens={d.get('max_prefill_tokens')}, "
               f"max_running_requests={d.get('max_running_requests')}, context_len={context_len}, "
               f"available_gpu_mem={avail:.2f} GB")
        from sglang.srt.observability.startup_time import (
            build_engine_startup_time,
            build_scheduler_startup_time,
        )

        self.scheduler_startup = build_scheduler_startup_time(
            target_load_weight=5 * share, draft_load_weight=share if self.spec["algo"] else 0.0,
            kv_cache_allocation=share, scheduler_e2e=self.load_seconds,
            target_cuda_graph=graph_times, draft_cuda_graph=None)
        self.startup_time = build_engine_startup_time(
            [self.scheduler_startup], tokenizer_e2e=time.monotonic() - self.t0)

    def hang_forever(self) -> None:
        shards, start = 163, time.monotonic()
        while True:
            self.wait(3)
            elapsed = time.strftime("%M:%S", time.gmtime(time.monotonic() - start))
            sys.stderr.write(f"Loading safetensors checkpoint shards:   1% Completed | "
                             f"1/{shards} [{elapsed}<?, ?it/s]\n")

    def open_port(self) -> None:
        host, port = str(self.resolved.get("host") or "127.0.0.1"), int(self.resolved["port"])
        server_cls = ThreadingHTTPServer
        if ":" in host:
            server_cls = type("V6Server", (ThreadingHTTPServer,), {"address_family": 10})
        try:
            self.httpd = server_cls((host, port), make_handler(self))
        except OSError as exc:
            emit_uvicorn("ERROR", f"[Errno {exc.errno}] error while attempting to bind on address "
                         f"{(host, port)}: {(exc.strerror or str(exc)).lower()}")
            raise SystemExit(1) from None
        self.httpd.daemon_threads = True
        emit_uvicorn("INFO", f"Started server process [{os.getpid()}]")
        emit_uvicorn("INFO", "Waiting for application startup.")
        emit_uvicorn("INFO", "Application startup complete.")
        shown = f"[{host}]" if ":" in host else host
        emit_uvicorn("INFO", f"Uvicorn running on http://{shown}:{port} (Press CTRL+C to quit)")
        threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True).start()

    def warmup(self) -> None:
        """SGLang's _execute_server_warmup: GET model info, then an 8-token /generate."""
        host = str(self.resolved.get("host") or "127.0.0.1")
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        base = f"http://{'[' + host + ']' if ':' in host else host}:{self.resolved['port']}"
        headers = {"Content-Type": "application/json"}
        if self.resolved.get("api_key"):
            headers["Authorization"] = f"Bearer {self.resolved['api_key']}"
        info = "/get_model_info" if self.old_api else "/model_info"
        body = json.dumps({"text": "The capital city of France is",
                           "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
        for path, data in ((info, None), ("/generate", body)):
            request = urllib.request.Request(base + path, data=data, headers=headers)
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
        self.up = True
        log.info("The server is fired up and ready to roll!")

    # ---------------------------------------------------------------- shutdown
    def on_sigterm(self, *_: object) -> None:
        # SGLang's loop.add_signal_handler calls sigterm_handler() without arguments.
        signum = frame = None
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
            if os.environ.get("SGL_FORCE_SHUTDOWN", "") not in ("", "0", "false"):
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

    # --------------------------------------------------------------- endpoints
    def server_info(self) -> dict:
        from sglang.srt.runtime_context import describe_kv_events_publisher

        d = dict(self.resolved)
        state = dict(d, world_size=d.get("tp_size", 1) * d.get("dp_size", 1) * d.get("pp_size", 1),
                     startup_time=self.scheduler_startup,
                     effective_max_running_requests_per_dp=d.get("max_running_requests"),
                     last_gen_throughput=0.0, lab_server=True)
        if self.spec["algo"] and self.stats["forwards"]:
            state["avg_spec_accept_length"] = self.stats["accepted"] / self.stats["forwards"]
        info = dict(d, launch_command=self.server_args.launch_command, status="ready",
                    max_total_num_tokens=self.max_total_num_tokens,
                    max_req_input_len=self.max_req_input_len,
                    hicache_object_layout={"enabled": False, "backend": None,
                                           "page_size": d.get("page_size"),
                                           "hicache_object_layout": {"pools": []},
                                           "reason": "Hierarchical cache is disabled"})
        info["kv_events"] = describe_kv_events_publisher(self.server_args)
        info.update(startup_time=self.startup_time, internal_states=[state],
                    version=self.version, frontend="python")
        if self.old_api:
            info = {(OLD_WINDOW_KEY if k == NEW_WINDOW_KEY else k): v for k, v in info.items()}
            state.pop(NEW_WINDOW_KEY, None)
            state[OLD_WINDOW_KEY] = d.get(NEW_WINDOW_KEY)
        return info

    def model_info(self) -> dict:
        d, cfg = self.resolved, self.model_cfg
        return {"model_path": d["model_path"], "served_model_name": d.get("served_model_name"),
                "tokenizer_path": d.get("tokenizer_path"), "is_generation": True,
                "preferred_sampling_params": d.get("preferred_sampling_params"),
                "weight_version": d.get("weight_version", "default"),
                "load_format": d.get("load_format"), "reasoning_parser": d.get("reasoning_parser"),
                "tool_call_parser": d.get("tool_call_parser"),
                "disaggregation_mode": d.get("disaggregation_mode"),
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": cfg.get("model_type"), "architectures": cfg.get("architectures")}

    def generate(self, prompt: str, prompt_tokens: int, max_new: int, rid: str, stream: bool):
        """Yield (text_so_far, meta_info) once per synthetic forward; last one is final."""
        spec, n = self.spec, max(0, max_new)
        forwards = max(1, math.ceil(n / spec["L"])) if n else 0
        tokens = synth_tokens(prompt, n)
        start = time.monotonic()
        with self.lock:
            self.inflight[rid] = start
        try:
            time.sleep(0.010 + 0.00001 * prompt_tokens)
            done = 0
            for k in range(1, forwards + 1):
                time.sleep(spec["step_ms"] / 1000)
                done = n if k == forwards else max(done + 1, min(n, int(k * spec["L"])))
                if stream or k == forwards:
                    yield "".join(tokens[:done]), self.meta(rid, prompt_tokens, done, k,
                                                            k == forwards, n, start)
            if not forwards:
                yield "", self.meta(rid, prompt_tokens, 0, 0, True, 0, start)
            with self.lock:
                self.stats.update(prompt=self.stats["prompt"] + prompt_tokens,
                                  generation=self.stats["generation"] + n,
                                  forwards=self.stats["forwards"] + forwards,
                                  accepted=self.stats["accepted"] + n,
                                  reqs=self.stats["reqs"] + 1)
        finally:
            with self.lock:
                self.inflight.pop(rid, None)

    def meta(self, rid, prompt_tokens, done, verify_ct, final, n, start) -> dict:
        meta = {"id": rid, "finish_reason": {"type": "length", "length": n} if final else None,
                "prompt_tokens": prompt_tokens, "weight_version": "default",
                "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": done,
                "cached_tokens": 0}
        if final:
            meta["e2e_latency"] = time.monotonic() - start
            if self.spec["algo"] and verify_ct:
                proposed = verify_ct * (self.spec["D"] - 1)
                meta.update(spec_accept_rate=(done - verify_ct) / proposed if proposed else 0.0,
                            spec_accept_length=done / verify_ct,
                            spec_num_correct_drafts=done - verify_ct,
                            spec_num_proposed_drafts=proposed, spec_verify_ct=verify_ct)
        meta["lab_server"] = True
        return meta

    def metrics(self) -> str:
        name = self.resolved.get("served_model_name")
        tok = f'model_name="{name}",engine_type="unified"'
        sched = tok + ',tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        lines = ["# sglang-lab-server: synthetic metrics"]
        for metric, kind, labels, value in (
                ("sglang:prompt_tokens_total", "counter", tok + ',is_streaming="false"',
                 self.stats["prompt"]),
                ("sglang:generation_tokens_total", "counter", tok + ',is_streaming="false"',
                 self.stats["generation"]),
                ("sglang:num_running_reqs", "gauge", sched, len(self.inflight)),
                ("sglang:spec_accept_length", "gauge", sched,
                 self.stats["accepted"] / self.stats["forwards"] if self.stats["forwards"] else 0)):
            base = metric[:-6] if kind == "counter" else metric
            lines += [f"# HELP {metric} lab server synthetic value", f"# TYPE {base} {kind}",
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

    def deprecated(old: str, new: str, fn):
        def wrapper(handler):
            if not lab.old_api:
                log.warning(f"Endpoint '{old}' is deprecated and will be removed in a future "
                            f"version. Please use '{new}' instead.")
            return fn(handler)
        return wrapper

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "sglang-lab-server"
        sys_version = ""

        def log_message(self, fmt, *args):  # replaced by the uvicorn access line
            pass

        def access(self, status: int) -> None:
            phrase = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                      405: "Method Not Allowed", 503: "Service Unavailable"}.get(status, "")
            emit_uvicorn("INFO", f'{self.client_address[0]}:{self.client_address[1]} - '
                         f'"{self.command} {self.path} HTTP/1.1" {status} {phrase}'.rstrip())

        def send(self, status: int, body=b"", ctype="application/json") -> None:
            if not isinstance(body, bytes):
                body = json.dumps(body, default=str, allow_nan=False).encode()
            self.send_response(status)
            if body or ctype != "application/json":
                self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.access(status)

        def body(self) -> dict:
            length = int(self.headers.get("content-length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):  # noqa: N802 - http.server naming
            self.dispatch()

        do_POST = do_PUT = do_GET  # noqa: N815

        def dispatch(self) -> None:
            path = self.path.split("?", 1)[0]
            level = AuthLevel.ADMIN_OPTIONAL if path == "/flush_cache" else AuthLevel.NORMAL
            decision = decide_request_auth(
                method=self.command, path=path,
                authorization_header=self.headers.get("Authorization"),
                api_key=lab.resolved.get("api_key"),
                admin_api_key=lab.resolved.get("admin_api_key"), auth_level=level)
            if not decision.allowed:
                self.send(decision.error_status_code, {
                    "error": "Unauthorized" if decision.error_status_code == 401 else "Forbidden"})
                return
            route = routes.get(path)
            if route is None and path.startswith("/v1/models/"):
                route = (("GET",), Handler.one_model)
            if route is None:
                self.send(404, {"detail": "Not Found"})
            elif self.command not in route[0]:
                self.send(405, {"detail": "Method Not Allowed"})
            else:
                try:
                    route[1](self)
                except (ValueError, TypeError, KeyError) as exc:
                    self.send(400, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

        def health(self):
            if lab.gracefully_exit:
                log.info("Health check request received during shutdown. Returning 503.")
            self.send(200 if lab.up and not lab.gracefully_exit else 503)

        def ready(self):
            self.send(200 if lab.up and not lab.gracefully_exit else 503)

        def server_info(self):
            self.send(200, lab.server_info())

        def model_info(self):
            self.send(200, lab.model_info())

        def models(self):
            name = lab.resolved.get("served_model_name")
            card = ModelCard(id=name, root=name, max_model_len=lab.context_len)
            self.send(200, ModelList(data=[card]).model_dump())

        def one_model(self):
            name, wanted = lab.resolved.get("served_model_name"), self.path[len("/v1/models/"):]
            if wanted != name:
                self.send(404, {"error": {"message": f"The model '{wanted}' does not exist",
                                          "type": "invalid_request_error", "param": "model",
                                          "code": "model_not_found"}})
                return
            self.send(200, ModelCard(id=name, root=name, max_model_len=lab.context_len).model_dump())

        def flush_cache(self):
            self.send(200, b"Cache flushed.\nPlease check backend logs for more details. (When "
                      b"there are running or waiting requests, the operation will not be "
                      b"performed.)\n", "text/plain; charset=utf-8")

        def metrics(self):
            self.send(200, lab.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")

        def stream_start(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()

        def chunk(self, data: str) -> None:
            raw = data.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

        def stream_end(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.access(200)

        def generate(self):
            req = self.body()
            params = req.get("sampling_params") or {}
            max_new = int(params.get("max_new_tokens", 128))
            text, ids = req.get("text"), req.get("input_ids")
            if text is None and ids is None:
                raise ValueError("Either text, input_ids or input_embeds should be provided.")
            prompts = text if isinstance(text, list) else [text] if text is not None else \
                (ids if ids and isinstance(ids[0], list) else [ids])
            if req.get("stream") and len(prompts) == 1:
                self.stream_start()
                rid = req.get("rid") or uuid.uuid4().hex
                for out, meta in lab.generate(str(prompts[0]), self.ntok(prompts[0]), max_new,
                                              rid, True):
                    self.chunk("data: " + json.dumps({"text": out, "output_ids": [],
                                                      "meta_info": meta}) + "\n\n")
                self.chunk("data: [DONE]\n\n")
                self.stream_end()
                return
            outs = []
            for prompt in prompts:
                for out, meta in lab.generate(str(prompt), self.ntok(prompt), max_new,
                                              uuid.uuid4().hex, False):
                    outs.append({"text": out, "output_ids": [], "meta_info": meta})
            self.send(200, outs if len(prompts) > 1 else outs[0])

        @staticmethod
        def ntok(prompt) -> int:
            return len(prompt) if isinstance(prompt, list) else count_tokens(str(prompt))

        def chat(self):
            if (self.headers.get("content-type") or "").split(";")[0].lower() != "application/json":
                self.send(400, {"object": "error", "message": "Unsupported Media Type: Only "
                                "'application/json' is allowed", "type": "Bad Request",
                                "param": None, "code": 400})
                return
            req = self.body()
            model = req.get("model") or "default"
            prompt = " ".join(str(m.get("content")) for m in req.get("messages") or [])
            max_new = int(req.get("max_completion_tokens") or req.get("max_tokens") or 128)
            rid, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())
            ptok = count_tokens(prompt)
            if not req.get("stream"):
                out, meta = list(lab.generate(prompt, ptok, max_new, rid, False))[-1]
                usage = UsageInfo(prompt_tokens=ptok, completion_tokens=meta["completion_tokens"],
                                  total_tokens=ptok + meta["completion_tokens"])
                choice = ChatCompletionResponseChoice(
                    index=0, message=ChatMessage(role="assistant", content=out),
                    finish_reason="length")
                self.send(200, ChatCompletionResponse(
                    id=rid, created=created, model=model, choices=[choice], usage=usage,
                    metadata={"weight_version": "default", "lab_server": True}).model_dump())
                return
            self.stream_start()
            self.chunk(build_sse_content(chunk_id=rid, created=created, model=model, index=0,
                                         role="assistant", content=""))
            sent, done = 0, 0
            for out, meta in lab.generate(prompt, ptok, max_new, rid, True):
                self.chunk(build_sse_content(chunk_id=rid, created=created, model=model,
                                             index=0, content=out[sent:]))
                sent, done = len(out), meta["completion_tokens"]
            self.chunk(build_sse_content(chunk_id=rid, created=created, model=model, index=0,
                                         finish_reason="length"))
            if (req.get("stream_options") or {}).get("include_usage"):
                usage = UsageInfo(prompt_tokens=ptok, completion_tokens=done,
                                  total_tokens=ptok + done)
                self.chunk("data: " + ChatCompletionStreamResponse(
                    id=rid, created=created, model=model, choices=[],
                    usage=usage).model_dump_json() + "\n\n")
            self.chunk("data: [DONE]\n\n")
            self.stream_end()

    get, post = ("GET",), ("POST", "PUT")
    routes = {
        "/health": (get, Handler.health), "/health_generate": (get, Handler.health),
        "/ready": (get, Handler.ready),
        "/get_server_info": (get, deprecated("/get_server_info", "/server_info",
                                             Handler.server_info)),
        "/get_model_info": (get, deprecated("/get_model_info", "/model_info",
                                            Handler.model_info)),
        "/v1/models": (get, Handler.models), "/generate": (post, Handler.generate),
        "/v1/chat/completions": (("POST",), Handler.chat),
        "/flush_cache": (("GET", "POST"), Handler.flush_cache),
    }
    if not lab.old_api:
        routes.update({"/server_info": (get, Handler.server_info),
                       "/model_info": (get, Handler.model_info)})
    if lab.resolved.get("enable_metrics"):
        routes["/metrics"] = (get, Handler.metrics)
    return Handler


def spawn_scheduler_child() -> None:
    """SGLANG_LAB_SPAWN_CHILD: a "scheduler" that outlives its parent (KillMode=process)."""
    pid = os.fork()
    if pid:
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.stderr.write(f"[{time.strftime(DATE_FORMAT)}] Scheduler process started "
                         f"(lab server child pid={os.getpid()}, parent={os.getppid()}, "
                         f"SGLANG_LAB_SPAWN_CHILD=1)\n")
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    finally:
        os._exit(0)


def crash_later(lab: Lab) -> None:
    """SGLANG_LAB_CRASH_AFTER: a scheduler exception, then the parent gives up (exit 1)."""
    time.sleep(max(0.0, lab.crash_after - (time.monotonic() - lab.t0)))
    try:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected by "
                           f"the lab server: SGLANG_LAB_CRASH_AFTER={lab.crash_after:g})")
    except RuntimeError:
        lab.sched.error(f"Scheduler hit an exception: {traceback.format_exc()}")
    logging.getLogger("sglang.srt.entrypoints.engine").error(
        "Received sigquit from a child process. It usually means the child failed.")
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
    from sglang.version import __version__

    lab.version = __version__
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
