"""What every verb that touches the box shares: docker, ranks, results, preflight (the GPU list among its checks)."""
