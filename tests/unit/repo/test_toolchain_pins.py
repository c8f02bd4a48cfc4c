"""The toolchain is pinned to the last package: requirements.txt names what the controller needs,
constraints.txt (pip -c in `make venv`) pins it and everything it pulls in, and
lab/constraints-lab-tooling.txt (pip -c in lab/build-wheelhouse) pins what the lab wheelhouse downloads
beside SGLang's closed list. A dependency released after a commit (cryptography 51 began warning on
stderr in every Ansible command) then cannot change a clean clone's run."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


def pins(path: Path) -> dict[str, str]:
    """name -> version of every requirement line; a line that is not name==version fails."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = PIN.fullmatch(line)
        assert m, f"{path.name}: not pinned as name==version: {line!r}"
        out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return out


def test_every_requirement_is_pinned_in_constraints_at_the_same_version():
    required = pins(REPO / "requirements.txt")
    constrained = pins(REPO / "constraints.txt")
    assert {n: v for n, v in required.items() if constrained.get(n) != v} == {}


def test_the_lab_pins_agree_with_the_controllers():
    # ansible-core's dependencies on a lab host (pull mode) are the controller's own versions.
    lab = pins(REPO / "lab" / "constraints-lab-tooling.txt")
    constrained = pins(REPO / "constraints.txt")
    assert {"cryptography", "jinja2", "pyyaml", "resolvelib"} <= lab.keys()
    assert {n: v for n, v in lab.items() if n in constrained and constrained[n] != v} == {}


def test_make_venv_and_the_wheelhouse_use_the_constraints():
    makefile = (REPO / "Makefile").read_text()
    assert "-r requirements.txt -c constraints.txt" in makefile
    assert "install -q pip==" in makefile
    wheelhouse = (REPO / "lab" / "build-wheelhouse").read_text()
    assert 'PINNED = ["-c", TOOLING_CONSTRAINTS]' in wheelhouse
    assert wheelhouse.count("*PINNED") >= 4
