"""Measurement: serving benchmarks, the communication benchmark and the cost model.

Verbs: bench, bench_comm, cost_model (python -m scripts.bench.<verb>; make bench, bench-comm, docs). Library:
config (scenarios, variants, the A/B/A plan), client (SGLang's bench_serving), observe (what a server reports),
launch (the servers a session starts), preflight (what the plan needs from the box, and its cost), sweep (the
drafter x settings points and SGLang's rules for them), spec_model (the cost model of a setting), report (tables,
plots, baselines), comm_worker (one rank of bench-comm), comm_report (bench-comm's summary, read by the cost model
too), kimi (model shapes), numbers (the formatter).
"""
