"""The API keys and the SSL key password never reach the startup log line or /server_info: upstream returned them from
GET /server_info (NORMAL auth level), so anyone holding the plain API key read the admin key there, and
`launch_command` carried `--api-key K` verbatim. Real command lines through prepare_server_args, the real endpoints."""

import asyncio
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from _sgl import KIMI_K25, platform

KEY, ADMIN, SSL_PW = "S3CRET-plain-key", "S3CRET-admin-key", "S3CRET-ssl-pw"
SECRETS = (KEY, ADMIN, SSL_PW)
PEM = Path(tempfile.mkdtemp(prefix="secrets-test-"))  # --ssl-certfile/--ssl-keyfile must name files
(PEM / "cert.pem").write_text("cert\n")
(PEM / "key.pem").write_text("key\n")


def parsed(*extra: str):
    from sglang.srt.server_args import prepare_server_args

    model = ["--model-path", str(KIMI_K25), "--tp-size", "8", "--device", "cuda"]
    cert = ["--ssl-certfile", str(PEM / "cert.pem")]  # what --ssl-keyfile needs beside it
    with platform(12):
        sa = prepare_server_args([*model, *cert, *extra])
        sa.resolve_once()
    return sa


# Each way argparse accepts the flags: spelled out, with "=", abbreviated (allow_abbrev).
KEYFILE = ("--ssl-keyfile", str(PEM / "key.pem"))
COMMAND_LINES = {
    "spelled": ("--api-key", KEY, "--admin-api-key", ADMIN, *KEYFILE, "--ssl-keyfile-password", SSL_PW),
    "equals": (f"--api-key={KEY}", f"--admin-api-key={ADMIN}", *KEYFILE, f"--ssl-keyfile-password={SSL_PW}"),
    "abbreviated": ("--api-ke", KEY, f"--admin-api-k={ADMIN}", *KEYFILE, "--ssl-keyfile-pass", SSL_PW),
}


@pytest.fixture
def server(monkeypatch):
    """make(server_args): the real http_server global state, with a tokenizer manager stand-in for its live
    state (scheduler internal states, startup time)."""
    from sglang.srt.entrypoints import http_server

    def make(sa):
        async def internal_state():
            return [{"avg_spec_accept_length": 1.0}]

        tm = SimpleNamespace(server_args=sa, startup_time=0.0, get_internal_state=internal_state)
        monkeypatch.setattr(
            http_server,
            "_global_state",
            http_server._GlobalState(tokenizer_manager=tm, template_manager=None, scheduler_info={}),
        )
        return http_server

    return make


@pytest.mark.parametrize("form", COMMAND_LINES)
def test_secrets_redacted_in_the_startup_log_line_and_server_info(server, form):
    from sglang.srt.entrypoints.engine import _server_args_for_logging

    sa = parsed(*COMMAND_LINES[form])
    assert (sa.api_key, sa.admin_api_key, sa.ssl_keyfile_password) == SECRETS  # the server still has them
    http = server(sa)
    infos = [asyncio.run(http.server_info()), asyncio.run(http.get_server_info())]
    for shown in (_server_args_for_logging(sa), *infos):  # the log line is f"server_args={logged}"
        text = json.dumps(shown, default=str)
        assert not any(s in text for s in SECRETS), text[:2000]
        assert shown["api_key"] == shown["admin_api_key"] == shown["ssl_keyfile_password"] == "<redacted>"
    assert all("<redacted>" in info["launch_command"] for info in infos)


@pytest.mark.unchanged
def test_no_key_reads_as_no_key_and_other_flags_stay(server):
    """No key set: /server_info says None, not a redaction; --ssl-keyfile (a prefix of --ssl-keyfile-password)
    and every other argument keep their values."""
    http = server(parsed(*KEYFILE, "--served-model-name", "kimi"))
    info = asyncio.run(http.server_info())
    assert info["api_key"] is None and info["admin_api_key"] is None
    assert f"--ssl-keyfile {PEM / 'key.pem'}" in info["launch_command"] and "kimi" in info["launch_command"]
