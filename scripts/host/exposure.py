"""Who can reach the server, the one rule serve applies and the doctor reports: loopback, or any address with an API
key (a key file the operator names, else $SGLANG_API_KEY). serve hands the key to SGLang on no command line."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from ..lib.errors import UserError

KEY_VAR = "SGLANG_API_KEY"
SGLANG_DEFAULT_HOST = "127.0.0.1"
KEY_FILE = "/etc/sglang/api_key"
FIX = (f"write a key file readable by you only, (umask 077 && mkdir -p /etc/sglang && openssl rand -hex 32 > "
       f"{KEY_FILE}), mount it (docker run -v {KEY_FILE}:/run/secrets/sglang_api_key:ro) and name it (serve "
       f"--api-key-file /run/secrets/sglang_api_key); or export {KEY_VAR}=$(openssl rand -hex 32) and pass it by "
       f"name (docker run -e {KEY_VAR}: docker inspect shows it); or stay on loopback (leave out --host)")


@dataclasses.dataclass
class Listen:
    host: str
    loopback: bool
    key_from: str = ""  # "the file F", "$SGLANG_API_KEY", "the command line", or "" (no key)
    refusal: str = ""

    @property
    def line(self) -> str:
        key = f" with an API key from {self.key_from}" if self.key_from else ""
        return self.refusal or f"listening on {self.host}" + (" only" if self.loopback else "") + key


def is_loopback(host: str) -> bool:
    try:
        return host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to any interface


def read_key(environ: dict[str, str], key_file: str | None) -> tuple[str, str]:
    """(key, where from) of the key file, else $SGLANG_API_KEY; ('', '') when neither is set."""
    if key_file is not None and KEY_VAR in environ:
        raise UserError(f"both {KEY_VAR} and --api-key-file {key_file} are set: keep one (unset {KEY_VAR})")
    if key_file is not None:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as e:
            raise UserError(f"--api-key-file {key_file}: cannot read it ({e.strerror}); mount it into the "
                            f"container (docker run -v /path/on/host:{key_file}:ro) or fix the path") from e
        where = f"the file {key_file}"
    elif KEY_VAR in environ:
        key, where = environ[KEY_VAR].strip(), f"${KEY_VAR}"
    else:
        return "", ""
    if not key:
        raise UserError(f"{where} is empty: put a key there ({FIX.split('; or ')[0]})")
    return key, where


def decide(host: str, environ: dict[str, str], key_file: str | None = None, cli_key: bool = False) -> Listen:
    """Where serve listens and with which key; `refusal` set when a host beyond loopback has no key."""
    out = Listen(host, is_loopback(host))
    out.key_from = "the command line (--api-key)" if cli_key else read_key(environ, key_file)[1]
    if not out.loopback and not out.key_from:
        out.refusal = f"refusing to listen on {host} without an API key: anyone who reaches the port could use it"
    return out


def client_key(environ: dict[str, str], key_file: str | None = None) -> tuple[str, str]:
    """(key, where from) for a client of the server (make bench): the sources serve reads."""
    return read_key(environ, key_file)
