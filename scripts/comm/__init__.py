"""make bench-comm: bench_comm (the image's verb), comm_worker, comm_report; sglang_comm, shared with tests/gpu."""
