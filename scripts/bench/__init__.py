"""Measurement: make bench (bench, plan, servers, observe, report, sweep), bench-comm, report (receipt), docs."""
