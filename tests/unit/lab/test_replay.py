"""The lab DDTree build (lab/replay/) against the REAL build it replays.

tests/fixtures/ddtree/resolve-runs/pr-*.json are real runs of the preflight's resolve script on the
code of PR sgl-project/sglang#29907 (tests/fixtures/ddtree/SOURCE.md). The replay wheel, installed
exactly as on a lab host (its files on PYTHONPATH of a plain python), must give the same exit code, the
same error line, the same SGLang log lines in the same order and the same resolved values.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
RUNS = sorted((REPO / "tests" / "fixtures" / "ddtree" / "resolve-runs").glob("pr-*.json"))

# What the preflight's resolve script does with the build, reduced to the replay's API: parse, resolve
# (dataclass __post_init__), report the log records from INFO up as "LEVEL: message".
DRIVER = r"""
import dataclasses, json, logging, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(f"{record.levelname}: {record.getMessage()}")
from sglang.srt.server_args import prepare_server_args
argv = json.loads(sys.argv[1])
root = logging.getLogger()
keep = Keep(level=logging.INFO)
orig = logging.basicConfig
def basic(**kwargs):
    orig(**kwargs)
    root.addHandler(keep)
logging.basicConfig = basic
try:
    server_args = prepare_server_args(argv)
except ValueError as exc:
    print(json.dumps({"rc": 1, "error": f"ValueError: {exc}", "log": records}))
    sys.exit(0)
print(json.dumps({"rc": 0, "resolved": dataclasses.asdict(server_args), "log": records}))
"""


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    wheel = subprocess.run(
        [sys.executable, str(REPO / "lab" / "replay" / "build-wheel"), "ddtree-pr29907", str(out)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    site = out / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    models = out / "models"
    (models / "target").mkdir(parents=True)
    (models / "draft").mkdir(parents=True)
    (models / "target" / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    # what resolution reads of the lab draft (lab/make_checkpoint.py): its block size
    (models / "draft" / "config.json").write_text('{"architectures": ["DFlashDraftModel"], "block_size": 16}')
    return {"site": site, "models": models, "wheel": Path(wheel)}


def run_replay(replay, argv):
    argv = [a.replace("<models>", str(replay["models"])) for a in argv]
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(replay['site'])!r}); exec({DRIVER!r})",
            json.dumps(argv),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("run", RUNS, ids=[p.stem for p in RUNS])
def test_replay_resolves_as_the_recorded_build(replay, run):
    real = json.loads(run.read_text())
    got = run_replay(replay, real["argv"])
    assert got["rc"] == real["rc"]
    assert got["log"] == real["log_messages"]
    if real["rc"]:
        assert got["error"] == real["error"]
        return
    for key, value in real["resolved"].items():
        if "." in key:  # cuda_graph_config.* is not replayed (no CUDA graphs in the lab)
            continue
        if key.endswith("_path"):
            value = value.replace("<models>", str(replay["models"])) if isinstance(value, str) else value
        assert got["resolved"][key] == value, key


def test_replay_argparse_errors_are_argparse_s(replay):
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.insert(0, {str(replay['site'])!r}); "
            "from sglang.srt.server_args import prepare_server_args; "
            'prepare_server_args(["--speculative-ddtree-budget", "x"])',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert proc.returncode == 2
    assert "sglang serve: error: argument --speculative-ddtree-budget: invalid int value: 'x'" in proc.stderr


def test_replay_is_named_as_what_it_is(replay):
    assert replay["wheel"].name == "sglang-0.0.0.dev0+labreplay.ddtree.pr29907-py3-none-any.whl"
    recording = json.loads((replay["site"] / "sglang" / "lab_replay_recording.json").read_text())
    assert recording["source"].startswith("sgl-project/sglang PR #29907 @ 93e9850e")
    metadata = (
        replay["site"] / "sglang-0.0.0.dev0+labreplay.ddtree.pr29907.dist-info" / "METADATA"
    ).read_text()
    assert "LAB REPLAY" in metadata
