"""Secrets off the command line (issue 16, item 6): the API key reaches SGLang through its --config file.

1. sglang_argv with config_path: no secret in argv (argv ends with --config), config_keys name the YAML
   keys; the installed parser's recorded capabilities decide the flag spelling.
2. The role's YAML quoting (roles/sglang/filter_plugins/sglang_yaml.py), read back by SGLang 0.5.23's own
   ConfigArgumentMerger (the lab venv's copy, loaded by path): the merged argv carries the exact key.
3. sglang_unit writes the file 0640 root:<group>, atomically, keeps the replaced one, never shows it.
"""

from __future__ import annotations

import argparse
import grp
import importlib.util
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.sglang_argv import build_argv, build_command
from ansible.module_utils.sglang_options import select_profile

ROOT = Path(__file__).resolve().parents[3]
CAPS = json.loads((ROOT / "tests" / "fixtures" / "capabilities" / "sglang-0.5.23.json").read_text())
DFLASH = {
    "model_path": "/srv/models/t",
    "speculative_algorithm": "DFLASH",
    "speculative_draft_model_path": "/srv/models/d",
    "speculative_draft_window_size": 2048,
}
SENTINEL = "SENTINEL-SECRET-9f3c"
CONFIG = "/etc/sglang/sglang.yaml"
MERGER = (
    ROOT
    / ".lab"
    / "sglang-venv"
    / "lib"
    / "python3.11"
    / "site-packages"
    / "sglang"
    / "srt"
    / "utils"
    / "server_args_config_parser.py"
)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


QUOTE = _load(
    "sglang_yaml_filters", ROOT / "roles" / "sglang" / "filter_plugins" / "sglang_yaml.py"
).sglang_yaml_quote


def test_secrets_go_to_the_config_file_not_argv():
    keys = {}
    argv, managed = build_argv(
        dict(DFLASH, api_key=True, admin_api_key=True), CAPS, config_path=CONFIG, config_keys=keys
    )
    assert keys == {"api_key": "api-key", "admin_api_key": "admin-api-key"}
    assert argv[-2:] == ["--config", CONFIG] and argv.count("--config") == 1
    assert "--api-key" not in argv and "--admin-api-key" not in argv
    assert "api_key" not in managed and "admin_api_key" not in managed
    assert managed["speculative_draft_window_size"] == 2048


def test_without_a_secret_there_is_no_config_flag():
    keys = {}
    argv, _ = build_argv(DFLASH, CAPS, config_path=CONFIG, config_keys=keys)
    assert keys == {} and "--config" not in argv


def test_build_command_reports_config_keys():
    profile, errors = select_profile("upstream", {})
    assert not errors
    built = build_command(dict(DFLASH, api_key=True), CAPS, profile, config_path=CONFIG)
    assert built["config_keys"] == {"api_key": "api-key"}
    assert built["secret_positions"] == [] and built["argv"][-2:] == ["--config", CONFIG]


@pytest.mark.parametrize(
    "settings, extra, path, expect",
    [
        (
            dict(DFLASH, api_key=True),
            [],
            "/etc/sglang/sglang.conf",
            "config_path: '/etc/sglang/sglang.conf' must end in .yaml or .yml",
        ),
        (
            DFLASH,
            [{"arg": "--config", "value": "/tmp/x.yaml"}],
            CONFIG,
            "extra_args[0] (--config): the role passes its own --config file",
        ),
    ],
)
def test_config_errors_name_the_setting(settings, extra, path, expect):
    with pytest.raises(ValueError) as err:
        build_argv(settings, CAPS, extra, config_path=path)
    assert str(err.value).startswith(expect), err.value


def test_module_returns_config_keys_and_no_secret(run_module):
    result, failed = run_module(
        "sglang_argv", {"settings": dict(DFLASH, api_key=True), "capabilities": CAPS, "config_path": CONFIG}
    )
    assert not failed, result
    assert result["config_keys"] == {"api_key": "api-key"}
    assert result["display_argv"].endswith(f"--config {CONFIG}") and "--api-key" not in result["display_argv"]


AWKWARD = [
    "yes",
    "null",
    "123",
    "0x1f",
    "~",
    'a"b\\c',
    "it's",
    "#hash",
    "k: v",
    " lead",
    "ü-key",
    "emoji-\U0001f600",
    "- dash",
    "{x}",
    "[1]",
    "*ref",
    "!tag",
    "%p",
    "@a",
    "`b`",
]


@pytest.mark.parametrize("value", AWKWARD)
def test_yaml_quote_reads_back_exactly(value):
    text = QUOTE(value, "api_key")
    assert text.isascii()  # whatever the service's locale
    assert yaml.safe_load(f"api-key: {text}\n") == {"api-key": value}


