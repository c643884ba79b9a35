"""What `make bench` reads from a running server (scripts/bench/launch.py starts and stops the servers).

Reading (stdlib HTTP, scripts/lib/http.py; /metrics parsed by prometheus_client):
  * /server_info: internal_states[0] carries avg_spec_accept_length, last_gen_throughput and, on patched servers,
    spec_cuda_graph {stage: {graph, piecewise, eager, fallback_reasons}} (stages target_verify, draft_decode,
    draft_extend: the patched SGLang's SpecGraphStats.to_dict()); the server args say whether it speculates.
  * /metrics (server started with --enable-metrics): sglang:gen_throughput (gauge, recomputed every
    decode_log_interval decode steps: the server's own decode tok/s), sglang:num_running_reqs,
    sglang:generation_tokens_total, sglang:spec_verify_calls_total and, on patched servers,
    sglang:spec_cuda_graph_forwards_total{stage,outcome,reason}.
Counters are read before and after each run and reported as deltas (a counter that went down was reset, e.g. by
/flush_cache, and the value after counts from zero). The run's "verify" record is the target_verify stage (graph,
piecewise and eager forwards, the fallback reasons, the graph hit rate) with every stage under "stages". Decode
tok/s is sampled while bench_serving's measured phase runs: each decode-stats window counts once, and the value
left over from before the run is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
import threading
import time

from ..host.sglang_pkg import patch_record
from ..lib import proc
from ..lib.errors import UserError
from ..lib.http import get_json, http_get

PATCHSET_LABEL = "io.eagle-fast-verify.patchset"
PATCHES_LABEL = "io.eagle-fast-verify.patches"


# -------------------------------------------------------------------------------------------------------------
# Prometheus text


def metrics_parser():
    """prometheus_client's text parser; a UserError with the fix where it is not installed."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as e:
        raise UserError("make bench reads /metrics with prometheus_client: pip install prometheus-client "
                        "(requirements/test.in pins it; make setup installs it into .venv)") from e
    return text_string_to_metric_families


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, dict(s.labels), float(s.value)) for fam in metrics_parser()(text) for s in fam.samples]


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a Prometheus text exposition; a line the parser refuses is
    skipped, the rest still read."""
    try:
        return _samples(text)
    except ValueError:
        out = []
        for line in text.splitlines():
            try:
                out += _samples(line + "\n") if line.strip() and not line.startswith("#") else []
            except ValueError:
                continue
        return out


def metric_sum(samples: list, name: str, **match: str) -> float | None:
    """Sum of a metric over the series of tensor-parallel rank 0 (other ranks repeat it); None if absent."""
    vals = [v for n, lab, v in samples
            if n == name and lab.get("tp_rank", "0") == "0" and all(lab.get(k) == x for k, x in match.items())]
    return sum(vals) if vals else None


# -------------------------------------------------------------------------------------------------------------
# snapshots and deltas


@dataclasses.dataclass
class Snapshot:
    t: float
    server_info: dict | None
    metrics: list | None  # parsed /metrics, None when the server exports none


def internal_state(server_info: dict | None) -> dict:
    if not server_info:
        return {}
    if "decode" in server_info and isinstance(server_info["decode"], list) and server_info["decode"]:
        server_info = server_info["decode"][0]  # PD disaggregation: bench_serving reads the decode side too
    states = server_info.get("internal_states") or []
    return states[0] if states and isinstance(states[0], dict) else {}


def take_snapshot(url: str) -> Snapshot:
    status, body = http_get(url + "/metrics", 10)
    metrics = parse_prometheus(body.decode("utf-8", "replace")) if status == 200 else None
    return Snapshot(time.time(), get_json(url + "/server_info", 30), metrics)


GRAPH_METRIC = "sglang:spec_cuda_graph_forwards_total"
GRAPH_INFO = "spec_cuda_graph"
STAGES = ("target_verify", "draft_decode", "draft_extend")
OUTCOMES = ("graph", "piecewise", "eager")
VERIFY = "target_verify"


def _empty() -> dict:
    return {**{o: 0 for o in OUTCOMES}, "fallback_reasons": {}}


def _stages_from_metrics(s: Snapshot) -> dict | None:
    series = [(lab, v) for n, lab, v in (s.metrics or []) if n == GRAPH_METRIC and lab.get("tp_rank", "0") == "0"]
    if not series:
        return None
    out: dict[str, dict] = {}
    for lab, v in series:
        c = out.setdefault(lab.get("stage") or "unknown", _empty())
        outcome = lab.get("outcome") if lab.get("outcome") in OUTCOMES else "eager"
        c[outcome] += int(v)
        if outcome != "graph":
            r = lab.get("reason") or "unspecified"
            c["fallback_reasons"][r] = c["fallback_reasons"].get(r, 0) + int(v)
    return out


def _stages_from_info(s: Snapshot) -> dict | None:
    raw = internal_state(s.server_info).get(GRAPH_INFO)
    if not isinstance(raw, dict):
        return None
    out = {}
    for stage, c in raw.items():
        if isinstance(c, dict):
            out[stage] = {**{o: int(c.get(o, 0)) for o in OUTCOMES},
                          "fallback_reasons": {str(k): int(v) for k, v in (c.get("fallback_reasons") or {}).items()}}
    return out


def _summary(stages: dict, source: str) -> dict:
    """The target_verify stage at the top (graph hit rate included), every stage under "stages"."""
    v = stages.get(VERIFY, _empty())
    total = sum(v[o] for o in OUTCOMES)
    return {**{o: v[o] for o in OUTCOMES}, "fallback_reasons": dict(v["fallback_reasons"]),
            "hit_rate": v["graph"] / total if total else None, "source": source, "stages": stages}


def verify_counts(s: Snapshot) -> dict | None:
    """Speculative forwards by stage and CUDA-graph outcome: from /metrics when exported, else /server_info."""
    for read, source in ((_stages_from_metrics, "metrics"), (_stages_from_info, "server_info")):
        stages = read(s)
        if stages is not None:
            return _summary(stages, source)
    return None


def _delta(before: float | None, after: float | None) -> float | None:
    if after is None:
        return None
    if before is None or after < before:  # absent before, or reset in between: counts from zero
        return after
    return after - before


def _stage_delta(b: dict, a: dict) -> dict:
    out = {o: int(_delta(b.get(o), a[o]) or 0) for o in OUTCOMES}
    reasons = {r: int(_delta(b["fallback_reasons"].get(r), n) or 0) for r, n in a["fallback_reasons"].items()}
    out["fallback_reasons"] = {r: n for r, n in reasons.items() if n}
    return out


def verify_delta(before: Snapshot, after: Snapshot) -> dict | None:
    """Speculative forwards during the run, from the first source both snapshots have (/metrics, /server_info);
    None when the server has no such counters (stock SGLang)."""
    for read, source in ((_stages_from_metrics, "metrics"), (_stages_from_info, "server_info")):
        b, a = read(before), read(after)
        if a is not None and b is not None:
            break
    else:
        counts = verify_counts(after)
        if counts is None:
            return None
        a, b, source = counts["stages"], {}, counts["source"]
    return _summary({st: _stage_delta(b.get(st, _empty()), c) for st, c in a.items()}, source)


def accept_length_from_metrics(before: Snapshot, after: Snapshot) -> float | None:
    """Generated tokens per verify call over the run (SGLang's per-request spec_accept_length, pooled)."""
    if not before.metrics or not after.metrics:
        return None
    toks = _delta(metric_sum(before.metrics, "sglang:generation_tokens_total"),
                  metric_sum(after.metrics, "sglang:generation_tokens_total"))
    calls = _delta(metric_sum(before.metrics, "sglang:spec_verify_calls_total"),
                   metric_sum(after.metrics, "sglang:spec_verify_calls_total"))
    return toks / calls if toks and calls else None


# -------------------------------------------------------------------------------------------------------------
# decode tok/s from server stats


class Sampler:
    """Polls the server's gen throughput every `interval` seconds in a thread (from /metrics, else /server_info)."""

    def __init__(self, url: str, interval: float = 1.0):
        self.url, self.interval = url, interval
        self.samples: list[tuple[float, float | None, float | None]] = []  # (monotonic t, tok/s, running reqs)
        self.source: str | None = None
        self.measure_start: float | None = None
        self.measure_end: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _poll(self) -> tuple[float | None, float | None]:
        if self.source in (None, "metrics"):
            status, body = http_get(self.url + "/metrics", max(1.0, self.interval * 2))
            if status == 200:
                m = parse_prometheus(body.decode("utf-8", "replace"))
                v = metric_sum(m, "sglang:gen_throughput")
                if v is not None:
                    self.source = "metrics"
                    return v, metric_sum(m, "sglang:num_running_reqs")
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
            v, running = self._poll()
            self.samples.append((t, v, running))
            if self._stop.wait(max(0.0, self.interval - (time.monotonic() - t))):
                return

    def start(self) -> "Sampler":
        self._thread.start()
        return self

    def mark_start(self) -> None:
        self.measure_start = time.monotonic()

    def mark_end(self) -> None:
        if self.measure_end is None:
            self.measure_end = time.monotonic()

    def stop(self) -> dict:
        self.mark_end()
        self._stop.set()
        self._thread.join(30)
        return decode_rate(self.samples, self.measure_start, self.measure_end, self.source)


def decode_rate(samples: list, start: float | None, end: float | None, source: str | None) -> dict:
    """Median over the decode-stats windows seen in [start, end]: a value counts once, and the value standing
    when the phase began (a previous run's last window) is skipped until the server posts a new one."""
    if start is None:
        start = samples[0][0] if samples else 0.0
    end = end if end is not None else float("inf")
    before = [v for t, v, _ in samples if t < start and v is not None]
    stale = before[-1] if before else None
    windows: list[float] = []
    running: list[float] = []
    last = stale
    for t, v, r in samples:
        if not start <= t <= end or v is None:
            continue
        if r is not None:
            running.append(r)
        if v == last:  # the same window sampled again, or the stale one
            continue
        last = v
        if v > 0:
            windows.append(v)
    return {"decode_tok_s": statistics.median(windows) if windows else None,
           "decode_tok_s_mean": statistics.fmean(windows) if windows else None,
           "decode_windows": len(windows), "decode_tok_s_source": source,
           "decode_tok_s_samples": [round(w, 3) for w in windows[:1000]],
           "running_reqs_mean": statistics.fmean(running) if running else None}


# -------------------------------------------------------------------------------------------------------------
# patch set of a server


def patchset_of_python(python: str) -> dict:
    """The patch record of the sglang that `python` imports, found without importing sglang."""
    return patch_record(python)


def patchset_of_image(image: str) -> dict:
    res = proc.run(["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", image], timeout=60)
    if not res.ok:
        why = (res.stderr.strip() or res.why)[-200:]
        return {"patchset": "unknown", "detail": f"docker image inspect {image}: {why}"}
    try:
        labels = json.loads(res.stdout) or {}
    except ValueError:
        labels = {}
    if PATCHSET_LABEL not in labels:
        return {"patchset": "none", "detail": f"{image} has no {PATCHSET_LABEL} label (stock image)", "image": image}
    patches = labels.get(PATCHES_LABEL, "")
    return {"patchset": labels[PATCHSET_LABEL], "image": image,
            "patches": [p.strip() for p in re.split(r"[\n;,]", patches) if p.strip()] if patches else []}
