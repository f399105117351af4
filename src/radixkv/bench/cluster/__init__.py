"""`radixkv bench cluster`: a workload through N replicas behind a real router, beside an
offline simulation of the same cluster."""
