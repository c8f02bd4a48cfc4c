"""module_utils/sglang_speculation.py: does speculative decoding take effect (issue 38 item 3), on /generate
answers recorded from the lab server in SGLang 0.5.23's shape (tests/fixtures/speculation/)."""

from __future__ import annotations

import http.server
import json
import threading

import pytest
from ansible.module_utils import sglang_speculation as sp
from conftest import FIXTURES

S = FIXTURES / "speculation"


def meta(name: str) -> dict:
    return json.loads((S / name).read_text())["meta_info"]


@pytest.mark.parametrize(
    "name, want",
    [
        (
            "generate-dflash-2048.json",
            {"accept_length": 4.0, "completion_tokens": 64, "spec_verify_ct": 16, "stand_in": True},
        ),
        (
            "generate-no-speculation.json",
            {"accept_length": 1.0, "completion_tokens": 64, "spec_verify_ct": None, "stand_in": True},
        ),
    ],
)
def test_acceptance_length_is_completion_tokens_over_verify_forwards(name, want):
    """As sglang/test/send_one.py: completion_tokens / spec_verify_ct, 1.0 when nothing was verified; the same
    figure SGLang puts into meta_info as spec_accept_length."""
    got = sp.acceptance(meta(name))
    assert got == want
    assert meta(name).get("spec_accept_length", 1.0) == got["accept_length"]


def test_an_answer_without_completion_tokens_is_refused_naming_it():
    with pytest.raises(sp.ProbeError, match="no completion_tokens"):
        sp.acceptance({"id": "x"})


def test_the_probe_is_deterministic_and_longer_than_the_window():
    body = sp.probe_request(2048, 64)
    assert body == sp.probe_request(2048, 64)
    assert body["sampling_params"] == {"temperature": 0, "max_new_tokens": 64, "ignore_eos": True}
    assert len(body["text"].split()) > 2048
    assert meta("generate-dflash-2048.json")["prompt_tokens"] > 2048


def test_the_gate_names_the_figure_only_under_the_minimum():
    result = sp.acceptance(meta("generate-dflash-2048.json"))
    assert sp.below_minimum(result, 0) is None and sp.below_minimum(result, 4.0) is None
    assert sp.below_minimum(result, 4.5) == (
        "speculative decoding acceptance length 4.0 (completion_tokens 64 / spec_verify_ct 16) is under "
        "sglang_min_accept_length 4.5"
    )


def test_a_window_over_the_drafters_trained_sliding_window_is_named_with_its_file_and_field(tmp_path):
    (tmp_path / "config.json").write_bytes((S / "draft-config.json").read_bytes())
    assert sp.window_warning(tmp_path, 2048) is None
    assert sp.window_warning(tmp_path, 4096) == (
        f"the draft window 4096 exceeds the sliding window the drafter was trained with: "
        f"{tmp_path / 'config.json'} sliding_window = 2048"
    )
    nested = tmp_path / "nested"
    nested.mkdir()
    (nested / "config.json").write_text(json.dumps({"text_config": {"sliding_window": 1024}}))
    assert "text_config.sliding_window = 1024" in sp.window_warning(nested, 2048)
    assert sp.window_warning(tmp_path / "missing", 4096) is None


def test_measure_posts_the_probe_with_the_key_and_reads_the_answer():
    seen = []
    answer = (S / "generate-dflash-2048.json").read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = sp.measure("127.0.0.1", server.server_address[1], "k3y", 2048)
    finally:
        server.shutdown()
    assert got == {"accept_length": 4.0, "completion_tokens": 64, "spec_verify_ct": 16, "stand_in": True,
                   "new_tokens": 64}  # fmt: skip
    assert seen == [("/generate", "Bearer k3y", sp.probe_request(2048))]
    with pytest.raises(sp.ProbeError, match="POST http://127.0.0.1:9/generate failed"):
        sp.measure("127.0.0.1", 9, None, 2048, timeout=2)
