#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Over 500 lines with its documentation (DOCUMENTATION, EXAMPLES and RETURN are 187 of them): the
# code is 332 lines.
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_bench
short_description: Benchmark the running SGLang server with SGLang's own client (bench_serving)
description:
  - Runs C(python -m sglang.bench_serving) from the INSTALLED SGLang (O(python) is the venv's
    interpreter) against the server on O(host):O(port), with a fixed, recorded workload (dataset,
    prompt count, input/output lengths, request rate, concurrency, seed, warm-up requests).
  - No downloads. O(dataset_name=random) and O(dataset_name=sharegpt) need O(dataset_path) to be a
    JSON file on the host (bench_serving would fetch ShareGPT from the Hugging Face Hub otherwise);
    O(dataset_name=random-ids) needs none. O(tokenizer) must be a local directory or file.
  - Ties the numbers to one server process. With O(invocation_id), the unit's C(InvocationID) must be
    that one before the run, and C(InvocationID) and C(NRestarts) must be unchanged after it;
    otherwise the module fails (the numbers would belong to another process).
  - The API key reaches the client only through its environment (C(OPENAI_API_KEY), which
    bench_serving sends as a Bearer token), never on a command line. The client's result embeds
    C(/server_info), which SGLang does not redact; the module keeps only the acceptance length,
    the version and the lab-server marker from it, and redacts the key from everything it returns.
  - Changes nothing on the host (the result file lives in a temporary directory that is removed).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  python:
    description: Interpreter of the SGLang venv (the client comes from the installed release).
    type: path
    required: true
  client_module:
    description: Python module of the client. C(sglang.benchmark.serving) is the new path of the same code.
    type: str
    default: sglang.bench_serving
  host:
    description: Address the server listens on (C(0.0.0.0) and C(::) are reached through loopback).
    type: str
    default: 127.0.0.1
  port:
    description: HTTP port of the server.
    type: int
    default: 30000
  api_key:
    description: API key of the server (C(--api-key)); empty for none.
    type: str
    default: ""
  unit:
    description: systemd unit of the server, for the invocation check.
    type: str
    default: sglang.service
  invocation_id:
    description: The verified invocation the numbers must belong to; empty skips the check.
    type: str
    default: ""
  backend:
    description: bench_serving backend. C(sglang) streams C(/generate); the C(-oai) ones the OpenAI API.
    type: str
    default: sglang
    choices: [sglang, sglang-oai, sglang-oai-chat]
  tokenizer:
    description: Tokenizer directory (or tokenizer.json) on the host; bench_serving needs one.
    type: path
    required: true
  dataset_name:
    description: bench_serving dataset.
    type: str
    default: random
    choices: [random, random-ids, sharegpt, custom]
  dataset_path:
    description: Dataset file on the host (ShareGPT-style JSON; JSONL for C(custom)).
    type: path
  num_prompts:
    description: Number of requests measured.
    type: int
    default: 64
  input_len:
    description: Input tokens per request (C(random), C(random-ids)).
    type: int
    default: 512
  output_len:
    description:
      - Output tokens per request (C(random), C(random-ids)).
      - Also the fixed output length of C(sharegpt) and C(custom).
    type: int
    default: 256
  range_ratio:
    description:
      - Lengths are drawn from [len x ratio, len].
      - 1.0 makes every request exactly O(input_len) and O(output_len) long.
    type: float
    default: 1.0
  request_rate:
    description:
      - Requests per second (Poisson arrivals).
      - C(inf) sends all at once; O(max_concurrency) then paces them.
    type: str
    default: inf
  max_concurrency:
    description: Requests in flight at most; 0 = unlimited.
    type: int
    default: 8
  seed:
    description: Seed of the dataset sampling and arrival times.
    type: int
    default: 1
  warmup_requests:
    description: Warm-up requests bench_serving sends (at O(max_concurrency)) before measuring.
    type: int
    default: 2
  report_args:
    description:
      - Resolved server arguments (SGLang dest names) to return from that C(/server_info).
      - For values SGLang chose itself, such as the block size taken from the drafter.
    type: list
    elements: str
    default: []
  extra_args:
    description: Further bench_serving arguments, passed as they are (no secrets).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds the client may run before it is killed and the module fails.
    type: int
    default: 3600
