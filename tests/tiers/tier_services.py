"""Whether the test services can run here (a module of its own: every test folder has a
`conftest`, so `from conftest import ...` would find whichever was imported first)."""

from __future__ import annotations

from pathlib import Path

from radixkv.storage.local_services import MooncakeProcs


def mooncake_missing() -> str | None:
    """Why the Mooncake tests cannot run here, or None."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        return f"mooncake.store does not import ({exc}): pip install .[test] (Linux x86-64)"
    try:
        MooncakeProcs(Path("."))
    except RuntimeError as exc:
        return str(exc)
    return None
