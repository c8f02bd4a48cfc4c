#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_plan_probe
short_description: Read what only root may read on a GPU host, as the plan account, with no secret in it
description:
  - Connects to the plan probe's socket (C(sglang-plan-probe.socket), installed by the sglang role with
    C(sglang_plan_authorized_keys)), sends nothing, and returns the one JSON document the root-owned probe
    (C(roles/sglang/files/sglang-plan-probe)) prints for O(service) - the sha256 of the unit, environment and
    --config file and of their known-good copies (computed on the host), the unit's text, the environment
    file entry by entry (a secret-named entry as its sha256 only), the known-good record without its API key,
    the pending marker, C(systemctl show) of the unit, and what the server runs now (/server_info asked with
    the key and without, the current invocation's journal, /proc/<MainPID>/cmdline and environ), every
    secret value redacted on the host.
  - Needs no root and no become; changes nothing (the probe writes nothing either).
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  service:
    description: The sglang role's C(sglang_service_name).
    type: str
    required: true
  socket:
    description: The probe's socket.
    type: path
    default: /run/sglang-plan-probe.sock
  timeout:
    description: Seconds for the whole answer.
    type: float
    default: 120
"""

EXAMPLES = r"""
- name: Read the host as the plan account
  sglang_plan_probe:
    service: sglang
  register: __plan_obs
"""

RETURN = r"""
observed:
  description: The probe's document for O(service) (keys C(sha256), C(unit_content), C(env), C(known_good),
    C(pending), C(systemd), C(running), C(errors)).
  returned: success
  type: dict
services:
  description: The names of every service the probe reports on.
  returned: always
  type: list
  elements: str
"""

import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

MAX_BYTES = 64 * 1024 * 1024


def ask(path, timeout):
    """The probe's whole answer: connect, send nothing, read until it closes."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.monotonic() + timeout
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.shutdown(socket.SHUT_WR)
        chunks, size = [], 0
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.1))
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_BYTES:
                raise ValueError(f"{path}: answer over {MAX_BYTES} bytes")
    finally:
        sock.close()
    return b"".join(chunks)


def observe(path, service, timeout):
    """(observed, services, error): the probe's entry for ``service``."""
    try:
        raw = ask(path, timeout)
    except FileNotFoundError:
        return (
            None,
            [],
            (
                f"no plan probe on this host ({path} does not exist): deploy the sglang role with "
                "sglang_plan_authorized_keys to set up the plan account and its probe"
            ),
        )
    except PermissionError:
        return (
            None,
            [],
            (
                f"{path}: permission denied: connect as the plan account (sglang_plan_user), the only "
                "member of the socket's group"
            ),
        )
    except (OSError, ValueError) as exc:
        return None, [], f"{path}: {exc}"
    try:
        doc = json.loads(raw)
    except ValueError:
        return None, [], f"{path}: the probe's answer is not JSON ({len(raw)} bytes; see its journal)"
    services = sorted((doc.get("services") or {}).keys())
    if service not in (doc.get("services") or {}):
        problems = "; ".join(doc.get("errors") or [])
        return (
            None,
            services,
            (
                f"the plan probe knows no service {service!r} (it reports {', '.join(services) or 'none'}"
                + (f"; {problems}" if problems else "")
                + "): deploy the sglang role for it with sglang_plan_authorized_keys"
            ),
        )
    return doc["services"][service], services, None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            service=dict(type="str", required=True),
            socket=dict(type="path", default="/run/sglang-plan-probe.sock"),
            timeout=dict(type="float", default=120),
        ),
        supports_check_mode=True,
    )
    p = module.params
    observed, services, error = observe(p["socket"], p["service"], p["timeout"])
    if error:
        module.fail_json(msg=error, services=services)
    module.exit_json(changed=False, observed=observed, services=services)


if __name__ == "__main__":
    main()
