"""The fleet lab's shared code (tests/integration/test_fleet_rollout.py, test_fleet_canary.py): two lab GPU
hosts and a router host of one inventory (`labctl up --hosts 2 --routers N`), reached over ssh, the router's
worker API, lab/loadgen through the router, and fleet_up, the fixtures' bring-up and tear-down."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from labtools import ansible_env, missing_lab_prerequisite, ssh_argv

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
ANSIBLE = REPO / ".venv" / "bin" / "ansible"
ROUTER_ADMIN_KEY = REPO / ".lab" / "router_admin_key"  # labctl's
LABCTL = REPO / "lab" / "labctl"
LOADGEN = REPO / "lab" / "loadgen"
WHEELHOUSE = Path(os.environ.get("WHEELHOUSE", "/var/cache/sglang-lab/wheelhouse"))
FAST = {"sglang_stable_seconds": 3, "sglang_health_count": 2}
ROUTER_UNIT = "sglang-router.service"
CHAT = "POST /v1/chat/completions"


@contextlib.contextmanager
def fleet_up(index: int, routers: int, inventory: Path):
    """lab<index> and lab<index+1> as GPU hosts, the next `routers` as router hosts, with the SGLang layer and
    the fleet network; down again (every host, namespace and veth) when the block ends."""
    missing = missing_lab_prerequisite()
    if missing:
        pytest.fail(missing)
    if not any(WHEELHOUSE.glob("sglang-*.whl")) or not any((WHEELHOUSE / "smg").glob("smg-1.13.0-*.whl")):
        pytest.fail(f"no sglang or smg 1.13.0 wheel in {WHEELHOUSE}: run `make wheelhouse` first")
    up = [str(LABCTL), "up", "--sglang-layer", "--hosts", "2", "--routers", str(routers)]
    up += ["--first-index", str(index)]
    subprocess.run([*up, "--inventory", str(inventory)], check=True, cwd=REPO, stdin=subprocess.DEVNULL)
    try:
        yield
    finally:
        subprocess.run([str(LABCTL), "down", "--inventory", str(inventory)], check=False, cwd=REPO)


# Runs on the router host as `python3 -c PROBE`, its input on stdin (never on a command line): the keys to
# look for in every /proc/<pid>/cmdline, and HTTP requests to the router ([method, path, bearer, JSON body]).
PROBE = r"""
import json, os, sys, urllib.error, urllib.request
given = json.load(sys.stdin)
cmdlines, holders = {}, []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        continue
    cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if any(k.encode() in raw for k in given["keys"]):
        holders.append(pid)
