# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary's verdict (issue 39 item 1): after the first batch of a rollout has baked in the router's
rotation, compare it with the hosts that still run the old configuration. Pure, standard library only.

Input: two scrapes of Prometheus text per worker, before and after the bake - smg's ``/engine_metrics``
(every worker's ``/metrics``, each sample labelled with the worker's URL) or a Prometheus server's answer.
SGLang 0.5.23's names (observability/metrics_collector.py, http_request_metrics.py):
  requests         sglang:http_responses_total on the generation endpoints (answered, whatever the status)
  error_ratio      the 5xx share of them
  aborted_ratio    sglang:num_aborted_requests_total over the requests
  ttft_seconds     mean of sglang:time_to_first_token_seconds over the bake (histogram _sum/_count deltas)
  itl_seconds      mean of sglang:inter_token_latency_seconds, likewise
  tokens_per_verify  sglang:generation_tokens_total / sglang:spec_verify_calls_total deltas (the spec_*
                   gauges are the most recent batch's value, not a rate over the bake)
Counters are compared as deltas; one that went down (the process restarted within the bake) counts from 0,
as Prometheus' increase() does.

The verdict: ``Inconclusive`` when the canary or the unchanged hosts answered fewer than ``min_requests``
generation requests over the bake (no figure is judged then); else ``Failed`` when any figure is past its
limit; else ``Successful``. A figure with no data on either side (no speculative decoding: no verify calls;
no streamed request: no inter-token latency) is reported ``no_data`` and not judged.
"""

from __future__ import annotations

import math
import re

GENERATION_ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/generate")
VERDICTS = ("Successful", "Failed", "Inconclusive")
# How an operator resumes a rollout held after an Inconclusive verdict (the role's messages, the reports).
RESUME = "resume with -e canary=promote (roll on) or -e canary=abort (roll the canary back)"

# Each figure's rule against the unchanged hosts: "above" fails a canary figure above baseline + limit
# (ratios, absolute), "times" above baseline * limit (latencies), "below" below baseline * limit.
RULES = {
    "error_ratio": "above",
    "aborted_ratio": "above",
    "ttft_seconds": "times",
    "itl_seconds": "times",
    "tokens_per_verify": "below",
}
# What an operator would start with in production: one percentage point more errors or aborts, 20 % slower
# first tokens or inter-token latency, 10 % fewer tokens per verify step.
DEFAULT_LIMITS = {
    "error_ratio": 0.01,
    "aborted_ratio": 0.01,
    "ttft_seconds": 1.2,
    "itl_seconds": 1.2,
    "tokens_per_verify": 0.9,
}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class CanaryError(Exception):
    """Input the verdict cannot judge (a setting out of range, a scrape that is not Prometheus text)."""


def parse_exposition(text):
    """Prometheus text -> [(name, {label: value}, float)]; comments and blank lines skipped."""
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise CanaryError(f"line {number} is not a Prometheus sample: {line[:200]!r}")
        name, body, value = match.groups()
        labels, pos = {}, 0
        while body and pos < len(body):
            label = _LABEL.match(body, pos)
            if not label:
                raise CanaryError(f"line {number}: bad labels: {body[:200]!r}")
            labels[label.group(1)] = re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], label.group(2))
            pos = label.end()
        try:
            samples.append((name, labels, float(value)))
        except ValueError:
            raise CanaryError(f"line {number}: bad value {value!r}") from None
    return samples


def by_worker(text, label):
    """One scrape (Prometheus text) -> {worker: its samples}, by the label that names the worker's URL."""
    workers = {}
    for name, labels, value in parse_exposition(text):
        if label in labels:
            workers.setdefault(labels[label], []).append((name, labels, value))
    return workers


def worker_url(address, port):
    """A worker's URL as the router role derives it (an IPv6 address in brackets)."""
    address = str(address)
    return f"http://[{address}]:{int(port)}" if ":" in address else f"http://{address}:{int(port)}"


def _total(samples, name, keep=lambda labels: True):
    return sum(value for n, labels, value in samples if n == name and keep(labels))


def _delta(before, after, name, keep=lambda labels: True):
    first, last = _total(before, name, keep), _total(after, name, keep)
    return last if last < first else last - first  # a reset within the bake counts from 0


def _generation(labels):
    return labels.get("endpoint") in GENERATION_ENDPOINTS


def _server_error(labels):
    return _generation(labels) and labels.get("status_code", "").startswith("5")


def counts(before, after):
    """The deltas of one worker over the bake (parsed samples of its two scrapes)."""
    delta = {
        "requests": _delta(before, after, "sglang:http_responses_total", _generation),
        "errors": _delta(before, after, "sglang:http_responses_total", _server_error),
        "aborted": _delta(before, after, "sglang:num_aborted_requests_total"),
        "generation_tokens": _delta(before, after, "sglang:generation_tokens_total"),
        "verify_calls": _delta(before, after, "sglang:spec_verify_calls_total"),
    }
    for key, metric in (
        ("ttft", "sglang:time_to_first_token_seconds"),
        ("itl", "sglang:inter_token_latency_seconds"),
    ):
        delta[key + "_sum"] = _delta(before, after, metric + "_sum")
        delta[key + "_count"] = _delta(before, after, metric + "_count")
    return delta


def figures(total):
    """The judged figures of summed deltas (None: no data)."""

    def ratio(num, den):
        return num / den if den > 0 else None

    return {
        "error_ratio": ratio(total["errors"], total["requests"]),
        "aborted_ratio": ratio(total["aborted"], total["requests"]),
        "ttft_seconds": ratio(total["ttft_sum"], total["ttft_count"]),
        "itl_seconds": ratio(total["itl_sum"], total["itl_count"]),
        "tokens_per_verify": ratio(total["generation_tokens"], total["verify_calls"]),
    }


def _summed(scrapes):
    """{worker: (before samples, after samples)} -> the deltas of all of them summed, and per worker."""
    per = {worker: counts(before, after) for worker, (before, after) in sorted(scrapes.items())}
    keys = counts([], [])
    return {key: sum(d[key] for d in per.values()) for key in keys}, per


def check_settings(limits, min_requests):
    """The limits merged over the defaults; CanaryError names a bad setting."""
    if not isinstance(limits, dict):
        raise CanaryError(f"sglang_canary_limits must be a mapping of {', '.join(RULES)}, got {limits!r}")
    unknown = sorted(set(limits) - set(RULES))
    if unknown:
        raise CanaryError(
            f"sglang_canary_limits: unknown figure(s) {', '.join(unknown)} (known: {', '.join(RULES)})"
        )
    merged = dict(DEFAULT_LIMITS)
    for key, value in limits.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise CanaryError(f"sglang_canary_limits.{key} must be a number >= 0, got {value!r}")
        merged[key] = float(value)
    if isinstance(min_requests, bool) or not isinstance(min_requests, int) or min_requests < 1:
        raise CanaryError(f"sglang_canary_min_requests must be an integer >= 1, got {min_requests!r}")
    return merged


def _judge(metric, canary, baseline, limit):
    rule = RULES[metric]
    if canary is None or baseline is None:
        return {"metric": metric, "canary": canary, "baseline": baseline, "limit": limit, "rule": rule,
                "result": "no_data"}  # fmt: skip
    bound = baseline + limit if rule == "above" else baseline * limit
    failed = canary < bound if rule == "below" else canary > bound
    return {"metric": metric, "canary": canary, "baseline": baseline, "limit": limit, "rule": rule,
            "bound": bound, "result": "failed" if failed else "passed"}  # fmt: skip


def verdict(canary, baseline, limits=None, min_requests=200):
    """canary, baseline: {worker: (samples before, samples after)} of the canary's and the unchanged hosts'
    workers (by_worker of each scrape). -> {verdict, reason, checks [per figure], canary {requests, figures,
    workers}, baseline {...}, limits, min_requests}."""
    merged = check_settings({} if limits is None else limits, min_requests)
    if not canary or not baseline:
        raise CanaryError("the verdict needs scrapes of the canary and of at least one unchanged host")
    sums = {side: _summed(scrapes) for side, scrapes in (("canary", canary), ("baseline", baseline))}
    report = {
        side: {"requests": int(total["requests"]), "figures": figures(total), "workers": per}
        for side, (total, per) in sums.items()
    }
    checks = [
        _judge(m, report["canary"]["figures"][m], report["baseline"]["figures"][m], merged[m]) for m in RULES
    ]
    short = [side for side in ("canary", "baseline") if report[side]["requests"] < min_requests]
    failed = [c for c in checks if c["result"] == "failed"]
    if short:
        result = "Inconclusive"
        reason = "; ".join(
            f"the {'canary' if side == 'canary' else 'unchanged hosts'} answered {report[side]['requests']} "
            f"generation request(s) over the bake, fewer than sglang_canary_min_requests={min_requests}"
            for side in short
        )
    elif failed:
        result = "Failed"
        reason = "; ".join(describe(c) for c in failed)
    else:
        result, reason = "Successful", "every figure within its limit"
    return {
        "verdict": result,
        "reason": reason,
        "checks": checks,
        "canary": report["canary"],
        "baseline": report["baseline"],
        "limits": merged,
        "min_requests": min_requests,
    }


def limit_text(check):
    """What a judged figure had to be, in words (the verdict's reason, the apply comment)."""
    return {
        "above": "at most the unchanged hosts' + {limit:g}",
        "times": "at most {limit:g}x the unchanged hosts'",
        "below": "at least {limit:g}x the unchanged hosts'",
    }[check["rule"]].format(limit=check["limit"])


def describe(check):
    """One line per judged figure: canary against the unchanged hosts and the limit."""
    if check["result"] == "no_data":
        return f"{check['metric']}: no data"
    return (
        f"{check['metric']} {check['canary']:.4g} (unchanged hosts {check['baseline']:.4g}; "
        f"{limit_text(check)}: {check['result']})"
    )


def stop(host, verdict, reason):
    """Why the rollout stops after the canary ``host``'s ``verdict`` (canary.yml fails the run with it), or
    None when it rolls on (Successful)."""
    if verdict == "Failed":
        return (
            f"Canary {host} FAILED its verdict and was rolled back ({reason}); the rollout stops, the other "
            "hosts untouched."
        )
    if verdict == "Inconclusive":
        return f"Canary {host} is HOLDING: verdict Inconclusive ({reason}). {RESUME[0].upper()}{RESUME[1:]}."
    return None


def hold(word, held, hosts):
    """What the first play does about a held rollout, before anything changes.

    ``word``: the operator's ``-e canary`` (None when not given); ``held``: ``[host, marker]`` of each of the
    play's ``hosts`` that holds a marker (the verdict canary.yml wrote: its ``reason``). Returns ``refusal``
    (the run fails with it, nothing changed) or what to do: ``abort`` (roll the held canary back, end the run)
    or ``promote`` (roll on without a new bake)."""
    refusal = None
    if word is not None and word not in ("promote", "abort"):
        refusal = f"canary must be promote or abort (got {word}); nothing was changed"
    elif held and word is None:
        names = ", ".join(host for host, _ in held)
        reason = (held[0][1] or {}).get("reason") or "no reason recorded"
        refusal = (
            f"The rollout is HOLDING after an Inconclusive canary verdict on {names}: {reason}. "
            f"{RESUME[0].upper()}{RESUME[1:]}; nothing was changed."
        )
    elif word is not None and not held:
        refusal = f"canary={word}: no rollout is held on {', '.join(hosts)}; nothing was changed"
    return {
        "refusal": refusal,
        "abort": refusal is None and word == "abort",
        "promote": refusal is None and word == "promote",
        "held": [host for host, _ in held],
    }
