"""lab/labctl keeps the lab server's parse cache and the role's SGLang caches across hosts: `down` keeps
what a host's lab servers wrote (never an entry with an API key) and what a layer host's deploys cached,
`up` seeds hosts with them (host-free: the functions on directories)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import stat
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


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


def test_down_keeps_the_role_caches_of_a_layer_host_and_up_seeds_new_layer_hosts(tmp_path, monkeypatch):
    """The role's preflight and capabilities caches (roles/sglang/vars/main.yml) go the same way."""
    upper, store, root = tmp_path / "upper", tmp_path / "store", tmp_path / "root"
    monkeypatch.setattr(labctl, "ROLE_CACHE_STORE", str(store))
    monkeypatch.setattr(labctl, "host_paths", lambda name: {"upper": str(upper)})
    state = upper / "var" / "lib" / "sglang-deploy"
    for kind in ("preflight", "capabilities"):
        (state / kind).mkdir(parents=True)
        (state / kind / f"{kind}-1.json").write_text(json.dumps({"version": "0.5.23", "kind": kind}))
    (state / "preflight" / "broken.json").write_bytes(b"{not json")
    (state / "history.jsonl").write_text("{}\n")  # not a cache: stays with the host
    assert labctl.harvest_role_cache("lab1") == ["2 role cache entries kept"]
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file()) == [
        "capabilities/capabilities-1.json",
        "preflight/preflight-1.json",
    ]
    assert stat.S_IMODE(os.stat(store / "preflight").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store / "preflight" / "preflight-1.json").st_mode) == 0o600
    assert labctl.harvest_role_cache("lab1") == []  # nothing new

    labctl.seed_role_cache(str(root))
    seeded = root / "var" / "lib" / "sglang-deploy"
    assert stat.S_IMODE(os.stat(seeded).st_mode) == 0o750
    for kind in ("preflight", "capabilities"):
        entry_path = seeded / kind / f"{kind}-1.json"
        assert json.loads(entry_path.read_text()) == {"version": "0.5.23", "kind": kind}
        assert stat.S_IMODE(os.stat(seeded / kind).st_mode) == 0o755
        # As the modules write them: sglang_preflight 0600, sglang_capabilities 0644.
        assert stat.S_IMODE(os.stat(entry_path).st_mode) == (0o600 if kind == "preflight" else 0o644)
    # Where the role keeps them: the directories labctl writes.
    assert (
        "write_cache(module, path, data):\n    write_json_atomic(module, path, data, 0o600,"
        in (REPO / "module_utils" / "sglang_preflight.py").read_text()
    )
    assert (
        "write_json_atomic(module, path, data, 0o644,"
        in (REPO / "module_utils" / "sglang_capabilities.py").read_text()
    )
    role_vars = (REPO / "roles" / "sglang" / "vars" / "main.yml").read_text()
    assert "__sglang_state_dir: /" + labctl.ROLE_CACHE_STATE_DIR + "\n" in role_vars
    for kind in labctl.ROLE_CACHE_DIRS:
        assert f'__sglang_{kind}_cache: "{{{{ __sglang_state_dir }}}}/{kind}"' in role_vars
