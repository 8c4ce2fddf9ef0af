"""The HTML report renders in a real headless browser, with its three charts, and needs no network."""

import os
import re
import shutil
import subprocess

import pytest

from shardwise.decide.theory import theorise
from shardwise.report.files import write_text
from shardwise.report.html import theory_html
from shardwise.spec.catalog import load_model
from shardwise.spec.cluster import load_cluster

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync"]  # fmt: skip


def _browser() -> str:
    found = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None:
        if os.environ.get("SHARDWISE_REQUIRE_BROWSER"):
            pytest.fail("no headless Chromium: install it (Debian: apt-get install chromium)")
        pytest.skip("no Chromium here (CI installs it and sets SHARDWISE_REQUIRE_BROWSER)")
    return found


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    model, cluster = load_model("kimi-k2.6"), load_cluster("8xrtx-pro-6000")
    theory = theorise(model, cluster, model_ref="kimi-k2.6", engines=["sglang"], isl=1024, osl=1024,
                      concurrency=[1, 8, 64, 512])  # fmt: skip
    path = tmp_path_factory.mktemp("report") / "theory.html"
    write_text(path, theory_html(theory, top=5))
    return path, theory


def test_the_page_is_self_contained(page):
    text = page[0].read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing to fetch
    assert text.count("<svg") == 3


def test_the_page_renders_in_headless_chromium_with_its_charts(page, tmp_path):
    path, theory = page
    dom = subprocess.run(
        [_browser(), *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for chart in ("throughput", "pareto", "breakdown"):
        figure = re.search(rf'<figure class="chart" id="chart-{chart}">(.*?)</figure>', html, re.S)
        assert figure is not None, chart
        assert "<svg" in figure.group(1) and ("<path" in figure.group(1) or "<use" in figure.group(1))
    assert theory.best.name in html
    shot = tmp_path / "page.png"
    subprocess.run([_browser(), *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,2000",
                    f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one
