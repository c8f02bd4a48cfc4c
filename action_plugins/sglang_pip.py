# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run a pip install on the host and say what it is doing while it runs (documented in library/sglang_pip.py).

An SGLang install (torch, flashinfer, CUDA wheels) takes minutes; a plain command task is silent
for all of them. Here pip runs on the host in its own session, its output going to a root-only log
file, and the plugin polls the host every O(poll) seconds, printing the last meaningful pip line
("Processing torch-2.9.1-...whl", "Installing 111 collected package(s): ...") with the elapsed time:
a line at least every ~20 s, and at once when pip moves to another step.

changed is pip's own word: true only when pip printed "Successfully installed ..." (a run that
only finds "Requirement already satisfied" changed nothing).

With ``lock`` (the deploy lock this run holds), pip starts only while the lock is this run's, and the lock's
lease is renewed while pip runs (through sglang_lock, state=renewed): an install that runs longer than the
lease keeps its lock, and one whose lock was taken over is stopped instead of building on.
"""

from __future__ import annotations

import re
import shlex
import time

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()

# pip's lines that say which step it is at (pip 23-25; indentation varies with the resolver).
STEP = re.compile(
    r"^\s*(Looking in (?:links|indexes)|Collecting|Obtaining|Cloning|Running command git|Resolved|Processing|"
    r"Downloading|Using cached|Requirement already satisfied|Preparing metadata|Building wheels? |"
    r"Created wheel|Stored in directory|Installing build dependencies|Getting requirements|"
    r"Attempting uninstall|Found existing installation|Uninstalling|Successfully (?:uninstalled|built)|"
    r"Installing collected packages|Successfully installed|ERROR:)"
)
COLLECTED = "Installing collected packages: "
# Steps pip takes inside "Installing collected packages" when it replaces an installed version.
REPLACING = re.compile(
    r"^(Attempting uninstall|Found existing installation|Uninstalling|Successfully uninstalled)"
)
INSTALLED = re.compile(r"^Successfully installed (.+)$", re.MULTILINE)
# Seconds without a new step after which the current one is printed again.
REPEAT_AFTER = 20
TAIL_BYTES = 16384
STATUS_MARK = "@@sglang-pip@@"


def progress_line(text: str, width: int = 160) -> str:
    """The last line of pip output that names a step, made short: wheel paths as file names, the
    package count of "Installing collected packages", and an uninstall of an older version inside that
    step said as part of it."""
    steps = [" ".join(line.split()) for line in text.splitlines() if STEP.match(line)]
    if not steps:
        return ""
    line = steps[-1]
    # "Processing /srv/wheelhouse/torch-2.9.1-....whl" -> "Processing torch-2.9.1-....whl"
    line = re.sub(r"(?<=\s)(?:file://)?/\S*/(?=[^/\s]+\.(?:whl|tar\.gz|zip)\b)", "", line)
    collecting = next((step for step in reversed(steps) if step.startswith(COLLECTED)), None)
    if collecting is not None:
        count = len(collecting[len(COLLECTED) :].split(", "))
        if line == collecting:
            line = f"Installing {count} collected package(s): {collecting[len(COLLECTED) :]}"
        elif REPLACING.match(line):
            line = f"Installing {count} collected package(s); {line}"
    return line if len(line) <= width else line[: width - 3] + "..."


def installed_packages(text: str) -> list[str]:
    """The name-version pairs pip reports as installed ("Successfully installed a-1.0 b-2.0")."""
    return [item for match in INSTALLED.finditer(text) for item in match.group(1).split()]


def error_lines(text: str, keep: int = 20) -> list[str]:
    """pip's ERROR lines, or the last lines when it printed none (a traceback, a killed process)."""
    errors = [line for line in text.splitlines() if line.startswith("ERROR:")]
    return errors or text.splitlines()[-keep:]