answers = []
for method, path, bearer, body in given["requests"]:
    request = urllib.request.Request(f"http://127.0.0.1:{given['port']}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode())
    request.add_header("Content-Type", "application/json")
    if bearer is not None:
        request.add_header("Authorization", "Bearer " + bearer)
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            answers.append([r.status, r.read().decode()])
    except urllib.error.HTTPError as e:
        answers.append([e.code, e.read().decode()])
print(json.dumps({"cmdlines": cmdlines, "holders": holders, "answers": answers}))
"""
# One long non-streaming chat completion straight to a worker, from the router host (the controller has
# no address on the fleet network). Prints status, whether the answer was complete, seconds.
LONG = r"""
import json, sys, time, urllib.error, urllib.request
url, tokens = sys.argv[1], int(sys.argv[2])
body = {"model": "lab-target", "messages": [{"role": "user", "content": "a long answer"}],
        "max_tokens": tokens}
request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
start, status, complete, detail = time.time(), None, False, ""
try:
    with urllib.request.urlopen(request, timeout=300) as r:
        status, answer = r.status, json.loads(r.read())
        complete = answer["usage"]["completion_tokens"] == tokens
except urllib.error.HTTPError as e:
    status, detail = e.code, e.read()[:300].decode(errors="replace")
except (OSError, ValueError, KeyError) as e:
    detail = f"{type(e).__name__}: {e}"
print(json.dumps({"status": status, "complete": complete, "start": start, "seconds": time.time() - start,
                  "detail": detail}))
"""


class Fleet:
    def __init__(self, client_key: str, inventory: Path):
        self.admin_key = ROUTER_ADMIN_KEY.read_text().strip()
        self.client_key = client_key
        self.keys = {"sglang_router_admin_key": self.admin_key, "sglang_router_worker_api_key": client_key}
        self.inventory = inventory
        inv = yaml.safe_load(inventory.read_text())["all"]["children"]
        self.hv = {**inv["gpu_nodes"]["hosts"], **inv["routers"]["hosts"]}
        self.gpu, self.routers = list(inv["gpu_nodes"]["hosts"]), list(inv["routers"]["hosts"])
        self.router = self.routers[0]  # the router role's checks and the canary's scrape run on it
        self.runs: list[str] = []  # every ansible-playbook output, for the "no key printed" check

    def ssh_argv(self, host: str, command: str) -> list[str]:
        return ssh_argv(self.hv[host], command, user="root")

    def ssh(self, host: str, command: str, stdin: str | None = None) -> str:
        r = subprocess.run(
            self.ssh_argv(host, command), input=stdin, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, f"ssh {host} {command[:80]!r}: {r.stderr}"
        return r.stdout

    def playbook(
        self,
        *args: str,
        extra: dict | None = None,
        playbook: str = "deploy.yml",
        inventory: Path | None = None,
        at: tuple[str, Callable[[], object]] | None = None,
    ):
        """The run's CompletedProcess. ``at``: (text, action) - the action runs once, when the run's output
        first shows the text (a task's banner is printed as the task starts); the run goes on meanwhile."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="fleet-extra-") as handle:
            json.dump({"sglang_router_worker_api_key": self.client_key, **FAST, **(extra or {})}, handle)
            handle.flush()
            argv = [
                str(ANSIBLE_PLAYBOOK),
                "-i",
                str(inventory or self.inventory),
                playbook,
                "-e",
                "@" + handle.name,
                *args,
            ]
            start = time.monotonic()
            if at is None:
                r = subprocess.run(
                    argv,
                    cwd=REPO,
                    env=ansible_env(),
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    text=True,
                )
            else:
                r = run_acting_at(argv, *at)
            print(f"{playbook} {' '.join(args)}: rc {r.returncode} in {time.monotonic() - start:.0f} s")
        self.runs.append(r.stdout + r.stderr)
        return r

    def invocation(self, host: str, unit: str = "sglang.service") -> str:
        return self.ssh(host, f"systemctl show -p InvocationID --value {unit}").strip()

    def invocations(self) -> dict[str, str]:
        return {h: self.invocation(h) for h in self.gpu} | {
            r: self.invocation(r, ROUTER_UNIT) for r in self.routers
        }

    def unit(self, host: str | None = None, name: str = ROUTER_UNIT) -> dict[str, str]:
        host = host or self.router
        out = self.ssh(
            host, f"systemctl show -p InvocationID -p ActiveState -p MainPID -p ControlGroup {name}"
        )
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def probe(self, *requests: list) -> dict:
        """PROBE on the router host: the keys in any cmdline, and the router's answers to ``requests``."""
        given = {"keys": list(self.keys.values()), "port": 30000, "requests": [list(r) for r in requests]}
        return json.loads(self.ssh(self.router, f"python3 -c {shlex.quote(PROBE)}", stdin=json.dumps(given)))

    def url(self, host: str) -> str:
        return f"http://{self.hv[host]['lab_fleet_address']}:30000"

    def server_info(self, host: str) -> dict:
        url = self.url(host) + "/server_info"
        code = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"
        return json.loads(self.ssh(host, f"python3 -c {shlex.quote(code)}"))

    def inflight(self, host: str) -> int:
        url = self.url(host) + "/v1/loads?include=core"
        code = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=10).read().decode())"
        loads = json.loads(self.ssh(self.router, f"python3 -c {shlex.quote(code)}"))["loads"]
        return sum(load["num_running_reqs"] + load["num_waiting_reqs"] for load in loads)

    def start_long_request(self, host: str, tokens: int) -> subprocess.Popen:
        """LONG straight to the worker on ``host`` (from the router host); returns once it is in flight."""
        command = f"python3 -c {shlex.quote(LONG)} {self.url(host)} {tokens}"
        proc = subprocess.Popen(
            self.ssh_argv(self.router, command), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        deadline = time.monotonic() + 20
        while self.inflight(host) < 1:
            assert proc.poll() is None and time.monotonic() < deadline, "the long request never got in flight"
            time.sleep(0.2)
        return proc

    def chat_arrivals(self, host: str, since: float) -> list[float]:
        """Wall times at which the worker began answering a chat completion (its access log line)."""
        out = self.ssh(
            host, f"journalctl -u sglang.service -o short-unix --no-pager --since @{int(since) - 1}"
        )
        return [float(line.split()[0]) for line in out.splitlines() if CHAT in line]

    def router_url(self, router: str | None = None) -> str:
        return f"http://{self.hv[router or self.router]['ansible_host']}:30000"

    def workers(self, router: str | None = None) -> list[dict]:
        request = urllib.request.Request(
            self.router_url(router or self.router) + "/workers",
            headers={"Authorization": f"Bearer {self.admin_key}"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())["workers"]

    def listed(self, host: str, router: str | None = None) -> list[tuple[str, str | None]]:
        """(status, sglang_invocation label) of each entry with ``host``'s URL in ``router``'s list."""
        return [
            (w["status"], w["labels"].get("sglang_invocation"))
            for w in self.workers(router or self.router)
            if w["url"] == self.url(host)
        ]

    def member(self, host: str, **args) -> subprocess.Popen:
        """library/sglang_router_member.py for ``host``'s worker on the router host, as the role delegates it
        there, in an ansible process of its own (another controller); the admin key from the inventory."""
        params = {"router_url": "http://127.0.0.1:30000", "worker_url": self.url(host), **args}
        params["router_api_key"] = "{{ sglang_router_admin_key }}"
        argv = [
            str(ANSIBLE),
            "-i",
            str(self.inventory),
            self.router,
            "-m",
            "sglang_router_member",
            "-a",
            json.dumps(params),
        ]
        env = dict(
            ansible_env(), ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json"
        )
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
        )
        proc.router = self.router
        return proc

    @staticmethod
    def member_result(proc: subprocess.Popen) -> dict:
        out, _ = proc.communicate(timeout=300)
        return json.loads(out)["plays"][0]["tasks"][0]["hosts"][proc.router]

    def start_load(self, out: Path, clients: int = 2) -> dict[str, tuple[subprocess.Popen, Path]]:
        """One lab/loadgen through each router (``clients`` streams each), sampling that router's list."""
        env = dict(os.environ, LOADGEN_ADMIN_KEY=self.admin_key, LOADGEN_API_KEY=self.client_key)
        loads = {}
        for router in self.routers:
            argv = [
                sys.executable,
                str(LOADGEN),
                "--router",
                self.router_url(router),
                "--clients",
                str(clients),
            ]
            argv += ["--duration", "400", "--max-requests", "20000", "--sample-interval", "0.3"]
            path = out.with_name(f"{out.stem}-{router}.json")
            with path.open("w") as handle:
                loads[router] = (subprocess.Popen(argv, stdout=handle, env=env, cwd=REPO), path)
        return loads


def run_acting_at(argv: list[str], text: str, action: Callable[[], object]) -> subprocess.CompletedProcess:
    """ansible-playbook ``argv``, ``action`` run once when a line of its output first contains ``text``."""
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=ansible_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        lines, pending = [], True
        for line in proc.stdout:
            if pending and text in line:
                pending = False
                action()
            lines.append(line)
        proc.wait()
        err.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, "".join(lines), err.read())


