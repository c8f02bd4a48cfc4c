# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A held rollout's decision (module_utils/sglang_canary.py ``hold``) and why a canary's verdict stops the
rollout (``stop``), on the controller.

``hosts | sglang_canary_hold(slurps, word)``: ``slurps`` the slurp result of each host's hold marker (in
the order of ``hosts``; a host without a marker has no ``content``), ``word`` the operator's ``-e canary``
or None.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os

# The project's module_utils, as the role's other filters load it (standard library only, loaded by path).
_HERE = os.path.dirname(os.path.abspath(__file__))
_PATH = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "module_utils", "sglang_canary.py"))
_SPEC = importlib.util.spec_from_file_location("sglang_deploy_canary", _PATH)
_CANARY = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CANARY)


def sglang_canary_hold(hosts, slurps, word):
    held = []
    for host, slurp in zip(hosts, slurps):
        content = (slurp or {}).get("content")
        if content is not None:
            try:
                marker = json.loads(base64.b64decode(content))
            except ValueError:
                marker = {"reason": "an unreadable hold marker"}
            held.append([host, marker if isinstance(marker, dict) else {}])
    return _CANARY.hold(None if word is None else str(word), held, list(hosts))


def sglang_canary_stop(host, verdict, reason):
    """``host | sglang_canary_stop(verdict, reason)``: the run's failure message, None when it rolls on."""
    return _CANARY.stop(str(host), verdict, reason)


class FilterModule:
    def filters(self):
        return {"sglang_canary_hold": sglang_canary_hold, "sglang_canary_stop": sglang_canary_stop}
