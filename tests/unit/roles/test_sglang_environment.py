"""What the sglang role writes into the service environment and asserts from the running process
(issue 18, items 6 and 9).

ONE controller-only ``ansible-playbook`` run (``ansible_connection: local``, nothing deployed): the role's
own controller checks (``tasks/preflight.yml``, included with ``public: true`` so its variables stay
visible), then the environment file and the unit rendered from the role's templates with the role's
variables, and ``__sglang_expected_env`` (what the running-arguments assertion gets as ``expected_env``:
``__sglang_running_args`` in ``vars/main.yml``, built by module_utils/sglang_expectations.py, compared with
``/proc/<MainPID>/environ``). ``sglang_argv``'s result is stood in for.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml
from conftest import REPO, run_playbook

SENTINEL = "sk-sentinel-env-18"
# What the running-arguments assertion gets as expected_env (vars/main.yml: __sglang_running_args, passed by
# tasks/verify.yml and tasks/apply.yml, and built the same way in the host probe's own proof, main.yml).
TASKS = REPO / "roles" / "sglang" / "tasks"
ROLE_VARS = yaml.safe_load((REPO / "roles" / "sglang" / "vars" / "main.yml").read_text())
VERIFY = yaml.safe_load((TASKS / "verify.yml").read_text())
PLAY = [
    {
        "name": "Render what the sglang role writes and asserts for the service environment",
        "hosts": "gpu_nodes",
        "gather_facts": False,
        "tasks": [
            {
                "name": "Run the role's controller-side checks (and keep its variables)",
                "ansible.builtin.include_role": {
                    "name": "sglang",
                    "tasks_from": "preflight.yml",
                    "public": True,
                },
            },
            {
                "name": "Stand in for sglang_argv (a DDTree build: top-k from the environment)",
                "ansible.builtin.set_fact": {
                    "__sglang_argv": {
                        "argv": [
                            "--model-path",
                            "/srv/m",
                            "--served-model-name",
                            "${SGLANG_API_KEY}",
                            "--api-key",
                            "${SGLANG_API_KEY}",
                        ],
                        "secret_positions": [5],
                        "env": {"SGLANG_DDTREE_MAX_TOPK": "4"},
                        "managed": {"model_path": "/srv/m"},
                        "runner_lines": {},
                        "flag_dests": {},
                        "version": "0.5.23",
                    },
                    # ... and for the probe's release (the unit's launcher names its python).
                    "__sglang_probe": {
                        "release": {
                            "key": "0.5.23-py3.11-0123456789ab",
                            "path": "/opt/sglang/releases/0.5.23-py3.11-0123456789ab",
                            "python_version": "3.11",
                        }
                    },
                },
            },
            {
                "name": "Show what the role renders",
                "ansible.builtin.debug": {
                    "msg": {
                        "env_file": "{{ lookup('ansible.builtin.template', repo ~ "
                        "'/roles/sglang/templates/etc/sglang/sglang.env.j2') }}",
                        "unit": "{{ lookup('ansible.builtin.template', repo ~ "
                        "'/roles/sglang/templates/etc/systemd/system/sglang.service.j2') }}",
                        # what the running-arguments assertion gets
                        "expected_env": "{{ __sglang_running_args.expected_env }}",
                    }
                },
            },
        ],
    }
]
HOSTS = {
    "nccl-on": {"nvidia_nccl_p2p_disable": True},
    "nccl-on-string": {"nvidia_nccl_p2p_disable": "true"},
    "nccl-on-and-set": {"nvidia_nccl_p2p_disable": True, "sglang_environment": {"NCCL_P2P_DISABLE": "1"}},
    "nccl-off": {"nvidia_nccl_p2p_disable": False},
    "nccl-undecided": {},
    "nccl-contradicted": {"nvidia_nccl_p2p_disable": True, "sglang_environment": {"NCCL_P2P_DISABLE": "0"}},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("role-env")
    hosts = {
        name: dict(v, ansible_connection="local", ansible_python_interpreter=sys.executable)
        for name, v in HOSTS.items()
    }
    inventory = tmp / "inventory.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {"repo": str(REPO), "sglang_api_key": SENTINEL},
                    "children": {"gpu_nodes": {"hosts": hosts}},
                }
            }
        )
    )
    play = tmp / "play.yml"
    play.write_text(yaml.safe_dump(PLAY, sort_keys=False))
    done = run_playbook("-i", inventory, play, json_output=True)
    # rc 2: the contradicting host fails (on purpose); the output is one JSON document either way.
    assert done.returncode in (0, 2), done.stdout[-4000:] + done.stderr[-2000:]
    tasks = json.loads(done.stdout)["plays"][0]["tasks"]
    out = {}
    for task in tasks:
        for host, result in task["hosts"].items():
            if result.get("failed"):
                out[host] = {"failed": result["msg"]}
            elif task["task"]["name"] == "Show what the role renders":
                out[host] = result["msg"]
    return out


def env_lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("host", ["nccl-on", "nccl-on-string", "nccl-on-and-set"])
def test_the_nccl_decision_reaches_the_env_file_and_the_assertion(rendered, host):
    """nvidia_nccl_p2p_disable: true -> NCCL_P2P_DISABLE=1 in the service's EnvironmentFile, and
    sglang_running_args is asked to find it in the running process's environment."""
    got = rendered[host]
    assert 'NCCL_P2P_DISABLE="1"' in env_lines(got["env_file"])
    assert got["expected_env"] == {"NCCL_P2P_DISABLE": "1", "SGLANG_DDTREE_MAX_TOPK": "4"}


