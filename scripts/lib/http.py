"""Talking to a running server over HTTP with the standard library: GET (status and body), JSON in and out.
Nothing answering is a status of 0, never an exception."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, ValueError):
        return 0, b""


def get_json(url: str, timeout: float = 10.0) -> dict | None:
    status, body = http_get(url, timeout)
    if status != 200:
        return None
    try:
        d = json.loads(body)
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def post_json(url: str, payload: dict, timeout: float = 300.0) -> tuple[int, dict | str]:
    """(status, the JSON answer, or the body as text when it is not JSON); status 0 when nothing answered."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read() if e.fp else b""
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, str(e)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode("utf-8", "replace")
