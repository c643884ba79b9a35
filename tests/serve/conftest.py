"""make test-serve's tests (scripts/host/serve_tier.py and its libraries).

On CPU (CI): the generated tiny models (loaded by SGLang's own config classes and by transformers), the phase plan
(every serve command through the real serve verb and sglang's parser; the phases' server arguments resolved by
SGLang on a faked H200), the checks over the recorded H200 run, the lent-GPU route's stand-ins, and the tier's
processes against tests/serve/fake_sglang.py. On a GPU machine, test_serve_tier.py also runs the whole tier
(skipped with its reason elsewhere).
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> Path:
    """Both tiny pairs, generated once (seconds)."""
    from scripts.host.tiny_models import PAIRS, write_pair

    out = tmp_path_factory.mktemp("tiny-models")
    for pair in PAIRS:
        write_pair(out, pair)
    return out
