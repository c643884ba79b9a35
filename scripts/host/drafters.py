"""Kimi EAGLE-3 drafters: what each one is, what was published about it, and whether this SGLang loads it.

SGLang picks a draft model's class the way it picks any model's: `architectures[0]` of the checkpoint's
config.json, looked up in the ModelRegistry, which holds the `EntryClass` of every module under
sglang/srt/models (registry.import_model_classes; _config_draft_model rewrites a few MTP architectures, none of
these). So the claim "SGLang loads it" is read from the installed source, not written here: the architecture the
drafter's config.json declares (from its config.json in the local HF cache when it is there, else the one this
table records from the drafter's card) must be an EntryClass of some srt/models module. A module whose text names
the checkpoint (kimi_k25_eagle3.py names ``kimi-k2.5-eagle3-mla``) is said to be built for it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Drafter:
    repo: str
    arch: str  # architectures[0] of its config.json, as its card / checkpoint shows it
    published: str  # published accept lengths (AL: tokens per verify, incl. the bonus token), with the source
    for_model: str = "Kimi-K2.5"


# docker/README.md ("Drafters") carries the same rows.
KNOWN = {d.repo: d for d in (
    Drafter("AQ-MedAI/Kimi-K25-eagle3", "LlamaForCausalLMEagle3",
            "used by SGLang's Kimi-K2.5 EAGLE-3 support (sgl-project/sglang#19689); vLLM measured 51.78% "
            "acceptance on GSM8K with 4 draft tokens (vllm-project/vllm#35966)"),
    Drafter("lightseekorg/kimi-k2.5-eagle3", "LlamaForCausalLMEagle3",
            "AL 2.69 MT-Bench, 3.20 GSM8K, 3.29 HumanEval, 2.30 C-Eval, ~3.8 BFCL (3/1/4, model card)"),
    Drafter("lightseekorg/kimi-k2.5-eagle3-mla", "Eagle3DeepseekV2ForCausalLM",
            "MLA draft (small draft KV cache): AL 2.94 MT-Bench, 3.02 GSM8K, 2.97 HumanEval (3/1/4, lm_eval, "
            "model card); on 8x RTX PRO 6000 the MLA drafter ran ~20 tok/s faster than the non-MLA one (the K2.6 "
            "pair, box-class report: huggingface.co/lightseekorg/kimi-k2.6-eagle3/discussions/1)"),
    Drafter("AQ-MedAI/Kimi-K2-Instruct-eagle3", "LlamaForCausalLMEagle3",
            "trained for Kimi-K2 (not K2.5): AL 3.37 HumanEval, 3.17 GSM8K (model card)", for_model="Kimi-K2"),
)}


ENTRY_RE = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[A-Za-z_]\w*)", re.M)


@functools.lru_cache(maxsize=8)
def entry_classes(pkg: Path) -> dict[str, str]:
    """Architecture name -> the srt/models module (relative to the package) whose EntryClass registers it (the
    module-level `EntryClass = X` or `= [X, Y]` that registry.import_model_classes reads)."""
    out: dict[str, str] = {}
    for f in sorted((Path(pkg) / "srt" / "models").glob("*.py")):
        for m in ENTRY_RE.finditer(f.read_text(errors="replace")):
            for name in re.findall(r"[A-Za-z_]\w*", m.group(1)):
                out.setdefault(name, str(f.relative_to(pkg)))
    return out


def cached_arch(repo: str, hub: Path | None = None) -> str | None:
    """architectures[0] of the drafter's config.json in the local HF cache, None when it is not there."""
    if hub is None:
        home = os.environ.get("HF_HUB_CACHE") or os.path.join(
            os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
        hub = Path(home)
    local = Path(repo)
    configs = [local / "config.json"] if local.is_dir() else sorted(
        (hub / f"models--{repo.replace('/', '--')}" / "snapshots").glob("*/config.json"))
    for c in configs:
        try:
            archs = json.loads(c.read_text()).get("architectures") or []
        except (OSError, ValueError):
            continue
        if archs:
            return str(archs[0])
    return None


@dataclasses.dataclass
class Claim:
    repo: str
    loads: bool | None  # None: no SGLang source to read
    text: str


def claim(repo: str, pkg: Path | None, hub: Path | None = None) -> Claim | None:
    """What this SGLang (its package directory) does with the drafter; None for a drafter nobody recorded."""
    known = KNOWN.get(repo)
    arch = cached_arch(repo, hub)
    if known is None and arch is None:
        return None
    arch_src = "its config.json in the HF cache" if arch else "the drafter table (its card)"
    arch = arch or known.arch
    about = f"{known.published}" if known else "not in the project's drafter table"
    if pkg is None or not (Path(pkg) / "srt" / "models").is_dir():
        return Claim(repo, None, f"{about}; declares {arch} ({arch_src}); no SGLang source here to check it")
    where = entry_classes(Path(pkg)).get(arch)
    if where is None:
        return Claim(repo, False, f"{about}; declares {arch} ({arch_src}), which no srt/models module of this "
                                  f"SGLang registers (EntryClass): expect sglang to refuse it")
    name = re.escape(repo.split("/")[-1])
    built = re.search(rf"(?<![\w.-]){name}(?![\w.-])", (Path(pkg) / where).read_text(errors="replace")) is not None
    return Claim(repo, True, f"{about}; SGLang loads it as {arch} ({where}"
                             + (", built for this checkpoint)" if built else ")") + f"; architecture from {arch_src}")
