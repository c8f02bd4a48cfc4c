# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Write one host's deploy report on the controller, in the controller process.

Documented in library/sglang_deploy_report.py.

The report used to be a ``file`` and a ``copy`` task delegated to localhost: two module runs, each a Python
process forked and fed on the controller, per host and per run (~2 s a host on a loaded 2-core controller,
paid by every no-change run and by every host of a rollout). Here the directory is made and the JSON
written atomically (a temporary file in the same directory, then rename) by the plugin itself.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase


def write_report(path: str, report: dict) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    written = {"written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    body = {"host": report.pop("host"), **written, **report} if "host" in report else {**written, **report}
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".report-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(body, indent=4, ensure_ascii=False, default=to_text) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        path, report = args.get("path"), args.get("report")
        if not isinstance(path, str) or not path:
            raise AnsibleActionFail(
                "sglang_deploy_report: path (the report file on the controller) is required"
            )
        if not isinstance(report, dict):
            raise AnsibleActionFail("sglang_deploy_report: report must be a dict")
        result.update(changed=False, path=path)
        if self._task.check_mode:
            result["skipped_reason"] = "check mode writes no report"
            return result
        try:
            write_report(path, dict(report))
        except OSError as error:
            raise AnsibleActionFail(f"sglang_deploy_report: cannot write {path}: {error}") from error
        return result
