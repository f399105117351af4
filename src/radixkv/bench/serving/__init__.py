"""Benchmarks over HTTP against any OpenAI-compatible server: the timing client and
its summaries, `bench serve`, `bench compare` (its table and rounds), `bench answers`, and
starting our server or a peer's for a run."""
