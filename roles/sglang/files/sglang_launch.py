#!/usr/bin/python3
"""sglang_launch: start SGLang (or the lab's stand-in) with every secret redacted from its log records
(issue 37 item 7, property P13 of docs/properties.md).

  <release>/bin/python sglang_launch.py serve ARGS...          # SGLang's own `sglang` console script
  <release>/bin/python sglang_launch.py --script PATH ARGS...  # another entry as __main__ (the lab server)

SGLang 0.5.23 logs its resolved arguments at startup (`server_args={...}`) with `api_key` and
`admin_api_key` in clear, and the journal keeps the line for anyone in `adm` or `systemd-journal`. Before
SGLang is imported, this installs a LogRecord factory that passes every record's message through
module_utils/sglang_redact.py's redact_text (installed beside this file) with the secret values of SGLang's
`--config` file and of secret-named environment variables: `'api_key': '<redacted>'`, every other key of
the line as SGLang printed it (the running-arguments assertion reads them). A factory, not a filter or a
handler: SGLang configures its own handlers after the start, and every record is made by the factory.
Processes SGLang starts with multiprocessing's spawn start method import this file again as __mp_main__ and
install the same factory, and a forked child keeps it (with --script, spawned children import that script
instead; the lab server only forks). Without sglang_redact.py nothing is started (exit 1): the key stays
out of the journal or the server does not run. Standard library only; installed by the sglang role.
"""

import importlib.util
import json
import logging
import os
import sys

HERE = os.path.dirname(os.path.realpath(__file__))


def load_redact(lib=HERE):
    spec = importlib.util.spec_from_file_location("sglang_redact", os.path.join(lib, "sglang_redact.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config_path(argv):
    """The value of SGLang's ``--config`` in ``argv`` (None without one)."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def secret_values(argv, environ, redact):
    """The secret values of the ``--config`` file (``key: "value"`` lines, as the role writes it) and of the
    environment's secret-named variables."""
    values = set()
    path = config_path(argv)
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError:
            lines = []  # SGLang reports the unreadable file itself
        for line in lines:
            key, sep, value = line.partition(":")
            if (
                not sep
                or line.lstrip().startswith("#")
                or not redact.is_secret_key(key.strip().replace("-", "_"))
            ):
                continue
            value = value.strip()
            try:
                value = json.loads(value) if value.startswith('"') else value.strip("'")
            except ValueError:
                value = value.strip('"')
            values.add(str(value))
    values.update(v for k, v in environ.items() if redact.is_secret_key(k.lower()) and v)
    return {v for v in values if v}


def install(redact, secrets):
    """Every LogRecord made from now on carries its message redacted (formatted once, its args dropped)."""
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's to report, as without the factory
            return record
        clean = redact.redact_text(message, secrets)
        if clean != message:
            record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(factory)


def run(argv):
    """Hand the process over to SGLang's console script or to ``--script PATH``; argv as they expect it."""
    if argv[:1] == ["--script"] and len(argv) >= 2:
        import runpy

        sys.argv = argv[1:]
        runpy.run_path(argv[1], run_name="__main__")
        return 0
    from importlib.metadata import entry_points

    (entry,) = entry_points(group="console_scripts", name="sglang")
    sys.argv = [os.path.join(os.path.dirname(sys.executable), "sglang"), *argv]
    return entry.load()()


try:
    _REDACT = load_redact()
except OSError as exc:
    _REDACT = exc
else:
    install(_REDACT, secret_values(sys.argv[1:], os.environ, _REDACT))


if __name__ == "__main__":
    if isinstance(_REDACT, OSError):
        sys.stderr.write(f"sglang_launch: cannot redact the log (not started): {_REDACT}\n")
        sys.exit(1)
    sys.exit(run(sys.argv[1:]))
