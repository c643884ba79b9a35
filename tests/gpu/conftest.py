"""The GPU tier (`make test-gpu`): [EAGLE_GPU_WORLD=N] [EAGLE_GPU_TIMEOUT=S] pytest tests/gpu --ignore tests/gpu/serve

World size: every visible GPU, at least 2 (else the GPU tests skip, saying why); EAGLE_GPU_WORLD picks fewer.
Environment variables, not options: `make test` runs all of tests/, where this conftest's options would not exist.
What a test records goes into pytest's junitxml as properties (scripts/host/gpu_tier.py's receipt)."""

import json
import os

import pytest

from _harness import gpu_count


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise pytest.UsageError(f"{name}={value!r} is not a whole number")
    return int(value)


@pytest.fixture(scope="session")
def gpu_world() -> int:
    """Ranks for the GPU tests; skips (with the reason) where fewer than 2 GPUs are visible."""
    n = gpu_count()
    want = _env_int("EAGLE_GPU_WORLD") or n
    if n < 2 or want < 2:
        pytest.skip(f"needs >= 2 GPUs (found {n}): the patched collectives only run with TP > 1")
    if want > n:
        pytest.skip(f"EAGLE_GPU_WORLD={want} but only {n} GPUs are visible")
    return want


@pytest.fixture(scope="session")
def gpu_timeout() -> float:
    return float(_env_int("EAGLE_GPU_TIMEOUT") or 600)


@pytest.fixture
def record(record_property):
    """record(key, value): keep a measurement or decision in the result (a junitxml property, as JSON)."""
    return lambda key, value: record_property(key, json.dumps(value, default=str))
