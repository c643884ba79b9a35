"""`serve`: launch SGLang from a serving profile (docker/profiles/<name>.toml), the image's default command.

  python -m scripts.host.serve [--profile NAME_OR_PATH] [--draft-model PATH] [--model PATH] [--port N]
                               [--host ADDR] [--api-key-file FILE] [--dry-run [--json]] [--check]
                               [-- EXTRA_SGLANG_ARGS...]

The profile's [args] become `python3 -m sglang.launch_server --flag value ...`; "{model}", "{draft_model}", "{port}"
and "{host}" are filled from its [defaults] or from --model/--draft-model/--port/--host. Arguments after `--` go to
sglang verbatim; a flag given there replaces the profile's value for the same flag (aliases and abbreviations
resolved with sglang's own parser when it can be imported), and serve says so. The profile's [env] is set only where the
environment has no value (a `docker run -e` value wins). The PCIe-only NCCL defaults and the PCIe-IPC all-reduce
are the patched launcher's to decide (NVML, at start); serve does not set them.

Who can reach it (scripts/host/exposure.py, the rule the doctor reports too): the profiles listen on 127.0.0.1;
another host (--host 0.0.0.0, a profile's [defaults] host, or -- --host) needs an API key from $SGLANG_API_KEY or
--api-key-file FILE, which reaches sglang's --api-key inside the process, never on a command line (a key given by
hand after -- is used as given, and redacted in what serve prints); without one serve refuses. serve says which
("listening on 127.0.0.1 only", "listening on 0.0.0.0 with an API key from $SGLANG_API_KEY") when it starts.

--dry-run prints the environment it would set, what the patched launcher will decide about the PCIe-only defaults
(scripts/host/pcie.py asks the sglang of --python, with the server's arguments and environment) and the exact
command (shell-quoted; the output is a valid shell script), then exits 0. --check runs the preflight (python -m scripts.host.doctor) instead.
Exit status: 0 dry run printed (serving replaces this process with sglang); 2 a profile or flag problem, named
with its fix; with --check, the doctor's status.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import functools
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

from ..lib.cli import run
from ..lib.envfile import KEY_RE as ENV_KEY_RE
from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR, REPO_ROOT, SHIPPED_PROFILE
from ..lib.tomlfile import load_toml
from ..series.sglang_pkg import probe
from . import exposure
from .drafters import claim
from .pcie import AT_START, LauncherDecision, launcher_decision

DEFAULT_PROFILE = SHIPPED_PROFILE
LAUNCH_MODULE = "sglang.launch_server"
DOCTOR_MODULE = "scripts.host.doctor"
PROFILE_KEYS = ("description", "defaults", "env", "args")
PLACEHOLDER_RE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
FLAG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# serve option -> (placeholder, sglang flag it sets when the profile has no placeholder for it)
CLI_VALUES = {"model": ("model", "model-path"), "draft_model": ("draft_model", "speculative-draft-model-path"),
              "port": ("port", "port"), "host": ("host", "host")}

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
    pcie: LauncherDecision  # what the patched launcher will decide about the PCIe-only defaults
    listen: exposure.Listen  # where sglang listens and with which API key
    shown: list[str] = dataclasses.field(default_factory=list)  # argv as printed: every secret redacted

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
    d = load_toml(path, "profile", "name an existing profile file, or one of docker/profiles/ by its name")
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

    def validate(self, args: list[str]) -> argparse.Namespace | None:
        """Parse the sglang arguments with sglang's parser (None when it is not importable here); a UserError names
        what it rejects."""
        if not self.known:
            return None

        def error(message):
            raise UserError(f"sglang's parser rejects the command: {message}")

        saved = self.parser.error
        self.parser.error = error
        try:
            return self.parser.parse_args(args)
        finally:
            self.parser.error = saved


def load_flag_index() -> tuple[FlagIndex, str]:
    """sglang's parser if sglang imports here; else an index that matches flags by exact name (and why)."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser(prog="sglang.launch_server", add_help=False)
        ServerArgs.add_cli_args(parser)
        return FlagIndex(parser), ""
    except Exception as e:  # noqa: BLE001 - any failure means: no parser, say so
        return FlagIndex(None), f"{type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------------------------
# the plan: sglang arguments, environment, notes


def _profile_args(profile: Profile, cli: dict, notes: list[str]) -> dict:
    """The profile's [args] with placeholders filled ([defaults], then --model/--draft-model/--port)."""
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
    return args


