#!/usr/bin/python
# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
---
module: sglang_router_member
short_description: Take an SGLang worker out of the SGLang router (smg) and drain it, or put it back
description:
  - Talks to the router's worker API (smg 1.13.0 C(GET|POST /workers), C(DELETE /workers/{id})) and to
    the worker's own load report (SGLang C(GET /v1/loads?include=core)). A worker is known by its URL;
    the router's ids (new on every C(POST)) are only reported.
  - C(state=absent) - removes the worker (its C(drain_settle_secs) set to O(settle_seconds) first, C(PATCH
    /workers/{id}), instead of the router's fixed 5 s), confirms the router no longer lists it (removal
    is asynchronous, the worker is still listed right after the C(202)), then waits until the worker
    itself reports no running and no waiting request, bounded by O(drain_timeout) (counted from the C(DELETE),
    the router's settle included). Past it,
    O(drain_policy=fail) re-adds the worker (untouched, with O(labels)) and fails; O(drain_policy=force)
    returns with C(drained=false) and the requests still in flight in C(requests_cut). Refused, with
    nothing touched, when fewer than O(min_ready_workers) other workers are ready (the capacity guard).
  - The capacity guard is one at a time per router. From the count of ready workers until the router no
    longer lists the leaving worker, the module holds C(flock(2)) on a file of O(lock_dir) on the host it
    runs on (the router host, where every controller and every host of a batch delegates it), so a second
    leave counts after the first one's removal. A leave that cannot take it within O(timeout) is refused,
    nothing touched, naming the worker whose leave holds it. The kernel releases it when the module's
    process ends.
  - C(state=present) - adds the worker with O(labels) and waits until the router lists it C(ready) with
    those labels. A worker already listed with other labels (the router keeps a restarted worker's old
    labels) is removed and added again.
  - C(state=query) - reads the router's list and changes nothing; fails naming the router when it cannot be
    reached or does not answer C(GET /workers) with its list. A rollout checks every router this way before
    a worker leaves any; a router that is down is never left out. With O(service), a router whose unit is not
    installed on the host (systemd C(LoadState=not-found), as on the fleet's first deploy, before the router
    play) has no worker to leave (C(installed=false)); one that is installed must answer, running or not.
    With O(must_answer=false) (a failed canary's rollback) one that does not answer is reported
    (C(answered=false), the reason in C(problem)) instead.
version_added: "0.1.0"
author: sglang-deploy contributors
options:
  router_url:
    description: Base URL of the router, e.g. C(http://router-1:30000).
    type: str
    required: true
  router_api_key:
    description: Control-plane admin key of the router (sent as an C(Authorization) bearer token).
    type: str
    default: ''
  worker_url:
    description: URL of the worker as the router knows it, e.g. C(http://gpu-1:30000).
    type: str
    required: true
  worker_api_key:
    description: API key of the SGLang worker, for its C(/v1/loads).
    type: str
    default: ''
  state:
    description:
      - C(absent) - out of the router and drained; C(present) - in the router and ready; C(query) - the
        router answers with its list (nothing changed).
    type: str
    choices: [absent, present, query]
    required: true
  labels:
    description: Labels the worker is added with (e.g. its invocation id), all strings.
    type: dict
    default: {}
  drain_timeout:
    description: Seconds to wait for the worker to become idle (the role's C(sglang_drain_timeout)).
    type: float
    default: 300
  drain_policy:
    description: What happens when the worker is not idle after O(drain_timeout).
    type: str
    choices: [fail, force]
    default: fail
  min_ready_workers:
    description: With C(state=absent), the least number of OTHER ready workers the router must keep.
    type: int
    default: 1
  timeout:
    description: Seconds to wait for the router to list the worker gone (absent) or ready (present).
    type: float
    default: 120
  settle_seconds:
    description:
      - Seconds the router keeps the removed worker C(draining) before it drops it (its C(drain_settle_secs),
        set for this worker before the C(DELETE)); covers a request routed to the worker just before it.
    type: int
    default: 1
  service:
    description:
      - With C(state=query), the router's systemd unit on the host the module runs on (e.g.
        C(sglang-router.service)); empty, the router must answer whatever systemd says.
    type: str
    default: ''
  must_answer:
    description:
      - With C(state=query), false - a router that cannot be reached is reported (C(answered=false)), not a
        failure (the rollback of a canary whose verdict failed goes on without it).
    type: bool
    default: true
  poll_interval:
    description: Seconds between two polls.
    type: float
    default: 1
  lock_dir:
    description:
      - Directory of the capacity guard's lock files on the host the module runs on (created 0700, a symlink
        is never followed); one file per router URL, C(router-guard-<host>_<port>.lock).
    type: path
    default: /run/sglang-deploy
attributes:
  check_mode:
    support: full
    details: Reads the router's list and reports what would change; removes, drains and adds nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Take the worker out of the router and drain it
  sglang_router_member:
    router_url: "http://{{ groups['routers'][0] }}:30000"
    router_api_key: "{{ sglang_router_admin_key }}"
    worker_url: "http://{{ inventory_hostname }}:30000"
    worker_api_key: "{{ sglang_api_key }}"
    state: absent
    drain_timeout: "{{ sglang_drain_timeout }}"
    drain_policy: fail

- name: Put the worker back with the new invocation's labels
  sglang_router_member:
    router_url: "http://{{ groups['routers'][0] }}:30000"
    router_api_key: "{{ sglang_router_admin_key }}"
    worker_url: "http://{{ inventory_hostname }}:30000"
    state: present
    labels:
      sglang_invocation: "{{ __sglang_restart.invocation_id }}"
"""

RETURN = r"""
worker_id:
  description: The router's id of the worker (the last one it had, for absent; the new one, for present).
  returned: when the router listed the worker
  type: str
  sample: 01a23e25-c9df-7034-8695-94f426cd32ad
status:
  description: The worker's status in the router at the end (C(absent) once removed).
  returned: always
  type: str
  sample: ready
drained:
  description: With C(state=absent), whether the worker reported no running and no waiting request.
  returned: always
  type: bool
  sample: true
requests_cut:
  description: Requests still in flight when O(drain_policy=force) gave up waiting (0 when drained).
  returned: always
  type: int
  sample: 0
drain_seconds:
  description:
    - Seconds from the router's C(DELETE) until the worker reported itself idle (or O(drain_timeout) ran out),
      the router's settle, its removal and the worker's own drain included.
  returned: always
  type: float
  sample: 2.5
installed:
  description: With C(state=query), whether the router's O(service) is installed (always true without it).
  returned: when state is query
  type: bool
  sample: true
answered:
  description: With C(state=query), whether the router answered with its list (false when not installed).
  returned: when state is query
  type: bool
  sample: true
problem:
  description: With C(state=query) and O(must_answer=false), why the router did not answer.
  returned: when a router did not answer
  type: str
  sample: "cannot reach router http://127.0.0.1:30000 ... Connection refused"
workers_ready:
  description: With C(state=query), how many workers the router lists C(ready).
  returned: when state is query
  type: int
  sample: 2
labels:
  description: The worker's labels in the router at the end (present).
  returned: when state is present
  type: dict
  sample: {sglang_invocation: "9d1c...", version: "0.5.23"}
"""

import contextlib
import datetime
import fcntl
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.sglang_lock import LockError, ensure_dir
from ansible.module_utils.sglang_systemd import SystemctlError, show


class RouterError(Exception):
    """An answer the module cannot work with; the message names the endpoint and the status."""


def http(method: str, url: str, key: str = "", body: dict | None = None, timeout: float = 10.0):
    """(status, body parsed as JSON or text); a connection error raises RouterError."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    except (OSError, ValueError) as err:
        raise RouterError(f"{method} {url}: {err}") from None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace").strip()


def workers_of(router: str, status: int, body) -> list[dict]:
    """The router's worker list from its answer to GET /workers; any other answer (a wrong admin key's 401,
    a router still starting) raises RouterError naming the router and the status."""
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        raise RouterError(f"router {router} answered GET /workers with {status}: {str(body)[:300]}")
    return body["workers"]


def same_url(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def capacity(workers: list[dict], worker_url: str, min_ready: int) -> tuple[dict | None, str | None]:
    """The capacity guard's decision on the router's list: (this worker's entry or None when the router does
    not list it, the refusal or None when it may leave). Only OTHER workers listed ``ready`` count."""
    found = [w for w in workers if same_url(str(w.get("url", "")), worker_url)]
    if not found:
        return None, None
    mine = found[0]
    others = sum(1 for w in workers if w is not mine and w.get("status") == "ready")
    if others >= min_ready:
        return mine, None
    return mine, (
        f"capacity guard: refusing to take {worker_url} out of the router: {others} other "
        f"worker(s) ready, fewer than min_ready_workers={min_ready}"
    )


class Guard:
    """flock(2) on this router's guard file, from the count of ready workers until the router no longer lists
    the leaving worker: two leaves (a batch above 1, two controllers) cannot both count the other as ready.
    The holder writes who it is into the file for a refused leave to name."""

    def __init__(self, directory: str, router: str, worker_url: str, wait: float, poll: float) -> None:
        netloc = urllib.parse.urlsplit(router).netloc
        self.path = os.path.join(
            directory, "router-guard-" + re.sub(r"[^A-Za-z0-9_.-]", "_", netloc) + ".lock"
        )
        self.directory, self.router, self.worker_url = directory, router, worker_url
        self.wait, self.poll = wait, max(poll, 0.05)
        self.fd = -1

    def __enter__(self):
        try:
            ensure_dir(self.directory)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            self.fd = os.open(self.path, flags, 0o600)
        except (OSError, LockError) as err:
            raise RouterError(f"capacity guard of router {self.router} in {self.directory}: {err}") from None
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self.holder()
                    os.close(self.fd)
                    raise RouterError(
                        f"capacity guard: refusing to take {self.worker_url} out of router {self.router}: "
                        f"another leave holds its guard ({self.path}) for more than timeout={self.wait:g} s: "
                        f"{holder}. Nothing was touched; run again when it has finished"
                    ) from None
                time.sleep(self.poll)
        since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {"worker_url": self.worker_url, "pid": os.getpid(), "since": since}
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(record).encode() + b"\n", 0)
        return self

    def holder(self) -> str:
        try:
            record = json.loads(os.pread(self.fd, 4096, 0))
            who, pid, since = record["worker_url"], record["pid"], record["since"]
            return f"the leave of {who} (PID {pid} on this host, since {since})"
        except (OSError, ValueError, TypeError, KeyError):
            return "a leave that has not said who it is yet"

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)  # releases the flock


class Member:
    def __init__(self, params: dict, check_mode: bool) -> None:
        self.p, self.check_mode = params, check_mode
        self.router = params["router_url"].rstrip("/")
        self.result = {
            "changed": False,
            "drained": False,
            "requests_cut": 0,
            "drain_seconds": 0.0,
        }
        self.deleted_at = time.monotonic()

    def workers(self) -> list[dict]:
        return workers_of(self.router, *http("GET", f"{self.router}/workers", self.p["router_api_key"]))

    def mine(self, workers: list[dict]) -> dict | None:
        found = [w for w in workers if same_url(str(w.get("url", "")), self.p["worker_url"])]
        return found[0] if found else None

    def wait(self, predicate, what: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() >= deadline:
                raise RouterError(f"{what} within {timeout:g} s (router {self.router})")
            time.sleep(self.p["poll_interval"])

    def remove(self, worker: dict) -> None:
        # smg keeps a deleted worker `draining` for its drain_settle_secs (5 s by default), then drops it: a
        # guessed wait. This module drains by the worker's own load report instead and only needs the router
        # to stop routing to it, with a short settle for a request routed to it just before the DELETE (a
        # stream in flight through a removal ends whole: tests/fixtures/router/SOURCE.md). Set for this
        # worker only (PATCH, smg 1.13.0 HealthCheckUpdate); a router that refuses it keeps its own value.
        url = f"{self.router}/workers/{worker['id']}"
        patch = {"health": {"drain_settle_secs": self.p["settle_seconds"]}}
        if http("PATCH", url, self.p["router_api_key"], patch)[0] == 202:
            # The update is a background job (GET shows job_status UpdateWorker/processing until it is done):
            # wait for it, so the DELETE after it is settled by the new value (bounded; else the old one).
            def updated():
                status, body = http("GET", url, self.p["router_api_key"])
                job = body.get("job_status") if status == 200 and isinstance(body, dict) else None
                return not (isinstance(job, dict) and job.get("job_type") == "UpdateWorker")

            with contextlib.suppress(RouterError):
                self.wait(updated, "the settle update", 10)
        self.deleted_at = time.monotonic()
        status, body = http("DELETE", url, self.p["router_api_key"])
        if status not in (202, 404):
            raise RouterError(
                f"router {self.router} refused DELETE /workers/{worker['id']} "
                f"({self.p['worker_url']}): {status} {str(body)[:300]}"
            )
        self.wait(
            lambda: self.mine(self.workers()) is None,
            f"the router still lists {self.p['worker_url']}",
            self.p["timeout"],
        )

    def add(self) -> dict:
        labels = {str(k): str(v) for k, v in self.p["labels"].items()}
        status, body = http(
            "POST",
            f"{self.router}/workers",
            self.p["router_api_key"],
            {"url": self.p["worker_url"], "labels": labels},
        )
        if status != 202:
            raise RouterError(
                f"router {self.router} refused POST /workers ({self.p['worker_url']}): "
                f"{status} {str(body)[:300]}"
            )

        def ready():
            worker = self.mine(self.workers())
            if worker and worker.get("status") == "ready" and self.labelled(worker):
                return worker
            self.last = worker
            return None

        self.last = None
        try:
            return self.wait(
                ready, f"{self.p['worker_url']} did not become ready with labels {labels}", self.p["timeout"]
            )
        except RouterError as err:
            seen = self.last.get("status") if self.last else "not listed"
            raise RouterError(f"{err}; last seen: {seen}") from None

    def labelled(self, worker: dict) -> bool:
        have = worker.get("labels") or {}
        return all(str(have.get(k)) == str(v) for k, v in self.p["labels"].items())

    def inflight(self) -> int:
        url = f"{self.p['worker_url'].rstrip('/')}/v1/loads?include=core"
        status, body = http("GET", url, self.p["worker_api_key"])
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("loads"), list):
            raise RouterError(f"worker answered GET /v1/loads?include=core with {status}: {str(body)[:300]}")
        return sum(
            int(load.get("num_running_reqs", 0)) + int(load.get("num_waiting_reqs", 0))
            for load in body["loads"]
        )

    def leave(self) -> bool:
        """The capacity guard and the removal; False when the router does not list the worker."""
        worker, refusal = capacity(self.workers(), self.p["worker_url"], self.p["min_ready_workers"])
        if worker is None:
            self.result.update(status="absent", drained=True)
            return False
        self.result["worker_id"] = worker.get("id")
        if refusal:
            raise RouterError(refusal)
        self.result["changed"] = True
        if self.check_mode:
            self.result["status"] = worker.get("status")
            return False
        self.remove(worker)
        self.result["status"] = "absent"
        return True

    def absent(self) -> None:
        if self.check_mode:
            self.leave()  # counts and touches nothing: no guard to hold
            return
        guard = Guard(
            self.p["lock_dir"], self.router, self.p["worker_url"], self.p["timeout"], self.p["poll_interval"]
        )
        with guard:
            if not self.leave():
                return
        # The drain is counted from the DELETE: the router's settle and its removal are part of it.
        deadline = self.deleted_at + self.p["drain_timeout"]
        while (left := self.inflight()) > 0 and time.monotonic() < deadline:
            time.sleep(self.p["poll_interval"])
        self.result["drain_seconds"] = round(time.monotonic() - self.deleted_at, 3)
        if left == 0:
            self.result["drained"] = True
            return
        if self.p["drain_policy"] == "force":
            self.result["requests_cut"] = left
            return
        self.add()
        self.result["status"] = "ready"
        raise RouterError(
            f"{self.p['worker_url']} still had {left} request(s) in flight after "
            f"drain_timeout={self.p['drain_timeout']:g} s; re-added to the router untouched "
            "(drain_policy=fail)"
        )

    def query(self, installed: bool = True) -> None:
        if not installed:
            self.result.update(status="absent", installed=False, answered=False, workers_ready=0)
            return
        try:
            workers = self.workers()
        except RouterError as err:
            problem = (
                f"cannot reach router {self.router} before {self.p['worker_url']} leaves any router: {err}. "
                "Nothing was touched: start the router (or take its host out of group routers) and run again"
            )
            if self.p["must_answer"]:
                raise RouterError(problem) from None
            self.result.update(status="unreachable", installed=True, answered=False, workers_ready=0)
            self.result["problem"] = problem
            return
        worker = self.mine(workers)
        self.result.update(
            status=worker.get("status") if worker else "absent",
            installed=True,
            answered=True,
            workers_ready=sum(1 for w in workers if w.get("status") == "ready"),
        )

    def present(self) -> None:
        worker = self.mine(self.workers())
        if worker and worker.get("status") == "ready" and self.labelled(worker):
            self.result.update(status="ready", worker_id=worker.get("id"), labels=worker.get("labels"))
            return
        self.result["changed"] = True
        if self.check_mode:
            self.result["status"] = worker.get("status") if worker else "absent"
            return
        if worker is not None:  # stale labels (a restart in place) or not ready: remove, then add anew
            self.remove(worker)
        worker = self.add()
        self.result.update(status="ready", worker_id=worker.get("id"), labels=worker.get("labels"))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "required": True},
            "router_api_key": {"type": "str", "default": "", "no_log": True},
            "worker_url": {"type": "str", "required": True},
            "worker_api_key": {"type": "str", "default": "", "no_log": True},
            "state": {"type": "str", "choices": ["absent", "present", "query"], "required": True},
            "labels": {"type": "dict", "default": {}},
            "drain_timeout": {"type": "float", "default": 300},
            "drain_policy": {"type": "str", "choices": ["fail", "force"], "default": "fail"},
            "min_ready_workers": {"type": "int", "default": 1},
            "timeout": {"type": "float", "default": 120},
            "settle_seconds": {"type": "int", "default": 1},
            "poll_interval": {"type": "float", "default": 1},
            "service": {"type": "str", "default": ""},
            "must_answer": {"type": "bool", "default": True},
            "lock_dir": {"type": "path", "default": "/run/sglang-deploy"},
        },
        supports_check_mode=True,
    )
    p = module.params
    for name in ("router_url", "worker_url"):
        if not p[name].startswith(("http://", "https://")):
            module.fail_json(msg=f"{name} must be an http:// or https:// URL, got {p[name]!r}")
    for name in ("drain_timeout", "timeout", "poll_interval", "min_ready_workers", "settle_seconds"):
        if p[name] < 0:
            module.fail_json(msg=f"{name} must be >= 0, got {p[name]}")
    member = Member(p, module.check_mode)
    try:
        if p["state"] == "query" and p["service"]:
            try:
                props = show(module, p["service"], ("LoadState",), systemctl="systemctl")
            except SystemctlError as err:
                module.fail_json(msg=str(err))
            # not-found: never installed (the fleet's first deploy), nothing to leave.
            member.query(installed=props.get("LoadState", "") != "not-found")
        else:
            getattr(member, p["state"])()
    except RouterError as err:
        module.fail_json(msg=str(err), **member.result)
    module.exit_json(**member.result)


if __name__ == "__main__":
    main()
