"""roles/sglang/filter_plugins/sglang_canary.py: the hold markers the first play slurps, decoded for
module_utils/sglang_canary.py ``hold`` (its table is in tests/unit/module_utils/test_sglang_canary.py)."""

from __future__ import annotations

import base64
import importlib.util

from conftest import FIXTURES, REPO

spec = importlib.util.spec_from_file_location(
    "sglang_canary_filter", REPO / "roles" / "sglang" / "filter_plugins" / "sglang_canary.py"
)
plugin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plugin)
hold = plugin.FilterModule().filters()["sglang_canary_hold"]
MARKER = (FIXTURES / "canary" / "reports" / "inconclusive" / "canary.json").read_bytes()


def slurped(data: bytes) -> dict:
    """What ansible.builtin.slurp returns for a file."""
    return {
        "content": base64.b64encode(data).decode(),
        "encoding": "base64",
        "source": "/x",
        "changed": False,
    }


# A host without a marker: slurp failed (failed_when false), no content.
MISSING = {"failed": False, "msg": "file not found: /var/lib/sglang-deploy/canary-hold.json"}


def test_only_the_hosts_with_a_marker_are_held_and_its_reason_is_shown():
    plan = hold(["lab200", "lab201"], [slurped(MARKER), MISSING], None)
    assert plan["held"] == ["lab200"]
    assert "on lab200: the canary answered 0 generation request(s)" in plan["refusal"]


def test_the_operators_word_resumes_and_an_unreadable_marker_still_holds():
    assert hold(["lab200", "lab201"], [slurped(MARKER), MISSING], "abort")["abort"] is True
    plan = hold(["lab200"], [slurped(b"{not json")], None)
    assert plan["held"] == ["lab200"] and "an unreadable hold marker" in plan["refusal"]


def test_the_stop_filter_is_the_canarys_own_message():
    stop = plugin.FilterModule().filters()["sglang_canary_stop"]
    assert stop("lab200", "Inconclusive", "too little traffic").startswith(
        "Canary lab200 is HOLDING: verdict Inconclusive (too little traffic). Resume with -e canary=promote"
    )
    assert stop("lab200", "Successful", "every figure within its limit") is None