@pytest.mark.parametrize("host", ["nccl-off", "nccl-undecided"])
def test_without_the_decision_nothing_is_set(rendered, host):
    got = rendered[host]
    assert not [line for line in env_lines(got["env_file"]) if line.startswith("NCCL_")]
    assert got["expected_env"] == {"SGLANG_DDTREE_MAX_TOPK": "4"}


def test_a_contradicting_sglang_environment_is_refused_naming_both(rendered):
    msg = rendered["nccl-contradicted"]["failed"]
    assert 'sglang_environment.NCCL_P2P_DISABLE="0" contradicts nvidia_nccl_p2p_disable: true' in msg


def test_only_the_api_key_reference_is_substituted_in_the_unit(rendered):
    """Issue 18, item 9: the served name ${SGLANG_API_KEY} (a user value) is escaped; the --api-key
    value (secret_positions of sglang_argv, shifted by the launcher) is systemd's to substitute."""
    unit = rendered["nccl-on"]["unit"]
    assert '"--served-model-name" "$${SGLANG_API_KEY}"' in unit
    assert '"--api-key" "${SGLANG_API_KEY}"' in unit
    assert SENTINEL not in unit


def test_execstart_names_the_release_not_sglang_venv(rendered):
    """Issue 14 item 1: the default launcher "{{ sglang_venv }}/bin/python" names the release's python, which
    runs the redacting launcher and `sglang serve` (issue 37 item 7)."""
    unit = rendered["nccl-on"]["unit"]
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    release = "/opt/sglang/releases/0.5.23-py3.11-0123456789ab"
    launch = "/usr/local/lib/sglang-deploy/sglang_launch.py"
    assert line.startswith(f'ExecStart="{release}/bin/python" "{launch}" "serve"'), line
    assert "/opt/sglang/venv" not in unit


def test_the_verification_passes_that_environment():
    """The running-arguments assertion (after a restart and on every run; check mode's own task too), the
    known-good record the rollback verifies with, and the pull-request plan all compare
    /proc/<MainPID>/environ with __sglang_expected_env."""
    wanted = "{{ __sglang_expected_env }}"
    assert ROLE_VARS["__sglang_expected_env"] == "{{ __sglang_running_args.expected_env }}"
    assert ROLE_VARS["__sglang_running_args"] == (
        "{{ __sglang_argv | sglang_running_expectations(__sglang_running_base, __sglang_release_path) }}"
    )
    # The host probe's own proof builds it from the same base (main.yml; sglang_host_probe's prove).
    main = yaml.safe_load((TASKS / "main.yml").read_text())
    probe = next(t for t in main if "block" in t)["block"][0]
    assert probe["sglang_host_probe"]["prove"] == "{{ __sglang_probe_prove }}"
    assert ROLE_VARS["__sglang_probe_prove"]["base"] == "{{ __sglang_running_base }}"
    # Every call of the assertion in verify.yml passes that one dict or its expected_env.
    calls = 0
    for task in VERIFY:
        if "sglang_verified_restart" in task:
            assert task["sglang_verified_restart"]["running_args"] == "{{ __sglang_running_args }}"
            calls += 1
        if "sglang_running_args" in task:
            assert task["sglang_running_args"]["expected_env"] == "{{ __sglang_running_args.expected_env }}"
            calls += 1
    assert calls == 2, "the proof and the check-mode comparison (verify.yml)"
    apply = yaml.safe_load((TASKS / "apply.yml").read_text())
    restart = next(
        t for t in apply if "block" in t and any("sglang_verified_restart" in b for b in t["block"])
    )
    call = next(b for b in restart["block"] if "sglang_verified_restart" in b)["sglang_verified_restart"]
    assert call["running_args"] == "{{ __sglang_running_args }}"
    # The deploy is recorded by that same call (record): the known-good metadata and the history entry.
    assert call["record"] == "{{ __sglang_record }}"
    assert ROLE_VARS["__sglang_record"]["known_good"]["meta"]["expected_env"] == wanted
    assert ROLE_VARS["__sglang_record"]["entry"]["env"] == wanted
    plan = (REPO / "playbooks" / "plan.yml").read_text()
    assert f'expected_env: "{wanted}"' in plan
