#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_canary
short_description: Bake the canary of a rollout in the router's rotation and give its verdict
description:
  - Runs on the router host. Waits O(delay) seconds (the canary's warm-up), scrapes the router's
    C(/engine_metrics) (smg 1.13.0 - every worker's C(/metrics), each sample labelled with the worker's URL),
    waits O(bake) seconds with the canary in rotation, scrapes again, and compares the canary's workers
    with the unchanged ones (module_utils/sglang_canary.py) - error ratio, aborted requests, time to first
    token and inter-token latency (histogram deltas), tokens per verify step (counter deltas), with a
    minimum request count.
  - The verdict is C(Successful), C(Failed) or C(Inconclusive); the module never fails on a verdict (the
    playbook routes it). It fails only when a scrape does not answer or a setting is bad, naming it.
  - With O(prometheus_url), the same two scrapes come from a Prometheus server's federation endpoint
    (C(/federate), the SGLang metrics selected) instead of the router; O(worker_label) names the label that
    carries each worker's URL there.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  router_url:
    description: Base URL of the router on the host the module runs on, e.g. C(http://127.0.0.1:30000).
    type: str
    default: ''
  router_api_key:
    description: Control-plane admin key of the router (a bearer token).
    type: str
    default: ''
  prometheus_url:
    description: A Prometheus server to read instead of the router (its C(/federate)).
    type: str
    default: ''
  worker_label:
    description: The label that names a sample's worker URL.
    type: str
    default: worker_addr
  canary:
    description: Addresses of the canary's workers (the first batch), as the router reaches them.
    type: list
    elements: str
    required: true
  baseline:
    description: Addresses of the workers that still run the old configuration.
    type: list
    elements: str
    required: true
  worker_port:
    description: The workers' port; a worker's URL is C(http://<address>:<worker_port>), as the router's.
    type: int
    default: 30000
  delay:
    description: Seconds before the first scrape (the canary's warm-up is not judged).
    type: float
    default: 60
  bake:
    description: Seconds between the two scrapes.
    type: float
    default: 600
  limits:
    description: Per-figure limits over the defaults (module_utils/sglang_canary.py, DEFAULT_LIMITS).
    type: dict
    default: {}
  min_requests:
    description: Generation requests the canary and the unchanged hosts must each answer over the bake.
    type: int
    default: 200
attributes:
  check_mode:
    support: full
    details: Reads only; in check mode it judges nothing and returns C(verdict=null).
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Bake the canary and give its verdict
  sglang_canary:
    router_url: http://127.0.0.1:30000
    router_api_key: "{{ sglang_router_admin_key }}"
    canary: [10.0.0.11]
    baseline: [10.0.0.12]
    delay: 60
    bake: 600
    limits: {ttft_seconds: 1.3}
  delegate_to: router-1
"""

RETURN = r"""
verdict:
  description: Successful, Failed or Inconclusive (null in check mode).
  returned: always
  type: str
  sample: Failed
reason:
  description: Why, one line per figure past its limit, or the request counts short of the minimum.
  returned: always
  type: str
  sample: "error_ratio 0.2 (unchanged hosts 0; at most the unchanged hosts' + 0.01: failed)"
checks:
  description: Per figure - metric, canary, baseline, limit, rule, bound, result (passed, failed, no_data).
  returned: always
  type: list
  sample: [{"metric": "error_ratio", "canary": 0.2, "baseline": 0.0, "limit": 0.01, "rule": "above",
            "bound": 0.01, "result": "failed"}]
canary:
  description: The canary's request count, figures and per-worker deltas.
  returned: always
  type: dict
  sample: {"requests": 120, "figures": {"error_ratio": 0.2}}
baseline:
  description: The same for the unchanged hosts.
  returned: always
  type: dict
  sample: {"requests": 130, "figures": {"error_ratio": 0.0}}
limits:
  description: The limits in force (the defaults merged with O(limits)).
  returned: always
  type: dict
  sample: {"error_ratio": 0.01, "ttft_seconds": 1.2}
min_requests:
  description: O(min_requests).
  returned: always
  type: int
  sample: 200
seconds:
  description: delay, bake, and what the verdict itself cost (scrapes and computation, in seconds).
  returned: always
  type: dict
  sample: {"delay": 60, "bake": 600, "verdict": 0.04}
"""

import time
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_canary import CanaryError, by_worker, verdict, worker_url
from ansible.module_utils.sglang_http import HttpError, get


def scrape(p):
    """One scrape: {worker URL: its samples} (the router's view, or a Prometheus server's), and the URL."""
    if p["prometheus_url"]:
        query = urllib.parse.urlencode({"match[]": '{__name__=~"sglang:.*"}'})
        url, key = p["prometheus_url"].rstrip("/") + "/federate?" + query, None
    else:
        url, key = p["router_url"].rstrip("/") + "/engine_metrics", p["router_api_key"] or None
    status, body = get(url, key, timeout=30.0, accept="text/plain")
    if status != 200:
        raise HttpError(f"GET {url}: {status} {body[:200].decode(errors='replace')}")
    return by_worker(body.decode(errors="replace"), p["worker_label"]), url


def main():
    module = AnsibleModule(
        argument_spec=dict(
            router_url=dict(type="str", default=""),
            router_api_key=dict(type="str", default="", no_log=True),
            prometheus_url=dict(type="str", default=""),
            worker_label=dict(type="str", default="worker_addr"),
            canary=dict(type="list", elements="str", required=True),
            baseline=dict(type="list", elements="str", required=True),
            worker_port=dict(type="int", default=30000),
            delay=dict(type="float", default=60),
            bake=dict(type="float", default=600),
            limits=dict(type="dict", default={}),
            min_requests=dict(type="int", default=200),
        ),
        required_one_of=[("router_url", "prometheus_url")],
        supports_check_mode=True,
    )
    p = module.params
    try:
        verdict({"c": ([], [])}, {"b": ([], [])}, p["limits"], p["min_requests"])  # the settings, up front
    except CanaryError as exc:
        module.fail_json(msg=str(exc))
    for name in ("delay", "bake"):
        if p[name] < 0:
            module.fail_json(msg=f"sglang_canary_{name} must be >= 0 seconds, got {p[name]}")
    seconds = {"delay": p["delay"], "bake": p["bake"]}
    if module.check_mode:
        module.exit_json(changed=False, verdict=None, reason="check mode: nothing baked", seconds=seconds)
    time.sleep(p["delay"])
    try:
        start = time.monotonic()
        before, url = scrape(p)
        cost = time.monotonic() - start
        time.sleep(p["bake"])
        start = time.monotonic()
        after, _ = scrape(p)
        canary = [worker_url(a, p["worker_port"]) for a in p["canary"]]
        baseline = [worker_url(a, p["worker_port"]) for a in p["baseline"]]
        missing = sorted(w for w in canary + baseline if w not in before or w not in after)
        if missing:
            module.fail_json(
                msg=f"{url} has no metrics of worker(s) {', '.join(missing)} (label {p['worker_label']})"
            )
        result = verdict(
            {w: (before[w], after[w]) for w in canary},
            {w: (before[w], after[w]) for w in baseline},
            p["limits"],
            p["min_requests"],
        )
        seconds["verdict"] = round(cost + time.monotonic() - start, 3)
    except (HttpError, CanaryError) as exc:
        module.fail_json(msg=f"the canary's verdict could not be read: {exc}")
    module.exit_json(changed=False, seconds=seconds, **result)


if __name__ == "__main__":
    main()
