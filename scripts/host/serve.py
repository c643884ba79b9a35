"""`serve`: SGLang's own launch_server with a serving profile (an SGLang --config YAML file); the image's default verb.

  python -m scripts.host.serve [--profile NAME|PATH] [--model M] [--draft-model D] [--port N] [--host ADDR]
                               [--api-key-file F] [--dry-run [--json]] [--image [IMAGE]] [-- SGLANG_ARGS...]

Runs `python3 -m sglang.launch_server --config PROFILE [...]`; command-line flags override the file (SGLang's rule).
SGLang's prepare_server_args checks the command first, then the values it would fail on only after the load (RULES,
the drafter's algorithm). Loopback unless an API key is given (a key file, else $SGLANG_API_KEY), which reaches
SGLang through a pipe, never a command line. --image (make serve): the box's checks (the engine, the image and its
patch set, no resident server), the image's own dry run (the checks above, there), then the GPUs (enough, idle), the
port and the weights here, each with its fix; then this verb in the serving image, a path of serve's options mounted
where it is. Exit status: 0 served or a dry run that passed (serving replaces this process with SGLang or docker);
2 a problem or a failed check, named with its fix.
"""

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
import signal
import sys
import tempfile
from pathlib import Path

from ..box import preflight
from ..box.docker import container_name, docker_run, hf_cache_dir, shown
from ..lib import proc, profiles
from ..lib.cli import parser, run, split
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
    "tp_size": (lambda v: v in (1, 2, 4, 8), "1, 2, 4 or 8 (what splits Kimi-K2.5's 64 heads over this box's GPUs)"),
}


@dataclasses.dataclass
class Plan:
    """What serve runs and what its dry run says (--json: all of it but the key)."""

    profile: str
    argv: list[str]
    listen: str = ""  # who can reach the server
    notes: list[str] = dataclasses.field(default_factory=list)
    port: int = 30000
    tp: int = 1
    weights: list[str] = dataclasses.field(default_factory=list)  # the model and the drafter
    launcher: str = LAUNCHER_NOTE
    key: str = ""  # goes into the private copy of the profile
    key_from: str = ""


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
    """SGLang's own parse of the command (ServerArgs)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from sglang.srt.server_args import prepare_server_args
    except Exception as e:  # noqa: BLE001 - any failure: SGLang is not usable here
        raise UserError(
            f"SGLang does not import here ({type(e).__name__}: {e}): serve runs where SGLang is installed (make "
            f"serve runs it in the serving image)"
        ) from None
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


def build_plan(a: argparse.Namespace, extra: list[str], environ: dict[str, str]) -> Plan:
    path = profiles.find(a.profile)
    given = [
        ("--model-path", a.model),
        ("--speculative-draft-model-path", a.draft_model),
        ("--port", a.port),
        ("--host", a.host),
    ]
    sgl = ["--config", str(path), *[x for f, v in given if v is not None for x in (f, str(v))], *extra]
    sa = parse_with_sglang(sgl)
    check_values(sa)
    plan = Plan(str(path), [sys.executable, "-m", LAUNCH, *sgl], port=sa.port, tp=sa.tp_size)
    plan.weights = [w for w in (sa.model_path, sa.speculative_draft_model_path) if w]
    plan.key, plan.key_from = read_key(environ, a.api_key_file)
    plan.listen = listening(sa.host, plan.key_from or ("the command line (--api-key)" if sa.api_key else ""))
    if sa.speculative_draft_model_path:
        plan.notes.append(drafters.drafter_note(sa.speculative_draft_model_path))
    if not drafters.cached(sa.model_path):
        plan.notes.append(
            f"model {sa.model_path} is not in the HF cache {hf_cache_dir()}: SGLang downloads it at start "
            f"(Kimi-K2.5: ~600 GB; the doctor asks for 700 GB free)"
        )
    if plan.key:
        plan.notes.append(
            f"the API key from {plan.key_from} reaches SGLang in a private copy of the profile "
            f"(read once through a pipe), on no command line"
        )
    return plan


def describe(doc: dict) -> str:
    """The dry run as text: the profile, the notes, who can reach the server, then SGLang's command."""
    notes = [*doc["notes"], doc["launcher"], doc["listen"]]
    return "\n".join([f"# profile {doc['profile']}", *(f"# {n}" for n in notes), shlex.join(doc["argv"])])


def private_config(profile: dict, key: str) -> str:
    """A FIFO holding the profile plus api-key, private to this user: a child writes it once when SGLang opens it,
    then removes it (or after 15 minutes if nothing reads it)."""
    import yaml

    mine = {**{k: v for k, v in profile.items() if k not in ("api-key", "api_key")}, "api-key": key}
    fifo = os.path.join(tempfile.mkdtemp(prefix="serve-"), "profile.yaml")
    os.mkfifo(fifo, 0o600)
    if os.fork() == 0:
        signal.signal(signal.SIGALRM, signal.default_int_handler)  # a KeyboardInterrupt, as SIGTERM and SIGHUP are
        signal.alarm(900)
        with contextlib.suppress(KeyboardInterrupt), open(fifo, "w") as f:  # open waits for SGLang to open it
            f.write(yaml.safe_dump(mine, sort_keys=False))
        os.unlink(fifo)
        os.rmdir(os.path.dirname(fifo))
        os._exit(0)
    return fifo


