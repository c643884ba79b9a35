"""`serve`: SGLang's own launch_server with a serving profile (an SGLang --config YAML file); the image's default verb.

  python -m scripts.host.serve [--profile NAME|PATH] [--model M] [--draft-model D] [--port N] [--host ADDR]
                               [--api-key-file F] [--dry-run [--json]] [--image [IMAGE]] [-- SGLANG_ARGS...]

Runs `python3 -m sglang.launch_server --config PROFILE [...]`; command-line flags override the file (SGLang's rule).
Where SGLang imports, its prepare_server_args checks the command first. Loopback unless an API key is given (a key
file, else $SGLANG_API_KEY), which reaches SGLang through a pipe, never a command line. --image: in the serving image.
Exit status: 0 dry run printed (serving replaces this process with SGLang or docker); 2 a problem, named with its fix.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import ipaddress
import json
import os
import re
import shlex
import sys
import tempfile
import time
from pathlib import Path

from ..box.docker import docker_run, hf_cache_dir, shown
from ..lib import profiles
from ..lib.cli import run
from ..lib.errors import UserError
from ..lib.repo import SHIPPED_PROFILE
from . import drafters

LAUNCH = "sglang.launch_server"
KEY_VAR, KEY_FILE = "SGLANG_API_KEY", "/etc/sglang/api_key"
FIX = (
    f"write a key file readable by you only, (umask 077 && mkdir -p /etc/sglang && openssl rand -hex 32 > "
    f"{KEY_FILE}), mount it (docker run -v {KEY_FILE}:/run/secrets/sglang_api_key:ro) and name it (serve "
    f"--api-key-file /run/secrets/sglang_api_key); or export {KEY_VAR}=$(openssl rand -hex 32) and pass it by "
    f"name (docker run -e {KEY_VAR}: docker inspect shows it); or stay on loopback (leave out --host)"
)
LAUNCHER_NOTE = (
    "the patched launcher decides the PCIe-only NCCL defaults and the PCIe-IPC all-reduce when it starts "
    "(NVML topology) and logs what it applied"
)
OWN = {
    "--profile": f"profile name in docker/profiles or a .yaml path (default {SHIPPED_PROFILE})",
    "--model": "target model (HF id or path): --model-path",
    "--draft-model": "drafter (EAGLE-3 or DFlash): --speculative-draft-model-path",
    "--port": "HTTP port",
    "--host": "address to listen on (beyond loopback it needs an API key)",
    "--api-key-file": "file holding the API key (e.g. a mounted docker secret)",
}
# Values SGLang's parser takes by type but that fail only once the server starts, after the weights load.
RULES = {
    "mem_fraction_static": (lambda v: 0 < v < 1, "a fraction between 0 and 1 (e.g. 0.85)"),
    "speculative_eagle_topk": (lambda v: v >= 1, "at least 1"),
    "speculative_num_steps": (lambda v: v >= 1, "at least 1"),
    "speculative_num_draft_tokens": (lambda v: v >= 1, "at least 1"),
    "max_running_requests": (lambda v: v >= 1, "at least 1"),
    "tp_size": (lambda v: v >= 1, "at least 1"),
}


@dataclasses.dataclass
class Plan:
    profile: Path
    argv: list[str]
    listen: str = ""  # who can reach the server
    key: str = ""  # goes into the private copy of the profile
    key_from: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)


def read_key(environ: dict[str, str], key_file: str | None) -> tuple[str, str]:
    """(key, where from) of the key file, else $SGLANG_API_KEY; ('', '') when neither is set."""
    if key_file is not None and KEY_VAR in environ:
        raise UserError(f"both {KEY_VAR} and --api-key-file {key_file} are set: keep one (unset {KEY_VAR})")
    if key_file is not None:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as e:
            raise UserError(
                f"--api-key-file {key_file}: cannot read it ({e.strerror}); mount it into the "
                f"container (docker run -v /path/on/host:{key_file}:ro) or fix the path"
            ) from e
        where = f"the file {key_file}"
    elif KEY_VAR in environ:
        key, where = environ[KEY_VAR].strip(), f"${KEY_VAR}"
    else:
        return "", ""
    if not key:
        raise UserError(f"{where} is empty: put a key there ({FIX.split('; or ')[0]})")
    return key, where


def listening(host: str, key_from: str) -> str:
    """Who can reach the server: loopback, or any address with an API key (a UserError beyond loopback without)."""
    try:
        loopback = host.lower() == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False  # a name other than localhost may resolve to any interface
    if not loopback and not key_from:
        raise UserError(
            f"refusing to listen on {host} without an API key: anyone who reaches the port could use it. Fix: {FIX}"
        )
    key = f" with an API key from {key_from}" if key_from else ""
    return f"listening on {host}" + (" only" if loopback else "") + key


def parse_with_sglang(args: list[str]):
    """SGLang's own parse of the command (ServerArgs), or None where SGLang does not import here."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from sglang.srt.server_args import prepare_server_args
    except Exception:  # noqa: BLE001 - any failure means: not checked, and the dry run says so
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return prepare_server_args(args)
    except (SystemExit, ValueError) as e:
        usage, said = err.getvalue(), (err.getvalue().strip().splitlines() or [str(e)])[-1]
        flags = set(re.findall(r"--[\w-]+", usage.replace(said, "")))  # the usage SGLang printed lists its flags
        close = [c for t in said.split() if t.startswith("--") for c in difflib.get_close_matches(t, flags, 1, 0.8)]
        raise UserError(
            f"SGLang refuses the command: {said}" + (f" (did you mean {', '.join(close)}?)" if close else "")
        ) from None


