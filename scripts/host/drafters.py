"""The Kimi-K2.5 drafters this project knows (docker/README.md "Drafters" has their evidence), the ones the shipped
profiles name, and whether a drafter or model is in the HF cache serve and bench mount."""

import difflib
import re
from pathlib import Path

from ..box.docker import hf_cache_dir
from ..box.preflight import weights_problem
from ..lib.errors import UserError
from ..lib.repo import PROFILES_DIR

KNOWN = {  # HF id: (the --speculative-algorithm it drafts for, what is published about it)
    "lightseekorg/kimi-k2.5-eagle3": ("EAGLE3", "AL 2.69 MT-Bench, 3.20 GSM8K, 3.29 HumanEval at 3/1/4 (model card)"),
    "lightseekorg/kimi-k2.5-eagle3-mla": ("EAGLE3", "MLA draft: AL 2.94 MT-Bench, 3.02 GSM8K at 3/1/4 (model card)"),
    "AQ-MedAI/Kimi-K25-eagle3": ("EAGLE3", "51.78% acceptance on GSM8K with 4 draft tokens (vllm-project/vllm#35966)"),
    "AQ-MedAI/Kimi-K2-Instruct-eagle3": ("EAGLE3", "trained for Kimi-K2, not K2.5 (model card)"),
    "z-lab/Kimi-K2.5-DFlash": (
        "DFLASH",
        "block drafting, block 8: AL 3.7 MT-Bench, 5.3 GSM8K and HumanEval, 4.5 "
        "MBPP with thinking on (model card, SGLang)",
    ),
}


def cached(repo: str, cache: str | None = None) -> bool:
    """Whether `repo` (an HF id) is complete in the HF cache, or is a local directory (the bench's weights check)."""
    return not weights_problem(repo, Path(cache or hf_cache_dir()))


def profiled() -> list[str]:
    """The drafters the shipped profiles (docker/profiles/*.yaml) name, each once."""
    named = (
        re.findall(r"^speculative-draft-model-path:\s*(\S+)", p.read_text(), re.M)
        for p in sorted(PROFILES_DIR.glob("*.yaml"))
    )
    return list(dict.fromkeys(repo for found in named for repo in found))


def drafter_note(repo: str, cache: str | None = None) -> str:
    """A line about the drafter for the dry run; a UserError for an id that is neither known nor in the cache, or a
    path that is no directory."""
    cache = cache or hf_cache_dir()
    if repo in KNOWN:
        missing = f"; not in the HF cache {cache}: SGLang downloads it at start (or before: hf download {repo})"
        return f"drafter {repo} ({KNOWN[repo][0]}): {KNOWN[repo][1]}" + ("" if cached(repo, cache) else missing)
    if cached(repo, cache):
        return f"drafter {repo}: not one of the known drafters ({', '.join(KNOWN)})"
    if repo.startswith(("/", ".", "~")):
        raise UserError(f"drafter {repo}: no such directory (a drafter given as a path is a directory of its weights)")
    close = difflib.get_close_matches(repo, list(KNOWN), n=1)
    raise UserError(
        f"drafter {repo} is neither a known drafter ({', '.join(KNOWN)}) nor in the HF cache {cache}"
        + (f": did you mean {close[0]}?" if close else ".")
        + f" To use it anyway, download it first: hf download {repo}"
    )
