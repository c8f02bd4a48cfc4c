"""The lab server's parse cache (lab/sglang_lab_server.py, ParseCache), in this interpreter: the key, the
entries, the directory it trusts, and record + replay in a subprocess of this interpreter (the lab server
imports only the standard library at the top). The lab server started twice with SGLang 0.5.23 (a hit, a
changed argv, a corrupt entry, a changed config.json) is tests/integration/lab_server/test_parse_cache.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVER = REPO / "lab" / "sglang_lab_server.py"
# The SGLang interpreter `make unit` names (as tests/integration/lab_server/test_lab_server.py reads it).
PYTHON = os.environ.get("SGLANG_LAB_PYTHON", "/opt/sglang/venv/bin/python")


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = dont_write
    return module


lab = load_module("sglang_lab_server_under_test", SERVER)


# ------------------------------------------------------------------ the key (this interpreter)
@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    """A sys.path holding one fake SGLang release (and nothing else installed)."""
    root = tmp_path / "site"
    info = root / "sglang-0.5.23.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n\nlong text\n")
    (info / "RECORD").write_text("sglang/__init__.py,sha256=abc,10\n")
    monkeypatch.setattr(sys, "path", [str(root)])
    for name in list(os.environ):
        if name.startswith(("SGLANG", "SGL_")):
            monkeypatch.delenv(name)
    return root


def key(argv: list[str]) -> str:
    return lab.parse_cache_key(argv, lab.sglang_identity())


def minimal_entry(key: str, model_path: str) -> dict:
    """A cache entry with nothing drawn or read: port 1 and the model path resolved, SGLang 0.5.23."""
    return {
        "format": 1,
        "key": key,
        "resolved": repr({"model_path": model_path, "port": 1}),
        "kv_events": "None",
        "launch_command": "--port 1",
        "version": "0.5.23",
        "drawn": [],
        "events": [],
        "files": [],
        "dirs": [],
    }


def test_key_covers_argv_release_python_environment_and_this_file(site, tmp_path, monkeypatch):
    argv = ["--model-path", "/srv/models/lab-target", "--port", "30000"]
    base = key(argv)
    assert key(list(argv)) == base  # deterministic
    assert key([*argv, "--tp-size", "1"]) != base
    assert key(["--port", "30000", "--model-path", "/srv/models/lab-target"]) != base  # the exact list

    record = site / "sglang-0.5.23.dist-info" / "RECORD"
    record.write_text("sglang/__init__.py,sha256=abd,10\n")  # another build of the same version
    assert key(argv) != base
    record.write_text("sglang/__init__.py,sha256=abc,10\n")
    assert key(argv) == base
    (site / "sglang-0.5.23.dist-info" / "direct_url.json").write_text('{"url": "file:///w/sglang.whl"}')
    assert key(argv) != base
    (site / "sglang-0.5.23.dist-info" / "direct_url.json").unlink()
    plugin = site / "sglang_plugin-1.0.dist-info"  # a plugin changes what the parser accepts
    plugin.mkdir()
    (plugin / "RECORD").write_text("x")
    assert key(argv) != base
    shutil.rmtree(plugin)
    assert key(argv) == base

    for name, value in (
        ("SGLANG_USE_MODELSCOPE", "1"),
        ("SGL_CHUNKED_PREFIX", "1"),
        ("HF_HOME", "/x"),
        ("CUDA_VISIBLE_DEVICES", "1"),
    ):
        monkeypatch.setenv(name, value)
        assert key(argv) != base, name
        monkeypatch.delenv(name)
    for name in ("SGLANG_LAB_HANG", "SGLANG_LAB_PARSE_CACHE_DIR", "INVOCATION_ID", "JOURNAL_STREAM"):
        monkeypatch.setenv(name, "1")  # fault switches and per-start values do not change the parse
    assert key(argv) == base

    monkeypatch.setattr(sys, "executable", "/opt/other/venv/bin/python")
    assert key(argv) != base
    monkeypatch.undo()
    monkeypatch.setattr(sys, "path", [str(site)])
    for name in [n for n in os.environ if n.startswith(("SGLANG", "SGL_"))]:
        monkeypatch.delenv(name)
    assert key(argv) == base
    changed = tmp_path / "sglang_lab_server.py"
    changed.write_text(SERVER.read_text() + "# another lab server\n")
    monkeypatch.setattr(lab, "THIS_FILE", str(changed))
    assert key(argv) != base


def test_identity_is_the_deploy_probes_identity():
    """The lab server computes what module_utils/sglang_venv.py's probe reports for the same python."""
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"no SGLang interpreter at {PYTHON}")
    # sglang_venv imports ansible.module_utils.sglang_files: resolve it in this repository's module_utils,
    # as Ansible does with ansible.cfg's module_utils (and tests/unit/conftest.py).
    import ansible.module_utils

    if str(REPO / "module_utils") not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(str(REPO / "module_utils"))
    probe = load_module("sglang_venv_under_test", REPO / "module_utils" / "sglang_venv.py")
    out = subprocess.run(
        [PYTHON, "-c", probe.PROBE_SCRIPT], capture_output=True, text=True, check=True, cwd="/"
    ).stdout
    want = probe.parse_marked(out)
    script = (
        f"import json, sys; sys.path.insert(0, {str(SERVER.parent)!r}); import sglang_lab_server as s; "
        "print(json.dumps(s.sglang_identity()))"
    )
    got = json.loads(
        subprocess.run(
            [PYTHON, "-B", "-c", script], capture_output=True, text=True, check=True, cwd="/"
        ).stdout
    )
    assert want["version"] == got["version"] == "0.5.23"
    assert (got["record_sha256"], got["dist_info"]) == (want["record_sha256"], want["dist_info"])
    assert got["editable"] is False


