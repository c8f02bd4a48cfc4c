"""Bad inputs are rejected, naming the setting, before the sglang role touches the host.

The corpus (bad_inputs.yml) runs in ONE ansible-playbook run against the shared lab host: a generated
playbook with one block/rescue per case around `include_role: sglang` with the case's variables; after
each case one shell round trip reads the unit and env file hashes, InvocationID, MainPID and the
history length. pytest then asserts per case (one test id per case): rejected, the message names the
setting, nothing on the host changed. Knob inputs (-e window=abc) are real `deploy.yml -e` runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

HERE = Path(__file__).resolve().parent
CORPUS = yaml.safe_load((HERE / "bad_inputs.yml").read_text(encoding="utf-8"))["cases"]

# Knob inputs as an operator types them: extra vars arrive as strings.
KNOB_CASES = [
    ("window=abc", "window"),
    ("window=0", "window"),
    ("window=2048x", "window"),
    ("budget=-1", "budget"),
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
                "rescue": [
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
                ],
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


@pytest.fixture(scope="module")
def corpus_run(lab_host, tmp_path_factory):
    work = tmp_path_factory.mktemp("bad-inputs")
    results = work / "results.json"
    playbook = work / "corpus.yml"
    plays = corpus_playbook(CORPUS, lab_host.name, lab_host.state_script, results)
    playbook.write_text(json.dumps(plays, indent=1))
    before = lab_host.state()
    history_before = lab_host.history()
    started = time.monotonic()
    r = lab_host.playbook(playbook=playbook, timeout=900)
    elapsed = time.monotonic() - started
    after = lab_host.state()
    assert r.returncode == 0, f"corpus run failed outside the cases:\n{r.stdout[-8000:]}\n{r.stderr[-3000:]}"
    outcomes = {o["index"]: o for o in json.loads(results.read_text())}
    clocks = [float(outcomes[i]["state"].split("clock=")[1]) for i in range(len(CORPUS))]
    slowest = sorted(
        ((b - a, CORPUS[i + 1]["id"]) for i, (a, b) in enumerate(zip(clocks, clocks[1:]))), reverse=True
    )[:5]
    print(f"bad-input corpus: {len(CORPUS)} cases in {elapsed:.1f} s; slowest: {slowest}")
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


@pytest.mark.parametrize("index", range(len(CORPUS)), ids=[c["id"] for c in CORPUS])
def test_bad_input_rejected_naming_the_setting(corpus_run, lab_host, index):
    case = CORPUS[index]
    outcome = corpus_run["outcomes"][index]
    before = corpus_run["before"]
    assert outcome["rejected"], f"{case['id']}: the role ACCEPTED {case['vars']!r}"
    message = outcome["msg"]
    for name in case["names"]:
        assert name in message, f"{case['id']}: message does not name {name!r}: {message!r}"
    for secret in case.get("hide", []):
        assert secret not in outcome["result"], f"{case['id']}: {secret!r} in the failed result"
        assert secret not in corpus_run["output"], f"{case['id']}: {secret!r} in the ansible output"
    state = lab_host.parse_state(outcome["state"])
    assert state == before, f"{case['id']}: host changed: {before} -> {state}"


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
