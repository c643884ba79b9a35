"""Who can reach the server: the one rule `serve` applies and the doctor reports (check `listen`).

- A loopback host (127.0.0.0/8, ::1, localhost; SGLang's own default --host is 127.0.0.1): only this machine can
  connect (with `docker run --network host`, the box itself). "listening on 127.0.0.1 only".
- Any other host (0.0.0.0, ::, an address or a name) is the operator's opt-in (`serve --host 0.0.0.0`, `host` under
  a profile's [defaults], or `serve -- --host ...`) and needs an API key: from $SGLANG_API_KEY, from a file the
  operator names (`serve --api-key-file FILE`, e.g. a mounted docker secret), or given to sglang by hand
  (`serve -- --api-key ...`, which then is on the command line). Without one, serve refuses to start.

The key reaches SGLang's --api-key inside the launched process (key_argv: `python3 -c KEY_SHIM SOURCE ARGS...`
appends it to sys.argv and runs sglang.launch_server as `-m` would), so it is on no command line: not in `ps`, not
in what serve prints (redacted() hides every secret flag's value, by the dest sglang's parser gives the token, so
abbreviations such as --api-k are hidden too). The series' entrypoints patch redacts the keys in SGLang's own
startup log line and in /server_info. A key file is written private: KEY_FILE_FIX.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

from ..lib.errors import UserError

KEY_VAR = "SGLANG_API_KEY"
SGLANG_DEFAULT_HOST = "127.0.0.1"
# sglang flags whose value is a secret, by dest; and their option strings (for tokens no parser resolved)
SECRET_DESTS = {"api_key": "--api-key", "admin_api_key": "--admin-api-key",
                "ssl_keyfile_password": "--ssl-keyfile-password"}
NOT_SECRET = {"--ssl-keyfile"}  # a flag of its own that is also a prefix of a secret flag
# argv: python3 -c KEY_SHIM env:NAME|file:PATH SGLANG_ARGS... (the key leaves the environment of sglang's children)
KEY_SHIM = ("import os, runpy, sys; kind, _, ref = sys.argv.pop(1).partition(':'); "
            "key = os.environ.pop(ref) if kind == 'env' else open(ref).read().strip(); "
            "sys.argv += ['--api-key', key]; "
            "runpy.run_module('sglang.launch_server', run_name='__main__', alter_sys=True)")
KEY_FILE = "/etc/sglang/api_key"


def key_file_fix(path: str = KEY_FILE) -> str:
    """Writes a new key into `path`, readable by its owner only (umask 077 before the file exists)."""
    return f"(umask 077 && mkdir -p {Path(path).parent} && openssl rand -hex 32 > {path})"


FIX = (f"write a key file, {key_file_fix()}, mount it (docker run -v {KEY_FILE}:/run/secrets/sglang_api_key:ro) and "
       f"name it (serve --api-key-file /run/secrets/sglang_api_key); or export {KEY_VAR}=$(openssl rand -hex 32) and "
       f"pass it by name (docker run -e {KEY_VAR}: docker inspect shows it); or serve on loopback only (leave out "
       f"--host 0.0.0.0)")


@dataclasses.dataclass
class Listen:
    host: str
    loopback: bool
    key_from: str = ""  # "$SGLANG_API_KEY", "the file PATH", "the command line (--api-key)", or "" (no key)
    key_spec: str = ""  # what KEY_SHIM reads: "env:SGLANG_API_KEY" or "file:PATH" ("": nothing to add)
    refusal: str = ""  # why serve must not start ("" when it may)

    @property
    def line(self) -> str:
        if self.refusal:
            return self.refusal
        key = f"with an API key from {self.key_from}" if self.key_from else ""
        if self.loopback:
            return f"listening on {self.host} only" + (f", {key}" if key else
                                                       f": other machines cannot connect (to open it: serve --host "
                                                       f"0.0.0.0 with {KEY_VAR} set)")
        return f"listening on {self.host} {key}"


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost: it may resolve to any interface


def _key_file(path: str) -> None:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UserError(f"--api-key-file {path}: cannot read it ({e.strerror}); mount the file into the container "
                        f"(docker run -v /path/on/host:{path}:ro) or fix the path") from e
    if not text.strip():
        raise UserError(f"--api-key-file {path} is empty: write a key into it on the host, "
                        f"{key_file_fix(KEY_FILE)}, and mount that file here")


def decide(host: str, environ: dict[str, str], key_file: str | None = None, cli_key: bool = False) -> Listen:
    """Where serve listens and with which key; refusal set when a host beyond loopback has no key. A UserError for
    a key source that is set but unusable (empty, unreadable, two sources)."""
    out = Listen(host=host, loopback=is_loopback(host))
    if cli_key:
        out.key_from = "the command line (--api-key; visible in ps, redacted in what serve prints)"
        return out
    if key_file is not None and KEY_VAR in environ:
        raise UserError(f"both {KEY_VAR} and --api-key-file {key_file} are set: keep one (unset {KEY_VAR}, or leave "
                        f"out --api-key-file)")
    if KEY_VAR in environ:
        if not environ[KEY_VAR].strip():
            raise UserError(f"{KEY_VAR} is empty: set it to the key (export {KEY_VAR}=$(openssl rand -hex 32)), or "
                            f"unset it")
        out.key_from, out.key_spec = f"${KEY_VAR}", f"env:{KEY_VAR}"
    elif key_file is not None:
        _key_file(key_file)
        out.key_from, out.key_spec = f"the file {key_file}", f"file:{key_file}"
    elif not out.loopback:
        out.refusal = (f"refusing to listen on {host} without an API key: anyone who reaches this port could use "
                       f"the model")
    return out


def client_key(environ: dict[str, str], key_file: str | None = None) -> tuple[str, str]:
    """(key, where it came from) for a client of the server (make bench), from the sources serve reads:
    $SGLANG_API_KEY or a file (--api-key-file); ('', '') when neither is set. The same UserErrors as serve for a
    source that is set but unusable."""
    listen = decide(SGLANG_DEFAULT_HOST, environ, key_file)
    kind, _, ref = listen.key_spec.partition(":")
    if kind == "env":
        return environ[ref].strip(), listen.key_from
    if kind == "file":
        return Path(ref).read_text().strip(), listen.key_from
    return "", ""


def key_argv(python: str, key_spec: str, sglang_args: list[str]) -> list[str]:
    """The command that starts sglang with the key added inside the process (see KEY_SHIM)."""
    return [python, "-c", KEY_SHIM, key_spec, *sglang_args]


def _secret(option: str, dest) -> bool:
    """Whether an option token names a secret flag: by sglang's dest for it, or as argparse abbreviates one."""
    if dest(option) in SECRET_DESTS:
        return True
    return (option.startswith("--") and len(option) > 3 and option not in NOT_SECRET
            and any(flag.startswith(option) for flag in SECRET_DESTS.values()))


def redacted(argv: list[str], dest=lambda token: None) -> list[str]:
    """argv with the value of every secret flag replaced (for printing). `dest` maps an option token to the dest
    sglang's parser gives it (serve's FlagIndex.dest), so abbreviations are caught."""
    out, hide = [], False
    for t in argv:
        name = t.split("=", 1)[0]
        if hide:
            out.append("<redacted>")
            hide = False
        elif "=" in t and _secret(name, dest):
            out.append(f"{name}=<redacted>")
        else:
            out.append(t)
            hide = t.startswith("--") and "=" not in t and _secret(t, dest)
    return out