def test_no_cache_when_disabled_or_editable(site, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE_DIR", str(tmp_path / "cache"))
    assert lab.ParseCache.open(["--port", "1"]) is not None
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE", "0")
    assert lab.ParseCache.open(["--port", "1"]) is None
    monkeypatch.delenv("SGLANG_LAB_PARSE_CACHE")
    (site / "sglang-0.5.23.dist-info" / "direct_url.json").write_text(
        '{"url": "file:///src/sglang", "dir_info": {"editable": true}}'
    )
    assert lab.ParseCache.open(["--port", "1"]) is None  # its code changes under the same RECORD


def test_directory_others_can_reach_is_not_used(site, tmp_path, monkeypatch, caplog):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    cache.chmod(0o755)
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE_DIR", str(cache))
    assert lab.ParseCache.open(["--port", "1"]) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"sglang-lab-server: parse cache not used: {cache} has mode 0755, not 0700"
    ]
    if os.geteuid() == 0:
        cache.chmod(0o700)
        os.chown(cache, 65534, -1)
        assert lab.ParseCache.open(["--port", "1"]) is None
        assert "is owned by uid 65534" in caplog.records[-1].getMessage()


def test_default_directory_is_root_only_or_the_service_users_home(monkeypatch):
    monkeypatch.delenv("SGLANG_LAB_PARSE_CACHE_DIR", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert lab.parse_cache_dir() == "/var/cache/sglang-lab-server"
    import pwd

    monkeypatch.setattr(os, "geteuid", lambda: 999)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: type("pw", (), {"pw_dir": "/var/lib/sglang"})())
    assert lab.parse_cache_dir() == "/var/lib/sglang/.cache/sglang-lab-server"


# ------------------------------------------------------------------ record, store, replay (a subprocess)
RECORD_AND_REPLAY = r"""
import json, logging, sys, warnings
sys.path.insert(0, sys.argv[1])
import sglang_lab_server as lab

def after():
    logging.getLogger("lab").warning("after resolution")

def setup():
    logging.basicConfig(level=logging.INFO, format=lab.LOG_FORMAT, datefmt=lab.DATE_FORMAT, force=True)

setup()
with lab.ResolutionRecorder(enabled=True) as recorder:
    logging.getLogger("sglang.a").info("before %s", "configure_logger")
    warnings.warn("an import-time UserWarning")
    logging.basicConfig(level=logging.WARNING, format="<%(levelname)s %(name)s:%(lineno)d> %(message)s",
                        force=True)  # what configure_logger does
    recorder.logger_configured()
    logging.getLogger("sglang.b").info("dropped: below WARNING")
    logging.getLogger("sglang.b").warning("Max running requests is reset to 48 for speculative decoding.")
    print("printed", "to stdout")
    try:
        1 / 0
    except ZeroDivisionError:
        logging.getLogger("sglang.c").exception("with a traceback")
    open(sys.argv[2]).read()
entry = recorder.entry("k", {"model_path": sys.argv[3], "port": 1}, "cmd", "0.5.23", None)
assert entry, recorder.problem
assert [path for path, _ in entry["files"]] == [sys.argv[2]], entry["files"]
assert [path for path, _ in entry["dirs"]] == [sys.argv[3]], entry["dirs"]
after()
sys.stdout.flush()
print("=====", file=sys.stderr, flush=True)
print("=====", flush=True)
setup()
cached = lab.CachedResolution(json.loads(json.dumps(entry)), "k")
assert cached.changed_input() is None
cached.replay()
after()
"""


def test_replay_prints_what_the_parse_printed(tmp_path):
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    config.write_text("{}")
    out = subprocess.run(
        [sys.executable, "-B", "-c", RECORD_AND_REPLAY, str(SERVER.parent), str(config), str(config.parent)],
        capture_output=True,
        text=True,
        check=True,
    )

    def same_time(text: str) -> str:
        return re.sub(r"^\[[\d :-]+\]", "[T]", text, flags=re.M)

    first, replayed = same_time(out.stderr).split("=====\n")
    assert first == replayed
    assert first.startswith("[T] before configure_logger\n") and "UserWarning: an import-time" in first
    assert "<WARNING sglang.b:" in first and "dropped" not in first
    assert "ZeroDivisionError: division by zero" in first
    assert re.search(r"<WARNING lab:\d+> after resolution\n$", first)  # SGLang's logging set-up stays
    assert out.stdout == "printed to stdout\n=====\nprinted to stdout\n"


