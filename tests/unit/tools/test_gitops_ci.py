"""CI gates kept in the repository (issue 16, item 3): the plan comment is found by marker AND author;
merge-request plans hold no deploy key and no write-scope token; apply is merge-only; the drift
workflow has a concurrency group of its own; the plan runs the base's code."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "gitlab"
WORKFLOWS = REPO / ".github" / "workflows"


@pytest.fixture
def publish(monkeypatch, tmp_path):
    script = str(REPO / "tools" / "gitops" / "publish")
    loader = importlib.machinery.SourceFileLoader("gitops_publish", script)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    calls = []

    def api(method, path, data=None):
        calls.append((method, path, data))
        if path == "/user":
            return json.loads((FIXTURES / "user.json").read_text())
        return {"iid": 7}

    monkeypatch.setattr(module, "api", api)
    monkeypatch.setattr(module, "paged", lambda path: json.loads((FIXTURES / "mr-notes.json").read_text()))
    monkeypatch.setenv("CI_PROJECT_ID", "17")
    monkeypatch.setenv("CI_MERGE_REQUEST_IID", "35")
    body = tmp_path / "plan.md"
    body.write_text("<!-- sglang-gitops-plan -->\n## SGLang deploy plan: 2 of 8 hosts change\n")
    monkeypatch.setattr("sys.argv", ["publish", "gitlab-note", "--body-file", str(body)])
    return module, calls


def test_gitlab_note_is_found_by_marker_and_author(publish):
    module, calls = publish
    assert module.main() == 0
    writes = [c for c in calls if c[0] != "GET"]
    # The person's note with the marker (619270) is not touched; the bot's own (619281) is updated.
    assert writes == [
        (
            "PUT",
            "/projects/17/merge_requests/35/notes/619281",
            {"body": "<!-- sglang-gitops-plan -->\n## SGLang deploy plan: 2 of 8 hosts change\n"},
        )
    ]


@pytest.mark.parametrize("state, writes", [("merged", 1), ("opened", 0)])
def test_gitlab_apply_note_goes_to_the_merge_request_merged_as_the_commit(
    publish, tmp_path, monkeypatch, state, writes
):
    module, calls = publish
    recorded = json.loads((FIXTURES / "commit-merge-requests.json").read_text())
    # The recorded merge request !35 as recorded (merged) or turned into an open one; an open one beside it.
    merge_requests = [{**recorded[0], "state": state}, {**recorded[0], "iid": 36, "state": "opened"}]
    notes = json.loads((FIXTURES / "mr-notes.json").read_text())
    answers = {
        "/projects/17/repository/commits/c0ffee/merge_requests": merge_requests,
        "/projects/17/merge_requests/35/notes?sort=asc": notes,
    }
    monkeypatch.setattr(module, "paged", lambda path: answers[path])
    body = tmp_path / "apply.md"
    body.write_text("<!-- sglang-gitops-apply -->\n## SGLang deploy applied and verified: `c0ffee`\n")
    argv = ["publish", "gitlab-merged-note", "--body-file", str(body), "--commit", "c0ffee"]
    monkeypatch.setattr("sys.argv", argv)
    monkeypatch.delenv("CI_MERGE_REQUEST_IID")  # a push pipeline of main has none
    assert module.main() == 0
    # The bot has no apply note on !35 yet (its plan note has another marker): one is posted, on !35 only.
    assert [c for c in calls if c[0] != "GET"] == [
        ("POST", "/projects/17/merge_requests/35/notes", {"body": body.read_text()})
    ][:writes]


def test_github_apply_comment_goes_to_the_merged_pull_request_without_a_checkout():
    deploy = load(WORKFLOWS / "deploy.yml")
    comment = deploy["jobs"]["comment"]
    assert comment["needs"] == "apply"
    assert comment["permissions"] == {"contents": "read", "pull-requests": "write"}
    assert "actions/checkout" not in json.dumps(comment)
    download = next(
        s for s in comment["steps"] if str(s.get("uses", "")).startswith("actions/download-artifact@")
    )
    upload = next(
        s
        for s in deploy["jobs"]["apply"]["steps"]
        if str(s.get("uses", "")).startswith("actions/upload-artifact@")
    )
    assert download["with"]["name"] == upload["with"]["name"]
    step = next(s for s in comment["steps"] if "run" in s and "gh api" in s["run"])
    assert (
        step["env"]["MARKER"] == "<!-- sglang-gitops-apply -->"
        and step["env"]["BOT"] == "github-actions[bot]"
    )
    assert "repos/$REPO/commits/$SHA/pulls" in step["run"] and "select(.merged_at != null)" in step["run"]
    assert ".user.login == env.BOT" in step["run"] and "startswith(env.MARKER)" in step["run"]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_github_plan_comment_selects_the_bots_own_comment():
    comment = load(WORKFLOWS / "pull-request.yml")["jobs"]["comment"]
    script = next(s["run"] for s in comment["steps"] if "run" in s and "gh api" in s["run"])
    env = next(s["env"] for s in comment["steps"] if "run" in s and "gh api" in s["run"])
    assert env["BOT"] == "github-actions[bot]"
    assert ".user.login == env.BOT" in script and "startswith(env.MARKER)" in script
    assert "actions/checkout" not in json.dumps(comment)


def test_github_plan_runs_the_bases_code_with_the_prs_data():
    plan = load(WORKFLOWS / "pull-request.yml")["jobs"]["plan"]
    steps = plan["steps"]
    checkouts = [s for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]
    assert checkouts[0]["with"]["ref"] == "${{ github.event.pull_request.base.sha }}"
    assert checkouts[1]["with"]["path"] == ".pr"
    run = "\n".join(s.get("run", "") for s in steps)
    # The PR checkout is only fetched from and removed before any tool runs.
    assert run.index("rm -rf .pr") < run.index("make venv") < run.index("tools/gitops/plan")
    assert "--head refs/sglang-plan/head" in run and "--vault-password-file" not in run
    assert "DEPLOY_SSH_PRIVATE_KEY" not in json.dumps(plan) and "VAULT" not in json.dumps(plan)


def test_github_drift_never_shares_the_deploy_concurrency_group():
    deploy, drift = load(WORKFLOWS / "deploy.yml"), load(WORKFLOWS / "drift.yml")
    assert deploy["concurrency"]["group"] != drift["concurrency"]["group"]
    assert drift["concurrency"]["group"].startswith("sglang-drift-")
    assert deploy["concurrency"]["cancel-in-progress"] is False
    assert drift["concurrency"]["cancel-in-progress"] is False
    assert deploy["jobs"]["apply"]["if"] == "github.ref == 'refs/heads/main' && github.event_name == 'push'"


def test_gitlab_merge_request_plan_holds_no_write_token_and_runs_the_base():
    ci = load(REPO / ".gitlab-ci.yml")
    plan = ci["plan"]
    # Only the plan account's key; the job refuses to run if a write token or the deploy key reached it.
    assert plan["variables"] == {
        "SSH_PRIVATE_KEY": "$PLAN_SSH_PRIVATE_KEY",
        "SSH_KNOWN_HOSTS": "$PLAN_SSH_KNOWN_HOSTS",
    }
    script = plan["script"]
    assert "publish" not in json.dumps(script)
    guard = 'test -z "${GITLAB_API_TOKEN:-}${DEPLOY_SSH_PRIVATE_KEY:-}${ANSIBLE_VAULT_PASSWORD:-}"'
    assert script[0] == guard
    checkout = script.index('git checkout --quiet --force --detach "$CI_MERGE_REQUEST_DIFF_BASE_SHA"')
    assert checkout < script.index("make venv")
    assert plan["artifacts"]["expose_as"] == "plan"
    apply = ci["apply"]
    merge_only = (
        '$CI_COMMIT_BRANCH == $CI_DEFAULT_BRANCH && $CI_COMMIT_REF_PROTECTED == "true" '
        '&& $CI_PIPELINE_SOURCE == "push"'
    )
    assert apply["rules"] == [{"if": merge_only}]
    assert apply["environment"]["name"] == "production"
