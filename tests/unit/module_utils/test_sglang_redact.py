"""module_utils/sglang_redact: the sentinel never survives (P13)."""

from __future__ import annotations

import json

from ansible.module_utils import sglang_redact as sr
from conftest import FIXTURES

SENTINEL = "SENTINEL-SECRET-9f3c"


def test_secret_keys():
    for key in (
        "api_key",
        "admin_api_key",
        "hf_token",
        "token",
        "HF_TOKEN",
        "github_token",
        "db_password",
        "client_secret",
        "ssl-keyfile-password",
    ):
        assert sr.is_secret_key(key), key
    for key in ("tokenizer_path", "max_total_tokens", "model_path", "api_key_header_name_x"):
        assert not sr.is_secret_key(key), key


def test_redact_recursive_on_real_server_info_body():
    body = json.loads((FIXTURES / "server_info" / "dflash-2048.json").read_text())
    assert SENTINEL in json.dumps(body)  # SGLang serves it unredacted
    out = sr.redact({"info": [body]}, [SENTINEL])
    text = json.dumps(out)
    assert SENTINEL not in text
    assert out["info"][0]["api_key"] == "<redacted>"
    assert out["info"][0]["admin_api_key"] is None
    assert "--api-key <redacted> --port 30000" in out["info"][0]["launch_command"]
    assert out["info"][0]["speculative_draft_window_size"] == 2048


def test_redact_argv_forms_and_variable_references():
    argv = [
        "sglang",
        "serve",
        "--api-key",
        SENTINEL,
        f"--admin-api-key={SENTINEL}",
        "--api-key",
        "${SGLANG_API_KEY}",
        "--api-key=$SGLANG_API_KEY",
        "--port",
        "30000",
    ]
    assert sr.redact_argv(argv) == [
        "sglang",
        "serve",
        "--api-key",
        "<redacted>",
        "--admin-api-key=<redacted>",
        "--api-key",
        "${SGLANG_API_KEY}",
        "--api-key=$SGLANG_API_KEY",
        "--port",
        "30000",
    ]


def test_redact_text_on_the_real_journal_line():
    line = (FIXTURES / "serverargs" / "dflash-2048.log").read_text()
    assert f"'api_key': '{SENTINEL}'" in line
    assert SENTINEL not in sr.redact_text(line)  # by key, even without the value
    assert "'api_key': '<redacted>'" in sr.redact_text(line)
    assert (
        sr.redact_text(f'curl -H "Authorization: Bearer {SENTINEL}"')
        == 'curl -H "Authorization: Bearer <redacted>"'
    )
    assert sr.redact_text(f"x {SENTINEL} y", [SENTINEL]) == "x <redacted> y"
    assert sr.redact_text("port 1 2", ["1"]) == "port 1 2"  # too short to scrub in free text


def test_unquoted_key_values_get_the_one_mask():
    """One mask for every redactor (sglang_verified_restart and model_weights_fetch wrote '********'):
    key=value and key: value without quotes, as in a log's key=value pairs, are masked by key name."""
    assert sr.redact_text(f"vrtest pid=309 starting, port=18002 api_key={SENTINEL}") == (
        "vrtest pid=309 starting, port=18002 api_key=<redacted>"
    )
    assert sr.redact_text(f"HF_TOKEN={SENTINEL} hf-token: {SENTINEL}") == (
        "HF_TOKEN=<redacted> hf-token: <redacted>"
    )
    assert sr.redact_text(f"db_password={SENTINEL}, next") == "db_password=<redacted>, next"
    # not secrets: another key, None, a variable reference; the quoted form keeps its quotes
    kept = "max_total_tokens=4096 tokenizer_path=/srv/t api_key=None api_key=${SGLANG_API_KEY}"
    assert sr.redact_text(kept) == kept
    assert sr.redact_text(f"api_key='{SENTINEL}'") == "api_key='<redacted>'"
    assert "*" not in sr.redact_text(f"api_key={SENTINEL} --api-key {SENTINEL} Bearer {SENTINEL}", [SENTINEL])