attributes:
  check_mode:
    support: full
    details: Runs nothing; returns the command that would run.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Benchmark the verified invocation
  sglang_bench:
    python: /opt/sglang/venv/bin/python
    port: 30000
    api_key: "{{ sglang_api_key }}"
    invocation_id: "{{ verified.invocation_id }}"
    tokenizer: /srv/models/Kimi-K2.6
    dataset_name: random
    dataset_path: /var/lib/sglang-deploy/sweep/prompts.json
    num_prompts: 200
    input_len: 1024
    output_len: 512
    request_rate: "inf"
    max_concurrency: 16
    seed: 1
  register: bench
"""

RETURN = r"""
metrics:
  description: Numeric results of bench_serving (its result without C(server_info)); inf/nan as strings.
  returned: success
  type: dict
  sample: {"completed": 16, "output_throughput": 812.4, "request_throughput": 25.3, "median_ttft_ms": 11.8,
           "p99_ttft_ms": 13.1, "median_itl_ms": 7.8, "p99_itl_ms": 8.9, "accept_length": 4.7}
workload:
  description: The recorded workload (what the numbers were produced with).
  returned: always
  type: dict
  sample: {"backend": "sglang", "dataset_name": "random", "dataset_sha256": "9c1e...", "num_prompts": 16,
           "input_len": 128, "output_len": 64, "range_ratio": 1.0, "request_rate": "inf",
           "max_concurrency": 4,
           "seed": 1, "warmup_requests": 2}
server:
  description: From the C(/server_info) that bench_serving read after the run.
  returned: success
  type: dict
  sample: {"version": "0.5.23", "avg_spec_accept_length": 4.71, "lab_server": true,
           "args": {"speculative_num_draft_tokens": 16}}
invocation:
  description: C(InvocationID), C(MainPID) and C(NRestarts) of the unit before and after the run.
  returned: when unit is checked
  type: dict
  sample: {"before": {"InvocationID": "5f67...", "MainPID": "812", "NRestarts": "0"},
           "after": {"InvocationID": "5f67...", "MainPID": "812", "NRestarts": "0"}}
argv:
  description: The client command line.
  returned: always
  type: list
  elements: str
elapsed:
  description: Seconds the client ran (import, tokenizer, warm-up and measurement).
  returned: success
  type: float
stdout_tail:
  description: Last lines of the client's output (redacted).
  returned: always
  type: str
"""

import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible.module_utils.sglang_redact import redact, redact_text  # noqa: E402
from ansible.module_utils.sglang_systemd import SystemctlError, show  # noqa: E402

INVOCATION_PROPS = ("InvocationID", "MainPID", "NRestarts", "ActiveState")
NEEDS_FILE = ("random", "sharegpt", "custom")
TAIL_LINES = 40


def finite(obj):
    """JSON-safe copy: inf/nan become strings (bench_serving writes Infinity for request_rate=inf)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def parse_rate(raw):
    text = str(raw).strip().lower()
    if text in ("inf", "infinity"):
        return "inf"
    try:
        value = float(text)
    except ValueError:
        return None
    return text if math.isfinite(value) and value > 0 else None


