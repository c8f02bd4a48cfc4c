# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small scripts run in the SGLang virtualenv's python, shared by sglang_capabilities and
sglang_preflight: the metadata probe, the result-marker protocol, the bounded runner and the
atomic JSON cache writer."""

from __future__ import annotations

import json
import os

from ansible.module_utils.sglang_files import replace_file

RESULT_MARKER = "SGLANG_DEPLOY_RESULT "

# Runs in the venv's python; imports nothing heavy. Prints the version and a hash of what is installed.
PROBE_SCRIPT = r"""
import hashlib, json, os, sys
# Same precedence as `import sglang`: the first sys.path entry holding a sglang dist-info.
found = None
for entry in sys.path:
    try:
        names = os.listdir(entry or ".")
    except OSError:
        continue
    for name in sorted(names):
        if name.startswith("sglang-") and name.endswith(".dist-info"):
            found = os.path.join(entry, name)
            break
    if found:
        break
if found is None:
    print("SGLANG_DEPLOY_RESULT " + json.dumps({"error": "sglang is not installed in " + sys.prefix}))
    sys.exit(3)
version = None
with open(os.path.join(found, "METADATA"), encoding="utf-8", errors="replace") as handle:
    for line in handle:
        if line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
            break
        if not line.strip():
            break
digest = hashlib.sha256()
for name in ("RECORD", "direct_url.json"):
    try:
        with open(os.path.join(found, name), "rb") as handle:
            data = handle.read()
    except OSError:
        data = b""
    digest.update(name.encode() + b"\0" + data + b"\0")
print("SGLANG_DEPLOY_RESULT " + json.dumps({"version": version, "record_sha256": digest.hexdigest(),
                                          "dist_info": found}))
"""


def parse_marked(stdout):
    """The JSON object on the last ``SGLANG_DEPLOY_RESULT`` line of ``stdout``, or None."""
    for line in reversed((stdout or "").splitlines()):
        if line.startswith(RESULT_MARKER):
            try:
                return json.loads(line[len(RESULT_MARKER) :])
            except ValueError:
                return None
    return None


def run_python(module, python, script, timeout, env=None, data=None, prefix=()):
    """Run ``script`` in ``python`` (list form, LANG=C, $ not expanded), bounded by ``timeout``; ``prefix``
    runs it through another command first (setpriv: as another account)."""
    environ = {"LANG": "C", "LC_ALL": "C", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    environ.update({str(k): str(v) for k, v in (env or {}).items()})
    # SIGALRM's default action ends the interpreter even inside a C extension import.
    wrapped = f"import signal\nsignal.alarm({int(timeout)})\n" + script
    return module.run_command(
        [*prefix, python, "-c", wrapped],
        environ_update=environ,
        cwd="/",
        data=data,
        binary_data=False,
        expand_user_and_vars=False,
    )


def write_json_atomic(module, path, data, mode, what):
    """Write ``data`` as JSON to ``path`` with ``sglang_files.replace_file`` (``mode`` from the first
    byte on, never the umask's default); fail naming ``what``."""
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        replace_file(path, json.dumps(data, sort_keys=True).encode("utf-8"), mode)
    except OSError as exc:
        module.fail_json(msg=f"cache_dir {directory}: cannot write the {what}: {exc}")
