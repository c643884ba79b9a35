"""`serve`: launch SGLang from a serving profile (docker/profiles/<name>.toml), the image's default command.

  python -m scripts.serve [--profile NAME_OR_PATH] [--draft-model PATH] [--model PATH] [--port N]
                          [--dry-run [--json]] [--check] [-- EXTRA_SGLANG_ARGS...]

The profile's [args] become `python3 -m sglang.launch_server --flag value ...`; "{model}", "{draft_model}" and
"{port}" are filled from its [defaults] or from --model/--draft-model/--port. Arguments after `--` go to sglang
verbatim; a flag given there replaces the profile's value for the same flag (aliases and abbreviations resolved
with sglang's own parser when it can be imported), and serve says so.

Environment for sglang, each key only where it is not already set (a `docker run -e` value wins): the profile's
[env], then the PCIe NCCL env file ($SGLANG_PCIE_NCCL_ENV_FILE, in the image /etc/sglang/pcie-nccl.env; skipped
with SGLANG_PCIE_NCCL_DEFAULTS=0). What was applied is printed.

--dry-run prints the environment it would set and the exact command (shell-quoted; the output is a valid shell
script), then exits 0. --check runs the preflight (scripts.doctor) instead of serving.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from .lib.cli import run
from .lib.errors import UserError

# Not scripts.lib.pin.REPO_ROOT: pin.py needs tomllib (Python >= 3.11); serve and doctor run on 3.10 + tomli too.
REPO_ROOT = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11; the upstream image has 3.12
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

PROFILES_DIR = REPO_ROOT / "docker" / "profiles"
DEFAULT_PROFILE = "kimi-k25-eagle3-tp8"
ENV_FILE_VAR = "SGLANG_PCIE_NCCL_ENV_FILE"
ENV_SKIP_VAR = "SGLANG_PCIE_NCCL_DEFAULTS"
IMAGE_ENV_FILE = Path("/etc/sglang/pcie-nccl.env")
REPO_ENV_FILE = REPO_ROOT / "docker" / "pcie-nccl.env"
LAUNCH_MODULE = "sglang.launch_server"
PROFILE_KEYS = ("description", "defaults", "env", "args")
PLACEHOLDER_RE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# serve option -> (placeholder, sglang flag it sets when the profile has no placeholder for it)
CLI_VALUES = {"model": ("model", "model-path"), "draft_model": ("draft_model", "speculative-draft-model-path"),
              "port": ("port", "port")}

# Kimi EAGLE-3 drafters with published accept lengths (AL; steps/topk/draft tokens 3/1/4 unless noted).
# Source: /work/shared/notes/anchors.md section 2; docker/README.md carries the same table.
KNOWN_DRAFTERS = {
    "AQ-MedAI/Kimi-K25-eagle3": (True, "used by SGLang's Kimi-K2.5 EAGLE-3 support (sgl-project/sglang#19689); "
                                       "vLLM measured 51.78% acceptance on GSM8K with 4 draft tokens"),
    "lightseekorg/kimi-k2.5-eagle3": (True, "AL 2.69 MT-Bench, 3.20 GSM8K, 3.29 HumanEval, 2.30 C-Eval"),
    "AQ-MedAI/Kimi-K2-Instruct-eagle3": (True, "trained for Kimi-K2 (not K2.5): AL 3.37 HumanEval, 3.17 GSM8K"),
    "lightseekorg/kimi-k2.5-eagle3-mla": (False, "MLA draft (AL 2.62 MT-Bench on vLLM); its card says SGLang does "
                                                 "not support MLA EAGLE-3 drafts"),
}


@dataclasses.dataclass
class Profile:
    path: Path
    description: str
    defaults: dict
    env: dict[str, str]
    args: dict


@dataclasses.dataclass
class Plan:
    profile: Profile
    argv: list[str]
    env_set: dict[str, tuple[str, str]]  # key -> (value, source) that serve adds
    env_kept: dict[str, tuple[str, str, str]]  # key -> (environment value, default not applied, its source)
    notes: list[str]
    env_file: Path | None

    def child_env(self, environ: dict[str, str]) -> dict[str, str]:
        env = dict(environ)
        env.update({k: v for k, (v, _) in self.env_set.items()})
        # The entrypoint puts the project on PYTHONPATH to run this verb; sglang does not need it.
        pp = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
              if p and Path(p).resolve() != REPO_ROOT.resolve()]
        if pp:
            env["PYTHONPATH"] = os.pathsep.join(pp)
        else:
            env.pop("PYTHONPATH", None)
        return env


# ---------------------------------------------------------------------------------------------------------------
# profiles


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml"))


def resolve_profile(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or os.sep in name_or_path:
        if not p.is_file():
            raise UserError(f"profile file {p} does not exist; copy one of {PROFILES_DIR} "
                            f"({', '.join(available_profiles())}) and pass its path")
        return p
    cand = PROFILES_DIR / f"{name_or_path}.toml"
    if not cand.is_file():
        raise UserError(f"no profile named {name_or_path!r}; known: {', '.join(available_profiles()) or '(none)'} "
                        f"(in {PROFILES_DIR}), or pass a path to a .toml file")
    return cand


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, bool))


def load_profile(path: Path) -> Profile:
    if tomllib is None:
        raise UserError("reading a profile needs Python >= 3.11 (tomllib) or the tomli package: pip install tomli")
    try:
        d = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"profile {path} is not valid TOML: {e}") from e
    unknown = sorted(set(d) - set(PROFILE_KEYS))
    if unknown:
        raise UserError(f"profile {path}: unknown top-level key(s) {', '.join(unknown)}; a profile has "
                        f"{', '.join(PROFILE_KEYS)} (flags go under [args], environment under [env])")
    args = d.get("args", {})
    if not isinstance(args, dict) or not args:
        raise UserError(f"profile {path} has no [args] table of sglang flags")
    for k, v in args.items():
        if k.startswith("-"):
            raise UserError(f"profile {path}: write flag {k!r} without the leading dashes ({k.lstrip('-')} = ...)")
        if not FLAG_RE.match(k):
            raise UserError(f"profile {path}: {k!r} is not a flag name (lower case, digits and dashes)")
        if not (_scalar(v) or (isinstance(v, list) and v and all(_scalar(x) and not isinstance(x, bool) for x in v))):
            raise UserError(f"profile {path}: value of {k} must be a string, number, true/false or a list of them")
    env = d.get("env", {})
    for k, v in env.items():
        if not ENV_KEY_RE.match(k) or not _scalar(v):
            raise UserError(f"profile {path}: [env] {k} = {v!r} is not NAME = \"value\"")
    defaults = d.get("defaults", {})
    if not isinstance(defaults, dict) or not all(_scalar(v) for v in defaults.values()):
        raise UserError(f"profile {path}: [defaults] must map names to plain values")
    return Profile(path=Path(path), description=str(d.get("description", "")), defaults=dict(defaults),
                   env={k: _env_str(v) for k, v in env.items()}, args=dict(args))


def _env_str(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _fill(value, values: dict, where: str, path: Path):
    if isinstance(value, list):
        return [_fill(x, values, where, path) for x in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in values:
            opt = {v[0]: k for k, v in CLI_VALUES.items()}.get(name)
            how = f"pass --{opt.replace('_', '-')} or set {name} under [defaults]" if opt else \
                f"set {name} under [defaults]"
            raise UserError(f"profile {path}: {where} uses {{{name}}} but nothing gives it a value: {how}")
        return str(values[name])

    return PLACEHOLDER_RE.sub(sub, value)


def argv_for(args: dict) -> list[str]:
    out: list[str] = []
    for flag, v in args.items():
        if v is True:
            out.append(f"--{flag}")
        elif v is False:
            continue
        elif isinstance(v, list):
            out += [f"--{flag}", *map(str, v)]
        else:
            out += [f"--{flag}", str(v)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# sglang's parser: flag names, aliases, validation


class FlagIndex:
    """Option strings of sglang's launch_server parser and the dest each one sets."""

    def __init__(self, parser=None):
        self.parser = parser
        self.dests: dict[str, str] = {}
        if parser is not None:
            for opt, action in parser._option_string_actions.items():
                if opt.startswith("--"):
                    self.dests[opt] = action.dest

    @property
    def known(self) -> bool:
        return self.parser is not None

    def dest(self, token: str) -> str | None:
        """dest of an option token (--flag or --flag=value); None if it is not an option."""
        if not token.startswith("--") or token == "--":
            return None
        opt = token.split("=", 1)[0]
        if not self.known:
            return opt[2:].replace("-", "_")
        if opt in self.dests:
            return self.dests[opt]
        hits = {d for o, d in self.dests.items() if o.startswith(opt)}  # argparse accepts unique prefixes
        return hits.pop() if len(hits) == 1 else opt[2:].replace("-", "_")

    def suggest(self, flag: str) -> str:
        close = difflib.get_close_matches(f"--{flag}", list(self.dests), n=3)
        return f" (did you mean {', '.join(close)}?)" if close else ""

    def validate(self, args: list[str]) -> None:
        """Parse the sglang arguments with sglang's parser; a UserError names what it rejects."""
        if not self.known:
            return

        def error(message):
            raise UserError(f"sglang's parser rejects the command: {message}")

        saved = self.parser.error
        self.parser.error = error
        try:
            self.parser.parse_args(args)
        finally:
            self.parser.error = saved


