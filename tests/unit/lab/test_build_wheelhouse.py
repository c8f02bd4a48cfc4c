"""lab/build-wheelhouse: requirement parsing, pins vs. the real sglang wheel, the stamp fast path."""

from __future__ import annotations

import glob
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "lab" / "build-wheelhouse"
LOADER = importlib.machinery.SourceFileLoader("build_wheelhouse", str(SCRIPT))
SPEC = importlib.util.spec_from_loader("build_wheelhouse", LOADER)
bw = importlib.util.module_from_spec(SPEC)
LOADER.exec_module(bw)

WHEELHOUSE = os.environ.get("SGLANG_LAB_WHEELHOUSE", bw.DEFAULT_DIR)
SGLANG_WHEELS = glob.glob(os.path.join(WHEELHOUSE, "sglang-0.5.23-*.whl"))
needs_wheelhouse = pytest.mark.skipif(
    not SGLANG_WHEELS, reason=f"no sglang wheel in {WHEELHOUSE}; run lab/build-wheelhouse"
)


def test_requirements_file_is_fully_pinned() -> None:
    pins = bw.read_pins(bw.REQUIREMENTS)
    assert "sglang" not in pins  # installed from its own wheel with --no-deps
    assert pins["compressed-tensors"] == "0.18.0"
    assert pins["sentencepiece"] == "0.2.1"
    assert pins["torch"] == "2.14.1"


def test_unpinned_requirement_is_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "req.txt"
    req.write_text("# comment\nnumpy==2.4.6\ntorch>=2.0\n")
    with pytest.raises(SystemExit):
        bw.read_pins(str(req))
    assert f"{req}:3: expected 'name==version', got 'torch>=2.0'" in capsys.readouterr().err


@needs_wheelhouse
def test_pins_satisfy_the_sglang_wheel() -> None:
    reqs = bw.sglang_requires(SGLANG_WHEELS[0])
    assert reqs["compressed-tensors"] == "==0.18.0"
    assert reqs["sentencepiece"] == "==0.2.1"
    assert reqs["torch"] == "==2.14.1"
    pins = bw.read_pins(bw.REQUIREMENTS)
    assert bw.pin_conflicts(reqs, pins, sys.executable) == []
    wrong = dict(pins, sentencepiece="0.2.3", **{"compressed-tensors": "0.20.1"})
    assert bw.pin_conflicts(reqs, wrong, sys.executable) == [
        "compressed-tensors==0.20.1 does not satisfy sglang's compressed-tensors==0.18.0",
        "sentencepiece==0.2.3 does not satisfy sglang's sentencepiece==0.2.1",
    ]


@needs_wheelhouse
def test_complete_wheelhouse_is_a_fast_no_op() -> None:
    stamp = Path(WHEELHOUSE, bw.STAMP)
    pyver = subprocess.run(
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], text=True, capture_output=True
    ).stdout.strip()
    if not stamp.exists() or json.loads(stamp.read_text())["inputs"] != bw.inputs_hash(pyver):
        pytest.skip(f"{WHEELHOUSE} is not built for the current requirements; run lab/build-wheelhouse")
    started = time.monotonic()
    proc = subprocess.run([str(SCRIPT), WHEELHOUSE], text=True, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{WHEELHOUSE}: complete (")
    assert time.monotonic() - started < 10
