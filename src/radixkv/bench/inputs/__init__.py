"""What a benchmark sends: seeded workloads and their ideal hit rate, the workload flags,
public traces and where they live, and where prompt tokens come from."""
