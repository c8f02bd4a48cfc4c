"""docs/properties.md defines P1-P27 (issue 18, item 8; P18, P19, P20: issue 14; P21: issue 17; P22: issue
37; P24, P25, P26: issue 38; P27: issue 39), and what it names exists.

One table row per property, in order; every test it names is a test of this repository (a renamed test
fails here, not silently in the document); every code path exists; the messages that cite a P-code
point at the document; no document points at a file outside the repository.
"""

from __future__ import annotations

import re

from conftest import REPO

DOC = REPO / "docs" / "properties.md"
TEXT = DOC.read_text()
ROWS = [line for line in TEXT.splitlines() if re.match(r"^\| P\d+ \|", line)]


def test_p1_to_p17_each_defined_once_in_order():
    assert [row.split("|")[1].strip() for row in ROWS] == [f"P{n}" for n in range(1, 28)]
    for row in ROWS:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert len(cells) == 5 and all(cells), row[:60]  # property, what breaks it, held by, tests


def test_every_named_test_and_path_exists():
    current = None
    for match in re.finditer(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`::(\w+)`", TEXT):
        if match.group(1):
            current, name = REPO / match.group(1), match.group(2)
            assert current.is_file(), match.group(1)
        else:
            name = match.group(3)
        if name:
            assert re.search(rf"^def {name}\(", current.read_text(), re.M), f"{current.name}::{name}"
    code_path = r"`((?:library|module_utils|action_plugins|roles|playbooks|tools)/[\w/.-]+)`"
    for path in re.findall(code_path, TEXT):
        assert (REPO / path).exists(), path
    default = (REPO / "molecule" / "default" / "tests" / "test_default.py").read_text()
    for name in re.findall(r"Molecule `default` `(\w+)`", TEXT):
        assert f"def {name}(" in default, name
    scenario = REPO / "molecule" / "failures"
    cases = sorted(scenario.glob("cases/*.yml"))
    failures = "".join(path.read_text() for path in [scenario / "verify.yml", *cases])
    for case in re.findall(r"(Case \d+[ab]?(?:, (?:module|failing))?)", TEXT):
        assert f'"{case}:' in failures, case


def test_messages_that_cite_a_p_code_link_to_the_definitions():
    """Module code (after its documentation, which says so once): each "(Pn)" is followed by the link."""
    for module in sorted((REPO / "library").glob("*.py")):
        code = module.read_text().split("\nRETURN = ", 1)[-1].split('"""', 2)[-1]
        for match in re.finditer(r"\(P\d+\)", code):
            line = code[: match.start()].rsplit("\n", 1)[-1]
            if line.lstrip().startswith("#"):
                continue
            following = re.sub(r'["\s]+', " ", code[match.end() : match.end() + 80])
            assert "see docs/properties.md" in following, (module.name, match.group())


def test_no_document_points_outside_the_repository():
    for path in [*REPO.glob("*.md"), *REPO.glob("docs/**/*.md"), *REPO.glob("roles/*/README.md")]:
        text = path.read_text()
        # every relative link target resolves inside the repository (none climbs out of it)
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if "://" in target or target.startswith("mailto:"):
                continue
            resolved = (path.parent / target).resolve()
            assert REPO in resolved.parents or resolved == REPO, (path, target)
        # no text reference that climbs above the repository root either
        assert not re.search(r"(?<![\w.])\.\./\.\./|(?<![\w/])\.\./[a-z]+/reference", text), path
