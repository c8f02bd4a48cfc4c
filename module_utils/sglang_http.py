# Copyright: contributors to this repository
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Minimal HTTP client for SGLang's endpoints (standard library only, no proxies).

Only loopback or the host's own address is ever queried; proxies from the environment are
ignored so that ``http_proxy`` on a GPU host cannot route a health check elsewhere.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

SERVER_INFO_PATHS = ('/server_info', '/get_server_info')

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HttpError(Exception):
    """The request did not produce an HTTP status (refused, timeout, bad URL)."""


def base_url(host, port):
    if ':' in host and not host.startswith('['):
        host = f'[{host}]'
    return f'http://{host}:{int(port)}'


def get_json(url, api_key=None, timeout=10.0):
    """GET ``url``; returns ``(status, body)``; body is the decoded JSON or the text if not JSON.

    HTTP error statuses (401, 404, 503, ...) are returned, not raised. Connection failures
    raise HttpError naming the URL (never the key).
    """
    headers = {'Accept': 'application/json'}
    if api_key:
        headers['Authorization'] = f'Bearer {api_key}'
    req = urllib.request.Request(url, headers=headers, method='GET')
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            raw = exc.read()
        except OSError:
            raw = b''
    except (urllib.error.URLError, socket.timeout, ConnectionError, OSError) as exc:
        reason = getattr(exc, 'reason', exc)
        raise HttpError(f'GET {url} failed: {reason}') from None
    text = raw.decode('utf-8', errors='replace')
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def server_info(base, api_key=None, timeout=10.0):
    """``/server_info``, falling back to ``/get_server_info`` on 404 (older servers).

    Returns ``(status, body, path_used, attempts)``; ``attempts`` lists ``(path, status)``.
    """
    attempts = []
    status, body, path = None, None, None
    for path in SERVER_INFO_PATHS:
        status, body = get_json(base.rstrip('/') + path, api_key=api_key, timeout=timeout)
        attempts.append((path, status))
        if status != 404:
            break
    return status, body, path, attempts
