# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sglang role's one decision (module_utils/sglang_decide.py), on the controller.

``probe | sglang_decide(rendered, want, mode)``: ``rendered`` holds the CONTENT of the unit, environment and
--config file this pass renders (hashed here, so no secret leaves this filter), or is None; a ``config`` of
None is not compared (the plan without secrets). ``host | sglang_fleet_revert(enabled, changed_before,
check)``: what a host's failure in the rolling play does to the rollout (playbooks/sglang.yml).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os

# The project's module_utils, as the role's other filters load it (standard library only, loaded by path).
_HERE = os.path.dirname(os.path.abspath(__file__))
_PATH = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "module_utils", "sglang_decide.py"))
_SPEC = importlib.util.spec_from_file_location("sglang_deploy_decide", _PATH)
_DECIDE = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_DECIDE)


def sha256_text(text):
    return hashlib.sha256(str(text).encode("utf-8")).hexdigest()


def sglang_decide(probe, rendered, want, mode):
    hashes = None
    if rendered:
        hashes = {
            name: None if rendered.get(name) is None else sha256_text(rendered[name])
            for name in _DECIDE.FILES
        }
    return _DECIDE.decide(dict(probe), hashes, dict(want or {}), dict(mode or {}))


def sglang_sha256(rendered):
    """{unit, env, config}: the sha256 of each rendered file (what the verified restart must find on disk)."""
    return {name: sha256_text(rendered[name]) for name in _DECIDE.FILES}


def sglang_fleet_revert(host, enabled, changed_before, check=False):
    return _DECIDE.fleet_revert(bool(enabled), str(host), [str(h) for h in changed_before or []], bool(check))


class FilterModule:
    def filters(self):
        return {
            "sglang_decide": sglang_decide,
            "sglang_sha256": sglang_sha256,
            "sglang_fleet_revert": sglang_fleet_revert,
        }
