# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the running server must show (module_utils/sglang_expectations.py), on the controller.

``sglang_release_launcher``: sglang_launcher with its elements under sglang_venv moved into the release.
``sglang_running_expectations``: the running-arguments assertion's options for a built command line - the
same function sglang_host_probe runs on the host when it proves the running invocation in its own call.
"""

from __future__ import annotations

import importlib.util
import os

# The project's module_utils, as the role's other references to it (vars/main.yml: role_path/../../).
_HERE = os.path.dirname(os.path.abspath(__file__))
_PATH = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "module_utils", "sglang_expectations.py"))
_SPEC = importlib.util.spec_from_file_location("sglang_deploy_expectations", _PATH)
_EXPECTATIONS = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_EXPECTATIONS)


class FilterModule:
    def filters(self):
        return {
            "sglang_release_launcher": _EXPECTATIONS.release_launcher,
            "sglang_running_expectations": _EXPECTATIONS.running_expectations,
        }