def test_corrupt_or_unreadable_entry_is_ignored_with_one_line(site, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE_DIR", str(tmp_path / "cache"))
    cache = lab.ParseCache.open(["--port", "1"])
    entry = minimal_entry(cache.key, "/m")
    cache.store(entry)
    assert (os.stat(cache.path).st_mode & 0o777) == 0o600
    assert [p.name for p in Path(cache.directory).iterdir()] == [Path(cache.path).name]  # no temp file left
    assert cache.lookup().resolution() == {"model_path": "/m", "port": 1}
    cache.store(
        {
            **entry,
            "resolved": repr({"model_path": "/m", "random_seed": 7, "port": 1}),
            "drawn": ["random_seed"],
        }
    )
    seeds = {cache.lookup().resolution()["random_seed"] for _ in range(3)}  # drawn anew, as SGLang does
    assert len(seeds) > 1 and all(0 <= seed <= 1 << 30 for seed in seeds)
    assert list(cache.lookup().resolution()) == ["model_path", "random_seed", "port"]
    for bad in (
        b"{not json",
        json.dumps({**entry, "resolved": "{'port': float('nan')}"}).encode(),
        json.dumps({**entry, "key": "0" * 64}).encode(),
        json.dumps(
            {
                **entry,
                "events": [
                    [
                        "log",
                        "stderr",
                        {"fmt": "%(nosuchfield)s", "style": "%", "datefmt": None, "terminator": "\n"},
                        {"msg": "m", "levelno": 20},
                    ]
                ],
            }
        ).encode(),
    ):
        caplog.clear()
        Path(cache.path).write_bytes(bad)
        assert cache.lookup() is None
        assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
        message = caplog.records[0].getMessage()
        assert message.startswith(f"sglang-lab-server: parse cache entry {cache.path} ignored (corrupt: ")
        assert "\n" not in message
    os.unlink(cache.path)
    os.mkdir(cache.path)  # cannot be read as a file
    caplog.clear()
    assert cache.lookup() is None
    assert "ignored (unreadable: " in caplog.records[0].getMessage()


def test_seed_of_labctl_is_used_only_from_an_owner_only_directory(site, tmp_path, monkeypatch):
    """lab/labctl's seed (PARSE_CACHE_SEED_DIR): used when the server's own directory has no entry for the
    key, never when others can write the seed directory, never with SGLANG_LAB_PARSE_CACHE_DIR; the
    server's own entry wins."""
    seed_dir = tmp_path / "seed"
    seed_dir.mkdir(mode=0o755)
    seed_dir.chmod(0o755)
    monkeypatch.setattr(lab, "PARSE_CACHE_SEED_DIR", str(seed_dir))
    monkeypatch.setattr(lab, "PARSE_CACHE_SEED_OWNER", os.geteuid())  # root's on a lab host
    monkeypatch.setattr(lab, "parse_cache_dir", lambda: str(tmp_path / "cache"))
    argv = ["--port", "1"]
    key = lab.ParseCache.open(argv).key
    entry = minimal_entry(key, "/seeded")
    (seed_dir / f"{key}.json").write_text(json.dumps(entry))
    cache = lab.ParseCache.open(argv)
    assert cache.lookup().resolution() == {"model_path": "/seeded", "port": 1}
    assert not Path(cache.path).exists()  # read, not copied: a seeded start writes nothing
    seed_dir.chmod(0o775)  # others may write it: not a seed
    assert lab.ParseCache.open(argv).lookup() is None
    seed_dir.chmod(0o755)
    cache.store({**entry, "resolved": repr({"model_path": "/own", "port": 1})})
    assert lab.ParseCache.open(argv).lookup().resolution() == {"model_path": "/own", "port": 1}
    os.unlink(cache.path)
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE_DIR", str(tmp_path / "cache"))  # a directory of its own only
    assert lab.ParseCache.open(argv).lookup() is None


def test_changed_file_misses_and_the_directory_stays_bounded(site, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_LAB_PARSE_CACHE_DIR", str(tmp_path / "cache"))
    config = tmp_path / "config.json"
    config.write_text('{"max_position_embeddings": 4096}')
    cache = lab.ParseCache.open(["--port", "1"])
    cache.store(
        {
            "format": 1,
            "key": cache.key,
            "resolved": repr({"model_path": "/m", "port": 1}),
            "kv_events": "None",
            "launch_command": "",
            "version": "0.5.23",
            "drawn": [],
            "events": [],
            "files": [[str(config), lab.file_digest(str(config))]],
            "dirs": [[str(tmp_path), None]],
        }
    )
    assert cache.lookup() is None  # tmp_path is a directory now: its listing was "none"
    cache.store({**json.loads(Path(cache.path).read_text()), "dirs": []})
    assert cache.lookup() is not None
    config.write_text('{"max_position_embeddings": 8192}')
    assert cache.lookup() is None
    for n in range(lab.PARSE_CACHE_MAX_ENTRIES + 5):
        lab.ParseCache(cache.directory, f"{n:064x}").store({"format": 1})
    assert len(list(Path(cache.directory).glob("*.json"))) == lab.PARSE_CACHE_MAX_ENTRIES
