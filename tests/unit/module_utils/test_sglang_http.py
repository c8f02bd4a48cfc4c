"""module_utils/sglang_http: the one HTTP client of the modules (http.client, no proxies) against a real
local HTTP server that answers as SGLang 0.5.23 does (recorded /server_info body)."""

from __future__ import annotations

import http.server
import socket
import threading

import pytest
from ansible.module_utils import sglang_http as sh
from conftest import FIXTURES

BODY = (FIXTURES / "server_info" / "dflash-2048.json").read_bytes()
KEY = "SENTINEL-SECRET-9f3c"


class _Handler(http.server.BaseHTTPRequestHandler):
    seen = []
    agents = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.agents.append(self.headers.get("User-Agent"))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            status, body = 401, b'{"error": "Unauthorized"}'
        elif self.path == "/server_info":
            status, body = 200, BODY
        elif self.path == "/health_generate":
            status, body = 503, b""
        else:
            status, body = 404, b'{"detail":"Not Found"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


@pytest.fixture
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    _Handler.seen = []
    _Handler.agents = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield sh.base_url("127.0.0.1", httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def test_get_json_sends_the_key_and_returns_error_statuses(server):
    status, body = sh.get_json(server + "/server_info", api_key=KEY)
    assert status == 200 and body["speculative_draft_window_size"] == 2048
    assert sh.get_json(server + "/server_info") == (401, {"error": "Unauthorized"})
    assert _Handler.seen == [("/server_info", f"Bearer {KEY}"), ("/server_info", None)]
    assert _Handler.agents == [sh.HTTP_AGENT] * 2


def test_server_info_falls_back_on_404_only(server):
    status, _body, path, attempts = sh.server_info(server, KEY)
    assert (status, path, attempts) == (200, "/server_info", [("/server_info", 200)])


def test_status_is_a_health_answer_never_an_exception(server):
    assert sh.status(server + "/health_generate", KEY, 5) == (503, "")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, error = sh.status(sh.base_url("127.0.0.1", port) + "/health_generate", KEY, 5)
    assert code is None and "refused" in error.lower() and KEY not in error


def test_an_answer_that_is_not_http_is_an_error_naming_the_url():
    """A listener that closes without answering (a port taken by something else) is an HttpError."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        url = sh.base_url("127.0.0.1", listener.getsockname()[1]) + "/server_info"

        def close_once():
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.close()

        thread = threading.Thread(target=close_once, daemon=True)
        thread.start()
        with pytest.raises(sh.HttpError, match=f"GET {url} failed"):
            sh.get_json(url, api_key=KEY, timeout=5)
        thread.join(5)
    assert sh.status(url, KEY, 1)[0] is None  # nobody accepts any more: no answer, never an exception


def test_proxies_from_the_environment_are_not_used(server, monkeypatch):
    """A health check must reach the server itself, never a proxy named by http_proxy on the host."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # discard port: a proxy there refuses
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert sh.status(server + "/server_info", KEY, 5) == (200, "")


def test_ipv6_hosts_are_bracketed():
    assert sh.base_url("::1", 30000) == "http://[::1]:30000"
    assert sh.base_url("[::1]", 30000) == "http://[::1]:30000"
    assert sh.base_url("gpu01.lab", "30000") == "http://gpu01.lab:30000"
