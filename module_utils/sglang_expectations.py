# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the running server must show, from the command line the host's SGLang built (the ``argv`` result of
sglang_argv, or of sglang_host_probe's O(argv)): the ``running_args`` of sglang_verified_restart and of
sglang_running_args (module_utils/sglang_running_args.py, P3).

One definition for both sides: the sglang role's filters (roles/sglang/filter_plugins/sglang_running.py) load
this file on the controller, and sglang_host_probe runs it on the host, where it proves the running invocation
in the probe's own call (O(prove)). Standard library only, no ansible import: the filters load it by path.

``base`` holds what only the controller knows: ``secret_keys`` (managed keys never compared by value: the
secrets are in SGLang's --config file), ``nccl_environment``, ``launcher`` and ``venv`` (sglang_launcher, its
elements under sglang_venv standing for the release's virtualenv) and ``version`` (the SGLang version the
settings pin; None for a git install: the version the built command line reports).
"""

from __future__ import annotations


def release_launcher(launcher, venv, release_path):
    """``launcher`` with each element under ``venv`` moved into ``release_path`` (the release that runs)."""
    prefix = f"{venv}/"
    return [
        release_path + str(arg)[len(venv) :] if str(arg).startswith(prefix) else arg for arg in launcher or []
    ]


def running_expectations(argv, base, release_path):
    """The running-arguments assertion's options (sglang_running_args' RUNNING_ARGS_SUBOPTIONS) for the
    command line ``argv`` built from the settings, run from the release at ``release_path``."""
    secret = set(base.get("secret_keys") or [])
    version = argv["version"] if base.get("version") is None else base["version"]
    launcher = release_launcher(base.get("launcher"), base["venv"], release_path)
    return {
        "expected": {key: value for key, value in argv["managed"].items() if key not in secret},
        "expected_env": dict(base.get("nccl_environment") or {}, **(argv.get("env") or {})),
        "require_window": bool(argv.get("require_window", False)),
        "runner_lines": argv["runner_lines"],
        "flag_dests": argv["flag_dests"],
        # /proc/<MainPID>/cmdline must be exactly the rendered ExecStart (launcher included).
        "expected_argv": launcher + list(argv["argv"]),
        # The release this run deploys runs: /server_info reports its version, MainPID's argv[0] lies in it.
        "expected_release": {"path": release_path, "version": version},
        # For the report file only (the registered result; the default output never shows it).
        "full_server_info": True,
    }
