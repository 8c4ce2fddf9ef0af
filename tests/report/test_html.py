"""The HTML report renders in a real headless browser, with its three charts, and needs no network; it fits the
window at the widths people read it at, each chart's legend is clear of its plot, and the charts draw distinct
layouts (as the terminal report lists them), not one layout under several options."""

import json
import os
import re
import shutil
import subprocess

import matplotlib.pyplot as plt
import pytest

from shardwise import theorise
from shardwise.report.files import write_text
from shardwise.report.html import CHARTED, charts, theory_html
from shardwise.report.theory import distinct_layouts

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-component-update", "--disable-sync"]  # fmt: skip
# Appended to a copy of the page: what the browser laid out, written into the page for --dump-dom to carry out.
MEASURE = """<script>
const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
const page = document.documentElement;
const measured = {inner: innerWidth, scroll: page.scrollWidth, client: page.clientWidth, charts: [...document
  .querySelectorAll("figure.chart")].map(f => ({id: f.id, svg: box(f.querySelector("svg")),
  plot: box(f.querySelector("[id$='-plot']")), legend: box(f.querySelector("[id$='-legend']"))}))};
const out = document.body.appendChild(document.createElement("pre"));
out.id = "measured"; out.textContent = JSON.stringify(measured);
</script>"""


def _browser() -> str:
    found = next((b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None:
        if os.environ.get("SHARDWISE_REQUIRE_BROWSER"):
            pytest.fail("no headless Chromium: install it (Debian: apt-get install chromium)")
        pytest.skip("no Chromium here (CI installs it and sets SHARDWISE_REQUIRE_BROWSER)")
    return found


def _dom(path, profile, *args: str) -> str:
    run = subprocess.run([_browser(), *FLAGS, f"--user-data-dir={profile}", *args, "--dump-dom", path.as_uri()],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    theory = theorise()  # the default case, as `shardwise theorise --html` draws it
    path = tmp_path_factory.mktemp("report") / "theory.html"
    write_text(path, theory_html(theory, top=5))
    return path, theory


def test_the_page_is_self_contained(page):
    text = page[0].read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # nothing to fetch
    assert text.count("<svg") == 3


def test_the_page_renders_in_headless_chromium_with_its_charts(page, tmp_path):
    path, theory = page
    html = _dom(path, tmp_path / "profile")
    for chart in ("throughput", "pareto", "breakdown"):
        figure = re.search(rf'<figure class="chart" id="chart-{chart}">(.*?)</figure>', html, re.S)
        assert figure is not None, chart
        assert "<svg" in figure.group(1) and ("<path" in figure.group(1) or "<use" in figure.group(1))
    assert theory.best.name in html
    shot = tmp_path / "page.png"
    subprocess.run([_browser(), *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,2000",
                    f"--screenshot={shot}", path.as_uri()], capture_output=True, timeout=120, check=True)  # fmt: skip
    assert shot.stat().st_size > 50_000  # a drawn page, not a blank one


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_page_fits_the_window_and_each_legend_is_clear_of_its_plot(page, tmp_path, width):
    path = tmp_path / "measured.html"
    path.write_text(page[0].read_text().replace("</body>", MEASURE + "</body>"))
    dom = _dom(path, tmp_path / "profile", f"--window-size={width},1000")
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom)
    assert found is not None, "the measuring script did not run"
    m = json.loads(found.group(1))
    assert m["inner"] == width  # laid out at the width asked for
    assert m["scroll"] <= m["client"], f"the page is {m['scroll']} px wide in a {m['client']} px window"
    assert [c["id"] for c in m["charts"]] == ["chart-throughput", "chart-pareto", "chart-breakdown"]
    for chart in m["charts"]:
        (left, top, right, bottom), plot, legend = chart["svg"], chart["plot"], chart["legend"]
        assert 0 <= left and right <= m["client"], chart
        assert plot[2] > plot[0] and legend[2] > legend[0], chart  # both found, and drawn
        assert left <= legend[0] and legend[2] <= right and top <= legend[1] and legend[3] <= bottom, chart
        apart = legend[0] >= plot[2] or legend[2] <= plot[0] or legend[1] >= plot[3] or legend[3] <= plot[1]
        assert apart, f"{chart['id']}: the legend {legend} lies on the plot {plot}"


def test_the_charts_draw_distinct_layouts_as_the_terminal_report_lists_them(page):
    theory = page[1]
    drawn = {name: fig for name, _, fig in charts(theory)}
    try:
        for fig in drawn.values():
            fig.canvas.draw()  # the breakdown's bar names are its tick labels, known once drawn
        lines = [line.get_label() for line in drawn["throughput"].axes[0].get_lines()]
        bars = [label.get_text() for label in drawn["breakdown"].axes[0].get_yticklabels()]
    finally:
        for fig in drawn.values():
            plt.close(fig)
    shown = distinct_layouts(theory)
    assert len(shown) > CHARTED
    top = {(s.candidate.engine, s.candidate.layout.structure()) for s in theory.ranking.scores[:CHARTED]}
    assert len(top) < CHARTED  # the best setups include one layout under several options: the test can fail
    want = [f"{s.candidate.engine} {s.candidate.layout.describe()}" for s in shown[:CHARTED]]
    for labels in (lines, bars):
        layouts = [label.splitlines()[0].split(" ", 1)[1] for label in labels]  # "#n engine layout\noptions"
        assert len(set(layouts)) == len(layouts), layouts
        assert layouts == want