def load_flag_index() -> tuple[FlagIndex, str]:
    """sglang's parser if sglang imports here; else an index that matches flags by exact name (and why)."""
    try:
        import argparse as _ap

        with contextlib.redirect_stdout(sys.stderr):
            from sglang.srt.server_args import ServerArgs
        parser = _ap.ArgumentParser(prog="sglang.launch_server", add_help=False)
        ServerArgs.add_cli_args(parser)
        return FlagIndex(parser), ""
    except Exception as e:  # noqa: BLE001 - any failure means: no parser, say so
        return FlagIndex(None), f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------------------------
# environment


def default_env_file(environ: dict[str, str]) -> Path | None:
    if environ.get(ENV_FILE_VAR):
        return Path(environ[ENV_FILE_VAR])
    for cand in (IMAGE_ENV_FILE, REPO_ENV_FILE):
        if cand.is_file():
            return cand
    return None


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (docker --env-file format: no quoting), # comments and blank lines."""
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].strip()
        key, sep, value = line.partition("=")
        if not sep or not ENV_KEY_RE.match(key.strip()):
            raise UserError(f"{path}:{n}: {raw!r} is not KEY=VALUE; regenerate it (python -m scripts.pcie_env)")
        out[key.strip()] = value.strip()
    return out


# ---------------------------------------------------------------------------------------------------------------
# the plan


