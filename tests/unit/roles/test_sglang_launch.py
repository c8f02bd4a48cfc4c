"""roles/sglang/files/sglang_launch.py: SGLang's log records leave its process with every secret redacted
(issue 37 item 7, P13), and the `server_args=` evidence stays.

A stand-in `sglang` console script (an installed distribution's entry point, as SGLang's is) configures its
logging after the start as SGLang does, logs SGLang 0.5.23's `server_args={...}` line with the key of the
`--config` file in clear, and starts a child with multiprocessing's spawn start method that logs it again.
Run under the launcher, no line holds the key, and module_utils/sglang_serverargs.py reads every other
value back from the line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from ansible.module_utils.sglang_serverargs import find_server_args_line, parse_server_args
from conftest import REPO

LAUNCHER = REPO / "roles" / "sglang" / "files" / "sglang_launch.py"
SENTINEL = "sk-sentinel-launch-37"
ADMIN = "sk-sentinel-admin-37"

FAKE_SGLANG = textwrap.dedent(
    """
    import logging, multiprocessing, sys

    def child(secret):
        logging.basicConfig(level=logging.INFO, format="[child] %(message)s", force=True)
        logging.getLogger("sglang.srt.managers.scheduler").info("scheduler args: api_key=%s", secret)

    def main():
        # As SGLang's configure_logger: its own handler and format, set up after the process started.
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", force=True)
        args = sys.argv[sys.argv.index("--config") + 1]
        secret = [l.split(":", 1)[1].strip().strip('"') for l in open(args) if l.startswith("api-key")][0]
        resolved = {"model_path": "/srv/m", "api_key": secret, "admin_api_key": "ADMIN",
                    "speculative_draft_window_size": 2048, "port": 30000}
        logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={resolved}")
        ctx = multiprocessing.get_context("spawn")
        proc = ctx.Process(target=child, args=(secret,))
        proc.start()
        proc.join()
        print("argv0", sys.argv[0], "serve" in sys.argv[1:2])
        return proc.exitcode
    """
).replace("ADMIN", ADMIN)


@pytest.fixture
def release(tmp_path):
    """A stand-in SGLang distribution (console script `sglang`), the launcher with the redaction beside it,
    and SGLang's --config file holding the keys."""
    site = tmp_path / "site"
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (dist / "entry_points.txt").write_text("[console_scripts]\nsglang = fake_sglang:main\n")
    (site / "fake_sglang.py").write_text(FAKE_SGLANG)
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(LAUNCHER, lib / "sglang_launch.py")
    shutil.copy(REPO / "module_utils" / "sglang_redact.py", lib / "sglang_redact.py")
    config = tmp_path / "sglang.yaml"
    config.write_text(f'api-key: "{SENTINEL}"\nadmin-api-key: "{ADMIN}"\n')
    return {"lib": lib, "site": site, "config": config}


def launch(release, *args):
    env = dict(os.environ, PYTHONPATH=str(release["site"]))
    return subprocess.run(
        [sys.executable, str(release["lib"] / "sglang_launch.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_the_server_args_line_keeps_its_evidence_and_loses_the_keys(release):
    done = launch(release, "serve", "--model-path", "/srv/m", "--config", str(release["config"]))
    assert done.returncode == 0, done.stderr
    out = done.stdout + done.stderr
    assert SENTINEL not in out and ADMIN not in out, out
    line = find_server_args_line(done.stderr.splitlines())
    assert line is not None, done.stderr
    parsed = parse_server_args(line)
    args = parsed["args"]
    assert parsed["form"] == "dict" and not parsed["partial"]
    assert args["api_key"] == args["admin_api_key"] == "<redacted>"
    assert args["speculative_draft_window_size"] == 2048 and args["model_path"] == "/srv/m"
    # The spawned child (SGLang's schedulers) logs through the same factory.
    assert "[child] scheduler args: api_key=<redacted>" in done.stderr
    # SGLang's console script sees the argv it would see from its own script.
    assert f"argv0 {os.path.dirname(sys.executable)}/sglang True" in done.stdout


def test_another_entry_runs_as_main_with_the_same_redaction(release, tmp_path):
    script = tmp_path / "lab_server.py"
    script.write_text(
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s', force=True)\n"
        "if __name__ == '__main__':\n"
        "    logging.getLogger('x').info('server_args=%s', {'api_key': sys.argv[2], 'port': 30000})\n"
    )
    done = launch(release, "--script", str(script), "--config", str(release["config"]))
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "server_args={'api_key': '<redacted>', 'port': 30000}"


def test_without_the_redaction_nothing_starts(release):
    (release["lib"] / "sglang_redact.py").unlink()
    done = launch(release, "serve", "--config", str(release["config"]))
    assert done.returncode == 1
    assert "cannot redact the log (not started)" in done.stderr and "argv0" not in done.stdout


def test_launcher_is_python3_standard_library_only():
    text = LAUNCHER.read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    imports = [ln.split()[1].split(".")[0] for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert imports and all(name in sys.stdlib_module_names for name in imports), imports
