#!/usr/bin/env python3
# Installed by the sglang_router role. Starts the SGLang router (smg) with the argv it is given plus
# the secrets systemd hands over as credentials ($CREDENTIALS_DIRECTORY, LoadCredential=): smg 1.13.0
# reads --api-key and --control-plane-api-keys from its argv only, and an argv is world-readable in
# /proc/<pid>/cmdline. This process's argv never holds them: smg is started in-process.
from __future__ import annotations

import os
import sys


def credential(name: str) -> str:
    directory = os.environ.get("CREDENTIALS_DIRECTORY", "")
    path = os.path.join(directory, name)
    if not directory or not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8") as handle:
        return handle.read().strip()


def main() -> None:
    args = sys.argv[1:]
    if any(a.split("=", 1)[0] in ("--api-key", "--control-plane-api-keys") for a in args):
        sys.exit("sglang-router-launch: API keys come from systemd credentials, never from the command line")
    worker_key, admin_key = credential("worker_api_key"), credential("admin_key")
    if worker_key:
        args += ["--api-key", worker_key]
    if admin_key:
        args += ["--control-plane-api-keys", f"sglang-deploy:sglang-deploy:admin:{admin_key}"]
    from smg.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args(args))


if __name__ == "__main__":
    main()
