# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The command line of an SGLang service as sglang_argv returns it, for library/sglang_argv.py and for
library/sglang_host_probe.py, whose O(argv) builds it in the probe's own call when the release the settings
want is complete (one round trip less per deploy). The builder itself is module_utils/sglang_argv.py; the
flags come from the installed parser (module_utils/sglang_capabilities.py, cached per installation)."""

from __future__ import annotations

import shlex

from ansible.module_utils.sglang_argv import build_command, flag_dests
from ansible.module_utils.sglang_capabilities import discover
from ansible.module_utils.sglang_options import SECRET_KEYS, select_profile
from ansible.module_utils.sglang_redact import redact_argv

# sglang_argv's options but the source of the flags (capabilities or python), which the caller adds.
BUILD_OPTIONS = dict(
    settings=dict(type="dict", default={}),
    extra_args=dict(type="list", elements="dict", default=[]),
    cache_dir=dict(type="path", default="/var/lib/sglang-deploy/capabilities"),
    cache_files=dict(type="dict"),
    timeout=dict(type="int", default=300),
    secret_env=dict(type="dict", default={}),
    profile=dict(type="str", default="upstream"),
    profiles=dict(type="dict", default={}),
    environment=dict(type="list", elements="str", default=[]),
    config_path=dict(type="path"),
    config_hash_label=dict(type="str"),
)


def discovered(module, params, python):
    """(capabilities, what command_line adds of them, the installation's metadata probe) of ``python``'s
    SGLang, from the cache when it holds this installation."""
    capabilities, cached, _, meta = discover(
        module, python, params["cache_dir"], params["timeout"], params["cache_files"]
    )
    found = {"algorithms": capabilities.get("algorithms", []), "capabilities_cached": cached}
    return capabilities, found, meta


def command_line(module, params, python=None, capabilities=None):
    """sglang_argv's result (without ``changed``) for ``params`` (BUILD_OPTIONS), the flags from
    ``capabilities`` or else asked of ``python``'s SGLang. A bad setting fails the module, naming it; a
    secret of the settings is never in any output (added to the module's no_log values)."""
    settings = params["settings"]
    secret_env = params["secret_env"]
    # The secret's value (if the caller passed it) must never come back in any output.
    secret_values = [
        str(settings[k])
        for k in set(secret_env) | SECRET_KEYS
        if isinstance(settings.get(k), str) and settings.get(k)
    ]
    for value in secret_values:
        module.no_log_values.add(value)
    found = {}
    if capabilities is None:
        capabilities, found, _ = discovered(module, params, python)
    profile, errors = select_profile(params["profile"], params["profiles"])
    if errors:
        module.fail_json(msg="; ".join(errors))
    try:
        built = build_command(
            settings,
            capabilities,
            profile,
            params["extra_args"],
            secret_env,
            params["environment"],
            params["config_path"],
            params["config_hash_label"],
        )
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    for note in built["notes"]:
        module.warn(f"{profile['name']}: {note}")
    dests = {
        flag: dest
        for flag, dest in flag_dests(capabilities).items()
        if flag.startswith("--") and flag[2:].replace("-", "_") != dest
    }
    return dict(
        display_argv=shlex.join(redact_argv(built["argv"], secret_values)),
        version=capabilities.get("version"),
        flag_dests=dests,
        profile=profile["name"],
        **built,
        **found,
    )
