"""Talking to a running server over HTTP with the standard library: GET and POST, JSON out. Nothing answering is a
status of 0, never an exception. Every request carries the API key use_api_key() set (a bearer token, as
bench_serving sends $OPENAI_API_KEY), so a server started with a key can be read."""

import dataclasses
import json
import urllib.error
import urllib.request


@dataclasses.dataclass
class ApiKey:
    """The API key every request sends, as a bearer token."""

    key: str = ""
    source: str = ""  # where it came from: "$SGLANG_API_KEY", "the file F"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}


API_KEY = ApiKey()


def use_api_key(key: str, source: str) -> None:
    """Send `key` with every request from here on ('' sends none)."""
    API_KEY.key, API_KEY.source = key, source


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=API_KEY.headers()), timeout=timeout) as r:
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
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json", **API_KEY.headers()}
    )
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
