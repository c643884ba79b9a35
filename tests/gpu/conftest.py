"""The GPU tier (`make test-gpu`): options, the world size, skips, and the result file.

  EAGLE_GPU_RESULTS=FILE [EAGLE_GPU_WORLD=N] [EAGLE_GPU_TIMEOUT=S] pytest tests/gpu

World size: every visible GPU (CUDA_VISIBLE_DEVICES narrows it), at least 2; EAGLE_GPU_WORLD picks fewer. A test
that needs GPUs skips with its reason where there are fewer than it needs, so on the CPU machine (CI) the tier is
all skips except the harness tests, which run CPU ranks over gloo. (Environment variables rather than pytest
options: `make test` runs the whole tests/ tree, where options of this directory's conftest would not exist.)

EAGLE_GPU_RESULTS=FILE (the make target sets it) gets, at the end of the session, one JSON document: the world
size, counts of passed / failed / skipped tests, one entry per test (outcome, seconds, skip reason) and what the
tests recorded (versions, decisions, per-call timings, correctness numbers), so a run on the box is a receipt.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path

import pytest

from _harness import gpu_count

_RECORDS: dict = {}
_TESTS: list = []
collect_ignore = ["serve"] if os.environ.get("EAGLE_GPU_RESULTS") else []  # test-serve's suite is make test-serve's


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


@pytest.fixture(scope="session")
def record():
    """record(key, value): keep a measurement or decision for the result document."""
    return _RECORDS.__setitem__


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry = {"nodeid": report.nodeid, "outcome": report.outcome, "seconds": round(report.duration, 2)}
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["skip_reason"] = report.longrepr[2]
        if report.failed:
            entry["error"] = str(report.longrepr)[-4000:]
        _TESTS.append(entry)
        _write_results(None)  # after every test: a run cut short still leaves what it found


def pytest_sessionfinish(session, exitstatus):
    _write_results(int(exitstatus))


def _write_results(exit_status) -> None:
    path = os.environ.get("EAGLE_GPU_RESULTS")
    if not path:
        return
    gpu_tests = [t for t in _TESTS if "tests/gpu/" in t["nodeid"]]
    counts = {k: sum(t["outcome"] == k for t in gpu_tests) for k in ("passed", "failed", "skipped")}
    doc = {"world": _env_int("EAGLE_GPU_WORLD") or gpu_count(), **counts,
           "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "exit_status": exit_status, "tests": gpu_tests, "records": _RECORDS}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1, default=str) + "\n")
