"""lab/sglang_lab_server.py driven as a process, with the installed SGLang as its parser.

The server interpreter is `SGLANG_LAB_PYTHON` (default /opt/sglang/venv/bin/python); it must
import SGLang 0.5.23 (on the controller: SGLANG_LAB_PYTHON=/tmp/w/venv/bin/python). Model
directories are written by lab/make_checkpoint.py, the same checkpoints lab hosts get.
Every server listens on a free loopback port; every process started here is stopped by PID.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVER = REPO / "lab" / "sglang_lab_server.py"
PYTHON = os.environ.get("SGLANG_LAB_PYTHON", "/opt/sglang/venv/bin/python")
SECRET = "SENTINEL-SECRET-9f3c"
START_TIMEOUT = 120  # importing torch + resolving takes ~12 s on a 2-core VM

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def sglang_interpreter() -> None:
    """Every lab server of this directory runs with SGLang's interpreter (its other files take this too)."""
    if not os.access(PYTHON, os.X_OK):
        pytest.fail(
            f"no SGLang interpreter at {PYTHON}: make sglang-venv, then set SGLANG_LAB_PYTHON to "
            ".lab/sglang-venv/bin/python of the repository (make lab-server and make lab-tests set it)"
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    out = {}
    for kind in ("target", "draft"):
        subprocess.run(
            [sys.executable, str(REPO / "lab" / "make_checkpoint.py"), kind, str(root / kind)],
            check=True,
            capture_output=True,
        )
        out[kind] = str(root / kind)
    return out


class Server:
    """One lab server process; output goes to a file (a surviving child keeps pipes open).
    Its parse cache is `<tmp>/parse-cache` unless env names another SGLANG_LAB_PARSE_CACHE_DIR."""

    def __init__(
        self,
        tmp: Path,
        argv: list[str],
        env: dict[str, str] | None = None,
        python_args: tuple[str, ...] = (),
        python: str = PYTHON,
    ) -> None:
        self.argv, self.log_path = argv, tmp / f"server-{time.monotonic_ns()}.log"
        self.port = int(argv[argv.index("--port") + 1]) if "--port" in argv else None
        full_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("SGLANG_LAB_") and k != "PYTEST_CURRENT_TEST"
        }
        full_env.update(
            {
                "SGLANG_LAB_LOAD_SECONDS": "0.5",
                "SGLANG_LAB_PARSE_CACHE_DIR": str(tmp / "parse-cache"),
                **(env or {}),
            }
        )
        with open(self.log_path, "wb") as log:
            self.started = time.monotonic()
            self.proc = subprocess.Popen(
                [python, *python_args, str(SERVER), *argv],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=full_env,
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_log(self, pattern: str, timeout: float = START_TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log)
            if match:
                return match
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{pattern!r} not logged (rc={self.proc.poll()}); log:\n{self.log[-3000:]}")

    def wait_exit(self, timeout: float = START_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            msg = f"server still running after {timeout} s; log:\n{self.log[-3000:]}"
            raise AssertionError(msg) from None

    def request(
        self, path: str, *, key: str | None = None, body: dict | None = None, headers: dict | None = None
    ) -> tuple[int, bytes]:
        hdrs = dict(headers or {})
        if key:
            hdrs["Authorization"] = f"Bearer {key}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def json(self, path: str, **kwargs) -> dict:
        status, raw = self.request(path, **kwargs)
        assert status == 200, (path, status, raw[:300])
        return json.loads(raw)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def dflash_argv(models: dict[str, str], window: str = "2048", port: int | None = None) -> list[str]:
    return [
        "--model-path",
        models["target"],
        "--speculative-algorithm",
        "DFLASH",
        "--speculative-draft-model-path",
        models["draft"],
        "--speculative-draft-window-size",
        window,
        "--host",
        "127.0.0.1",
        "--port",
        str(port or free_port()),
    ]


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def assert_nothing_cached(tmp: Path) -> None:
    """A failing parse is never stored: the cache directory was in use (created 0700) and holds nothing."""
    cache = tmp / "parse-cache"
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700
    assert not list(cache.iterdir())


# ------------------------------------------------------------------ parse / resolve errors
def test_old_window_flag_is_an_argparse_error(tmp_path, models):
    argv = dflash_argv(models)
    argv[argv.index("--speculative-draft-window-size")] = "--speculative-dflash-draft-window-size"
    server = Server(tmp_path, argv)
    assert server.wait_exit() == 2
    assert (
        "sglang serve: error: unrecognized arguments: --speculative-dflash-draft-window-size 2048"
        in server.log
    )
    assert "usage: sglang serve" in server.log
    assert not port_open(server.port)
    assert_nothing_cached(tmp_path)


def test_window_below_block_size_is_sglangs_value_error(tmp_path, models):
    server = Server(tmp_path, dflash_argv(models, window="8"))
    assert server.wait_exit() == 1
    assert "Traceback (most recent call last):" in server.log
    assert (
        "ValueError: --speculative-draft-window-size must be >= --speculative-num-draft-tokens "
        "(block_size). window_size=8, block_size=16."
    ) in server.log
    assert "server_args=" not in server.log
    assert_nothing_cached(tmp_path)


def test_dflash_without_draft_path_fails_resolution(tmp_path, models):
    server = Server(
        tmp_path,
        ["--model-path", models["target"], "--speculative-algorithm", "DFLASH", "--port", str(free_port())],
    )
    assert server.wait_exit() == 1
    assert "DFLASH speculative decoding requires setting --speculative-draft-model-path." in server.log
    assert_nothing_cached(tmp_path)


# ------------------------------------------------------------------ a DFLASH server with an API key
# --extra-metric-labels as the role passes it (the configuration's hash), and a value that needs escaping.
LABELS = json.dumps({"config_hash": "3f2a9c0d41be", "team": 'in"fer\\ence'})


@pytest.fixture(scope="module")
def dflash(tmp_path_factory, models):
    argv = [*dflash_argv(models), "--api-key", SECRET, "--enable-metrics", "--extra-metric-labels", LABELS]
    server = Server(tmp_path_factory.mktemp("dflash"), argv)
    server.wait_log(r"The server is fired up and ready to roll!")
    server.ready_after = time.monotonic() - server.started
    yield server
    server.stop()


def test_startup_log_is_sglangs(dflash):
    log = dflash.log
    line = re.search(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] server_args=\{.*\}$", log, re.M)
    assert line, "no dict-form server_args line"
    assert "'speculative_draft_window_size': 2048" in line.group(0)
    assert "'device': 'cuda'" in line.group(0)
    assert f"'api_key': '{SECRET}'" in line.group(0), "SGLang does not redact; the lab server must not either"
    assert "Max running requests is reset to 48 for speculative decoding." in log  # SGLang's own warning
    runner = re.search(
        r"Initialized DFLASH draft runner\. attention_backend=(\w+), model=DFlashDraftModel, "
        r"block_size=16, draft_window_size=2048, compact_cache=True$",
        log,
        re.M,
    )
    assert runner, "no DFLASH runner line with the resolved values"
    order = [
        log.index(s)
        for s in (
            "server_args={",
            "Load weight begin.",
            "Initialized DFLASH draft runner",
            "Uvicorn running on http://127.0.0.1:",
            "fired up and ready to roll",
        )
    ]
    assert order == sorted(order), order


def test_server_info_reports_resolved_args(dflash):
    info = dflash.json("/server_info", key=SECRET)
    assert info["speculative_draft_window_size"] == 2048
    assert info["speculative_num_draft_tokens"] == 16
    assert info["speculative_algorithm"] == "DFLASH"
    assert info["max_running_requests"] == 48
    assert info["launch_command"] == " ".join(dflash.argv)
    assert info["version"] == "0.5.23"
    assert set(info["startup_time"]) >= {"load_weight", "kv_cache_allocation", "cuda_graph", "tokenizer_e2e"}
    state = info["internal_states"][0]
    assert state["lab_server"] is True
    assert state["avg_spec_accept_length"] > 1.0  # the warm-up generation ran speculative forwards
    assert "lab_server" not in info


def test_api_key_is_required_where_sglang_requires_it(dflash):
    for path in ("/server_info", "/get_server_info", "/model_info", "/v1/models", "/no_such_endpoint"):
        status, raw = dflash.request(path)
        assert (status, json.loads(raw)) == (401, {"error": "Unauthorized"}), path
        assert dflash.request(path, key="wrong-key")[0] == 401, path
    assert dflash.request("/generate", body={"text": "hi"})[0] == 401
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert dflash.request(path)[0] == 200, path
    assert dflash.request("/no_such_endpoint", key=SECRET)[0] == 404


def test_deprecated_alias_logs_sglangs_warning(dflash):
    assert dflash.json("/get_server_info", key=SECRET)["speculative_draft_window_size"] == 2048
    assert dflash.json("/get_model_info", key=SECRET)["architectures"] == ["LlamaForCausalLM"]
    dflash.wait_log(
        r"Endpoint '/get_server_info' is deprecated and will be removed in a future version\. "
        r"Please use '/server_info' instead\.",
        timeout=5,
    )


def test_generate_streams_sse_like_sglang(dflash):
    status, raw = dflash.request(
        "/generate",
        key=SECRET,
        body={"text": "Hello there", "sampling_params": {"max_new_tokens": 40}, "stream": True},
    )
    assert status == 200
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) > 1
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 40
    final = chunks[-1]["meta_info"]
    assert final["finish_reason"] == {"type": "length", "length": 40}
    assert final["spec_verify_ct"] == len(chunks)
    assert final["spec_accept_length"] == pytest.approx(40 / len(chunks))
    assert chunks[-1]["text"].startswith(chunks[0]["text"])


def test_chat_completion_shape(dflash):
    body = dflash.json(
        "/v1/chat/completions",
        key=SECRET,
        body={"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6},
    )
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 6
    models = dflash.json("/v1/models", key=SECRET)
    assert models["data"][0]["id"] == dflash.argv[dflash.argv.index("--model-path") + 1]


def test_metrics_are_prometheus_text(dflash):
    status, raw = dflash.request("/metrics")
    assert status == 200
    assert re.search(r'^sglang:generation_tokens_total\{model_name=".*"\} \d+\.\d+$', raw.decode(), re.M)


def test_every_metric_carries_the_extra_labels_as_sglang_puts_them(dflash):
    """SGLang's collectors add --extra-metric-labels after their own labels and before a metric's own
    (is_streaming), escaped as prometheus_client writes label values."""
    lines = dflash.request("/metrics")[1].decode().splitlines()
    # http_responses_total is the HTTP middleware's (endpoint, method, status_code only), as in SGLang
    samples = [line for line in lines if line.startswith("sglang:") and not line.startswith("sglang:http_")]
    names = {line.split("{", 1)[0] for line in samples}
    for name in (
        "sglang:prompt_tokens_total",
        "sglang:num_running_reqs",
        "sglang:spec_accept_length",
        "sglang:num_aborted_requests_total",
        "sglang:spec_verify_calls_total",
        "sglang:inter_token_latency_seconds_count",
    ):
        assert name in names, names
    extra = 'config_hash="3f2a9c0d41be",team="in\\"fer\\\\ence"'
    for line in samples:
        assert extra in line, line
    order = re.escape(f'engine_type="unified",{extra},is_streaming="false"}}')
    assert any(
        re.match(rf'sglang:prompt_tokens_total\{{model_name="[^"]+",{order} ', line) for line in samples
    )


def test_fault_switches_make_it_slower_and_erroring_in_sglangs_metrics(tmp_path, models):
    """SGLANG_LAB_SLOW and SGLANG_LAB_ERROR_RATE (the canary's lab faults): every second generation request
    answered 500 and counted per status in http_responses_total, the forwards 4x as long in the
    time-to-first-token and inter-token histograms; a counter's TYPE names its _total family (smg refuses
    the metrics of a worker whose family names differ)."""
    argv = [*dflash_argv(models), "--enable-metrics"]
    figures = {}
    for slow, rate in (("1", "0"), ("4", "0.5")):
        server = Server(tmp_path, argv, env={"SGLANG_LAB_SLOW": slow, "SGLANG_LAB_ERROR_RATE": rate})
        try:
            server.wait_log(r"The server is fired up and ready to roll!")
            body = {"text": "a prompt", "sampling_params": {"max_new_tokens": 32}}
            statuses = [server.request("/generate", body=body)[0] for _ in range(4)]
            text = server.request("/metrics")[1].decode()
        finally:
            server.stop()
        assert "# TYPE sglang:http_responses_total counter" in text
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("sglang:"))
        errors = sum(float(v) for k, v in values.items() if 'endpoint="/generate"' in k and "500" in k)
        itl = [float(v) for k, v in values.items() if k.startswith("sglang:inter_token_latency_seconds_")]
        figures[slow] = {"statuses": statuses, "errors": errors, "itl_mean": itl[-1] / itl[-2]}
    assert figures["1"]["statuses"] == [200] * 4 and figures["1"]["errors"] == 0
    assert figures["4"]["statuses"].count(500) == 2 and figures["4"]["errors"] == 2
    assert figures["4"]["itl_mean"] > 3 * figures["1"]["itl_mean"]


# ------------------------------------------------------------------ older server: old API + dataclass log
def test_old_api_and_dataclass_log(tmp_path, models):
    server = Server(
        tmp_path, dflash_argv(models), env={"SGLANG_LAB_OLD_API": "1", "SGLANG_LAB_LOG_FORMAT": "dataclass"}
    )
    try:
        server.wait_log(r"The server is fired up and ready to roll!")
        line = re.search(r"^\[[^]]+\] server_args=ServerArgs\(model_path='[^']+', .*\)$", server.log, re.M)
        assert line and "speculative_dflash_draft_window_size=2048" in line.group(0)
        assert "server_args={" not in server.log
        assert server.request("/server_info")[0] == 404
        assert server.request("/model_info")[0] == 404
        info = server.json("/get_server_info")
        assert info["speculative_dflash_draft_window_size"] == 2048
        assert "speculative_draft_window_size" not in info
        assert server.json("/get_model_info")["model_type"] == "llama"
        assert '"GET /get_model_info HTTP/1.1" 200' in server.log  # the warm-up used the old name
        assert "is deprecated" not in server.log
    finally:
        server.stop()


# ------------------------------------------------------------------ plain server, forked scheduler, SIGTERM
def test_warmup_drain_sigterm_and_surviving_child(tmp_path, models):
    server = Server(
        tmp_path,
        ["--model-path", models["target"], "--port", str(free_port())],
        env={"SGLANG_LAB_SPAWN_CHILD": "1"},
    )
    child = None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not port_open(server.port):  # the first answers come during warm-up, before ready
            assert time.monotonic() < deadline and server.proc.poll() is None, server.log[-3000:]
            time.sleep(0.05)
        assert server.request("/health")[0] == 503
        assert server.request("/health_generate")[0] == 503
        assert server.request("/ready")[0] == 503
        assert server.request("/v1/models")[0] == 200  # answers before warm-up is done
        server.wait_log(r"The server is fired up and ready to roll!")
        assert server.request("/health_generate")[0] == 200
        child = int(server.wait_log(r"Scheduler process started \(lab server child pid=(\d+)").group(1))
        assert "Initialized DFLASH draft runner" not in server.log
        assert "avg_spec_accept_length" not in server.json("/server_info")["internal_states"][0]
        assert server.request("/metrics")[0] == 404  # no --enable-metrics

        # SIGTERM while a ~4 s stream runs: health turns 503, the stream completes, then exit 0.
        result = {}
        worker = threading.Thread(
            target=lambda: result.update(
                zip(
                    ("status", "raw"),
                    server.request(
                        "/generate",
                        body={"text": "x", "sampling_params": {"max_new_tokens": 1000}, "stream": True},
                    ),
                )
            )
        )
        worker.start()
        time.sleep(0.5)
        server.proc.send_signal(signal.SIGTERM)
        server.wait_log(r"Gracefully exiting\.\.\. Remaining number of requests 1\.", timeout=5)
        assert server.request("/health")[0] == 503
        # As SGLang 0.5.23: a NEW generation request during the drain is still accepted and answered.
        late = server.request("/generate", body={"text": "y", "sampling_params": {"max_new_tokens": 4}})
        assert late[0] == 200 and json.loads(late[1])["meta_info"]["completion_tokens"] == 4, late
        worker.join(30)
        assert result["status"] == 200 and result["raw"].endswith(b"data: [DONE]\n\n")
        assert server.wait_exit(timeout=10) == 0
        assert (
            "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in server.log
        )
        assert "Gracefully exiting... Remaining number of requests 0." in server.log
        assert not port_open(server.port)
        os.kill(child, 0)  # still alive: it would survive its parent under KillMode=process
    finally:
        server.stop()
        if child:
            os.kill(child, signal.SIGKILL)


# ------------------------------------------------------------------ fault injection
def test_crash_before_port_opens(tmp_path, models):
    server = Server(
        tmp_path, dflash_argv(models), env={"SGLANG_LAB_CRASH_AFTER": "3", "SGLANG_LAB_HANG": "1"}
    )
    try:
        assert server.wait_exit(timeout=15) == 1
        elapsed = time.monotonic() - server.started
        assert 3 <= elapsed < 8, elapsed
        assert "Scheduler hit an exception: Traceback (most recent call last):" in server.log
        assert "SGLANG_LAB_CRASH_AFTER=3" in server.log
        assert "Received sigquit from a child process. It usually means the child failed." in server.log
    finally:
        server.stop()


def test_crash_after_port_opened(tmp_path, models, dflash):
    crash_at = round(dflash.ready_after * 1.5 + 8)  # well after this machine's start-up time
    server = Server(tmp_path, dflash_argv(models), env={"SGLANG_LAB_CRASH_AFTER": str(crash_at)})
    try:
        server.wait_log(r"The server is fired up and ready to roll!", timeout=crash_at)
        assert server.request("/health")[0] == 200
        assert server.wait_exit(timeout=crash_at + 10) == 1
        assert crash_at <= time.monotonic() - server.started < crash_at + 5
        assert server.log.index("fired up") < server.log.index("Scheduler hit an exception")
        assert not port_open(server.port)
    finally:
        server.stop()


def test_hang_never_opens_the_port(tmp_path, models):
    server = Server(tmp_path, dflash_argv(models), env={"SGLANG_LAB_HANG": "1"})
    try:
        server.wait_log(r"Load weight begin\.")
        time.sleep(7)
        assert server.proc.poll() is None
        assert not port_open(server.port)
        assert len(re.findall(r"Loading safetensors checkpoint shards:", server.log)) >= 2
        assert "Uvicorn running" not in server.log
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait_exit(timeout=10) == 0
    finally:
        server.stop()


def test_load_gate_ends_the_weight_load_when_its_path_appears(tmp_path):
    """SGLANG_LAB_LOAD_UNTIL (Lab.load_weights, in this interpreter: the server imports only the standard
    library at the top): the load ends once the path exists, at the latest after SGLANG_LAB_LOAD_SECONDS;
    without it the phase takes its share of the load time."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("sglang_lab_server_gate", SERVER)
    lab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lab)
    gate = tmp_path / "gate"
    opened = threading.Timer(0.6, gate.touch)
    opened.start()
    try:
        took = lab.Lab.load_weights(types.SimpleNamespace(load_until=str(gate), load_seconds=30.0), 15.0)
    finally:
        opened.cancel()
    assert 0.5 <= took < 5, took  # the gate, not the 15 s share nor the 30 s bound
    started = time.monotonic()
    took = lab.Lab.load_weights(
        types.SimpleNamespace(load_until=str(tmp_path / "never"), load_seconds=1.0), 15.0
    )
    assert 1.0 <= took < 5 and time.monotonic() - started < 5, took  # at most SGLANG_LAB_LOAD_SECONDS
    assert lab.Lab.load_weights(types.SimpleNamespace(load_until=None, load_seconds=2.0), 0.3) == 0.3


def test_port_in_use_fails_after_load_like_uvicorn(tmp_path, models):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        server = Server(tmp_path, ["--model-path", models["target"], "--port", str(port)])
        try:
            assert server.wait_exit() == 1
        finally:
            server.stop()
    log = server.log
    assert (
        f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
        "address already in use" in log
    )
    assert log.index("Load weight end.") < log.index("[Errno 98]")


# ------------------------------------------------------------------ the lab DDTree build (lab/replay/)
@pytest.fixture(scope="module")
def replay_site(tmp_path_factory) -> str:
    """The LAB REPLAY wheel of PR #29907 unpacked as it is installed: a python with only it (no torch)."""
    out = tmp_path_factory.mktemp("replay")
    build = [sys.executable, str(SERVER.parent / "replay" / "build-wheel"), "ddtree-pr29907", str(out)]
    wheel = subprocess.run(build, check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(out / "site")
    return str(out / "site")


def test_ddtree_replay_build_logs_and_serves_as_the_recorded_build(tmp_path, models, replay_site):
    port = free_port()
    argv = [
        "--model-path",
        models["target"],
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        models["draft"],
        "--speculative-ddtree-budget",
        "32",
        "--speculative-draft-window-size",
        "2048",
        "--page-size",
        "1",
        "--port",
        str(port),
    ]
    server = Server(
        tmp_path, argv, env={"PYTHONPATH": replay_site, "SGLANG_DDTREE_MAX_TOPK": "4"}, python=sys.executable
    )
    try:
        server.wait_log(r"The server is fired up and ready to roll!")
        log = server.log
        # the build's dataclass startup line with ITS window field, and both of its worker lines
        assert re.search(r"server_args=ServerArgs\(.*speculative_draft_window_size=2048, ", log)
        assert (
            "Initialized DFLASH draft runner. attention_backend=triton, model=DFlashDraftModel, "
            "block_size=16, draft_window_size=2048, compact_cache=True"
        ) in log
        assert "Initialized DDTree worker. block_size=16, tree_budget=32, max_tree_nodes=33" in log
        # the build's own warnings, as its resolution logs them
        assert "--speculative-draft-window-size has no effect with speculative_algorithm=DDTREE" in log
        assert "Piecewise CUDA graph is disabled for DDTREE full-tree mode (budget=32 > block_size-1=15)" in (
            log
        )
        status, body = server.request("/server_info")
        info = json.loads(body)
        assert status == 200 and info["version"] == "0.0.0.dev0+labreplay.ddtree.pr29907"
        assert info["speculative_ddtree_budget"] == 32 and info["page_size"] == 1
        status, body = server.request("/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["object"] == "model"
    finally:
        server.stop()


def test_ddtree_replay_refuses_as_the_recorded_build(tmp_path, models, replay_site):
    argv = [
        "--model-path",
        models["target"],
        "--speculative-algorithm",
        "DDTREE",
        "--speculative-draft-model-path",
        models["draft"],
        "--port",
        str(free_port()),
    ]
    server = Server(tmp_path, argv, env={"PYTHONPATH": replay_site}, python=sys.executable)
    assert server.wait_exit() == 1
    assert "ValueError: DDTREE currently supports only page_size == 1. Got page_size=None." in server.log