def elapsed_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def start_command(argv: list[str], log: str) -> str:
    """Start argv in its own session (no SIGHUP when the SSH channel closes), output to log, exit status
    to log.rc when it ends; prints the pid of the session's shell, which it writes itself to log.pid
    (the pid of a background job as the starting shell sees it can be a setsid that forked)."""
    # Only the log and the status files are root-only (umask 077 in subshells): pip itself keeps the
    # umask of the connection, so the venv stays readable by the service user.
    script = (
        'log=$1; shift; (umask 077; echo $$ > "$log.pid.tmp"; : > "$log.rc.tmp") '
        '&& mv "$log.pid.tmp" "$log.pid" && "$@" >> "$log" 2>&1; '
        'echo $? > "$log.rc.tmp" && mv "$log.rc.tmp" "$log.rc"'
    )
    q = shlex.quote
    args = " ".join(q(a) for a in ["sglang-pip", log, *argv])
    pid = q(log + ".pid")
    return (
        f"rm -f {q(log + '.rc')} {pid} && (umask 077; : > {q(log)}) && "
        f"{{ setsid sh -c {q(script)} {args} < /dev/null > /dev/null 2>&1 & }} && "
        f"i=0; while [ ! -s {pid} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done; cat {pid}"
    )


def status_command(log: str, pid: int) -> str:
    q = shlex.quote
    return (
        f'if [ -e {q(log + ".rc")} ]; then echo "rc=$(cat {q(log + ".rc")})"; '
        f"elif kill -0 {pid} 2>/dev/null; then echo running; else echo vanished; fi; "
        f"echo {STATUS_MARK}; tail -c {TAIL_BYTES} {q(log)} 2>/dev/null || true"
    )


