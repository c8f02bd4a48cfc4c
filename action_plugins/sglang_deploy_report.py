# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write one host's deploy report on the controller and show its summary, in the controller process.

Documented in library/sglang_deploy_report.py.

The report used to be a ``file`` and a ``copy`` task delegated to localhost: two module runs, each a Python
process forked and fed on the controller, per host and per run (~2 s a host on a loaded 2-core controller,
paid by every no-change run and by every host of a rollout). Here the directory is made and the JSON
written atomically (a temporary file in the same directory, then rename) by the plugin itself.

The summary (templates/deploy_summary.j2) used to be a task of its own, ``debug`` with a template lookup:
one more worker per host, and the lookup deep-copies every task variable to render a template that reads
three (docs/ARCHITECTURE.md, "What a run costs the controller"). Here it is rendered in the same task,
with only the variables given in ``summary_vars``, the way the template lookup renders (trim_blocks,
backslashes not escaped), then ``| trim | split('\\n')`` as the debug task did: the same lines.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

# The task arguments, as library/sglang_deploy_report.py documents them.
ARGS = ("path", "report", "server_info_json", "summary_template", "summary_vars")


def write_report(path: str, report: dict) -> None:
    """0600 in a directory made 0700: the report holds the whole /server_info (secrets redacted, the rest of
    the server's configuration not), for the operator who ran the deploy only."""
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        # makedirs' mode is masked by the umask (and may race another host's): 0700 whatever the umask.
        os.chmod(directory, 0o700)
    written = {"written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    body = {"host": report.pop("host"), **written, **report} if "host" in report else {**written, **report}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".report-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(body, indent=4, ensure_ascii=False, default=to_text) + "\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def server_info(text):
    """The /server_info object of ``server_info_json`` (JSON text, or None when the assertion read none)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise AnsibleActionFail(
            f"sglang_deploy_report: server_info_json must be JSON text, got {type(text).__name__}"
        )
    try:
        return json.loads(text)
    except ValueError as error:
        raise AnsibleActionFail(f"sglang_deploy_report: server_info_json is not JSON ({error})") from error


def render_summary(templar, loader, template: str, variables: dict) -> list[str]:
    """The lines of ``lookup('ansible.builtin.template', template) | trim | split('\\n')``, rendered with
    ``variables`` only (no task variable, none of the lookup's template_* variables).

    As ansible-core 2.19's template lookup: the file read by the loader and trusted as a template, a
    templar over these variables whose Jinja search path starts at the template's directory, trim_blocks,
    backslashes not escaped."""
    data = trust_as_template(loader.get_text_file_contents(template))
    summary = templar.copy_with_new_env(
        available_variables=dict(variables), searchpath=[os.path.dirname(template)]
    )
    text = summary.template(data, escape_backslashes=False, overrides={"trim_blocks": True})
    return to_text(text).strip().split("\n")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(ARGS)  # any other argument fails the task (ActionBase.run)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        path, report = args.get("path"), args.get("report")
        template, variables = args.get("summary_template"), args.get("summary_vars", {})
        if not isinstance(path, str) or not path:
            raise AnsibleActionFail(
                "sglang_deploy_report: path (the report file on the controller) is required"
            )
        if not isinstance(report, dict):
            raise AnsibleActionFail("sglang_deploy_report: report must be a dict")
        report = dict(report)
        if "server_info_json" in args:
            if "server_info" in report:
                raise AnsibleActionFail(
                    "sglang_deploy_report: give the whole /server_info as server_info_json or as "
                    "report.server_info, not both"
                )
            report["server_info"] = server_info(args["server_info_json"])
        if template is not None and (not isinstance(template, str) or not os.path.isabs(template)):
            raise AnsibleActionFail(
                "sglang_deploy_report: summary_template must be the absolute path of a template"
            )
        if not isinstance(variables, dict):
            raise AnsibleActionFail("sglang_deploy_report: summary_vars must be a dict")
        if variables and template is None:
            raise AnsibleActionFail("sglang_deploy_report: summary_vars needs summary_template")
        result.update(changed=False, path=path)
        if self._task.check_mode:
            result["skipped_reason"] = "check mode writes no report and shows no summary"
            return result
        try:
            write_report(path, report)
        except OSError as error:
            raise AnsibleActionFail(f"sglang_deploy_report: cannot write {path}: {error}") from error
        if template is not None:
            result["msg"] = render_summary(self._templar, self._loader, template, variables)
            # Printed by the default stdout callback without -v, as ansible.builtin.debug's msg.
            result["_ansible_verbose_always"] = True
        return result
