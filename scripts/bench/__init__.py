"""make bench and make bench-sweep: bench (the verb), plan, sweep, servers, observe, report."""