def check_values(sa) -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    bad = [
        f"{k.replace('_', '-')} {getattr(sa, k)}: must be {what}"
        for k, (ok, what) in RULES.items()
        if isinstance(getattr(sa, k, None), (int, float)) and not ok(getattr(sa, k))
    ]
    try:
        SpeculativeAlgorithm.from_string(sa.speculative_algorithm)
    except ValueError as e:
        bad.append(f"speculative-algorithm: {e}")
    draft, algorithm = sa.speculative_draft_model_path, sa.speculative_algorithm
    drafts_for = drafters.KNOWN.get(draft, ("EAGLE3",))[0]
    if draft and not algorithm:
        bad.append(
            f"a drafter without --speculative-algorithm is never loaded: add -- --speculative-algorithm {drafts_for}"
        )
    elif draft in drafters.KNOWN and algorithm.upper() != drafts_for:
        bad.append(
            f"drafter {draft} drafts for {drafts_for}, not {algorithm}: add -- --speculative-algorithm {drafts_for}"
        )
    if bad:
        raise UserError(
            "SGLang would fail on these only after loading the weights; fix them in the profile or "
            "after --:\n  " + "\n  ".join(bad)
        )


def last_flag(args: list[str], flag: str, default=None):
    for i, t in enumerate(args):
        if t == flag and i + 1 < len(args):
            default = args[i + 1]
        elif t.startswith(flag + "="):
            default = t.split("=", 1)[1]
    return default


def build_plan(a: argparse.Namespace, extra: list[str], environ: dict[str, str]) -> Plan:
    path = profiles.find(a.profile)
    prof = profiles.load(path)
    given = [
        ("--model-path", a.model),
        ("--speculative-draft-model-path", a.draft_model),
        ("--port", a.port),
        ("--host", a.host),
    ]
    sgl = ["--config", str(path), *[x for f, v in given if v is not None for x in (f, str(v))], *extra]
    plan = Plan(path, [sys.executable, "-m", LAUNCH, *sgl])
    sa = parse_with_sglang(sgl)
    if sa is None:
        plan.notes.append("SGLang does not import here: the values were not checked (run it in the image)")
        host = last_flag(sgl, "--host", prof.get("host", "127.0.0.1"))  # SGLang's default
        draft = last_flag(sgl, "--speculative-draft-model-path", prof.get("speculative-draft-model-path"))
        model = last_flag(sgl, "--model-path", prof.get("model-path"))
        cli_key = any(str(t).lstrip("-").replace("_", "-").split("=")[0] == "api-key" for t in [*prof, *sgl])
    else:
        check_values(sa)
        host, draft, model, cli_key = sa.host, sa.speculative_draft_model_path, sa.model_path, bool(sa.api_key)
    plan.key, plan.key_from = read_key(environ, a.api_key_file)
    plan.listen = listening(host, plan.key_from or ("the command line (--api-key)" if cli_key else ""))
    if draft:
        plan.notes.append(drafters.drafter_note(draft))
    if model and not drafters.cached(model):
        plan.notes.append(
            f"model {model} is not in the HF cache {hf_cache_dir()}: SGLang downloads it at start "
            f"(Kimi-K2.5: ~600 GB; the doctor asks for 700 GB free)"
        )
    return plan


