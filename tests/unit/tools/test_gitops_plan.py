"""tools/gitops/plan: trusted code, untrusted data (issue 16, item 1), on this repository's real files.

The plan runs the base's code; from the pull request it takes only inventory and variable files,
each checked against the base's role argument specs before it is used (tools/gitops/datacheck.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools" / "gitops"))

import datacheck  # noqa: E402
import gitops  # noqa: E402

SGLANG_VARS = "inventory/lab/group_vars/gpu_nodes/sglang.yml"
LAB_VARS = "inventory/lab/group_vars/lab/lab.yml"
SAMPLE_HOSTS = "inventory/sample/hosts.yml"
WINDOW = "sglang_speculative_draft_window_size"


@pytest.fixture(scope="module")
def specs():
    return datacheck.role_specs(gitops.role_spec_texts(REPO))


def text(rel: str) -> str:
    return (REPO / rel).read_text()


def with_window(value: str) -> str:
    return (
        "\n".join(
            f"{WINDOW}: {value}" if ln.startswith(f"{WINDOW}:") else ln
            for ln in text(SGLANG_VARS).splitlines()
        )
        + "\n"
    )


@pytest.mark.parametrize(
    ("path", "mode", "kind"),
    [
        (SGLANG_VARS, "100644", "data"),
        (SAMPLE_HOSTS, "100644", "data"),
        ("inventory/site/hosts.yml", "100755", "code"),  # executable: ansible would run it as a script
        ("inventory/site/inventory.py", "100644", "code"),
        ("roles/sglang/tasks/main.yml", "100644", "code"),
        ("library/sglang_argv.py", "100644", "code"),
        ("action_plugins/sglang_settings_check.py", "100644", "code"),
        ("ansible.cfg", "100644", "code"),
        ("tools/gitops/gitops.py", "100644", "code"),
        ("templates/plan-comment.md.j2", "100644", "code"),
        ("requirements.yml", "100644", "code"),
        ("deploy.yml", "100644", "code"),
        ("docs/gitops.md", "100644", "inert"),
        ("README.md", "100644", "inert"),
        ("tests/unit/test_x.py", "100644", "inert"),
    ],
)
def test_classify(path, mode, kind):
    assert datacheck.classify(path, mode) == kind


def test_a_changed_window_is_accepted_as_data(specs):
    changes = datacheck.check_file(SGLANG_VARS, with_window("4096"), text(SGLANG_VARS), specs)
    assert changes == [f"group gpu_nodes: {WINDOW}"]


def test_the_base_files_unchanged_are_accepted_even_with_their_templates(specs):
    # lab.yml holds Jinja (lookups of the lab wheelhouse): the base's own values are the base's.
    assert "{{" in text(LAB_VARS)
    assert datacheck.check_file(LAB_VARS, text(LAB_VARS), text(LAB_VARS), specs) == []


def test_a_wrong_type_is_refused_naming_the_setting(specs):
    with pytest.raises(datacheck.DataError, match=rf"{SGLANG_VARS}: group gpu_nodes: {WINDOW}: .*int"):
        datacheck.check_file(SGLANG_VARS, with_window("wide"), text(SGLANG_VARS), specs)


def test_a_misspelt_role_variable_is_refused_with_the_closest_option(specs):
    head = text(SGLANG_VARS) + "sglang_speculative_draft_windw_size: 4096\n"
    with pytest.raises(
        datacheck.DataError,
        match=rf"sglang_speculative_draft_windw_size is not an option of the role sglang .*"
        rf"did you mean {WINDOW}\?",
    ):
        datacheck.check_file(SGLANG_VARS, head, text(SGLANG_VARS), specs)


def test_a_template_in_new_data_is_refused(specs):
    head = with_window("\"{{ lookup('ansible.builtin.pipe', 'id > /tmp/pwned') | int }}\"")
    jinja = f"{WINDOW} holds a Jinja template.*code that runs on the controller"
    with pytest.raises(datacheck.DataError, match=jinja):
        datacheck.check_file(SGLANG_VARS, head, text(SGLANG_VARS), specs)


def test_a_connection_setting_is_refused(specs):
    head = text(SAMPLE_HOSTS).replace(
        "ansible_become: true", "ansible_become: true\n          ansible_ssh_common_args: -o ProxyCommand=sh"
    )
    refused = "host gpu-node-01: ansible_ssh_common_args is a connection or privilege setting"
    with pytest.raises(datacheck.DataError, match=refused):
        datacheck.check_file(SAMPLE_HOSTS, head, text(SAMPLE_HOSTS), specs)
    # A new host with its address is data.
    added = text(SAMPLE_HOSTS).replace(
        "      hosts:\n", "      hosts:\n        gpu-node-09:\n          ansible_host: 10.0.0.9\n"
    )
    assert datacheck.check_file(SAMPLE_HOSTS, added, text(SAMPLE_HOSTS), specs) == [
        "host gpu-node-09 added",
        "host gpu-node-09: ansible_host",
    ]


def test_an_inventory_plugin_and_unknown_tags_are_refused(specs):
    with pytest.raises(datacheck.DataError, match="plugin: script.*inventory plugin"):
        datacheck.check_file("inventory/site/hosts.yml", "plugin: script\n", None, specs)
    with pytest.raises(datacheck.DataError, match="not plain YAML data"):
        datacheck.check_file(SGLANG_VARS, "sglang_port: !!python/object/apply:os.system [id]\n", None, specs)
    # An encrypted value is data (opaque: the plan never decrypts it).
    vaulted = "sglang_api_key: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n"
    assert datacheck.check_file(SGLANG_VARS, vaulted, None, specs) == ["group gpu_nodes: sglang_api_key"]


def sh(*argv, cwd):
    r = subprocess.run([str(a) for a in argv], cwd=cwd, check=True, capture_output=True, text=True)
    return r.stdout.strip()


def commit_all(repo: Path, msg: str) -> str:
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=t", "-c", "user.email=t@lab.invalid", "commit", "--quiet", "-m", msg, cwd=repo)
    return sh("git", "rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def clone(tmp_path):
    repo = tmp_path / "repo"
    sh("git", "clone", "--quiet", "--no-hardlinks", REPO, repo, cwd=tmp_path)
    return repo


def test_the_tree_has_the_bases_code_and_the_pull_requests_data(clone, tmp_path):
    base = sh("git", "rev-parse", "HEAD", cwd=clone)
    (clone / SGLANG_VARS).write_text(with_window("4096"))
    task = clone / "roles" / "sglang" / "tasks" / "main.yml"
    task.write_text(
        task.read_text() + "\n- name: Not in any plan\n  ansible.builtin.copy:\n"
        "    content: x\n    dest: /tmp/pwned\n    mode: '0644'\n  check_mode: false\n"
    )
    exe = clone / "inventory" / "sample" / "group_vars" / "gpu_nodes" / "gpu.yml"
    exe.chmod(0o755)
    head = commit_all(clone, "data, code and an executable inventory file")
    tree = tmp_path / "tree"
    tree.mkdir()
    gitops.materialise(clone, base, tree)
    trust = gitops.pr_data(clone, base, head, tree)
    assert trust["errors"] == []
    assert trust["data"] == [f"M  {SGLANG_VARS}"]
    assert trust["code"] == [
        "M  inventory/sample/group_vars/gpu_nodes/gpu.yml",
        "M  roles/sglang/tasks/main.yml",
    ]
    assert trust["data_changes"] == [f"{SGLANG_VARS}: group gpu_nodes: {WINDOW}"]
    assert f"{WINDOW}: 4096" in (tree / SGLANG_VARS).read_text()
    base_task = sh("git", "show", f"{base}:roles/sglang/tasks/main.yml", cwd=clone)
    assert (tree / "roles/sglang/tasks/main.yml").read_text().strip() == base_task
    assert (tree / "inventory/sample/group_vars/gpu_nodes/gpu.yml").stat().st_mode & 0o111 == 0


def test_refused_data_stops_the_plan_before_any_host(clone, tmp_path):
    (clone / SGLANG_VARS).write_text(with_window("\"{{ lookup('ansible.builtin.env', 'HOME') }}\""))
    head = commit_all(clone, "a template in data")
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable,
            REPO / "tools" / "gitops" / "plan",
            "--repo",
            clone,
            "--inventory",
            SAMPLE_HOSTS,
            "--base",
            "HEAD~1",
            "--head",
            head,
            "--out",
            out,
            "--ansible-playbook",
            "/bin/false",
        ],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "the pull request's data was refused (nothing was planned)" in r.stderr
    md = (out / "plan.md").read_text()
    assert md.startswith(gitops.PLAN_MARKER) and "REFUSED" in md and f"{WINDOW} holds a Jinja template" in md
    assert not (out / "plan-ansible.log").exists()


def test_the_plans_ansible_gets_no_secret_from_the_environment(monkeypatch, tmp_path):
    sentinel = "sentinel-plan-env-3b9e"
    for name in (
        "GITLAB_API_TOKEN",
        "GITHUB_TOKEN",
        "ANSIBLE_VAULT_PASSWORD_FILE",
        "DEPLOY_SSH_PRIVATE_KEY",
        "SGLANG_API_KEY",
        "CI_JOB_TOKEN",
    ):
        monkeypatch.setenv(name, sentinel)
    monkeypatch.setenv("ANSIBLE_PRIVATE_KEY_FILE", "/run/plan/id")
    env = gitops.ansible_env(REPO, tmp_path, scrub=True)
    assert sentinel not in "\n".join(f"{k}={v}" for k, v in env.items())
    assert env["ANSIBLE_PRIVATE_KEY_FILE"] == "/run/plan/id" and env["PATH"]
    # apply and drift keep their environment (the deploy needs its vault settings).
    assert gitops.ansible_env(REPO, tmp_path)["ANSIBLE_VAULT_PASSWORD_FILE"] == sentinel


def test_the_plan_connects_as_the_plan_account_without_become(tmp_path):
    # Extra variables: the highest precedence, so no inventory (a pull request's data included) can make
    # the plan connect as root or with become.
    args = type("Args", (), {"plan_user": None, "private_key": None})
    assert gitops.plan_connection(args) == {"ansible_user": "sglang-plan", "ansible_become": False}
    key = tmp_path / "plan_key"
    key.write_text("not a real key\n")
    args.plan_user, args.private_key = "site-plan", str(key)
    assert gitops.plan_connection(args) == {
        "ansible_user": "site-plan",
        "ansible_become": False,
        "ansible_ssh_private_key_file": str(key),
    }


@pytest.mark.parametrize("user", ["root", "Bad User", "-o", "x" * 40])
def test_root_or_a_bad_plan_user_is_refused_naming_the_flag(user):
    args = type("Args", (), {"plan_user": user, "private_key": None})
    with pytest.raises(gitops.GitopsError, match=r"--plan-user .*not a non-root account name"):
        gitops.plan_connection(args)


def test_a_missing_plan_key_is_refused_naming_the_flag(tmp_path):
    args = type("Args", (), {"plan_user": None, "private_key": str(tmp_path / "none")})
    with pytest.raises(gitops.GitopsError, match=r"--private-key .*: no such file"):
        gitops.plan_connection(args)