def parse_status(stdout: str) -> tuple[str, int | None, str]:
    """('running'|'done'|'vanished', exit status or None, log tail) from status_command's output."""
    head, _, tail = stdout.partition(STATUS_MARK + "\n")
    state = head.strip()
    if state.startswith("rc="):
        try:
            return "done", int(state[3:]), tail
        except ValueError:
            return "vanished", None, tail
    return ("running" if state == "running" else "vanished"), None, tail


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("argv", "log", "poll", "timeout", "label", "lock"))
    # Check mode installs nothing: the task is reported skipped.
    _supports_check_mode = False

    def _host(self, command: str, what: str) -> dict:
        res = self._low_level_execute_command(command, sudoable=True)
        # The SSH connection may run the command on a tty (ansible_ssh_use_tty): CRLF line ends.
        for key in ("stdout", "stderr"):
            res[key] = (res.get(key) or "").replace("\r\n", "\n")
        if res.get("rc", 1) != 0:
            raise AnsibleActionFail(
                f"sglang_pip: {what} failed on the host (rc {res.get('rc')}): "
                f"{(res.get('stderr') or res.get('stdout') or '').strip()[-2000:]}"
            )
        return res

    def _renew(self, lock: dict, doing: str, task_vars) -> int:
        """The deploy lock still this run's, its lease renewed (the record's own length): that length.
        AnsibleActionFail naming the holder otherwise."""
        res = self._execute_module(
            module_name="sglang_lock",
            module_args={
                "name": lock["name"],
                "dir": lock["dir"],
                "state": "renewed",
                "token": lock["token"],
                "doing": doing,
            },
            task_vars=task_vars,
        )
        if res.get("failed"):
            raise AnsibleActionFail(res.get("msg") or "sglang_lock: renewing the deploy lock failed")
        lease = (res.get("holder") or {}).get("lease_seconds")
        return lease if isinstance(lease, int) and lease > 0 else 3600

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp
        args = self._task.args
        argv = args.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            raise AnsibleActionFail("sglang_pip: argv must be a non-empty list of non-empty strings")
        log = args.get("log")
        if not isinstance(log, str) or not log.startswith("/"):
            raise AnsibleActionFail(f"sglang_pip: log must be an absolute path on the host (is {log!r})")
        try:
            poll = int(args.get("poll", 10))
            timeout = int(args.get("timeout", 7200))
        except (TypeError, ValueError) as exc:
            raise AnsibleActionFail(f"sglang_pip: poll and timeout must be integers: {exc}") from exc
        if not 1 <= poll <= 15:
            raise AnsibleActionFail(f"sglang_pip: poll must be 1..15 seconds (is {poll})")
        if timeout < poll:
            raise AnsibleActionFail(f"sglang_pip: timeout must be at least poll (is {timeout})")
        label = str(args.get("label") or "pip install")
        host = (task_vars or {}).get("inventory_hostname", "")
        lock = args.get("lock")
        if lock is not None and not (
            isinstance(lock, dict)
            and all(isinstance(lock.get(k), str) and lock[k] for k in ("dir", "name", "token"))
        ):
            raise AnsibleActionFail(
                "sglang_pip: lock must be a dict with dir, name and token (the deploy lock)"
            )
        doing = f"{label}: pip install, output in {log}"
        # A run whose lock was taken over starts nothing; the lease then renewed at a quarter of its length.
        lease = self._renew(lock, doing, task_vars) if lock else 0
        renewed = time.monotonic()

        started = self._host(start_command(argv, log), "starting pip")
        try:
            pid = int(started["stdout"].strip().splitlines()[-1])
        except (ValueError, IndexError) as exc:
            raise AnsibleActionFail(f"sglang_pip: no pid from the host: {started.get('stdout')!r}") from exc

        begin = time.monotonic()
        shown, shown_at = None, begin
        display.display(f"{host}: {label}: started, output in {log}")
        while True:
            time.sleep(poll)
            status = self._host(status_command(log, pid), "reading the pip log")["stdout"]
            state, rc, tail = parse_status(status)
            now = time.monotonic()
            line = progress_line(tail) or "starting"
            if state == "running" and (line != shown or now - shown_at >= REPEAT_AFTER):
                display.display(f"{host}: {label} [{elapsed_text(now - begin)}]: {line}")
                shown, shown_at = line, now
            if state != "running":
                break
            stop = f"kill -TERM -{pid} 2>/dev/null || kill -TERM {pid} 2>/dev/null; true"
            if lock and now - renewed >= lease / 4:
                try:
                    lease = self._renew(lock, doing, task_vars)
                except AnsibleActionFail as exc:
                    self._low_level_execute_command(stop, sudoable=True)
                    raise AnsibleActionFail(
                        f"{label}: pip stopped after {elapsed_text(now - begin)}: {exc.message}; "
                        f"its output is in {log} on the host"
                    ) from exc
                renewed = time.monotonic()
            if now - begin > timeout:
                self._low_level_execute_command(stop, sudoable=True)
                raise AnsibleActionFail(
                    f"{label}: pip still running after {elapsed_text(now - begin)} (timeout {timeout} s): "
                    f"stopped; last step: {line}; its output is in {log} on the host"
                )

        output = self._host(f"cat {shlex.quote(log)}", "reading the pip log")["stdout"]
        took = elapsed_text(time.monotonic() - begin)
        installed = installed_packages(output)
        result.update(
            cmd=argv,
            log=log,
            stdout=output,
            stdout_lines=output.splitlines(),
            installed=installed,
            changed=bool(installed),
            elapsed=took,
        )
        if state == "vanished":
            result.update(
                failed=True,
                rc=None,
                msg=f"{label}: pip ended without an exit status after {took} (killed? the host "
                f"rebooted?); last step: {line}; output in {log} on the host",
            )
            return result
        result["rc"] = rc
        if rc != 0:
            errors = " | ".join(error_lines(output))
            msg = f"{label}: pip exited {rc} after {took}: {errors} (full output: {log} on the host)"
            result.update(failed=True, msg=msg)
        else:
            what = f"installed {len(installed)} package(s)" if installed else "nothing to install"
            display.display(f"{host}: {label} [{took}]: done, {what}")
        return result
