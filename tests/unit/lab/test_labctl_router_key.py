"""lab/labctl makes the key a lab with routers needs, as it makes its SSH key: the routers' admin key
(sglang_router_admin_key, required by the router role) in .lab/ (0600, made once, not in git), and the
inventory it writes gives it to the routers group, so `deploy.yml` runs on a lab inventory as written
(host-free: the functions, and Ansible reading the written inventory)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ANSIBLE = REPO / ".venv" / "bin" / "ansible"


def load_labctl():
    loader = importlib.machinery.SourceFileLoader("labctl_under_test", str(REPO / "lab" / "labctl"))
    spec = importlib.util.spec_from_loader("labctl_under_test", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


labctl = load_labctl()


def test_the_admin_key_is_made_once_root_only_and_kept_out_of_git(tmp_path, monkeypatch):
    path = tmp_path / ".lab" / "router_admin_key"
    monkeypatch.setattr(labctl, "ROUTER_ADMIN_KEY", str(path))
    assert labctl.ensure_router_admin_key() == str(path)
    key = path.read_text()
    # What the router role's preflight requires: not empty, no whitespace or colon.
    assert re.fullmatch(r"[0-9a-f]{64}\n", key)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    labctl.ensure_router_admin_key()
    assert path.read_text() == key  # made once: a redeploy of the router keeps its key
    # The real one is under the repository's .lab/, which git ignores.
    relative = os.path.relpath(load_labctl().ROUTER_ADMIN_KEY, REPO)
    assert relative == os.path.join(".lab", "router_admin_key")
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", relative], check=False)
    assert ignored.returncode == 0


@pytest.mark.skipif(not ANSIBLE.exists(), reason="needs the controller toolchain (.venv)")
def test_the_written_inventory_gives_the_routers_their_admin_key(tmp_path, monkeypatch):
    path = tmp_path / ".lab" / "router_admin_key"
    monkeypatch.setattr(labctl, "ROUTER_ADMIN_KEY", str(path))
    labctl.ensure_router_admin_key()
    key = path.read_text().strip()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(labctl.render_inventory(["lab5", "lab6", "lab7"], "test", ["lab7"], True))
    # What the router role reads on the router, and what a GPU host's leave reads (hostvars of the router).
    # debug runs on the controller: no host is reached.
    r = subprocess.run(
        [str(ANSIBLE), "-i", str(inventory), "lab5,lab7", "-m", "ansible.builtin.debug"]
        + [
            "-a",
            "msg={{ [sglang_router_admin_key | default('UNSET'),"
            " hostvars['lab7'].sglang_router_admin_key] }}",
        ],
        cwd=REPO,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
        | {"ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    hosts = json.loads(r.stdout)["plays"][0]["tasks"][0]["hosts"]
    assert hosts["lab7"]["msg"] == [key, key]
    assert hosts["lab5"]["msg"] == ["UNSET", key]  # a GPU host has no admin key of its own
    # Without routers there is no router key to give.
    assert "sglang_router_admin_key" not in labctl.render_inventory(["lab5"], "test")