def detect_topology(timeout: float = 20.0) -> str:
    """'nvlink' if any two GPUs share NVLink, 'pcie' if none do, 'unknown' without nvidia-smi."""
    from .doctor import Probe, parse_topo_m

    out = Probe(timeout=timeout).get("topo-m")
    if not out.ok:
        return "unknown"
    links = parse_topo_m(out.text)["links"]
    if not links:
        return "unknown"
    return "nvlink" if any(v.startswith("NV") for v in links.values()) else "pcie"


def build_plan(profile: Profile, *, model: str | None = None, draft_model: str | None = None, port: int | None = None,
               extra: list[str] | None = None, python: str = sys.executable, environ: dict[str, str] | None = None,
               env_file: Path | None = None, index: FlagIndex | None = None, topology: str = "unknown") -> Plan:
    environ = dict(os.environ if environ is None else environ)
    extra = list(extra or [])
    index = index or FlagIndex(None)
    notes: list[str] = []

    cli = {"model": model, "draft_model": draft_model, "port": port}
    values = dict(profile.defaults)
    values.update({CLI_VALUES[k][0]: v for k, v in cli.items() if v is not None})
    used = {m.group(1) for v in profile.args.values() for x in (v if isinstance(v, list) else [v])
            if isinstance(x, str) for m in PLACEHOLDER_RE.finditer(x)}
    args = {k: _fill(v, values, f"--{k}", profile.path) for k, v in profile.args.items()}
    for k, v in cli.items():
        placeholder, flag = CLI_VALUES[k]
        if v is not None and placeholder not in used:
            if flag in args:
                notes.append(f"--{k.replace('_', '-')} {v} replaces the profile's --{flag} {args[flag]}")
            args[flag] = v

    if index.known:
        for k in args:
            if f"--{k}" not in index.dests:
                raise UserError(f"profile {profile.path}: --{k} is not a flag of sglang's launch_server"
                                f"{index.suggest(k)}; fix or remove it")

    # Flags on the command line win: drop the profile's value for each, by what it sets (aliases included).
    extra_dests = {d for d in (index.dest(t) for t in extra) if d}
    for k in list(args):
        d = index.dest(f"--{k}")
        if d in extra_dests and args[k] is not False:
            given = next(t.split("=", 1)[0] for t in extra if index.dest(t) == d)
            shown = "" if args[k] is True else f" {args[k]}"
            notes.append(f"{given} from the command line replaces the profile's --{k}{shown}")
            del args[k]

    sgl_args = argv_for(args) + extra
    index.validate(sgl_args)
    argv = [python, "-m", LAUNCH_MODULE, *sgl_args]

    env_set: dict[str, tuple[str, str]] = {}
    env_kept: dict[str, tuple[str, str, str]] = {}

    def offer(key: str, value: str, source: str) -> None:
        if key in env_set or key in env_kept:
            return  # an earlier (higher-priority) source already decided this key
        if key in environ:
            env_kept[key] = (environ[key], value, source)
        else:
            env_set[key] = (value, source)

    for k, v in profile.env.items():
        offer(k, _fill(v, values, f"[env] {k}", profile.path), f"profile {profile.path.name}")
    if environ.get(ENV_SKIP_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        notes.append(f"{ENV_SKIP_VAR}={environ[ENV_SKIP_VAR]}: PCIe NCCL env file not applied")
        env_file = None
    elif topology == "nvlink":
        notes.append("GPUs share NVLink: the PCIe NCCL env file is not applied (its values are for PCIe-only hosts)")
        env_file = None
    else:
        if env_file is None:
            env_file = default_env_file(environ)
        if env_file is not None:
            if not env_file.is_file():
                raise UserError(f"PCIe NCCL env file {env_file} does not exist; point {ENV_FILE_VAR} at it, or set "
                                f"{ENV_SKIP_VAR}=0 to run without it")
            for k, v in read_env_file(env_file).items():
                offer(k, v, str(env_file))
            if topology == "unknown":
                notes.append(f"GPU topology unknown (no nvidia-smi topo -m): applying {env_file} as for a PCIe-only "
                             f"host; {ENV_SKIP_VAR}=0 skips it")
        else:
            notes.append(f"no PCIe NCCL env file ({IMAGE_ENV_FILE} or {REPO_ENV_FILE}); sglang's own defaults apply")

    drafter = args.get("speculative-draft-model-path") or next(
        (extra[i + 1] for i, t in enumerate(extra[:-1])
         if index.dest(t) == index.dest("--speculative-draft-model-path")), None)
    if drafter in KNOWN_DRAFTERS:
        ok, what = KNOWN_DRAFTERS[drafter]
        notes.append(f"drafter {drafter}: {what}" + ("" if ok else " -- expect sglang to refuse it"))
    return Plan(profile=profile, argv=argv, env_set=env_set, env_kept=env_kept, notes=notes, env_file=env_file)


def render(plan: Plan) -> str:
    """The plan as a shell script: comments, exports, the command."""
    lines = [f"# profile {plan.profile.path}" + (f": {plan.profile.description}" if plan.profile.description else "")]
    for n in plan.notes:
        lines.append(f"# note: {n}")
    if plan.env_set:
        lines.append("# environment for sglang (only keys the environment does not already set):")
        for k, (v, src) in plan.env_set.items():
            lines.append(f"export {k}={shlex.quote(v)}  # from {src}")
    for k, (v, default, src) in plan.env_kept.items():
        lines.append(f"# kept {k}={v} from the environment (default {default} from {src} not applied)")
    lines.append(shlex.join(plan.argv))
    return "\n".join(lines)


def as_json(plan: Plan) -> dict:
    return {
        "profile": str(plan.profile.path),
        "argv": plan.argv,
        "command": shlex.join(plan.argv),
        "env": {k: v for k, (v, _) in plan.env_set.items()},
        "env_sources": {k: src for k, (_, src) in plan.env_set.items()},
        "env_kept": {k: v for k, (v, _, _) in plan.env_kept.items()},
        "env_file": str(plan.env_file) if plan.env_file else None,
        "notes": plan.notes,
    }


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = split_extra(argv)
    ap = argparse.ArgumentParser(prog="serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"profile name in docker/profiles or a .toml path "
                                                              f"(default {DEFAULT_PROFILE})")
    ap.add_argument("--draft-model", help="EAGLE-3 draft model (HF repo id or local path); fills {draft_model}")
    ap.add_argument("--model", help="target model (HF repo id or local path); fills {model}")
    ap.add_argument("--port", type=int, help="HTTP port; fills {port}")
    ap.add_argument("--env-file", type=Path, help=f"PCIe NCCL env file (default ${ENV_FILE_VAR}, {IMAGE_ENV_FILE}, "
                                                   f"or docker/pcie-nccl.env)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs sglang (default: this one)")
    ap.add_argument("--dry-run", action="store_true", help="print the environment and the command, run nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: one JSON object")
    ap.add_argument("--check", action="store_true", help="run the preflight (scripts.doctor) instead of serving")
    a, unknown = ap.parse_known_args(own)
    if unknown:
        raise UserError(f"serve does not know {' '.join(unknown)}; sglang flags go after `--`, e.g. "
                        f"serve -- {' '.join(unknown)}")

    profile = load_profile(resolve_profile(a.profile))
    if a.check:
        from . import doctor

        tp = profile.args.get("tp-size", profile.args.get("tensor-parallel-size", 8))
        return doctor.main(["--tp", str(tp), "--python", a.python])

    a.python = shutil.which(a.python) or a.python
    index, why = load_flag_index()
    plan = build_plan(profile, model=a.model, draft_model=a.draft_model, port=a.port, extra=extra,
                      python=a.python, env_file=a.env_file, index=index, topology=detect_topology())
    if not index.known:
        plan.notes.append(f"sglang's parser is not importable here ({why}); flags were not checked and are "
                          f"matched by exact name only")
    if a.dry_run:
        print(json.dumps(as_json(plan), indent=1) if a.json else render(plan))
        return 0
    print(render(plan), file=sys.stderr, flush=True)
    env = plan.child_env(dict(os.environ))
    sys.stdout.flush()
    os.execve(plan.argv[0], plan.argv, env)
    return 0  # not reached


if __name__ == "__main__":
    run(main)
