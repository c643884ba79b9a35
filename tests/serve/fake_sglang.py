"""A fake `python -m sglang.launch_server` for the CPU tests of `make test-serve`'s plumbing (no GPU, no model).

It takes the sglang flags `serve` assembles and answers what scripts/host/serve_tier.py asks, in SGLang's shapes:
/health, /model_info, POST /generate (input_ids -> output_ids: the continuation the tiny target's chain.json
prescribes; meta_info with spec_accept_length 4 when a drafter is given), /server_info (max_running_requests,
internal_states[0] with avg_spec_accept_length, the patched spec_cuda_graph counts and spec_collectives) and /metrics (the patched
sglang:spec_cuda_graph_forwards_total). With --disable-decode-cuda-graph every verify counts as eager
(no_graph_runner), and it prints the patched SGLang's startup warnings for that and for a capped
--max-running-requests. It proves nothing about SGLang: the tests that use it check the tier's processes, ports,
steps and documents. tests/serve/fake_python runs it in place of sglang.launch_server.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CAPTURED = 8


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-path")
    ap.add_argument("--port", type=int)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--speculative-draft-model-path")
    ap.add_argument("--max-running-requests", type=int, default=CAPTURED)
    ap.add_argument("--disable-decode-cuda-graph", action="store_true")
    a, _ = ap.parse_known_args()
    chain = json.loads((Path(a.model_path).parent / "chain.json").read_text())["next"]
    spec = a.speculative_draft_model_path is not None
    running = a.max_running_requests
    if spec and running > CAPTURED:
        print(f"max_running_requests is capped from {running} to {CAPTURED} so that every speculative verify "
              f"batch fits the largest captured decode CUDA graph (bs {CAPTURED}).", flush=True)
        running = CAPTURED
    if spec and a.disable_decode_cuda_graph:
        print("Speculative decoding (EAGLE3) runs with the target's decode CUDA graphs disabled "
              "(--disable-decode-cuda-graph): every verify forward runs eagerly", flush=True)
    outcome = "eager" if a.disable_decode_cuda_graph else "graph"
    counts = {"n": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, body, ctype="application/json"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            n = counts["n"]
            stage = {"graph": n if outcome == "graph" else 0, "piecewise": 0, "eager": n if outcome == "eager" else 0,
                     "fallback_reasons": {"no_graph_runner": n} if outcome == "eager" and n else {}}
            if self.path in ("/health", "/model_info"):
                return self.answer({"model_path": a.model_path})
            if self.path == "/server_info":
                stages = ("target_verify", "draft_decode", "draft_extend")
                record = {"calls": {}, "bytes": {}}  # TP1: no collective to issue
                collectives = {f"{s}_eager": {**record, "forwards": n} for s in stages} if outcome == "eager" \
                    else {s: {**record, "graphs": 4} for s in stages}
                state = {"avg_spec_accept_length": 4.0, "spec_cuda_graph": {s: dict(stage) for s in stages},
                         "spec_collectives": collectives} if spec else {}
                return self.answer({"max_running_requests": running, "internal_states": [state]})
            if self.path == "/metrics":
                reason = "no_graph_runner" if outcome == "eager" else ""
                lines = [f'sglang:spec_cuda_graph_forwards_total{{outcome="{outcome}",reason="{reason}",'
                         f'stage="{s}",tp_rank="0"}} {float(n)}' for s in ("target_verify", "draft_decode",
                                                                         "draft_extend")] if spec and n else []
                return self.answer("\n".join(["# TYPE sglang:spec_cuda_graph_forwards_total counter", *lines]) + "\n",
                                   "text/plain")
            self.send_error(404)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            n, t, out = req["sampling_params"]["max_new_tokens"], req["input_ids"][-1], []
            for _ in range(n):
                t = chain[t]
                out.append(t)
            time.sleep(0.002 * n)  # as fast with a drafter as without, graphs or not: the speed check must fail
            with lock:
                counts["n"] += (n + 3) // 4 if spec else 0
            meta = {"completion_tokens": n, **({"spec_accept_length": 4.0, "spec_verify_ct": (n + 3) // 4}
                                               if spec else {})}
            return self.answer({"output_ids": out, "meta_info": meta})

    print(f"fake sglang on {a.host}:{a.port} ({'EAGLE-3' if spec else 'no speculation'})", flush=True)
    ThreadingHTTPServer((a.host, a.port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