def _extra_wins(args: dict, extra: list[str], index: FlagIndex, notes: list[str]) -> dict:
    """Flags on the command line win: drop the profile's value for each, by what it sets (aliases included)."""
    extra_dests = {d for d in (index.dest(t) for t in extra) if d}
    for k in list(args):
        d = index.dest(f"--{k}")
        if d in extra_dests and args[k] is not False:
            given = next(t.split("=", 1)[0] for t in extra if index.dest(t) == d)
            shown = "" if args[k] is True else f" {args[k]}"
            notes.append(f"{given} from the command line replaces the profile's --{k}{shown}")
            del args[k]
    return args


def _environment(profile: Profile, values: dict, environ: dict[str, str]) -> tuple[dict, dict]:
    """(env serve sets, env it keeps): the profile's [env], each key only where the environment has none."""
    env_set: dict[str, tuple[str, str]] = {}
    env_kept: dict[str, tuple[str, str, str]] = {}
    source = f"profile {profile.path.name}"
    for k, v in profile.env.items():
        value = _fill(v, values, f"[env] {k}", profile.path)
        if k in environ:
            env_kept[k] = (environ[k], value, source)
        else:
            env_set[k] = (value, source)
    return env_set, env_kept


@functools.lru_cache(maxsize=8)
def _sglang_package(python: str) -> Path | None:
    """The sglang package the command will run (python's), else the one this interpreter would import."""
    here = os.path.realpath(shutil.which(python) or python) == os.path.realpath(sys.executable)
    pkg = (probe(None if here else python).get("sglang")) or probe().get("sglang")
    return Path(pkg) if pkg else None


def _drafter_note(args: dict, extra: list[str], index: FlagIndex, python: str) -> list[str]:
    """What the SGLang that will run does with the drafter, read from its source (scripts/host/drafters.py)."""
    drafter = _given("speculative-draft-model-path", args, extra, index)
    if not isinstance(drafter, str):
        return []
    c = claim(drafter, _sglang_package(python))
    return [f"drafter {drafter}: {c.text}"] if c else []


def _given(flag: str, args: dict, extra: list[str], index: FlagIndex):
    """The value the final command gives `flag` (by what it sets, aliases included): extra wins over the profile."""
    dest = index.dest(f"--{flag}")
    for i, t in enumerate(extra):
        if index.dest(t) == dest:
            return t.split("=", 1)[1] if "=" in t else (extra[i + 1] if i + 1 < len(extra) else True)
    v = args.get(flag)
    return None if v is False else v


def _check_speculation(profile: Profile, args: dict, extra: list[str], index: FlagIndex, draft_model: str | None):
    """A draft model without a speculative algorithm is loaded by nothing: refuse it, naming both ways out."""
    draft = _given("speculative-draft-model-path", args, extra, index)
    if draft is None or _given("speculative-algorithm", args, extra, index) is not None:
        return
    how = f"--draft-model {draft}" if draft_model else f"--speculative-draft-model-path {draft}"
    raise UserError(f"{how}: profile {profile.path.stem} sets no --speculative-algorithm, so sglang would serve "
                    f"without speculation and never load the drafter. Fix: serve --profile {DEFAULT_PROFILE} "
                    f"--draft-model {draft} (EAGLE-3), or keep this profile and add the algorithm: serve --profile "
                    f"{profile.path.stem} --draft-model {draft} -- --speculative-algorithm EAGLE3")


# Values sglang's parser takes by type but that fail only once the server starts (after the weights load): what
# each must be. SGLang has no check of its own for these at parse time (mem-fraction-static sizes the KV pool
# from 1 - fraction; topk 0 drafts nothing).
VALUE_RULES = {
    "mem_fraction_static": (lambda v: 0 < v < 1, "a fraction of GPU memory between 0 and 1 (e.g. 0.85)"),
    "speculative_eagle_topk": (lambda v: v >= 1, "at least 1 (1: chain drafting)"),
    "speculative_num_steps": (lambda v: v >= 1, "at least 1"),
    "speculative_num_draft_tokens": (lambda v: v >= 1, "at least 1 (chain drafting: steps + 1)"),
    "max_running_requests": (lambda v: v >= 1, "at least 1"),
    "tp_size": (lambda v: v >= 1, "at least 1"),
    "cuda_graph_max_bs": (lambda v: v >= 1, "at least 1"),
}


def _where(dest: str, args: dict, extra: list[str], index: FlagIndex, profile: Profile) -> str:
    """Where the final command's value of `dest` comes from: after serve's `--`, or the profile's [args]."""
    given = next((t.split("=", 1)[0] for t in extra if index.dest(t) == dest), None)
    if given:
        return f"{given} after -- on the command line"
    key = next((k for k in args if index.dest(f"--{k}") == dest), dest.replace("_", "-"))
    return f"{key} in [args] of profile {profile.path}"


