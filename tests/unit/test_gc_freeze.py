"""callback_plugins/sglang_gc_freeze.py: the workers ansible-playbook forks start with the parent's objects
frozen (gc.freeze), and only when the callback is enabled (ansible.cfg)."""

from __future__ import annotations

import json

from conftest import REPO, run_playbook

# A test-only action plugin: reports, from inside the forked worker, how many inherited objects are frozen.
ACTION = """
import gc
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        return {"changed": False, "frozen": gc.get_freeze_count()}
"""
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Count the frozen objects in the worker
      frozen_count:
"""


def frozen_in_worker(tmp_path, **env):
    (tmp_path / "action").mkdir()
    (tmp_path / "action" / "frozen_count.py").write_text(ACTION)
    (tmp_path / "play.yml").write_text(PLAY)
    env["ANSIBLE_ACTION_PLUGINS"] = f"{tmp_path / 'action'}:{REPO / 'action_plugins'}"
    done = run_playbook("-i", "localhost,", tmp_path / "play.yml", json_output=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    return result["frozen"]


def test_the_workers_inherit_the_parents_objects_frozen(tmp_path):
    assert "sglang_gc_freeze" in (REPO / "ansible.cfg").read_text()
    # ansible-core's own objects, the inventory and the play: tens of thousands.
    assert frozen_in_worker(tmp_path) > 10_000


def test_without_the_callback_nothing_is_frozen(tmp_path):
    assert frozen_in_worker(tmp_path, ANSIBLE_CALLBACKS_ENABLED="sglang_ansiballz_cache") == 0
