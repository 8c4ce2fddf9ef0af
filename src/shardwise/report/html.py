"""The theory as one self-contained HTML page: the narrative, the tables and three charts (throughput against
concurrency per layout, the Pareto frontier, each top layout's token time by part), drawn by matplotlib as inline
SVG. The page loads nothing from the network. The charts and the ranking list distinct layouts, each at its best
options, as the terminal report does; each chart is drawn at a fixed size with its legend outside the plot, and the
page scales it to the width of its column.
"""

from __future__ import annotations

import html
import io
import re

import matplotlib

matplotlib.use("Agg")  # no display: draw to memory
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import LogLocator, StrMethodFormatter  # noqa: E402

from shardwise.decide.search import Candidate  # noqa: E402
from shardwise.decide.theory import Theory  # noqa: E402
from shardwise.engines.flags import command_text  # noqa: E402
from shardwise.report.theory import (  # noqa: E402
    PART_NAMES,
    distinct_layouts,
    family_lines,
    headline,
    narrative,
    ranking_rows,
    what_if_rows,
    winner_rows,
)

CHARTED = 6  # layouts drawn on the throughput chart and the breakdown bars
WIDTH_IN = 10.0  # inches: each chart's drawn width (720 pt); the page scales it to its column
MARKERS = "osD^vP"
PARTS_COLOURS = dict(zip(PART_NAMES, plt.get_cmap("tab10").colors, strict=False))
NUMBER = re.compile(r"[\d,.×%+—-]*")  # a cell of figures: right-aligned
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1180px; margin: 2em auto; padding: 0 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; font-size: 13px; max-width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
th.num, td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
code, pre { background: #f5f5f5; font-size: 12.5px; } pre { padding: .6em; overflow-x: auto; }
.note, figcaption { font-size: 13px; color: #555; }
figure { margin: 1.2em 0 2em; } figure svg { display: block; width: 100%; height: auto; }
"""


def _label(n: int, c: Candidate) -> str:
    """A setup's name on the charts: its number in the ranking and its layout, over its options."""
    return f"#{n} {c.engine} {c.layout.describe()}" + (f"\n{c.variant.label}" if c.variant.label else "")


def _figure(height: float) -> tuple[Figure, Axes]:
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), layout="constrained")
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=9)
    return fig, ax


def _legend(fig: Figure, ncols: int) -> None:
    """The legend below the plot, clear of the data (constrained layout makes room for it)."""
    fig.legend(loc="outside lower center", ncols=ncols, fontsize=9, frameon=False)


def _labelled(fig: Figure, ax: Axes, x: str, y: str) -> Figure:
    """A throughput chart's axes labelled, its y ticks as whole tokens with thousands marked, its legend below."""
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    _legend(fig, ncols=2)
    return fig


def _throughput_chart(t: Theory) -> Figure:
    fig, ax = _figure(5.2)
    for n, s in enumerate(distinct_layouts(t)[:CHARTED], start=1):  # the best drawn over the others
        c = s.candidate
        ax.plot(
            [p.concurrency for p in c.predictions],
            [p.output_tok_s for p in c.predictions],
            label=_label(n, c),
            marker=MARKERS[(n - 1) % len(MARKERS)],
            markersize=4,
            linewidth=2.2 if n == 1 else 1.3,
            color=f"C{n - 1}",
            zorder=3 + CHARTED - n,
        )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=24))  # every power of two
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))  # 1, 2, 4, ... not 2^0, 2^1, 2^2
    return _labelled(fig, ax, "concurrent clients", "output tokens/s")


def _pareto_chart(t: Theory) -> Figure:
    fig, ax = _figure(4.4)
    xs = [p.per_user_tok_s for c in t.result.candidates for p in c.predictions]
    ys = [p.output_tok_s / c.gpus for c in t.result.candidates for p in c.predictions]
    ax.scatter(xs, ys, s=6, color="#bbb", label="every setup × concurrency")
    front = t.frontier
    ax.plot(
        [q.per_user_tok_s for q in front],
        [q.tok_s_per_gpu for q in front],
        color="#c0392b",
        marker="o",
        markersize=4,
        label="Pareto frontier",
    )
    return _labelled(fig, ax, "output tokens/s per user", "output tokens/s per GPU")