@pytest.mark.parametrize("value", ["a\nb", "a\x00b", "a\tb", "a\x85b"])
def test_yaml_quote_refuses_control_characters_naming_the_setting_only(value):
    with pytest.raises(AnsibleFilterError) as err:
        QUOTE(value, "api_key")
    message = str(err.value)
    assert message.startswith("api_key contains the control character U+") and value not in message


@pytest.mark.skipif(not MERGER.is_file(), reason="no SGLang 0.5.23 in .lab/sglang-venv (make sglang-venv)")
def test_sglangs_own_merger_reads_the_key_back(tmp_path):
    """SGLang 0.5.23's ConfigArgumentMerger (what prepare_server_args runs for --config) turns the file the
    template writes into `--api-key <the key>` ahead of the argv, and argv keeps no secret."""
    merger_mod = _load("sglang_config_merger", MERGER)
    keys = {}
    argv, _ = build_argv(
        dict(DFLASH, api_key=True), CAPS, config_path=str(tmp_path / "sglang.yaml"), config_keys=keys
    )
    key = 'k"e\\y yes #1 ü'
    (tmp_path / "sglang.yaml").write_text(
        "# managed\n" + "".join(f"{k}: {QUOTE(key, s)}\n" for s, k in keys.items()), encoding="ascii"
    )
    parser = argparse.ArgumentParser()
    for dest, option in CAPS["options"].items():
        for action in option.get("actions", ()):
            flags = [f for f in action.get("flags", ()) if f.startswith("--")]
            if flags and dest in (
                "api_key",
                "config",
                "model_path",
                "speculative_algorithm",
                "speculative_draft_model_path",
                "speculative_draft_window_size",
            ):
                parser.add_argument(*flags, dest=dest)
    merged = merger_mod.ConfigArgumentMerger(parser).merge_config_with_args(argv)
    assert merged[:2] == ["--api-key", key]
    assert parser.parse_args(merged).api_key == key
    assert key not in argv


@pytest.fixture
def unit_host(tmp_path, monkeypatch):
    from ansible.module_utils.basic import AnsibleModule

    monkeypatch.setattr(
        AnsibleModule,
        "run_command",
        lambda self, cmd, **kw: (0, "UnitFileState=enabled\nLoadState=loaded\n", ""),
    )
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda self, name, required=False, opt_dirs=None: name)
    for d in ("system", "etc"):
        (tmp_path / d).mkdir()
    group = grp.getgrgid(os.getgid()).gr_name
    return {
        "name": "sglang.service",
        "unit_path": str(tmp_path / "system" / "sglang.service"),
        "unit_content": "# unchanged\n",
        "env_path": str(tmp_path / "etc" / "sglang.env"),
        "env_content": "HF_HOME=/x\n",
        "config_path": str(tmp_path / "etc" / "sglang.yaml"),
        "config_content": f'api-key: "{SENTINEL}"\n',
        "config_group": group,
        "previous_dir": str(tmp_path / "previous"),
    }


def test_unit_module_writes_the_config_file_group_readable_only(run_module, unit_host):
    Path(unit_host["unit_path"]).write_text(unit_host["unit_content"])
    os.chmod(unit_host["unit_path"], 0o644)
    Path(unit_host["env_path"]).write_text(unit_host["env_content"])
    os.chmod(unit_host["env_path"], 0o600)
    Path(unit_host["config_path"]).write_text('api-key: "old-key-value"\n')
    os.chmod(unit_host["config_path"], 0o644)
    result, failed = run_module("sglang_unit", unit_host)
    assert not failed, result
    assert result["config_changed"] and not result["unit_changed"] and not result["env_changed"]
    st = os.stat(unit_host["config_path"])
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == os.getgid()
    assert Path(unit_host["config_path"]).read_text() == unit_host["config_content"]
    assert Path(unit_host["previous_dir"], "sglang.yaml.previous").read_text() == 'api-key: "old-key-value"\n'
    assert SENTINEL not in run_module.last_output and "old-key-value" not in run_module.last_output
    result, failed = run_module("sglang_unit", unit_host)
    assert not failed and not result["config_changed"] and not result["changed"], result


def test_unit_module_refuses_an_unknown_group_and_touches_nothing(run_module, unit_host):
    result, failed = run_module("sglang_unit", dict(unit_host, config_group="no-such-group-x"))
    assert failed and result["msg"].startswith("config_group: no group 'no-such-group-x' on the host")
    assert not os.path.exists(unit_host["config_path"]) and not os.path.exists(unit_host["unit_path"])
