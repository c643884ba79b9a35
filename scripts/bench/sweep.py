"""The drafter and speculative-settings sweep of `make bench` (bench/sweep.toml; `make bench-sweep`): one server per
(drafter, draft quantization, steps/topk/draft tokens) point, each the speculative base variant with the point's
drafter and settings (after serve's `--`, where they replace the profile's), plus reference variants.

Every point is checked first against the rules of the SGLang that serves it, read from its source (the sglang this
python imports, else build/sglang): a rule's anchor text must still be where SGLang keeps it, else the check says
the rule may have moved: chains (topk 1) get draft tokens = steps + 1 (speculative_hook.py); a tree offers
topk + (steps - 1) * topk^2 candidates (eagle_utils.py); topk > 1 needs a page-tree backend with page_size > 1, and
not trtllm_mha or rejection sampling; the draft quantization is one of QUANTIZATION_CHOICES; the drafter's
architecture is registered (scripts/host/drafters.py).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from ..host.docker_run import hf_cache_dir
from ..lib.errors import UserError
from ..lib.tomlfile import load_toml
from ..series.sglang_pkg import package_or_tree
from . import plan as pl

SWEEP_FILE = pl.BENCH_DIR / "sweep.toml"
KEYS = {"base", "reference", "drafters", "draft_quantization", "settings", "scenarios", "repeats", "order",
        "description"}
SETTING_RE = re.compile(r"^(\d+)/(\d+)/(\d+)$")
# (file under the sglang package, text that must be there for the rule to be the one this module applies)
ANCHORS = {
    "chain": ("srt/arg_groups/speculative_hook.py",
              "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"),
    "page": ("srt/arg_groups/speculative_hook.py", "_PAGE_TREE_SPEC_BACKENDS = ("),
    "trtllm_mha": ("srt/arg_groups/speculative_hook.py", "trtllm_mha backend only supports topk = 1"),
    "rejection": ("srt/arg_groups/speculative_hook.py", "--speculative-use-rejection-sampling requires "
                                                        "--speculative-eagle-topk=1"),
    "tree": ("srt/speculative/eagle_utils.py", "torch.topk(score_list, num_draft_token - 1"),
    "quant": ("srt/arg_groups/choices.py", "QUANTIZATION_CHOICES = ["),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    steps: int
    topk: int
    draft_tokens: int

    @property
    def label(self) -> str:
        return f"{self.steps}/{self.topk}/{self.draft_tokens}"

    def args(self) -> list[str]:
        return ["--speculative-num-steps", str(self.steps), "--speculative-eagle-topk", str(self.topk),
                "--speculative-num-draft-tokens", str(self.draft_tokens)]


def parse_setting(text: str, where: str) -> Setting:
    m = SETTING_RE.match(str(text).strip())
    if not m:
        raise UserError(f"{where}: setting {text!r} is not steps/topk/draft_tokens (e.g. \"3/1/4\")")
    return Setting(*map(int, m.groups()))


@dataclasses.dataclass(frozen=True)
class Point:
    drafter: str
    setting: Setting
    quant: str = ""  # "": the drafter's own weights (its checkpoint's dtype)

    @property
    def name(self) -> str:
        short = re.sub(r"[^A-Za-z0-9.+-]+", "-", self.drafter).strip("-")  # org/name: two orgs' drafters differ
        return f"sweep-{short}-{self.setting.label.replace('/', '-')}" + (f"-{self.quant}" if self.quant else "")

    def describe(self) -> dict:
        return {"drafter": self.drafter, "steps": self.setting.steps, "topk": self.setting.topk,
                "draft_tokens": self.setting.draft_tokens, "draft_quantization": self.quant or "checkpoint"}


# ---------------------------------------------------------------------------------------------------------------
# SGLang's rules, read from its source


class Rules:
    """The rules of one SGLang tree (its package directory) for EAGLE settings and draft models."""

    def __init__(self, pkg: Path, hub: Path | None = None):
        self.pkg, self.hub = Path(pkg), hub
        self.text: dict[str, str] = {}
        moved = []
        for rule, (rel, needle) in ANCHORS.items():
            f = self.pkg / rel
            body = f.read_text(errors="replace") if f.is_file() else ""
            self.text[rel] = body
            if needle not in body:
                moved.append(f"{rel} no longer has {needle!r} (rule {rule})")
        if moved:
            raise UserError(f"SGLang at {self.pkg} does not keep the speculative-settings rules where "
                            f"scripts/bench/sweep.py reads them: " + "; ".join(moved) + ". Re-read them there "
                            "and update scripts/bench/sweep.py (or run the sweep with the pinned SGLang)")
        hook = self.text[ANCHORS["page"][0]]
        self.page_backends = tuple(re.findall(r'"([^"]+)"', re.search(r"_PAGE_TREE_SPEC_BACKENDS = \(([^)]*)\)",
                                                                      hook).group(1)))
        self.quant_choices = self._list("srt/arg_groups/choices.py", "QUANTIZATION_CHOICES")

    def _list(self, rel: str, name: str) -> tuple[str, ...]:
        for node in ast.parse(self.text[rel]).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return tuple(e.value for e in node.value.elts if isinstance(e, ast.Constant))
        return ()

    def problems(self, p: Point, server_args: list[str]) -> list[str]:
        """Why SGLang would refuse or silently change this point; [] when it takes it as written."""
        s, out = p.setting, []
        if min(s.steps, s.topk) < 1 or s.draft_tokens < 2:
            return [f"{s.label}: steps and topk must be at least 1 and draft tokens at least 2"]
        if s.topk == 1 and s.draft_tokens != s.steps + 1:
            out.append(f"{s.label}: with topk 1 SGLang replaces {s.draft_tokens} draft tokens by steps + 1 = "
                       f"{s.steps + 1} (speculative_hook.py, a warning only); write {s.steps}/1/{s.steps + 1}")
        candidates = s.topk + (s.steps - 1) * s.topk ** 2
        if s.topk > 1 and s.draft_tokens - 1 > candidates:
            out.append(f"{s.label}: the draft tree offers {candidates} candidates, fewer than draft tokens - 1 = "
                       f"{s.draft_tokens - 1} (eagle_utils.organize_draft_results' torch.topk fails)")
        out += self._server_arg_problems(s, server_args)
        if p.quant and p.quant not in self.quant_choices:
            out.append(f"draft quantization {p.quant!r} is not one of SGLang's QUANTIZATION_CHOICES "
                       f"(arg_groups/choices.py): {', '.join(self.quant_choices)}")
        return out

    def _server_arg_problems(self, s: Setting, server_args: list[str]) -> list[str]:
        def value(flag: str) -> str | None:
            for i, t in enumerate(server_args):
                if t == flag and i + 1 < len(server_args):
                    return server_args[i + 1]
                if t.startswith(flag + "="):
                    return t.split("=", 1)[1]
            return None

        if s.topk == 1:
            return []
        out = []
        page, backend = value("--page-size"), value("--attention-backend")
        if page and int(page) > 1 and backend not in self.page_backends:
            out.append(f"{s.label}: topk > 1 with --page-size {page} needs --attention-backend one of "
                       f"{', '.join(self.page_backends)} (speculative_hook.py), not {backend}")
        if "trtllm_mha" in (backend, value("--decode-attention-backend"), value("--prefill-attention-backend")):
            out.append(f"{s.label}: the trtllm_mha backend only supports topk 1 (speculative_hook.py)")
        if "--speculative-use-rejection-sampling" in server_args:
            out.append(f"{s.label}: --speculative-use-rejection-sampling requires topk 1 (speculative_hook.py)")
        return out


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
    names = [p.name for p in points]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"{path}: points listed twice: {', '.join(dup)}")
    scen = d.get("scenarios")
    return Sweep(Path(path), str(d["base"]), [str(x) for x in d.get("reference", [])], points,
                 ",".join(scen) if scen else None, d.get("repeats"), d.get("order"), str(d.get("description", "")))


def variants(sw: Sweep, vset: pl.VariantSet, server_args: list[str], rules: Rules | None = None) -> list[pl.Variant]:
    """The reference variants, then one variant per point (the base with the point's drafter and settings);
    UserError listing every point SGLang would refuse or change. rules: the serving SGLang's (default: the sglang
    this python imports, else build/sglang)."""
    by_name = {v.name: v for v in vset.variants}
    for n in [sw.base, *sw.reference]:
        if n not in by_name:
            raise UserError(f"{sw.path}: variant {n!r} is not in {vset.path} ({', '.join(by_name)})")
    base = by_name[sw.base]
    if not base.speculative:
        raise UserError(f"{sw.path}: base variant {base.name} does not speculate, so the sweep cannot set its "
                        f"drafter; pick an EAGLE-3 variant such as patched-eagle3")
    if rules is None:
        pkg = package_or_tree()
        if not (pkg / "srt").is_dir():
            raise UserError(f"--sweep checks every point against SGLang's own rules, read from its source, and "
                            f"finds none at {pkg}: run make apply (build/sglang), or run where sglang is installed")
        rules = Rules(pkg, Path(hf_cache_dir()) / "hub")
    bad, out = [], [dataclasses.replace(by_name[n], default=True) for n in sw.reference]
    for p in sw.points:
        extra = p.setting.args() + (["--speculative-draft-model-quantization", p.quant] if p.quant else [])
        bad += [f"{p.name}: {w}" for w in rules.problems(p, [*base.args, *extra, *server_args])]
        out.append(dataclasses.replace(
            base, name=p.name, default=True, draft_model=p.drafter, args=(*base.args, *extra),
            description=f"{base.description}; drafter {p.drafter}, {p.setting.label}"
                        + (f", draft {p.quant}" if p.quant else ""), setting=tuple(p.describe().items())))
    if bad:
        raise UserError(f"{sw.path}: {len(bad)} point(s) SGLang ({rules.pkg}) would refuse or change:\n  "
                        + "\n  ".join(bad))
    return out