def _breakdown_chart(t: Theory) -> Figure:
    win = t.ranking.best
    assert win is not None
    shown = distinct_layouts(t)[:CHARTED]
    points = [s.candidate.at(win.at.concurrency) for s in shown]
    parts = [k for k in PART_NAMES if any(p.breakdown_s.get(k, 0) > 0 for p in points)]
    fig, ax = _figure(0.62 * len(shown) + 1.5)
    names = [_label(n, s.candidate) for n, s in enumerate(shown, start=1)]
    left = [0.0] * len(shown)
    for part in parts:
        widths = [p.breakdown_s.get(part, 0.0) * 1e3 for p in points]
        ax.barh(names, widths, left=left, height=0.7, label=PART_NAMES[part], color=PARTS_COLOURS[part])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    for y, total in enumerate(left):
        ax.annotate(f"{total:,.1f} ms", (total, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.margins(x=0.09)  # room for the totals inside the plot
    ax.invert_yaxis()
    ax.grid(axis="y", visible=False)
    ax.tick_params(axis="y", labelsize=8.5)
    ax.set_xlabel(f"ms per output token at {win.at.concurrency} clients")
    _legend(fig, ncols=len(parts))
    return fig


def charts(t: Theory) -> list[tuple[str, str, Figure]]:
    """The page's charts: (name, caption, figure). Each plot area and legend carries an id ('NAME-plot',
    'NAME-legend') by which a browser can find them."""
    out = [
        (
            "throughput",
            "Output throughput against concurrency, the best layouts (numbered as in the ranking)",
            _throughput_chart(t),
        ),
        ("pareto", "Throughput per GPU against speed per user; the frontier in red", _pareto_chart(t)),
        ("breakdown", "Where each output token's time goes, at the winner's concurrency", _breakdown_chart(t)),
    ]
    for name, _, fig in out:
        fig.axes[0].patch.set_gid(f"{name}-plot")
        fig.legends[0].set_gid(f"{name}-legend")
    return out


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")  # at its own size: the constrained layout keeps everything inside it
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _table(header: list[str], rows: list[list[str]]) -> str:
    numeric = [all(NUMBER.fullmatch(row[i]) for row in rows) for i in range(len(header))]

    def cell(tag: str, i: int, text: str) -> str:
        return f"<{tag}{' class=num' if numeric[i] else ''}>{html.escape(text)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, text) for i, text in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def theory_html(t: Theory, *, top: int) -> str:
    out = [f"<h1>{html.escape(headline(t))}</h1>", "<ul>"]
    out += [f"<li>{html.escape(line)}</li>" for line in narrative(t)]
    out.append("</ul>")
    if t.ranking.scores:
        shown = distinct_layouts(t)
        out.append("<h2>Ranking</h2>")
        out.append(
            f'<p class="note">The top {min(top, len(shown))} of {len(shown)} layouts that start, each at its '
            f"best options ({len(t.ranking.scores)} setups).</p>"
        )
        out.append(_table(*ranking_rows(shown, top)))
        for name, caption, fig in charts(t):
            out.append(
                f'<figure class="chart" id="chart-{name}">{_svg(fig)}<figcaption>{html.escape(caption)}'
                "</figcaption></figure>"
            )
        out.append("<h2>The best setup at each concurrency</h2>")
        out.append(_table(*winner_rows(t)))
    families = family_lines(t)
    if families:
        out.append("<h2>Why the others lose</h2><ul>")
        out += [f"<li>{html.escape(line)}</li>" for line in families]
        out.append("</ul>")
    if t.what_ifs:
        out.append("<h2>What would change it</h2>")
        out.append(_table(*what_if_rows(t)))
    tried = [e for e in t.result.excluded if e.hand_tried]
    out.append(f"<h2>Excluded ({len(t.result.excluded)} setups; those tried by hand)</h2>")
    out.append(
        _table(["verdict", "command", "why"], [[e.verdict, command_text(list(e.launch)), e.reason] for e in tried])
    )
    if t.verify:
        out.append("<h2>Start it and check it</h2><pre>")
        out += [html.escape(line) for line in t.verify_lines()]
        out.append("</pre>")
    body = "\n".join(out)
    title = html.escape(headline(t))
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n"
    )
