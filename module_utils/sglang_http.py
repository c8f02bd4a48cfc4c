# Copyright: (c) 2026, the sglang-deploy authors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one HTTP client of the modules for SGLang's endpoints (``ansible.module_utils.urls``, no proxies).

Only loopback or the host's own address is ever queried; proxies from the environment are
ignored so that ``http_proxy`` on a GPU host cannot route a health check elsewhere.
"""

from __future__ import annotations

import json
import socket
import urllib.error

from ansible.module_utils.urls import open_url

SERVER_INFO_PATHS = ("/server_info", "/get_server_info")
HTTP_AGENT = "sglang-deploy"


class HttpError(Exception):
    """The request did not produce an HTTP status (refused, timeout, bad URL)."""


def base_url(host, port):
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{int(port)}"


def get(url, api_key=None, timeout=10.0, accept="application/json"):
    """GET ``url`` through ``ansible.module_utils.urls.open_url`` without proxies; ``(status, bytes)``.

    HTTP error statuses (401, 404, 503, ...) are returned with their body, not raised. Connection
    failures and timeouts raise HttpError naming the URL (never the key).
    """
    headers = {"Accept": accept}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    try:
        with open_url(
            url, method="GET", headers=headers, timeout=timeout, use_proxy=False, http_agent=HTTP_AGENT
        ) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        try:
            raw = exc.read()
        except OSError:
            raw = b""
        return exc.code, raw
    except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HttpError(f"GET {url} failed: {reason}") from None


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
