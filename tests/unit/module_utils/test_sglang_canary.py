"""module_utils/sglang_canary.py: the canary's verdict (issue 39 item 1), over the SGLang router's (smg
1.13.0) /engine_metrics recorded before and after a load through it on a lab fleet
(tests/fixtures/canary/SOURCE.md): every figure's Successful, Failed and Inconclusive, and the settings an
operator can get wrong."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils import sglang_canary as sc
from conftest import FIXTURES

C = FIXTURES / "canary"
LABEL = "worker_addr"  # the label smg's /engine_metrics puts on each worker's samples
CANARY, OTHER = "http://10.214.0.200:30000", "http://10.214.0.201:30000"


def scrapes(name: str) -> dict:
    """{worker: (samples before, samples after)} of one recording."""
    before = sc.by_worker((C / f"{name}.before.prom").read_text(), LABEL)
    after = sc.by_worker((C / f"{name}.after.prom").read_text(), LABEL)
    return {worker: (before[worker], after[worker]) for worker in before}


def judge(name: str, limits=None, min_requests=20) -> dict:
    both = scrapes(name)
    return sc.verdict({CANARY: both[CANARY]}, {OTHER: both[OTHER]}, limits, min_requests)


def check(result: dict, metric: str) -> dict:
    return next(c for c in result["checks"] if c["metric"] == metric)


def test_engine_metrics_names_each_worker_and_carries_sglangs_names():
    """smg relabels every worker's /metrics with worker_addr and keeps SGLang's metric names."""
    both = scrapes("healthy")
    assert sorted(both) == [CANARY, OTHER]
    names = {name for name, _labels, _value in both[CANARY][1]}
    for metric in (
        "sglang:http_responses_total",
        "sglang:num_aborted_requests_total",
        "sglang:generation_tokens_total",
        "sglang:spec_verify_calls_total",
        "sglang:time_to_first_token_seconds_sum",
        "sglang:time_to_first_token_seconds_count",
        "sglang:inter_token_latency_seconds_sum",
        "sglang:inter_token_latency_seconds_count",
    ):
        assert metric in names, metric


def test_two_like_hosts_under_load_are_successful_with_every_figure_judged():
    result = judge("healthy")
    assert result["verdict"] == "Successful", result["reason"]
    assert {c["metric"]: c["result"] for c in result["checks"]} == dict.fromkeys(sc.RULES, "passed")
    assert result["canary"]["requests"] >= 20 and result["baseline"]["requests"] >= 20
    assert result["canary"]["figures"]["error_ratio"] == 0.0


# (recording, limits, the figure, its result, the verdict): each figure failed by the faulty canary's own
# recording, and passed when its limit allows what was measured.
@pytest.mark.parametrize(
    "name, limits, metric, result, want",
    [
        ("faulty_canary", {}, "error_ratio", "failed", "Failed"),
        ("faulty_canary", {}, "ttft_seconds", "failed", "Failed"),
        ("faulty_canary", {}, "itl_seconds", "failed", "Failed"),
        ("faulty_canary", {}, "tokens_per_verify", "failed", "Failed"),
        ("faulty_canary", {}, "aborted_ratio", "failed", "Failed"),
        (
            "faulty_canary",
            {"error_ratio": 1, "aborted_ratio": 1, "ttft_seconds": 100, "itl_seconds": 100,
             "tokens_per_verify": 0},
            "error_ratio",
            "passed",
            "Successful",
        ),
        ("healthy", {"ttft_seconds": 0.5}, "ttft_seconds", "failed", "Failed"),
        ("healthy", {"itl_seconds": 0.5}, "itl_seconds", "failed", "Failed"),
        ("healthy", {"tokens_per_verify": 1.5}, "tokens_per_verify", "failed", "Failed"),
    ],
)  # fmt: skip
def test_each_figure_fails_past_its_limit_and_passes_within_it(name, limits, metric, result, want):
    got = judge(name, limits)
    assert check(got, metric)["result"] == result, sc.describe(check(got, metric))
    assert got["verdict"] == want, got["reason"]
    if want == "Failed":
        assert metric in got["reason"]


@pytest.mark.parametrize("name", ["idle", "healthy", "faulty_canary"])
def test_too_few_requests_is_inconclusive_whatever_the_figures(name):
    """No figure is judged on too little traffic: a faulty canary with too few requests holds, not fails."""
    got = judge(name, min_requests=100000)
    assert got["verdict"] == "Inconclusive"
    assert "fewer than sglang_canary_min_requests=100000" in got["reason"]


def test_no_traffic_leaves_the_latency_figures_without_data():
    got = judge("idle", min_requests=1)
    assert got["verdict"] == "Inconclusive"
    assert check(got, "ttft_seconds")["result"] == "no_data"


def test_a_counter_reset_within_the_bake_counts_from_zero():
    both = scrapes("healthy")
    before, after = both[CANARY]
    # the worker restarted: its counters went down; what it counted since is the increase
    assert sc.counts(after, before)["requests"] == sc.counts([], before)["requests"]


@pytest.mark.parametrize(
    "limits, min_requests, message",
    [
        ({"latency": 2}, 20, "sglang_canary_limits: unknown figure(s) latency"),
        ({"ttft_seconds": "fast"}, 20, "sglang_canary_limits.ttft_seconds must be a number >= 0"),
        ({"error_ratio": -1}, 20, "sglang_canary_limits.error_ratio must be a number >= 0"),
        ([], 20, "sglang_canary_limits must be a mapping"),
        ({}, 0, "sglang_canary_min_requests must be an integer >= 1"),
    ],
)
def test_bad_settings_are_refused_naming_them(limits, min_requests, message):
    with pytest.raises(sc.CanaryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        judge("healthy", limits, min_requests)


def test_text_that_is_not_prometheus_is_refused_naming_the_line():
    with pytest.raises(sc.CanaryError, match="line 2 is not a Prometheus sample"):
        sc.parse_exposition("# HELP x y\n<html>All backend requests failed</html>\n")


def test_label_values_are_unescaped_as_prometheus_writes_them():
    samples = sc.parse_exposition('m{a="in\\"fer\\\\ence",b="x"} 1.5\n')
    assert samples == [("m", {"a": 'in"fer\\ence', "b": "x"}, 1.5)]


def test_a_worker_url_is_the_routers():
    assert sc.worker_url("10.214.0.200", 30000) == CANARY
    assert sc.worker_url("fd00::1", 30000) == "http://[fd00::1]:30000"


# A held rollout's marker: the Inconclusive verdict recorded on the lab fleet (reports/inconclusive).
HELD = json.loads((C / "reports" / "inconclusive" / "canary.json").read_text())
HOSTS = ["lab200", "lab201"]
RESUMED = (
    "Resume with -e canary=promote (roll on) or -e canary=abort (roll the canary back); nothing was changed."
)


@pytest.mark.parametrize(
    "word, held, refusal, abort, promote",
    [
        (None, [], None, False, False),  # nothing held, no word: the run goes on
        (
            None,
            [["lab200", HELD]],
            "The rollout is HOLDING after an Inconclusive canary verdict on lab200: "
            + HELD["reason"]
            + ". "
            + RESUMED,
            False,
            False,
        ),
        ("promote", [["lab200", HELD]], None, False, True),
        ("abort", [["lab200", HELD]], None, True, False),
        (
            "promote",
            [],
            "canary=promote: no rollout is held on lab200, lab201; nothing was changed",
            False,
            False,
        ),
        (
            "abort",
            [],
            "canary=abort: no rollout is held on lab200, lab201; nothing was changed",
            False,
            False,
        ),
        (
            "yes",
            [["lab200", HELD]],
            "canary must be promote or abort (got yes); nothing was changed",
            False,
            False,
        ),
        ("", [], "canary must be promote or abort (got ); nothing was changed", False, False),
        (
            None,
            [["lab200", {}]],
            "The rollout is HOLDING after an Inconclusive canary verdict on lab200: no reason "
            "recorded. " + RESUMED,
            False,
            False,
        ),
    ],
)
def test_a_held_rollout_goes_on_only_on_the_operators_word(word, held, refusal, abort, promote):
    plan = sc.hold(word, held, HOSTS)
    assert plan == {"refusal": refusal, "abort": abort, "promote": promote, "held": [h for h, _ in held]}


# The verdicts recorded on the lab fleet (reports/failed, reports/inconclusive) and a Successful one.
FAILED = json.loads((C / "reports" / "failed" / "canary.json").read_text())


@pytest.mark.parametrize(
    "verdict, reason, message",
    [
        (
            FAILED["verdict"],
            FAILED["reason"],
            f"Canary lab200 FAILED its verdict and was rolled back ({FAILED['reason']}); "
            "the rollout stops, the other hosts untouched.",
        ),
        (
            HELD["verdict"],
            HELD["reason"],
            f"Canary lab200 is HOLDING: verdict Inconclusive ({HELD['reason']}). "
            "Resume with -e canary=promote (roll on) or -e canary=abort (roll the canary back).",
        ),
        ("Successful", "every figure within its limit", None),
    ],
)
def test_the_run_stops_after_a_failed_or_inconclusive_verdict_saying_how_to_resume(verdict, reason, message):
    assert sc.stop("lab200", verdict, reason) == message
