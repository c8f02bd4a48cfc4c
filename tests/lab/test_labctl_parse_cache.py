"""lab/labctl keeps the lab server's parse cache across hosts: `down` keeps what a host's lab servers wrote
(never an entry with an API key), `up` seeds every host with it (host-free: the functions on directories)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import stat
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def load_labctl():
    loader = importlib.machinery.SourceFileLoader("labctl_under_test", str(REPO / "lab" / "labctl"))
    spec = importlib.util.spec_from_loader("labctl_under_test", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


labctl = load_labctl()


def entry(key: str, api_key: str | None = None, launch: str = "--model-path /m --port 30000") -> bytes:
    """The fields of a lab server entry that labctl reads (resolved as the server stores it: a repr)."""
    resolved = {"model_path": "/m", "api_key": api_key, "admin_api_key": None, "port": 30000}
    return json.dumps(
        {"format": 1, "key": key, "resolved": repr(resolved), "launch_command": launch}
    ).encode()


def test_down_keeps_public_entries_and_up_seeds_them_read_only(tmp_path, monkeypatch):
    upper, store, root = tmp_path / "upper", tmp_path / "store", tmp_path / "root"
    monkeypatch.setattr(labctl, "PARSE_CACHE_STORE", str(store))
    monkeypatch.setattr(labctl, "host_paths", lambda name: {"upper": str(upper)})
    written = upper / "var" / "lib" / "sglang" / ".cache" / "sglang-lab-server"
    written.mkdir(parents=True)
    (written / "a.json").write_bytes(entry("a"))
    (written / "secret.json").write_bytes(entry("secret", api_key="sentinel-key"))
    (written / "argv.json").write_bytes(entry("argv", launch="--api-key sentinel-key --port 30000"))
    (written / "broken.json").write_bytes(b"{not json")
    assert labctl.harvest_parse_cache("lab1") == ["1 parse cache entries kept"]
    assert sorted(p.name for p in store.iterdir()) == ["a.json"]
    assert (store / "a.json").read_bytes() == entry("a")
    assert stat.S_IMODE(os.stat(store / "a.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
    assert labctl.harvest_parse_cache("lab1") == []  # nothing new

    labctl.seed_parse_cache(str(root))
    seed = root / labctl.PARSE_CACHE_SEED
    assert sorted(p.name for p in seed.iterdir()) == ["a.json"]
    assert (seed / "a.json").read_bytes() == entry("a")
    assert stat.S_IMODE(os.stat(seed).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(seed / "a.json").st_mode) == 0o644
    # The lab server's own seed directory is the one labctl writes.
    assert "/" + labctl.PARSE_CACHE_SEED == "/var/cache/sglang-lab-server-seed"
    server = (REPO / "lab" / "sglang_lab_server.py").read_text()
    assert f'PARSE_CACHE_SEED_DIR = "/{labctl.PARSE_CACHE_SEED}"' in server
