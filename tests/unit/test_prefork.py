"""callback_plugins/sglang_prefork.py: the workers ansible-playbook forks start with the Jinja filters and
tests loaded and the parent's objects frozen (gc.freeze), and only when the callback is enabled
(ansible.cfg)."""

from __future__ import annotations

import json

from conftest import REPO, run_playbook

# A test-only action plugin: reports, from inside the forked worker (a task without arguments or
# conditions: nothing templated a filter in it yet), how many inherited objects are frozen and how many
# filters and tests the loaders hold.
ACTION = """
import gc
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import filter_loader, test_loader


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        return {"changed": False, "frozen": gc.get_freeze_count(),
                "filters": len(filter_loader._cached_non_collection_wrappers),
                "tests": len(test_loader._cached_non_collection_wrappers)}
"""
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Count the frozen objects and the loaded Jinja plugins in the worker
      in_worker:
"""


def seen_in_worker(tmp_path, **env):
    (tmp_path / "action").mkdir()
    (tmp_path / "action" / "in_worker.py").write_text(ACTION)
    (tmp_path / "play.yml").write_text(PLAY)
    env["ANSIBLE_ACTION_PLUGINS"] = f"{tmp_path / 'action'}:{REPO / 'action_plugins'}"
    done = run_playbook("-i", "localhost,", tmp_path / "play.yml", json_output=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_the_workers_inherit_the_jinja_plugins_and_the_parents_objects_frozen(tmp_path):
    assert "sglang_prefork" in (REPO / "ansible.cfg").read_text()
    seen = seen_in_worker(tmp_path)
    # ansible-core's own objects, the inventory and the play: tens of thousands.
    assert seen["frozen"] > 10_000
    # ansible-core's filters (core, mathstuff, urls, ...) and tests, each under its short and its
    # ansible.builtin name: over a hundred each.
    assert seen["filters"] > 100 and seen["tests"] > 50


def test_without_the_callback_nothing_is_frozen_or_loaded(tmp_path):
    seen = seen_in_worker(tmp_path, ANSIBLE_CALLBACKS_ENABLED="sglang_ansiballz_cache")
    assert (seen["frozen"], seen["filters"], seen["tests"]) == (0, 0, 0)