def host_path(opt: str, v: str) -> str:
    """A value of serve's own option as the container sees it: a path of this machine made absolute (docker_run
    mounts it there), an HF id or a profile's name as is."""
    if (opt == "--profile" and not v.endswith((".yaml", ".yml"))) or opt in ("--port", "--host"):
        return v
    if opt != "--api-key-file" and not (v.startswith(("/", ".", "~")) or Path(v).exists()):
        return v
    path = Path(v).expanduser().absolute()
    try:
        path.stat()
    except PermissionError as e:
        raise UserError(
            f"{opt} {v}: this user cannot reach it ({e.strerror}), so serve cannot check it (docker, as root, could "
            f"still mount it). Fix: sudo chown $USER {path.parent} {path} (it stays private), or run make serve as root"
        ) from None
    except OSError:
        raise UserError(f"{opt} {v}: no such file here, so there is nothing to mount into the container") from None
    return str(path)


def in_image(a: argparse.Namespace, extra: list[str]) -> int:
    """make serve: the checks (the module's docstring) with their fixes, then this verb in the serving image."""
    from ..series.pin import load_pin, patchset_id

    pin, own = load_pin(), []
    image = a.image or pin.serving_image
    for opt in OWN:
        v = getattr(a, opt[2:].replace("-", "_"))
        own += [opt, host_path(opt, str(v))] if v is not None and v != SHIPPED_PROFILE else []
    args = [*own, *(["--", *extra] if extra else [])]
    cmd = docker_run(image, ["serve", *args], hf_cache=hf_cache_dir(), network_host=True, name=container_name("serve"))
    print(shown(cmd), flush=True)
    checks = preflight.docker_checks([image], patchset_id(), (pin.upstream_image,), not a.dry_run)
    if all(c.ok for c in checks):
        dry = ["serve", "--dry-run", "--json", *args]
        res = proc.run(docker_run(image, dry, gpus=False, hf_cache=hf_cache_dir()), timeout=600)
        if not res.ok:
            said = res.output[res.output.rfind("error: ") + 7 :] if "error: " in res.output else res.why
            raise UserError(f"the image's serve refuses the command (its dry run, before any GPU is used): {said}")
        doc = json.loads(res.stdout)
        print(describe(doc))
        checks += [*preflight.gpu_checks(doc["tp"]), preflight.port_check(doc["port"])]
        checks.append(preflight.weights_check(doc["weights"]))
    failed = [c.line() for c in checks if not c.ok]
    if a.dry_run:
        print("checks (a real run stops when one fails):\n" + "\n".join("  " + c.line() for c in checks))
        return 2 if failed else 0
    if failed:
        raise UserError("make serve cannot start; nothing was started:\n  " + "\n  ".join(failed))
    os.execvp(cmd[0], cmd)
    return 0  # not reached


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    own, extra = split(argv)
    ap = parser("serve", __doc__, allow_abbrev=False)
    for opt, what in OWN.items():
        ap.add_argument(opt, type=int if opt == "--port" else str, help=what)
    ap.set_defaults(profile=SHIPPED_PROFILE)
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: one JSON object")
    ap.add_argument("--image", nargs="?", const="", help="run serve in this image (default: make image's)")
    a, unknown = ap.parse_known_args(own)
    if unknown:
        t = unknown[0]
        close = difflib.get_close_matches(t.split("=")[0], [*OWN, "--dry-run", "--json", "--image"], 1, 0.8)
        after = f"an SGLang flag goes after --: serve ... -- {shlex.join(unknown)}"
        raise UserError(f"serve has no option {t}: " + (f"did you mean {close[0]}?" if close else after))
    return a, extra


def main(argv=None) -> int:
    a, extra = parse_args(argv)
    if a.image is not None:
        return in_image(a, extra)
    environ = dict(os.environ)
    plan = build_plan(a, extra, environ)
    doc = {k: v for k, v in dataclasses.asdict(plan).items() if k != "key"}
    if a.dry_run:
        print(json.dumps(doc, indent=1) if a.json else describe(doc))
        return 0
    print(describe(doc), file=sys.stderr, flush=True)  # what starts, and what it will download
    if plan.key:
        plan.argv[plan.argv.index("--config") + 1] = private_config(profiles.load(Path(plan.profile)), plan.key)
    environ.pop(KEY_VAR, None)
    os.execve(plan.argv[0], plan.argv, environ)
    return 0  # not reached


if __name__ == "__main__":
    run(main)
