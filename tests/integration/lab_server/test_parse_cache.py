"""The lab server's parse cache (lab/sglang_lab_server.py, ParseCache), the server started with SGLang 0.5.23.

A restart with the same argv replays SGLang's parse + resolution without importing torch, and looks
exactly like the first start; a changed argv, SGLang release, environment or config.json misses; a
corrupt entry falls back to SGLang's parser with one log line. Failing argvs are never cached
(test_lab_server.py: assert_nothing_cached). The key and entry tests, which run in this interpreter, are
tests/unit/lab/test_lab_server_parse_cache.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_lab_server
from test_lab_server import REPO, Server, dflash_argv, free_port

READY = r"The server is fired up and ready to roll!"
TIMINGS: dict[str, float] = {}
sglang_interpreter = test_lab_server.sglang_interpreter  # fails every test when SGLang's python is missing


# ------------------------------------------------------------------ the lab server, started twice
def libtorch_mapped(server: Server) -> bool:
    return "libtorch" in Path(f"/proc/{server.proc.pid}/maps").read_text()


def normalized(log: str) -> str:
    """The log without what differs between two identical starts: times, pids, client ports, and the
    random_seed SGLang draws when the argv has none."""
    log = "\n".join(line for line in log.splitlines() if not line.startswith("import time:"))
    log = re.sub(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\]", "[T]", log, flags=re.M)
    log = re.sub(r"server process \[\d+\]", "server process [PID]", log)
    log = re.sub(r"'random_seed': \d+", "'random_seed': SEED", log)
    return re.sub(r"127\.0\.0\.1:\d+ - ", "127.0.0.1:PORT - ", log)


def without_timings(info: dict) -> dict:
    info = {k: v for k, v in info.items() if k not in ("startup_time", "random_seed")}
    info["internal_states"] = [
        {k: v for k, v in state.items() if k not in ("startup_time", "random_seed")}
        for state in info["internal_states"]
    ]
    return info


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cache-models")
    for kind in ("target", "draft"):
        subprocess.run(
            [sys.executable, str(REPO / "lab" / "make_checkpoint.py"), kind, str(root / kind)],
            check=True,
            capture_output=True,
        )
    return {kind: str(root / kind) for kind in ("target", "draft")}


@pytest.fixture(scope="module")
def first_start(tmp_path_factory, models):
    """A DFLASH server started once (a miss: SGLang parses), its log and /server_info, then stopped."""
    tmp = tmp_path_factory.mktemp("first-start")
    env = {"SGLANG_LAB_PARSE_CACHE_DIR": str(tmp / "cache")}
    server = Server(tmp, dflash_argv(models), env)
    try:
        server.wait_log(READY)
        TIMINGS["miss: start to ready"] = time.monotonic() - server.started
        assert libtorch_mapped(server)
        info = server.json("/server_info")
    finally:
        server.stop()
    return {"tmp": tmp, "env": env, "argv": server.argv, "log": server.log, "info": info}


@pytest.mark.slow
def test_restart_with_the_same_argv_is_served_from_the_cache(first_start):
    cache = first_start["tmp"] / "cache"
    assert (cache.stat().st_mode & 0o777) == 0o700
    entries = list(cache.glob("*.json"))
    assert len(entries) == 1 and (entries[0].stat().st_mode & 0o777) == 0o600

    server = Server(
        first_start["tmp"], first_start["argv"], first_start["env"], python_args=("-X", "importtime")
    )
    try:
        server.wait_log(READY)
        TIMINGS["hit: start to ready"] = time.monotonic() - server.started
        assert not libtorch_mapped(server)
        info = server.json("/server_info")
    finally:
        server.stop()
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", server.log, re.M)
    assert "sglang.srt.entrypoints.openai.protocol" in imported  # the -X importtime list is complete
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    assert "sglang.srt.server_args" not in imported  # SGLang's parser did not run
    # Up to the port opening (warnings, server_args line, load phases): the same lines in the same order;
    # after it, the same lines (the HTTP thread's access lines race the main thread's).
    first, *rest_first = normalized(first_start["log"]).split("(Press CTRL+C to quit)\n")
    again, *rest_again = normalized(server.log).split("(Press CTRL+C to quit)\n")
    assert again == first
    assert sorted("".join(rest_again).splitlines()) == sorted("".join(rest_first).splitlines())
    assert "Max running requests is reset to 48 for speculative decoding." in server.log
    assert "UserWarning: Only CUDA, HIP and XPU support AWQ currently." in server.log
    assert without_timings(info) == without_timings(first_start["info"])
    assert info["random_seed"] != first_start["info"]["random_seed"]  # drawn anew, as SGLang does
    assert info["launch_command"] == " ".join(first_start["argv"]) and info["version"] == "0.5.23"
    print(f"lab server start-to-ready: {TIMINGS}")


@pytest.mark.slow
def test_a_changed_argv_misses(first_start, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(first_start["tmp"] / "cache", cache)
    argv = [*first_start["argv"], "--max-running-requests", "8"]
    server = Server(tmp_path, argv, {"SGLANG_LAB_PARSE_CACHE_DIR": str(cache)})
    try:
        line = server.wait_log(r"server_args=\{.*\}").group(0)
        assert libtorch_mapped(server)  # SGLang's parser ran
        assert "'max_running_requests': 8" in line
    finally:
        server.stop()
    assert len(list(cache.glob("*.json"))) == 2


@pytest.mark.slow
def test_a_corrupt_entry_falls_back_to_sglang_with_one_line(first_start, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(first_start["tmp"] / "cache", cache)
    (entry,) = cache.glob("*.json")
    entry.write_text(entry.read_text()[:500])
    server = Server(tmp_path, first_start["argv"], {"SGLANG_LAB_PARSE_CACHE_DIR": str(cache)})
    try:
        line = server.wait_log(r"server_args=\{.*\}").group(0)
        assert libtorch_mapped(server)
    finally:
        server.stop()
    assert len(re.findall(r"parse cache", server.log)) == 1
    assert re.search(
        rf"^\[[^]]+\] sglang-lab-server: parse cache entry {re.escape(str(entry))} ignored "
        r"\(corrupt: JSONDecodeError: .*\); parsing with SGLang$",
        server.log,
        re.M,
    )
    assert normalized(line) == normalized(re.search(r"server_args=\{.*\}", first_start["log"]).group(0))
    assert json.loads(entry.read_text())["key"] == entry.stem  # written anew


@pytest.mark.slow
def test_a_changed_config_json_misses(tmp_path, models):
    root = tmp_path / "models"
    shutil.copytree(Path(models["target"]).parent, root)
    argv = dflash_argv({kind: str(root / kind) for kind in ("target", "draft")}, port=free_port())
    env = {"SGLANG_LAB_PARSE_CACHE_DIR": str(tmp_path / "cache")}

    def start() -> tuple[str, bool]:
        server = Server(tmp_path, argv, env)
        try:
            line = server.wait_log(r"server_args=\{.*\}").group(0)
            return line, libtorch_mapped(server)
        finally:
            server.stop()

    line, parsed = start()
    assert parsed
    again, parsed = start()
    assert (normalized(again), parsed) == (normalized(line), False)  # served from the cache
    config = root / "draft" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "block_size": 8}))
    changed, parsed = start()
    assert parsed  # the draft's config.json changed: SGLang resolves again
    assert "'speculative_num_draft_tokens': 8" in changed and "'speculative_num_draft_tokens': 16" in line
