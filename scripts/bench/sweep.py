"""The drafter and speculative-settings sweep of `make bench` (bench/sweep.toml; `make bench-sweep`): one server per
(drafter, draft quantization, steps/topk/draft tokens) point, each the speculative base variant with the point's
drafter and settings (after serve's `--`, where they replace the profile's), plus reference variants. Block drafters
(DFlash: bench/sweep-dflash.toml) fill their own base variant, one point per block size: steps and topk 1, draft
tokens = the block, as SGLang resolves DFLASH.

Each point's setting is checked first where SGLang would not say so before the run: a chain (topk 1) must have
draft tokens = steps + 1 (SGLang replaces any other count, with a warning only), a tree must offer at least draft
tokens - 1 candidates, topk + (steps - 1) topk^2 (else eagle_utils' torch.topk fails mid-run). The rest is SGLang's:
its parser checks every variant's arguments in serve's dry run (bench's checks), its start refuses what only its
resolution knows (a topk > 1 backend, rejection sampling).
"""

import dataclasses
import re
from pathlib import Path

from ..lib.errors import UserError
from ..lib.repo import REPO_ROOT
from ..lib.tomlfile import load_toml

SWEEP_FILE = REPO_ROOT / "bench" / "sweep.toml"
KEYS = {
    "base",
    "reference",
    "drafters",
    "draft_quantization",
    "settings",
    "scenarios",
    "repeats",
    "order",
    "description",
} | {"block_base", "block_drafters", "blocks"}  # block drafters (DFlash)
SETTING_RE = re.compile(r"^(\d+)/(\d+)/(\d+)$")