def _check_values(profile: Profile, args: dict, extra: list[str], index: FlagIndex, ns) -> None:
    """Values sglang would fail on only after loading the model, refused now: the speculative algorithm by SGLang's
    own name resolution (SpeculativeAlgorithm.from_string, as ServerArgs does), the VALUE_RULES ranges."""
    if ns is None:
        return
    problems = []
    algo = getattr(ns, "speculative_algorithm", None)
    if algo is not None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        try:
            SpeculativeAlgorithm.from_string(algo)
        except ValueError as e:
            names = ", ".join(a.name for a in SpeculativeAlgorithm if a.name != "NONE")
            problems.append(f"{_where('speculative_algorithm', args, extra, index, profile)}: {e} (SGLang's own "
                            f"names: {names})")
    for dest, (ok, what) in VALUE_RULES.items():
        v = getattr(ns, dest, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not ok(v):
            problems.append(f"{_where(dest, args, extra, index, profile)}: {v} would fail only after the model "
                            f"loads; it must be {what}")
    if problems:
        raise UserError("sglang would start and then fail on:\n  " + "\n  ".join(problems)
                        + "\nFix each where it is named (the profile's [args], or the flag after --)")


def _listen(ns: argparse.Namespace | None, sgl_args: list[str], index: FlagIndex, environ: dict[str, str],
            key_file: str | None) -> exposure.Listen:
    """Where sglang will listen (its own parse when available, else the last --host given, else its default) and
    with which API key (scripts/host/exposure.py)."""
    host = getattr(ns, "host", None) if ns is not None else None
    if host is None:
        host = exposure.SGLANG_DEFAULT_HOST
        for i, t in enumerate(sgl_args):
            if index.dest(t) == "host":
                host = t.split("=", 1)[1] if "=" in t else sgl_args[i + 1] if i + 1 < len(sgl_args) else host
    cli_key = any(index.dest(t) == "api_key" for t in sgl_args)
    return exposure.decide(host, environ, key_file, cli_key)


def build_plan(profile: Profile, *, model: str | None = None, draft_model: str | None = None, port: int | None = None,
               host: str | None = None, api_key_file: str | None = None, extra: list[str] | None = None,
               python: str = sys.executable, environ: dict[str, str] | None = None, index: FlagIndex | None = None,
               ask_launcher: bool = False, refuse: bool = True) -> Plan:
    """The command and environment for sglang. ask_launcher: ask the patched launcher (of `python`, under the
    child's environment) what it will decide about the PCIe-only defaults; otherwise say that it decides at start. refuse: a UserError when it
    would listen beyond loopback without an API key (serve --check leaves that to the doctor)."""
    environ = dict(os.environ if environ is None else environ)
    extra = list(extra or [])
    index = index or FlagIndex(None)
    notes: list[str] = []
    cli = {"model": model, "draft_model": draft_model, "port": port, "host": host}
    args = _profile_args(profile, cli, notes)
    if index.known:
        for k in args:
            if f"--{k}" not in index.dests:
                raise UserError(f"profile {profile.path}: --{k} is not a flag of sglang's launch_server"
                                f"{index.suggest(k)}; fix or remove it")
    args = _extra_wins(args, extra, index, notes)
    _check_speculation(profile, args, extra, index, draft_model)
    sgl_args = argv_for(args) + extra
    ns = index.validate(sgl_args)
    _check_values(profile, args, extra, index, ns)
    values = {**profile.defaults, **{CLI_VALUES[k][0]: v for k, v in cli.items() if v is not None}}
    env_set, env_kept = _environment(profile, values, environ)
    child_env = {**environ, **{k: v for k, (v, _) in env_set.items()}}
    pcie = launcher_decision(python, sgl_args, child_env) if ask_launcher else LauncherDecision(False, [AT_START])
    notes += _drafter_note(args, extra, index, python)
    listen = _listen(ns, sgl_args, index, child_env, api_key_file)
    if listen.refusal and refuse:
        raise UserError(f"{listen.refusal}. Fix: {exposure.FIX}")
    argv = (exposure.key_argv(python, listen.key_spec, sgl_args) if listen.key_spec
            else [python, "-m", LAUNCH_MODULE, *sgl_args])
    return Plan(profile=profile, argv=argv, env_set=env_set, env_kept=env_kept, notes=notes, pcie=pcie, listen=listen,
                shown=exposure.redacted(argv, index.dest))


def render(plan: Plan) -> str:
    """The plan as a shell script: comments, exports, the command."""
    lines = [f"# profile {plan.profile.path}" + (f": {plan.profile.description}" if plan.profile.description else "")]
    lines += [f"# note: {n}" for n in plan.notes]
    lines += [f"# pcie: {n}" for n in plan.pcie.lines]
    lines.append(f"# listen: {plan.listen.line}")
    if plan.listen.key_spec:
        lines.append(f"# the API key reaches sglang's --api-key inside the process (python -c below reads "
                     f"{plan.listen.key_from} and runs {LAUNCH_MODULE}): it is on no command line")
    if plan.env_set:
        lines.append("# environment for sglang (only keys the environment does not already set):")
        for k, (v, src) in plan.env_set.items():
            lines.append(f"export {k}={shlex.quote(v)}  # from {src}")
    for k, (v, default, src) in plan.env_kept.items():
        lines.append(f"# kept {k}={v} from the environment (default {default} from {src} not applied)")
    lines.append(shlex.join(plan.shown))
    return "\n".join(lines)


def as_json(plan: Plan) -> dict:
    return {
        "profile": str(plan.profile.path),
        "argv": plan.shown,
        "command": shlex.join(plan.shown),
        "env": {k: v for k, (v, _) in plan.env_set.items()},
        "env_sources": {k: src for k, (_, src) in plan.env_set.items()},
        "env_kept": {k: v for k, (v, _, _) in plan.env_kept.items()},
        "pcie_defaults": {"known": plan.pcie.known, "lines": plan.pcie.lines, "decision": plan.pcie.data},
        "listen": {"host": plan.listen.host, "loopback": plan.listen.loopback, "api_key_from": plan.listen.key_from,
                   "line": plan.listen.line},
        "notes": plan.notes,
    }


def split_extra(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def run_doctor(profile: Profile, python: str, listen: exposure.Listen, key_file: str | None) -> int:
    """serve --check: this process becomes `python -m scripts.host.doctor --tp N --python PY --listen-host H`."""
    tp = profile.args.get("tp-size", profile.args.get("tensor-parallel-size", 8))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + [p for p in [env.get("PYTHONPATH", "")] if p])
    argv = [sys.executable, "-m", DOCTOR_MODULE, "--tp", str(tp), "--python", python, "--listen-host", listen.host]
    argv += ["--api-key-file", key_file] if key_file else []
    sys.stdout.flush()
    os.execve(argv[0], argv, env)
    return 0  # not reached


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    own, extra = split_extra(argv)
    ap = argparse.ArgumentParser(prog="serve", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help=f"profile name in docker/profiles or a .toml path "
                                                              f"(default {DEFAULT_PROFILE})")
    ap.add_argument("--draft-model", help="EAGLE-3 draft model (HF repo id or local path); fills {draft_model}")
    ap.add_argument("--model", help="target model (HF repo id or local path); fills {model}")
    ap.add_argument("--port", type=int, help="HTTP port; fills {port}")
    ap.add_argument("--host", help="address to listen on; fills {host} (the profiles: 127.0.0.1). Beyond loopback "
                                   "(e.g. 0.0.0.0) it needs an API key: $SGLANG_API_KEY or --api-key-file")
    ap.add_argument("--api-key-file", metavar="FILE", help="file holding the API key (e.g. a mounted docker secret); "
                                                          "the alternative to $SGLANG_API_KEY")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs sglang (default: this one)")
    ap.add_argument("--dry-run", action="store_true", help="print the environment and the command, run nothing")
    ap.add_argument("--json", action="store_true", help="with --dry-run: one JSON object")
    ap.add_argument("--check", action="store_true", help="run the preflight (scripts.host.doctor) instead of serving")
    a, unknown = ap.parse_known_args(own)
    if unknown:
        raise UserError(f"serve does not know {' '.join(unknown)}; sglang flags go after `--`, e.g. "
                        f"serve -- {' '.join(unknown)}")
    return a, extra


def main(argv=None) -> int:
    a, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    profile = load_profile(resolve_profile(a.profile))
    if a.check:
        plan = build_plan(profile, model=a.model, draft_model=a.draft_model, port=a.port, host=a.host,
                          api_key_file=a.api_key_file, extra=extra, python=a.python, refuse=False)
        return run_doctor(profile, a.python, plan.listen, a.api_key_file)
    a.python = shutil.which(a.python) or a.python
    index, why = load_flag_index()
    plan = build_plan(profile, model=a.model, draft_model=a.draft_model, port=a.port, host=a.host,
                      api_key_file=a.api_key_file, extra=extra, python=a.python, index=index, ask_launcher=a.dry_run)
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
