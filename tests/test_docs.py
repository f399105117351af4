"""The repository stands on its own: README.md and docs/ never send a reader outside it (no
../shared, no absolute path of the machine that wrote them) and every relative link resolves to a
file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "data" / "traces" / "README.md", *(ROOT / "docs").glob("*.md")]
)
MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|home|root|tmp|mnt|opt|srv|Users)/\S*")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_stays_inside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text and "shared/traces" not in text
    assert not MACHINE_PATH.findall(text), MACHINE_PATH.findall(text)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # an external URL or an anchor on the same page
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{target} leaves the repository"
        assert path.exists(), f"{page.name}: broken link {target}"


def test_docs_pages_exist() -> None:
    for name in ("architecture.md", "traces.md", "server.md", "benchmarks.md"):
        assert (ROOT / "docs" / name).is_file()