@dataclasses.dataclass(frozen=True)
class Setting:
    steps: int
    topk: int
    draft_tokens: int

    @property
    def label(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"

    def args(self) -> list[str]:
        return [
            "--speculative-num-steps",
            str(self.steps),
            "--speculative-eagle-topk",
            str(self.topk),
            "--speculative-num-draft-tokens",
            str(self.draft_tokens),
        ]


def parse_setting(text: str, where: str) -> Setting:
    m = SETTING_RE.match(str(text).strip())
    if not m:
        raise UserError(f'{where}: setting {text!r} is not steps/topk/draft_tokens (e.g. "3/1/4")')
    return Setting(*map(int, m.groups()))


@dataclasses.dataclass(frozen=True)
class Point:
    drafter: str
    setting: Setting
    quant: str = ""  # "": the drafter's own weights (its checkpoint's dtype)
    block: bool = False  # a block drafter (block_drafters): its base is the sweep's block_base

    @property
    def name(self) -> str:
        short = re.sub(r"[^A-Za-z0-9.+-]+", "-", self.drafter).strip("-")  # org/name: two orgs' drafters differ
        return f"sweep-{short}-{self.setting.label.replace('/', '-')}" + (f"-{self.quant}" if self.quant else "")

    def describe(self) -> dict:
        return {
            "drafter": self.drafter,
            "steps": self.setting.steps,
            "topk": self.setting.topk,
            "draft_tokens": self.setting.draft_tokens,
            "draft_quantization": self.quant or "checkpoint",
        }


def problems(s: Setting) -> list[str]:
    """Why SGLang would change this setting or fail on it mid-run; [] when it runs as written."""
    if min(s.steps, s.topk) < 1 or s.draft_tokens < 2:
        return [f"{s.label}: steps and topk must be at least 1 and draft tokens at least 2"]
    candidates = s.topk + (s.steps - 1) * s.topk**2
    if s.topk == 1 and s.draft_tokens != s.steps + 1:
        return [
            f"{s.label}: with topk 1 SGLang replaces {s.draft_tokens} draft tokens by steps + 1 = "
            f"{s.steps + 1} (speculative_hook.py, a warning only); write {s.steps}/1/{s.steps + 1}"
        ]
    if s.topk > 1 and s.draft_tokens - 1 > candidates:
        return [
            f"{s.label}: the draft tree offers {candidates} candidates, fewer than draft tokens - 1 = "
            f"{s.draft_tokens - 1} (eagle_utils.organize_draft_results' torch.topk fails)"
        ]
    return []


# ---------------------------------------------------------------------------------------------------------------
# the sweep file and its variants


@dataclasses.dataclass
class Sweep:
    path: Path
    base: str
    reference: list[str]
    points: list[Point]
    scenarios: str | None
    repeats: int | None
    order: str | None
    description: str = ""
    block_base: str = ""


def load(path: Path = SWEEP_FILE) -> Sweep:
    d = load_toml(path, "sweep file", "pass an existing file to --sweep")
    unknown = sorted(set(d) - KEYS)
    if unknown:
        raise UserError(f"{path}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(KEYS))}")
    for k in ("base", "drafters", "settings"):
        if not d.get(k):
            raise UserError(f"{path}: needs {k} (see the comments in bench/sweep.toml)")
    settings = [parse_setting(x, str(path)) for x in d["settings"]]
    quants = [str(q) for q in d.get("draft_quantization", [""])]
    points = [Point(str(dr), s, q) for dr in d["drafters"] for q in quants for s in settings]
    blocks = d.get("blocks", [])
    if d.get("block_drafters") and not (
        d.get("block_base") and blocks and all(isinstance(b, int) and b >= 2 for b in blocks)
    ):
        raise UserError(f'{path}: block_drafters need block_base = "<variant>" and blocks = [<draft tokens>, ...]')
    points += [Point(str(dr), Setting(1, 1, b), block=True) for dr in d.get("block_drafters", []) for b in blocks]
    names = [p.name for p in points]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{path}: points listed twice: {', '.join(dup)}")
    scen = d.get("scenarios")
    reference, scenarios = [str(x) for x in d.get("reference", [])], ",".join(scen) if scen else None
    return Sweep(
        Path(path),
        str(d["base"]),
        reference,
        points,
        scenarios,
        d.get("repeats"),
        d.get("order"),
        str(d.get("description", "")),
        str(d.get("block_base", "")),
    )


def variants(sw: Sweep, vset) -> list:
    """The reference variants, then one variant per point (the base with the point's drafter and settings), from
    plan's VariantSet `vset`;
    UserError listing every point whose setting SGLang would change or fail on."""
    by_name = {v.name: v for v in vset.variants}
    bases = [sw.base] + ([sw.block_base] if any(p.block for p in sw.points) else [])
    for n in [*bases, *sw.reference]:
        if n not in by_name:
            raise UserError(f"{sw.path}: variant {n!r} is not in {vset.path} ({', '.join(by_name)})")
    if plain := [n for n in bases if not by_name[n].speculative]:
        raise UserError(
            f"{sw.path}: base variant {plain[0]} does not speculate, so the sweep cannot set its drafter; pick a "
            f"speculative variant such as patched-eagle3 (patched-dflash for block drafters)"
        )
    bad, out = [], [dataclasses.replace(by_name[n], default=True) for n in sw.reference]
    for p in sw.points:
        base = by_name[sw.block_base if p.block else sw.base]
        extra = p.setting.args() + (["--speculative-draft-model-quantization", p.quant] if p.quant else [])
        bad += [f"{p.name}: {w}" for w in ([] if p.block else problems(p.setting))]
        said = f"{base.description}; drafter {p.drafter}, {p.setting.label}" + (f", draft {p.quant}" if p.quant else "")
        point = dict(name=p.name, default=True, draft_model=p.drafter, args=(*base.args, *extra), description=said)
        out.append(dataclasses.replace(base, **point, setting=tuple(p.describe().items())))
    if bad:
        raise UserError(f"{sw.path}: {len(bad)} point(s) SGLang would change or fail on:\n  " + "\n  ".join(bad))
    return out