def private_config(profile: dict, key: str) -> str:
    """A FIFO holding the profile plus api-key, private to this user: a child writes it once when SGLang opens it,
    then removes it (or after 15 minutes if nothing reads it)."""
    import yaml

    mine = {**{k: v for k, v in profile.items() if k not in ("api-key", "api_key")}, "api-key": key}
    text = yaml.safe_dump(mine, sort_keys=False)
    fifo = os.path.join(tempfile.mkdtemp(prefix="serve-"), "profile.yaml")
    os.mkfifo(fifo, 0o600)
    if os.fork() == 0:
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.2)
                continue
            os.set_blocking(fd, True)
            os.write(fd, text.encode())
            os.close(fd)
            break
        os.unlink(fifo)
        os.rmdir(os.path.dirname(fifo))
        os._exit(0)
    return fifo


def in_image(a: argparse.Namespace, extra: list[str]) -> int:
    """make serve: this verb in the serving image through docker_run; a profile or key file given as a host path is
    mounted read-only."""
    from ..series.pin import load_pin

    args, mounts = [], []
    for opt in OWN:
        v = getattr(a, opt[2:].replace("-", "_"))
        if opt == "--api-key-file" and v or opt == "--profile" and v.endswith((".yaml", ".yml")):
            if not Path(v).is_file():
                raise UserError(f"{opt} {v}: no such file here, so there is nothing to mount into the container")
            mounts += ["-v", f"{Path(v).resolve()}:/run/serve/{Path(v).name}:ro"]
            v = f"/run/serve/{Path(v).name}"
        args += [opt, str(v)] if v is not None and v != SHIPPED_PROFILE else []
    cmd = docker_run(
        a.image or load_pin().serving_image,
        ["serve", *args, *(["--", *extra] if extra else [])],
        hf_cache=hf_cache_dir(),
        network_host=True,
        extra=mounts,
    )
    print(shown(cmd), flush=True)
    if not a.dry_run:
        os.execvp(cmd[0], cmd)
    at = cmd.index("serve") + 1
    print(
        f"# what SGLang resolves from it, and the patched launcher's decisions, without serving: "
        f"{shlex.join([*cmd[:at], '--dry-run', *cmd[at:]])}"
    )
    return 0


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(
        prog="serve", description=__doc__, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for opt, what in OWN.items():
        ap.add_argument(opt, type=int if opt == "--port" else str, help=what)
    ap.set_defaults(profile=SHIPPED_PROFILE)
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: one JSON object")
    ap.add_argument("--image", nargs="?", const="", help="run serve in this image (default: make image's)")
    a, unknown = ap.parse_known_args(own)
    for t in unknown:
        close = difflib.get_close_matches(t.split("=")[0], [*OWN, "--dry-run", "--json", "--image"], 1, 0.8)
        raise UserError(
            f"serve has no option {t}: "
            + (f"did you mean {close[0]}?" if close else f"an SGLang flag goes after --: serve ... -- {t}")
        )
    return a, extra


def main(argv=None) -> int:
    a, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.image is not None:
        return in_image(a, extra)
    environ = dict(os.environ)
    plan = build_plan(a, extra, environ)
    if plan.key:
        plan.notes.append(
            f"the API key from {plan.key_from} reaches SGLang in a private copy of the profile "
            f"(read once through a pipe), on no command line"
        )
    shown = "\n".join(
        [
            f"# profile {plan.profile}",
            *(f"# {n}" for n in [*plan.notes, LAUNCHER_NOTE, plan.listen]),
            shlex.join(plan.argv),
        ]
    )
    if a.dry_run:
        doc = {
            "argv": plan.argv,
            "env": {},
            "listen": plan.listen,
            "notes": plan.notes,
            "profile": str(plan.profile),
            "launcher": LAUNCHER_NOTE,
        }
        print(json.dumps(doc, indent=1) if a.json else shown)
        return 0
    print(shown, file=sys.stderr, flush=True)  # what starts, and what it will download
    if plan.key:
        plan.argv[plan.argv.index("--config") + 1] = private_config(profiles.load(plan.profile), plan.key)
    environ.pop(KEY_VAR, None)
    os.execve(plan.argv[0], plan.argv, environ)
    return 0  # not reached


if __name__ == "__main__":
    run(main)
