"""Maintainer tools, outside the installed package: what regenerates the docs or measured a
one-time question (each is run as `python scripts/NAME.py`, against the `radixkv` on the path).
What a user runs to measure their own setup stays in `radixkv bench`."""
