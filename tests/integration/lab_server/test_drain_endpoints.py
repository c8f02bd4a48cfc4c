"""The lab server's drain endpoints against SGLang 0.5.23's shapes (tests/fixtures/sglang_drain/).

`GET /v1/loads` counts the server's in-flight requests per DP rank with SGLang's own LoadSnapshot;
`POST /flush_cache?timeout=T` answers 200 only once idle, 400 `Timed out waiting for idle state.` after T.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import test_lab_server
from test_lab_server import SECRET, Server, dflash_argv

pytestmark = pytest.mark.slow
SHAPE = json.loads(
    (Path(__file__).resolve().parents[2] / "fixtures" / "sglang_drain" / "v1_loads_shape.json").read_text()
)
FLUSH = SHAPE["flush_cache"]


models = test_lab_server.models  # the same lab checkpoints (a session fixture)
sglang_interpreter = test_lab_server.sglang_interpreter  # fails every test when SGLang's python is missing


@pytest.fixture(scope="module")
def server(tmp_path_factory, models):
    srv = Server(tmp_path_factory.mktemp("drain"), [*dflash_argv(models), "--api-key", SECRET])
    srv.wait_log(r"The server is fired up and ready to roll!")
    yield srv
    srv.stop()


class Generations:
    """`count` long /generate requests in flight, each in its own thread, until they finish."""

    def __init__(self, server: Server, count: int, tokens: int = 1500) -> None:
        self.results: list[int] = []
        body = {"text": "drain me", "sampling_params": {"max_new_tokens": tokens}}
        self.threads = [
            threading.Thread(
                target=lambda: self.results.append(server.request("/generate", key=SECRET, body=body)[0])
            )
            for _ in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def join(self) -> list[int]:
        for thread in self.threads:
            thread.join(60)
        return self.results


def running(server: Server) -> int:
    return sum(
        load["num_running_reqs"] + load["num_waiting_reqs"]
        for load in server.json("/v1/loads?include=core", key=SECRET)["loads"]
    )


def wait_running(server: Server, want: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (seen := running(server)) != want:
        assert time.monotonic() < deadline, f"/v1/loads reports {seen} requests, expected {want}"
        time.sleep(0.05)


def test_loads_response_is_sglangs_shape(server):
    body = server.json("/v1/loads", key=SECRET)
    assert list(body) == SHAPE["response_keys"]
    assert body["version"] == SHAPE["sglang_version"] and body["num_accelerators"] == 1
    assert body["timestamp"].endswith("+00:00")  # datetime.now(timezone.utc).isoformat()
    (load,) = body["loads"]
    # no --enable-lora: SGLang leaves the lora section out; all others are set by its scheduler
    assert list(load) == [k for k in SHAPE["include_all_keys"] if k != "lora"]
    assert load["dp_rank"] == 0 and load["max_running_requests"] == 48
    assert list(load["speculative"]) == SHAPE["sections"]["spec"]["speculative"]
    assert load["speculative"]["accept_length"] > 1  # the warm-up ran speculative forwards
    core = server.json("/v1/loads?include=core", key=SECRET)["loads"][0]
    assert list(core) == SHAPE["include_core_keys"]
    for include, section in SHAPE["sections"].items():
        got = server.json(f"/v1/loads?include=core,{include}", key=SECRET)["loads"][0]
        expected = {} if include == "lora" else section
        assert {k: list(v) for k, v in got.items() if isinstance(v, dict)} == expected, include
    assert server.json("/v1/loads?dp_rank=1", key=SECRET)["loads"] == []
    assert server.json("/v1/loads?dp_rank=0&include=core", key=SECRET)["loads"][0]["dp_rank"] == 0


def test_loads_errors_and_prometheus_as_sglang(server):
    status, raw = server.request("/v1/loads?include=core,bogus", key=SECRET)
    assert (status, raw) == (500, b"Internal Server Error")  # to_dict's ValueError escapes get_loads' try
    assert SHAPE["invalid_include_error"].split(":")[0] in server.log
    status, raw = server.request("/v1/loads?dp_rank=x", key=SECRET)
    assert status == 400 and json.loads(raw)["type"] == "Bad Request"
    assert server.request("/v1/loads")[0] == 401  # behind the API key like every normal endpoint
    status, raw = server.request("/v1/loads?include=core&format=prometheus", key=SECRET)
    assert status == 200
    assert '# TYPE sglang_num_running_reqs gauge\nsglang_num_running_reqs{dp_rank="0"} 0' in raw.decode()


def test_loads_count_in_flight_requests(server):
    wait_running(server, 0)
    gens = Generations(server, 3)
    wait_running(server, 3)
    assert gens.join() == [200, 200, 200]
    wait_running(server, 0, timeout=1)


def test_flush_cache_succeeds_only_when_idle(server):
    wait_running(server, 0)
    idle = server.request("/flush_cache?timeout=1", key=SECRET)
    assert idle == (FLUSH["ok_status"], FLUSH["ok_body"].encode())
    gens = Generations(server, 1, tokens=1500)
    wait_running(server, 1)
    status, raw = server.request("/flush_cache", key=SECRET)  # timeout 0: at once
    assert (status, raw.decode()) == (FLUSH["fail_status"], FLUSH["busy_immediate_body"])
    start = time.monotonic()
    status, raw = server.request("/flush_cache?timeout=0.3", key=SECRET)
    assert (status, raw.decode()) == (FLUSH["fail_status"], FLUSH["timeout_body"])
    assert time.monotonic() - start >= 0.3
    assert running(server) == 1, "the request must still be in flight when the flush timed out"
    status, raw = server.request("/flush_cache?timeout=30", key=SECRET)  # waits for the request to end
    assert status == FLUSH["ok_status"] and running(server) == 0
    assert gens.join() == [200]
    assert server.request("/flush_cache?timeout=-1", key=SECRET)[0] == 400  # Query(ge=0.0)
    assert "Deferred flush_cache timed out while waiting for idle state." in server.log