def client_host(host):
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def build_argv(p, output_file):
    argv = [
        p["python"],
        "-m",
        p["client_module"],
        "--backend",
        p["backend"],
        "--host",
        client_host(p["host"]),
        "--port",
        str(p["port"]),
        "--tokenizer",
        p["tokenizer"],
        "--dataset-name",
        p["dataset_name"],
        "--num-prompts",
        str(p["num_prompts"]),
        "--seed",
        str(p["seed"]),
        "--request-rate",
        p["request_rate"],
        "--warmup-requests",
        str(p["warmup_requests"]),
        "--output-file",
        output_file,
        "--disable-tqdm",
        "--ready-check-timeout-sec",
        "30",
    ]
    if p["dataset_path"]:
        argv += ["--dataset-path", p["dataset_path"]]
    if p["dataset_name"] in ("random", "random-ids"):
        argv += [
            "--random-input-len",
            str(p["input_len"]),
            "--random-output-len",
            str(p["output_len"]),
            "--random-range-ratio",
            repr(float(p["range_ratio"])),
        ]
    else:
        argv += ["--sharegpt-output-len", str(p["output_len"])]
    if p["max_concurrency"] > 0:
        argv += ["--max-concurrency", str(p["max_concurrency"])]
    return argv + list(p["extra_args"])


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_client(argv, env, timeout):
    """Run the client in its own session; kill the whole group on timeout. -> (rc, output, timed_out)."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode("utf-8", errors="replace"), False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return proc.returncode, out.decode("utf-8", errors="replace"), True


def read_result(path):
    """The last JSON line bench_serving appended (the file is new, so it is the only one)."""
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    if not lines:
        raise ValueError("empty result file")
    return json.loads(lines[-1])


def split_result(result, report_args=()):
    """bench_serving's result -> (numeric metrics, server summary). server_info is dropped."""
    info = result.get("server_info") or {}
    if isinstance(info.get("decode"), list) and info["decode"]:  # PD disaggregation: the decode server
        info = info["decode"][0]
    states = info.get("internal_states") or [{}]
    state = states[0] if isinstance(states[0], dict) else {}
    server = {
        "version": info.get("version"),
        "avg_spec_accept_length": state.get("avg_spec_accept_length"),
        "lab_server": bool(info.get("lab_server") or state.get("lab_server")),
        "args": {key: info.get(key) for key in report_args},
    }
    metrics = {
        k: v
        for k, v in result.items()
        if k != "server_info" and (isinstance(v, (int, float)) and not isinstance(v, bool) or v is None)
    }
    return finite(metrics), finite(server)


def unit_state(module, unit):
    return {k: v for k, v in show(module, unit, INVOCATION_PROPS).items() if k in INVOCATION_PROPS}


