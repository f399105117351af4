"""Maintainer tools, outside the installed package: what regenerates the docs or measured a
one-time question, and the head-to-head against vLLM (`peers/`); each is run from a checkout
as `python scripts/NAME.py` (`python -m scripts.peers`), against the `radixkv` on the path.
What a user runs to measure their own setup stays in `radixkv bench`."""
