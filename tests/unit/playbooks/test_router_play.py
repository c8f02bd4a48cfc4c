"""deploy.yml's router play (playbooks/router.yml): the hosts of group `routers`, and none at all, without a
warning, when the inventory has no such group (a deploy without a router is as before). Runs
`ansible-playbook --list-hosts` on the controller: no host is contacted."""

from __future__ import annotations

import re

import yaml
from conftest import run_playbook

ROUTER_PLAY = "Deploy the SGLang router and verify it"


def list_hosts(tmp_path, groups: dict) -> tuple[str, list[str]]:
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": groups}}))
    done = run_playbook("-i", inventory, "--list-hosts", "deploy.yml", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    plays = re.split(r"\n\s*play #\d+ ", done.stdout)
    # One router play, the last: the router starts after the SGLang play deployed the workers.
    assert [i for i, p in enumerate(plays) if f"): {ROUTER_PLAY}" in p] == [len(plays) - 1], done.stdout
    hosts = re.search(r"hosts \((\d+)\):\n((?:\s+\S+\n?)*)", plays[-1])
    assert hosts, plays[-1]
    names = hosts.group(2).split()
    assert int(hosts.group(1)) == len(names)
    return done.stdout + done.stderr, names


def test_without_a_routers_group_the_router_play_has_no_host_and_no_warning(tmp_path):
    output, hosts = list_hosts(tmp_path, {"gpu_nodes": {"hosts": {"gpu-1": {"ansible_host": "192.0.2.1"}}}})
    assert hosts == []
    assert "WARNING" not in output


def test_the_router_play_runs_on_the_hosts_of_group_routers(tmp_path):
    output, hosts = list_hosts(
        tmp_path,
        {
            "gpu_nodes": {
                "hosts": {"gpu-1": {"ansible_host": "192.0.2.1"}, "gpu-2": {"ansible_host": "192.0.2.3"}}
            },
            "routers": {"hosts": {"router-1": {"ansible_host": "192.0.2.2"}, "gpu-2": {}}},
        },
    )
    assert sorted(hosts) == ["gpu-2", "router-1"]
    assert "WARNING" not in output
