"""roles/sglang/lookup_plugins/sglang_template.py renders exactly what ansible.builtin.template's lookup
renders (the role's files are compared by sha256 with the host's, so one byte of difference would restart
every server), and the task's variables stay as they were."""

from __future__ import annotations

import json

from conftest import REPO, run_playbook

# What the role's templates use: ansible_managed | comment, a variable built from another one, a
# dict and a list, a template_* variable, an include found in the role's templates, a `set` that shadows a
# task variable, trim_blocks, a backslash, and an extra template_vars entry.
TEMPLATE = """{{ ansible_managed | comment }}
# {{ template_path | basename }} for {{ inventory_hostname }}
{% set shadowed = 'inside' %}
ExecStart={{ argv | join(' ') }} --window {{ window }}
{% for key, value in env | dictsort %}
{{ key }}={{ value }}
{% endfor %}
{% include 'part.j2' %}
Escaped=a\\tb {{ shadowed }} {{ extra | default('no extra') }}
{{ argv.append('--mutated') }}{{ env.update({'C': '3'}) }}
"""
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: t
"""
TASKS = """
- name: Render with both lookups
  ansible.builtin.set_fact:
    builtin: "{{ lookup('ansible.builtin.template', 'main.j2', template_vars={'extra': 'x'}) }}"
    ours: "{{ lookup('sglang_template', 'main.j2', template_vars={'extra': 'x'}) }}"
    builtin_plain: "{{ lookup('ansible.builtin.template', 'main.j2') }}"
    ours_plain: "{{ lookup('sglang_template', 'main.j2') }}"
- name: Show them and the variable the template shadowed
  ansible.builtin.debug:
    msg: "{{ {'builtin': builtin, 'ours': ours, 'builtin_plain': builtin_plain, 'ours_plain': ours_plain,
              'shadowed': shadowed, 'argv': argv, 'env': env} }}"
"""
VARS = """
shadowed: outside
window: "{{ base_window * 2 }}"
base_window: 1024
argv: [python, -m, sglang.launch_server, --speculative-algorithm, DFLASH]
env: {B: "2", A: "1"}
"""


def rendered(tmp_path, extra_vars: str = "") -> dict:
    role = tmp_path / "roles" / "t"
    for sub, name, text in (
        ("templates", "main.j2", TEMPLATE),
        ("templates", "part.j2", "Part={{ window }}\n"),
        ("tasks", "main.yml", TASKS),
        ("vars", "main.yml", VARS + extra_vars),
    ):
        (role / sub).mkdir(parents=True, exist_ok=True)
        (role / sub / name).write_text(text)
    (tmp_path / "play.yml").write_text(PLAY)
    env = {
        "ANSIBLE_ROLES_PATH": str(tmp_path / "roles"),
        "ANSIBLE_LOOKUP_PLUGINS": str(REPO / "roles" / "sglang" / "lookup_plugins"),
    }
    done = run_playbook("-i", "localhost,", tmp_path / "play.yml", json_output=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["plays"][0]["tasks"][1]["hosts"]["localhost"]["msg"]


def test_the_same_text_as_the_builtin_lookup(tmp_path):
    out = rendered(tmp_path)
    assert out["ours"] == out["builtin"]
    assert out["ours_plain"] == out["builtin_plain"]
    # What the comparison covers really is in the text: ansible_managed, the template_* variable, the
    # variable built from another, the dict in order, the include, the backslash, template_vars.
    assert out["ours"].startswith("#\n# Ansible managed")
    assert "# main.j2 for localhost\nExecStart=python -m sglang.launch_server" in out["ours"]
    # (Jinja drops the included file's last newline.)
    assert "--window 2048\nA=1\nB=2\nPart=2048Escaped=a\\tb inside x\n" in out["ours"]
    assert "Escaped=a\\tb inside no extra\n" in out["ours_plain"]
    # The template's `set` bound its own name only, and its calls that would change a list or a dict in
    # place changed no task variable (ansible-core hands a template copies; nothing is shared either).
    assert out["shadowed"] == "outside"
    assert out["argv"][-1] == "DFLASH" and out["env"] == {"A": "1", "B": "2"}


def test_ansible_managed_set_by_the_user_is_kept(tmp_path):
    out = rendered(tmp_path, "ansible_managed: managed by the sglang role\n")
    assert out["ours"] == out["builtin"]
    assert out["ours"].startswith("#\n# managed by the sglang role\n#\n")
