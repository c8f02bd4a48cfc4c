# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one HTTP client of the modules for SGLang's endpoints: plain HTTP over ``http.client``, no proxies.

Only loopback or the host's own address is ever queried, over ``http://`` (``base_url``); proxies from
the environment are never read, so that ``http_proxy`` on a GPU host cannot route a health check
elsewhere. ``http.client`` rather than ``ansible.module_utils.urls``: a module that queries SGLang
imports no ``urls`` and loads no CA store (measured on a lab host: ~70 ms of CPU
less per run of the proof, sglang_verified_restart).
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
HTTP_AGENT = "sglang-deploy"


class HttpError(Exception):
    """The request did not produce an HTTP status (refused, timeout, bad URL)."""


def base_url(host, port):
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def _exchange(url, headers, timeout, method="GET", body=None):
    """One request to an ``http://host:port/path`` URL on a connection of its own; ``(status, bytes)``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError("not an http://host:port URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request(method, target, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get(url, api_key=None, timeout=10.0, accept="application/json"):
    """GET ``url`` without proxies; ``(status, bytes)``.

    HTTP error statuses (401, 404, 503, ...) are returned with their body, not raised. Connection
    failures, timeouts and answers that are not HTTP raise HttpError naming the URL (never the key).
    """
    headers = {"Accept": accept, "User-Agent": HTTP_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        return _exchange(url, headers, timeout)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise HttpError(f"GET {url} failed: {exc}") from None


def post_json(url, payload, api_key=None, timeout=60.0):
    """POST ``payload`` as JSON to ``url`` without proxies; ``(status, body)`` with the body decoded as JSON
    (its text when it is not). HTTP error statuses are returned; connection failures raise HttpError naming
    the URL (never the key)."""
    headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": HTTP_AGENT}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        code, raw = _exchange(url, headers, timeout, "POST", json.dumps(payload).encode("utf-8"))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise HttpError(f"POST {url} failed: {exc}") from None
    text = raw.decode("utf-8", errors="replace")
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def status(url, api_key=None, timeout=10.0):
    """Only the status of GET ``url``: ``(status, '')``, or ``(None, reason)`` when there was none
    (refused, timeout). For health checks, where an unreachable server is an answer, not an error."""
    try:
        code, _body = get(url, api_key=api_key, timeout=timeout, accept="*/*")
    except HttpError as exc:
        return None, str(exc)
    return code, ""


def get_json(url, api_key=None, timeout=10.0):
    """GET ``url``; returns ``(status, body)``; body is the decoded JSON or the text if not JSON.

    HTTP error statuses are returned, not raised; connection failures raise HttpError.
    """
    code, raw = get(url, api_key=api_key, timeout=timeout)
    text = raw.decode("utf-8", errors="replace")
    try:
        return code, json.loads(text)
    except ValueError:
        return code, text


def server_info(base, api_key=None, timeout=10.0):
    """``/server_info``, falling back to ``/get_server_info`` on 404 (older servers).

    Returns ``(status, body, path_used, attempts)``; ``attempts`` lists ``(path, status)``.
    """
    attempts = []
    status, body, path = None, None, None
    for path in SERVER_INFO_PATHS:
        status, body = get_json(base.rstrip("/") + path, api_key=api_key, timeout=timeout)
        attempts.append((path, status))
        if status != 404:
            break
    return status, body, path, attempts
