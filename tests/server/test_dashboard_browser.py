"""The dashboard in a real browser: Debian's headless `chromium` driven by Selenium through the
system `chromedriver` (no browser download). A real server on a tiny checkpoint serves requests
while the page polls; once they are done the numbers the page shows must equal /cache/stats.
A screenshot is saved to test-artifacts/dashboard.png (gitignored; the path is printed).

`.ci/run` installs chromium and chromium-driver when they are missing; without them (a local
machine) the test is skipped with the reason."""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_harness import LiveServer, live_server

from radixkv.engine.engine import Engine
from radixkv.engine.types import EngineConfig

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
KEY = "browser-key"
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1440,1200",
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="needs Debian's chromium and chromium-driver (apt-get install chromium "
        "chromium-driver; .ci/run installs them)",
    ),
]


@pytest.fixture(scope="module")
def srv(tiny_model_dir: Callable[..., Path]) -> Iterator[LiveServer]:
    cfg = EngineConfig(num_slots=4096, max_model_len=512, seed=0, max_running_requests=4)
    with live_server(Engine(str(tiny_model_dir("llama")), cfg), "tiny", api_key=KEY) as server:
        yield server


@pytest.fixture()
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    profile = tempfile.mkdtemp(prefix="radixkv-chromium-")
    for flag in (*HEADLESS_FLAGS, f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _send(srv: LiveServer, i: int, group: int) -> None:
    """A completion whose prompt shares a long prefix with the others of its group."""
    body = {
        "prompt": f"Group {group} instructions, repeated so the tree can share them. " * 4
        + f"Question {i}?",
        "max_tokens": 4,
        "temperature": 0,
        "ignore_eos": True,
        "cache_salt": f"tenant-{group % 2}",
        "session_id": f"session-{group}",
    }
    r = httpx.post(
        srv.url + "/v1/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=120,
    )
    r.raise_for_status()


# One read of everything the test checks, inside the page's own JS turn: the page re-renders its
# tables on every poll, so element handles held across two WebDriver calls can go stale.
SNAPSHOT_JS = """
const all = (s) => [...document.querySelectorAll(s)];
const kpi = {};
all('[id^="kpi-"]').forEach((e) => { kpi[e.id.slice(4)] = e.innerText; });
const pool = {};
const p = document.querySelector('#pools .pool');
if (p) p.querySelectorAll('b[data-k]').forEach((b) => { pool[b.dataset.k] = b.innerText; });
const tree = document.getElementById('tree');
return {
  kpi, pool,
  cached: all('#recent tbody td[data-k=cached]').map((c) => c.innerText),
  recent_rows: all('#recent tbody tr').length,
  tree_nodes: all('#tree tbody tr td.node').length,
  tree_total: tree ? tree.getAttribute('data-total') : null,
  ns_rows: all('#namespaces tbody tr').length,
  polls: Number(document.body.getAttribute('data-polls') || 0),
};
"""


def _snap(driver: Any) -> dict[str, Any]:
    snap: dict[str, Any] = driver.execute_script(SNAPSHOT_JS)
    return snap


def _kpi(driver: Any, name: str) -> str:
    return str(_snap(driver)["kpi"].get(name, ""))


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def test_dashboard_in_chromium_matches_cache_stats(srv: LiveServer, browser: Any) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    waves, groups, per_wave = 4, 3, 2
    n_requests = waves * groups * per_wave
    wait = WebDriverWait(browser, 60, poll_frequency=0.2)

    def polls(d: Any) -> int:
        return int(_snap(d)["polls"])

    # Waves of requests (3 groups in parallel) while the page loads and polls between them.
    for wave in range(waves):
        workers = [
            threading.Thread(
                target=lambda k=k, base=wave * per_wave: [
                    _send(srv, base + i, k) for i in range(per_wave)
                ]
            )
            for k in range(groups)
        ]
        for w in workers:
            w.start()
        if wave == 0:
            browser.get(srv.url + f"/dashboard?api_key={KEY}")
        for w in workers:
            w.join()
        seen = polls(browser)
        wait.until(lambda d, seen=seen: polls(d) >= seen + 2)
    assert "api_key" not in browser.current_url  # the page strips the key from the address bar
    wait.until(lambda d: _kpi(d, "finished") == str(n_requests))
    wait.until(lambda d: _snap(d)["tree_nodes"] > 0)
    wait.until(lambda d: _snap(d)["recent_rows"] == n_requests)
    # A tree poll after the last request (the tree polls every 2 s): its total is the tree's.
    wait.until(lambda d: (s := _snap(d))["kpi"].get("tree-tokens") == s["tree_total"])

    stats = httpx.get(
        srv.url + "/cache/stats", headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    ).json()
    assert stats["memory_check"] == "ok" and stats["finished_requests"] == n_requests
    # The numbers the page shows, as a reader sees them.
    snap = _snap(browser)
    kpi = snap["kpi"]
    assert kpi["hit-rate"] == f"{100 * stats['token_hit_rate']:.1f}%"
    assert kpi["prompt-tokens"] == f"{stats['prompt_tokens_total']:,}"
    assert kpi["cached-tokens"] == f"{stats['cached_prompt_tokens_total']:,}"
    assert kpi["tree-tokens"] == f"{stats['cached_tokens_in_tree']:,}"
    assert kpi["running"] == "0" and kpi["waiting"] == "0"
    assert stats["cached_prompt_tokens_total"] > 0  # the groups really shared their prefixes
    census = {k: _num(v) for k, v in snap["pool"].items()}
    assert census["free"] == stats["free_slots"]
    assert census["cached"] == stats["cached_tokens_in_tree"]
    assert census["held"] == 0 and census["sum"] == stats["pool_slots"]
    # The recent-requests table sums to the server's counters.
    assert sum(_num(c) for c in snap["cached"]) == stats["cached_prompt_tokens_total"]
    # Two salted namespaces, hashed; no salt, session id or prompt text on the page.
    assert snap["ns_rows"] == 2
    page = browser.page_source
    for secret in ("tenant-0", "tenant-1", "session-0", "instructions", KEY):
        assert secret not in page

    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors  # no script error, no failed fetch

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    browser.set_window_size(1440, 1200)
    assert browser.save_screenshot(str(shot))
    print(f"\ndashboard screenshot: {shot}")