def run_module(module):
    p = dict(module.params)
    secrets = [p["api_key"]] if p["api_key"] else []
    rate = parse_rate(p["request_rate"])
    if rate is None:
        module.fail_json(msg=f"request_rate={p['request_rate']!r}: must be a number > 0 or inf")
    p["request_rate"] = rate
    for name in ("num_prompts", "input_len", "output_len"):
        if p[name] < 1:
            module.fail_json(msg=f"{name}={p[name]}: must be >= 1")
    for name in ("max_concurrency", "warmup_requests"):
        if p[name] < 0:
            module.fail_json(msg=f"{name}={p[name]}: must be >= 0")
    if not 0.0 <= p["range_ratio"] <= 1.0:
        module.fail_json(msg=f"range_ratio={p['range_ratio']}: must be from 0.0 to 1.0")
    if not os.access(p["python"], os.X_OK):
        module.fail_json(
            msg=f"python={p['python']}: not an executable interpreter (is SGLang installed there?)"
        )
    if not os.path.exists(p["tokenizer"]):
        module.fail_json(
            msg=f"tokenizer={p['tokenizer']}: no such file or directory on the host "
            "(bench_serving would try to download it; lab and GPU hosts have no route out)"
        )
    workload = {
        k: p[k]
        for k in (
            "backend",
            "dataset_name",
            "dataset_path",
            "num_prompts",
            "input_len",
            "output_len",
            "range_ratio",
            "request_rate",
            "max_concurrency",
            "seed",
            "warmup_requests",
            "tokenizer",
            "client_module",
            "extra_args",
        )
    }
    if p["dataset_name"] in NEEDS_FILE:
        if not p["dataset_path"] or not os.path.isfile(p["dataset_path"]):
            module.fail_json(
                msg=f"dataset_path={p['dataset_path']!r}: dataset_name={p['dataset_name']} needs a dataset "
                "file on the host (without one bench_serving downloads ShareGPT)",
                workload=workload,
            )
        workload["dataset_sha256"] = sha256_file(p["dataset_path"])
    elif p["dataset_path"]:
        module.fail_json(msg=f"dataset_path: not used by dataset_name={p['dataset_name']}; leave it out")

    tmp = tempfile.mkdtemp(prefix="sglang-bench.")
    try:
        argv = build_argv(p, os.path.join(tmp, "result.jsonl"))
        shown = [redact_text(a, secrets) for a in argv]
        if module.check_mode:
            module.exit_json(
                changed=False,
                argv=shown,
                workload=workload,
                stdout_tail="",
                msg="check mode: the benchmark was not run",
            )
        before = after = None
        if p["invocation_id"]:
            try:
                before = unit_state(module, p["unit"])
            except SystemctlError as exc:
                module.fail_json(msg=f"unit={p['unit']}: {exc}", argv=shown, workload=workload)
            if before.get("InvocationID") != p["invocation_id"]:
                module.fail_json(
                    msg=f"unit={p['unit']}: the running invocation is {before.get('InvocationID')!r}, not "
                    f"the verified {p['invocation_id']!r}: refusing to benchmark another process",
                    argv=shown,
                    workload=workload,
                    invocation={"before": before},
                )
        env = dict(
            os.environ,
            LANG="C",
            PYTHONUNBUFFERED="1",
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
        )
        env.pop("OPENAI_API_KEY", None)
        env.pop("API_KEY", None)
        if p["api_key"]:
            env["OPENAI_API_KEY"] = p["api_key"]
        start = time.monotonic()
        rc, out, timed_out = run_client(argv, env, p["timeout"])
        elapsed = round(time.monotonic() - start, 3)
        tail = redact_text("\n".join(out.splitlines()[-TAIL_LINES:]), secrets)
        common = dict(argv=shown, workload=workload, stdout_tail=tail, elapsed=elapsed)
        if p["invocation_id"]:
            try:
                after = unit_state(module, p["unit"])
            except SystemctlError as exc:
                module.fail_json(msg=f"unit={p['unit']}: {exc}", **common)
            common["invocation"] = {"before": before, "after": after}
            moved = [k for k in ("InvocationID", "NRestarts") if before.get(k) != after.get(k)]
            if moved:
                module.fail_json(
                    msg=f"unit={p['unit']}: {' and '.join(moved)} changed during the benchmark "
                    f"({before} -> {after}): the numbers do not belong to invocation "
                    f"{p['invocation_id']}",
                    **common,
                )
        if timed_out:
            module.fail_json(
                msg=f"{p['client_module']} did not finish within timeout={p['timeout']} s; killed", **common
            )
        if rc != 0:
            module.fail_json(msg=f"{p['client_module']} failed (rc={rc}); see stdout_tail", rc=rc, **common)
        try:
            result = read_result(argv[argv.index("--output-file") + 1])
        except (OSError, ValueError) as exc:
            module.fail_json(msg=f"{p['client_module']} wrote no result ({exc}); see stdout_tail", **common)
        metrics, server = split_result(result, p["report_args"])
        if metrics.get("completed") != p["num_prompts"]:
            module.fail_json(
                msg=f"{p['client_module']}: {metrics.get('completed')} of num_prompts={p['num_prompts']} "
                "requests completed; see stdout_tail",
                metrics=redact(metrics, secrets),
                **common,
            )
        module.exit_json(changed=False, metrics=metrics, server=redact(server, secrets), **common)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", required=True),
            client_module=dict(type="str", default="sglang.bench_serving"),
            host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", default=30000),
            api_key=dict(type="str", default="", no_log=True),
            unit=dict(type="str", default="sglang.service"),
            invocation_id=dict(type="str", default=""),
            backend=dict(type="str", default="sglang", choices=["sglang", "sglang-oai", "sglang-oai-chat"]),
            tokenizer=dict(type="path", required=True),
            dataset_name=dict(
                type="str", default="random", choices=["random", "random-ids", "sharegpt", "custom"]
            ),
            dataset_path=dict(type="path"),
            num_prompts=dict(type="int", default=64),
            input_len=dict(type="int", default=512),
            output_len=dict(type="int", default=256),
            range_ratio=dict(type="float", default=1.0),
            request_rate=dict(type="str", default="inf"),
            max_concurrency=dict(type="int", default=8),
            seed=dict(type="int", default=1),
            warmup_requests=dict(type="int", default=2),
            report_args=dict(type="list", elements="str", default=[]),
            extra_args=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=3600),
        ),
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
