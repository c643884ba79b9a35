"""The one reader of what a running SGLang server says about speculation (make bench, test-serve, the receipt).

/metrics: sglang:cuda_graph_passes_total{stage,outcome,reason} of the speculative stages (upstream's own passes, stage
decode or prefill, are not read), gen_throughput, num_running_reqs, generation_tokens_total, spec_verify_calls_total.
/server_info internal_states[0]: spec_cuda_graph, spec_collectives (with SGLANG_RECORD_SPEC_COLLECTIVES=1),
last_gen_throughput. Counters are read before and after a run; a counter that went down was reset (/flush_cache)
and counts from zero.
"""

import dataclasses
import statistics
import threading
import time

from ..lib.errors import UserError
from ..lib.http import get_json, http_get

GRAPH_METRIC = "sglang:cuda_graph_passes_total"
STAGES = ("target_verify", "draft_decode", "draft_extend", "draft_block")
OUTCOMES = ("graph", "piecewise", "eager")


def parse_metrics(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample of a Prometheus text, read by prometheus_client ([] if unreadable)."""
    try:
        from prometheus_client.parser import text_string_to_metric_families as families
    except ImportError as e:
        raise UserError(
            "reading /metrics needs prometheus_client: pip install prometheus-client (make setup puts it in .venv)"
        ) from e
    try:
        return [(s.name, dict(s.labels), float(s.value)) for f in families(text) for s in f.samples]
    except ValueError:
        return []


def _rank0(labels: dict) -> bool:
    return labels.get("tp_rank", "0") == "0"  # the other TP ranks repeat rank 0's numbers


def metric_sum(samples: list, name: str, **match: str) -> float | None:
    """Sum of a metric over tensor-parallel rank 0's series (matching `match`); None when absent."""
    vals = [v for n, lab, v in samples if n == name and _rank0(lab) and all(lab.get(k) == x for k, x in match.items())]
    return sum(vals) if vals else None


def internal_state(server_info: dict | None) -> dict:
    """internal_states[0] of /server_info ({} when absent); the decode side's under PD disaggregation."""
    info = server_info or {}
    if isinstance(info.get("decode"), list) and info["decode"]:
        info = info["decode"][0]
    states = info.get("internal_states") or []
    return states[0] if states and isinstance(states[0], dict) else {}


def _empty() -> dict:
    return {**{o: 0 for o in OUTCOMES}, "fallback_reasons": {}}


def graph_counts_from_metrics(samples: list) -> dict | None:
    """{stage: {graph, piecewise, eager, fallback_reasons}} of the speculative stages from /metrics samples."""
    out: dict = {}
    for name, lab, v in samples:
        if name != GRAPH_METRIC or not _rank0(lab) or lab.get("stage") not in STAGES:
            continue
        c = out.setdefault(lab["stage"], _empty())
        outcome = lab.get("outcome") if lab.get("outcome") in OUTCOMES else "eager"
        c[outcome] += int(v)
        if outcome != "graph":
            reason = lab.get("reason") or "unspecified"
            c["fallback_reasons"][reason] = c["fallback_reasons"].get(reason, 0) + int(v)
    return out or None


def graph_counts_from_info(server_info: dict | None) -> dict | None:
    """The same counts from /server_info spec_cuda_graph."""
    raw = internal_state(server_info).get("spec_cuda_graph")
    if not isinstance(raw, dict):
        return None
    return {
        stage: {
            **{o: int(c.get(o, 0)) for o in OUTCOMES},
            "fallback_reasons": {str(k): int(n) for k, n in (c.get("fallback_reasons") or {}).items()},
        }
        for stage, c in raw.items()
        if isinstance(c, dict)
    }


def spec_collectives(server_info: dict | None) -> dict | None:
    """/server_info spec_collectives ({stage: {calls, bytes, graphs | forwards}}); None when not recorded."""
    raw = internal_state(server_info).get("spec_collectives")
    return raw if isinstance(raw, dict) else None


@dataclasses.dataclass
class Snapshot:
    t: float
    server_info: dict | None
    metrics: list | None  # parsed /metrics; None when the server exports none


def snapshot(url: str) -> Snapshot:
    status, body = http_get(url + "/metrics", 10)
    metrics = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else None
    return Snapshot(time.time(), get_json(url + "/server_info", 30), metrics)


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    return after if before is None or after < before else after - before


def _stage_delta(b: dict, a: dict) -> dict:
    out = {o: int(_delta(b.get(o), a[o]) or 0) for o in OUTCOMES}
    reasons = {r: int(_delta(b["fallback_reasons"].get(r), n) or 0) for r, n in a["fallback_reasons"].items()}
    return {**out, "fallback_reasons": {r: n for r, n in reasons.items() if n}}


def graph_delta(before: Snapshot, after: Snapshot) -> dict | None:
    """Speculative forwards during a run, from the first source both snapshots have (/metrics, /server_info): the
    target verify's counts and graph hit rate at the top, every stage under "stages"; None for a stock server."""
    for source, read in (
        ("metrics", lambda s: graph_counts_from_metrics(s.metrics or [])),
        ("server_info", lambda s: graph_counts_from_info(s.server_info)),
    ):
        a = read(after)
        if a is not None:
            b = read(before) or {}
            stages = {st: _stage_delta(b.get(st, _empty()), c) for st, c in a.items()}
            v = stages.get("target_verify", _empty())
            total = sum(v[o] for o in OUTCOMES)
            return {**v, "hit_rate": v["graph"] / total if total else None, "source": source, "stages": stages}
    return None


def accept_length(before: Snapshot, after: Snapshot) -> float | None:
    """Generated tokens per verify call over the run, from the server's counters."""
    if not before.metrics or not after.metrics:
        return None
    toks = _delta(
        metric_sum(before.metrics, "sglang:generation_tokens_total"),
        metric_sum(after.metrics, "sglang:generation_tokens_total"),
    )
    calls = _delta(
        metric_sum(before.metrics, "sglang:spec_verify_calls_total"),
        metric_sum(after.metrics, "sglang:spec_verify_calls_total"),
    )
    return toks / calls if toks and calls else None


def decode_rate(samples: list, start: float | None, end: float | None, source: str | None) -> dict:
    """The server's decode tok/s over [start, end]: the median of its decode-stats windows, each counted once; the
    value standing when the phase began (the last run's window) is skipped until the server posts a new one."""
    start = start if start is not None else (samples[0][0] if samples else 0.0)
    end = end if end is not None else float("inf")
    before = [v for t, v, _ in samples if t < start and v is not None]
    last, windows, running = (before[-1] if before else None), [], []
    for t, v, r in samples:
        if not start <= t <= end or v is None:
            continue
        if r is not None:
            running.append(r)
        if v != last:
            last = v
            windows += [v] if v > 0 else []
    return {
        "decode_tok_s": statistics.median(windows) if windows else None,
        "decode_tok_s_mean": statistics.fmean(windows) if windows else None,
        "decode_windows": len(windows),
        "decode_tok_s_source": source,
        "decode_tok_s_samples": [round(w, 3) for w in windows[:1000]],
        "running_reqs_mean": statistics.fmean(running) if running else None,
    }


class Sampler:
    """Polls the server's decode tok/s every `interval` s in a thread (/metrics gen_throughput, else /server_info
    last_gen_throughput); mark_start / mark_end bracket the measured phase; stop() returns decode_rate()."""

    def __init__(self, url: str, interval: float = 1.0):
        self.url, self.interval, self.source = url, interval, None
        self.samples: list[tuple[float, float | None, float | None]] = []
        self.start_t: float | None = None
        self.end_t: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _poll(self) -> tuple[float | None, float | None]:
        if self.source in (None, "metrics"):
            status, body = http_get(self.url + "/metrics", max(1.0, self.interval * 2))
            m = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else []
            if metric_sum(m, "sglang:gen_throughput") is not None:
                self.source = "metrics"
                return metric_sum(m, "sglang:gen_throughput"), metric_sum(m, "sglang:num_running_reqs")
            if self.source == "metrics":
                return None, None
        st = internal_state(get_json(self.url + "/server_info", max(2.0, self.interval * 2)))
        if "last_gen_throughput" in st:
            self.source = "server_info"
            return float(st["last_gen_throughput"]), None
        return None, None

    def _loop(self) -> None:
        while True:
            t = time.monotonic()
            self.samples.append((t, *self._poll()))
            if self._stop.wait(max(0.0, self.interval - (time.monotonic() - t))):
                return

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def mark_start(self) -> None:
        self.start_t = time.monotonic()

    def mark_end(self) -> None:
        self.end_t = self.end_t or time.monotonic()

    def stop(self) -> dict:
        self.mark_end()
        self._stop.set()
        self._thread.join(30)
        return decode_rate(self.samples, self.start_t, self.end_t, self.source)
