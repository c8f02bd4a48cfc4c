"""Bad inputs are rejected, naming the setting, before the sglang role touches the host.

The corpus (bad_inputs.yml) runs twice, each time in ONE ansible-playbook run:

1. Without a lab host (``controller_run``): one inventory host per case, the case's variables as its
   host variables, every host unreachable by construction (ssh's ProxyCommand is /bin/false: no packet
   leaves the controller). One play runs `include_role: sglang` on all of them in a block/rescue. A case
   rejected there was refused on the CONTROLLER: had any task reached its host, the host would have
   gone unreachable and recorded nothing. Most of the corpus is refused this way.
2. On the shared lab host (``corpus_run``): a generated playbook with one block/rescue per case around
   `include_role: sglang` with the case's variables; after each case one shell round trip reads the unit
   and env file hashes, InvocationID, MainPID and the history length. It runs every case the controller
   did NOT refuse (those need the host's SGLang: its parser's flags and choices), and a representative
   subset of the controller-refused ones (every LAB_SAMPLE_EVERY-th, and every case with a secret to
   hide), which proves on a real host that a controller refusal leaves it exactly as it was.

pytest then asserts per case (one test id per case), for each run the case was part of: rejected, the
message names the setting, no secret shown, and (lab run) nothing on the host changed.
Knob inputs (-e window=abc) are real `deploy.yml -e` runs against the lab host.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CORPUS = yaml.safe_load((HERE / "bad_inputs.yml").read_text(encoding="utf-8"))["cases"]
# Of the cases refused on the controller, these also run on the lab host: every LAB_SAMPLE_EVERY-th
# (in corpus order) and every one with a secret that must not be shown.
LAB_SAMPLE_EVERY = 6

# Knob inputs as an operator types them: extra vars arrive as strings.
KNOB_CASES = [
    ("window=abc", "window"),
    ("window=0", "window"),
    ("window=2048x", "window"),
    ("budget=-1", "budget"),
]


def rescue_tasks() -> list[dict]:
    """The rescue of a case: record the rejection, with the message the operator reads."""
    return [
        {
            "name": "Record the rejection",
            "ansible.builtin.set_fact": {
                "__it_outcome": {
                    "rejected": True,
                    "task": "{{ ansible_failed_task.name | default('') }}",
                    # A loop task fails with "One or more items failed": the
                    # operator reads the failed items' messages, so do we.
                    "msg": (
                        "{{ ([ansible_failed_result.msg | default('') | string]"
                        " + (ansible_failed_result.results | default([])"
                        " | selectattr('failed', 'defined') | selectattr('failed')"
                        " | map(attribute='msg') | map('string') | list)) | join(' | ') }}"
                    ),
                    "result": "{{ ansible_failed_result | to_json }}",
                }
            },
        }
    ]


def corpus_playbook(cases: list[dict], host: str, state_script: str, results: Path) -> list[dict]:
    tasks: list[dict] = []
    for index, case in enumerate(cases):
        tasks.append(
            {
                "name": f"Case {index} {case['id']}",
                "block": [
                    {
                        "name": f"Run the sglang role with case {case['id']}",
                        "ansible.builtin.include_role": {"name": "sglang"},
                        "vars": case["vars"],
                    },
                    {
                        "name": "Record that the role did NOT reject the case",
                        "ansible.builtin.set_fact": {"__it_outcome": {"rejected": False}},
                    },
                ],
                "rescue": rescue_tasks(),
                "always": [
                    {
                        "name": "Read the host state after the case",
                        "ansible.builtin.shell": state_script + "; echo clock=$(date +%s.%N)",
                        "register": "__it_state",
                        "changed_when": False,
                    },
                    {
                        "name": "Collect the outcome",
                        "ansible.builtin.set_fact": {
                            "__it_results": (
                                "{{ __it_results | default([]) + [__it_outcome | combine({'index': "
                                f"{index}, 'state': __it_state.stdout}})] }}}}"
                            )
                        },
                    },
                ],
            }
        )
    tasks.append(
        {
            "name": "Write the outcomes for pytest",
            "ansible.builtin.copy": {"content": "{{ __it_results | to_json }}", "dest": str(results)},
            "delegate_to": "localhost",
        }
    )
    return [{"name": "Bad inputs corpus", "hosts": host, "gather_facts": False, "tasks": tasks}]


def controller_playbook(results: Path) -> list[dict]:
    """One play over every case host: the role in a block/rescue, then the outcomes written for pytest."""
    return [
        {
            "name": "Bad inputs corpus, no host reachable",
            "hosts": "gpu_nodes",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Run the sglang role with the case's variables",
                    "block": [
                        {"name": "Run the sglang role", "ansible.builtin.include_role": {"name": "sglang"}},
                        {
                            "name": "Record that the role did NOT reject the case",
                            "ansible.builtin.set_fact": {"__it_outcome": {"rejected": False}},
                        },
                    ],
                    "rescue": corpus_playbook([{"id": "-", "vars": {}}], "-", "", results)[0]["tasks"][0][
                        "rescue"
                    ],
                },
                {
                    "name": "Write the outcomes for pytest (hosts that went unreachable recorded none)",
                    "ansible.builtin.copy": {
                        "content": (
                            "{% set out = {} %}{% for h in ansible_play_hosts_all %}"
                            "{% set _ = out.update({h: hostvars[h].__it_outcome | default(None)}) %}"
                            "{% endfor %}{{ out | to_json }}"
                        ),
                        "dest": str(results),
                    },
                    "delegate_to": "localhost",
                    "run_once": True,
                },
            ],
        }
    ]


def case_host(index: int) -> str:
    return f"bad-input-{index}"


@pytest.fixture(scope="module")
def controller_run(tmp_path_factory):
    """The whole corpus without a lab host: {"outcomes": {index: outcome}} of the cases whose host was
    never contacted (refused on the controller), and the run's output."""
    work = tmp_path_factory.mktemp("bad-inputs-controller")
    results = work / "results.json"
    playbook = work / "corpus.yml"
    playbook.write_text(json.dumps(controller_playbook(results), indent=1))
    hosts = {
        case_host(i): {
            # Any connection fails before a byte is sent: the host is unreachable, on purpose.
            "ansible_host": f"{case_host(i)}.invalid",
            "ansible_ssh_common_args": "-o ProxyCommand=/bin/false",
            **case["vars"],
        }
        for i, case in enumerate(CORPUS)
    }
    # Inside inventory/lab/ so that the lab group_vars apply, as they do on a lab host.
    inventory = REPO / "inventory" / "lab" / f"it-bad-inputs-{os.getpid()}.yml"
    inventory.write_text(
        yaml.safe_dump(
            {"all": {"children": {"gpu_nodes": {"hosts": hosts}, "lab": {"hosts": dict.fromkeys(hosts)}}}}
        )
    )
    started = time.monotonic()
    try:
        r = subprocess.run(
            [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(playbook)],
            cwd=REPO,
            env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1"),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        inventory.unlink()
    assert results.exists(), (
        f"controller corpus run wrote no results:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"
    )
    by_host = json.loads(results.read_text())
    outcomes = {i: by_host[case_host(i)] for i in range(len(CORPUS)) if by_host.get(case_host(i))}
    print(
        f"bad-input corpus without a host: {len(CORPUS)} cases in {time.monotonic() - started:.1f} s, "
        f"{sum(o['rejected'] for o in outcomes.values())} refused on the controller"
    )
    return {"outcomes": outcomes, "output": r.stdout + r.stderr}


def lab_cases(controller_run) -> list[int]:
    """Corpus indices the lab host run covers: all that the controller did not refuse, and a sample."""
    refused = [i for i in range(len(CORPUS)) if controller_run["outcomes"].get(i, {}).get("rejected")]
    sample = {i for n, i in enumerate(refused) if n % LAB_SAMPLE_EVERY == 0 or CORPUS[i].get("hide")}
    return [i for i in range(len(CORPUS)) if i not in refused or i in sample]


@pytest.fixture(scope="module")
def corpus_run(lab_host, controller_run, tmp_path_factory):
    work = tmp_path_factory.mktemp("bad-inputs")
    results = work / "results.json"
    playbook = work / "corpus.yml"
    indices = lab_cases(controller_run)
    plays = corpus_playbook([CORPUS[i] for i in indices], lab_host.name, lab_host.state_script, results)
    playbook.write_text(json.dumps(plays, indent=1))
    before = lab_host.state()
    history_before = lab_host.history()
    started = time.monotonic()
    r = lab_host.playbook(playbook=playbook, timeout=900)
    elapsed = time.monotonic() - started
    after = lab_host.state()
    assert r.returncode == 0, f"corpus run failed outside the cases:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"
    # Outcomes by corpus index (the playbook numbers the cases it runs 0..n-1).
    outcomes = {indices[o["index"]]: o for o in json.loads(results.read_text())}
    clocks = [float(outcomes[i]["state"].split("clock=")[1]) for i in indices]
    slowest = sorted(
        ((b - a, CORPUS[indices[n + 1]]["id"]) for n, (a, b) in enumerate(zip(clocks, clocks[1:]))),
        reverse=True,
    )[:5]
    print(
        f"bad-input corpus on {lab_host.name}: {len(indices)} of {len(CORPUS)} cases in {elapsed:.1f} s; "
        f"slowest: {slowest}"
    )
    return {
        "before": before,
        "after": after,
        "history_before": history_before,
        "outcomes": outcomes,
        "output": r.stdout + r.stderr,
    }


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 40
    assert len({c["id"] for c in CORPUS}) == len(CORPUS), "case ids must be unique"
    for case in CORPUS:
        assert case["names"], f"{case['id']}: names the setting nowhere"


def assert_rejected_naming_the_setting(case: dict, outcome: dict, output: str, where: str) -> None:
    assert outcome["rejected"], f"{case['id']} ({where}): the role ACCEPTED {case['vars']!r}"
    message = outcome["msg"]
    for name in case["names"]:
        assert name in message, f"{case['id']} ({where}): message does not name {name!r}: {message!r}"
    for secret in case.get("hide", []):
        assert secret not in outcome["result"], f"{case['id']} ({where}): {secret!r} in the failed result"
        assert secret not in output, f"{case['id']} ({where}): {secret!r} in the ansible output"


@pytest.mark.parametrize("index", range(len(CORPUS)), ids=[c["id"] for c in CORPUS])
def test_bad_input_rejected_naming_the_setting(controller_run, corpus_run, lab_host, index):
    case = CORPUS[index]
    runs = 0
    if index in controller_run["outcomes"]:
        # Its host was never contacted (it would have gone unreachable): refused on the controller.
        assert_rejected_naming_the_setting(
            case, controller_run["outcomes"][index], controller_run["output"], "controller"
        )
        runs += 1
    if index in corpus_run["outcomes"]:
        outcome = corpus_run["outcomes"][index]
        assert_rejected_naming_the_setting(case, outcome, corpus_run["output"], lab_host.name)
        before = corpus_run["before"]
        state = lab_host.parse_state(outcome["state"])
        assert state == before, f"{case['id']}: host changed: {before} -> {state}"
        runs += 1
    assert runs, f"{case['id']}: in neither run"


def test_corpus_left_the_host_as_it_was(corpus_run, lab_host):
    assert corpus_run["after"] == corpus_run["before"]
    assert corpus_run["after"].active_state == "active"
    assert lab_host.history() == corpus_run["history_before"]


@pytest.mark.parametrize("knob,setting", KNOB_CASES, ids=[k for k, _ in KNOB_CASES])
def test_bad_knob_rejected_before_any_host(lab_host, knob, setting):
    before = lab_host.state()
    r = lab_host.playbook("-e", knob, timeout=180)
    after = lab_host.state()
    out = r.stdout + r.stderr
    assert r.returncode != 0, f"-e {knob} was accepted:\n{out[-4000:]}"
    assert f"{setting}=" in out and "must be an integer" in out, out[-4000:]
    # Rejected on the controller: no task of the deploy play ran on the host.
    assert "TASK [sglang :" not in out, f"-e {knob} reached the role:\n{out[-4000:]}"
    assert after == before