def long_result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=300)
    result = json.loads(out)
    print(f"long request: {result}")
    return result


def load_failures(result: dict) -> int:
    return result["non_2xx"] + result["truncated"] + result["errors"]


def stop_load(loads: dict[str, tuple[subprocess.Popen, Path]]) -> dict[str, dict]:
    """Each router's load result (its requests, failures and samples of that router's list)."""
    for proc, _ in loads.values():
        proc.send_signal(signal.SIGINT)
    for proc, _ in loads.values():
        assert proc.wait(timeout=180) == 0
    return {router: json.loads(path.read_text()) for router, (_, path) in loads.items()}


def why(r: subprocess.CompletedProcess) -> str:
    """The failed tasks of a run (the end of its output when none is marked)."""
    found = [m.start() for m in re.finditer(r"^(fatal|failed): ", r.stdout, re.M)]
    return "\n".join(r.stdout[i : i + 2500] for i in found[:3]) or (r.stdout[-4000:] + r.stderr[-2000:])


def rolling_play(stdout: str) -> str:
    """The output of playbooks/sglang.yml's rolling play (the second SGLang play), all its batches."""
    # Every batch of it (serial) prints the play's header again; the router play or the recap ends it.
    rest = stdout.split("PLAY [Deploy SGLang and verify the running server]", 1)[1]
    for end in ("\nPLAY [Deploy the SGLang router", "\nPLAY RECAP"):
        rest = rest.split(end, 1)[0]
    return rest


def recap(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+)\s+:\s+(ok=.*)$", stdout, re.M))
