"""The theory as one self-contained HTML page: the narrative, the tables and three charts (throughput against
concurrency per setup, the Pareto frontier, each top setup's token time by part), drawn by matplotlib as inline
SVG. The page loads nothing from the network.
"""

from __future__ import annotations

import html
import io

import matplotlib

matplotlib.use("Agg")  # no display: draw to memory
import matplotlib.pyplot as plt  # noqa: E402

from shardwise.decide.theory import Theory  # noqa: E402
from shardwise.engines.flags import command_text  # noqa: E402
from shardwise.report.theory import PART_NAMES, family_lines, headline, narrative  # noqa: E402

CHARTED = 6  # setups drawn on the throughput chart and the breakdown bars
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:nth-child(2), td:nth-child(2) { text-align: left; }
code, pre { background: #f5f5f5; font-size: 12.5px; } pre { padding: .6em; overflow-x: auto; }
figure { margin: 1em 0; } figcaption { font-size: 13px; color: #555; }
"""


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _throughput_chart(t: Theory) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for s in t.ranking.scores[:CHARTED]:
        c = s.candidate
        ax.plot([p.concurrency for p in c.predictions], [p.output_tok_s for p in c.predictions], marker="o",
                markersize=3, label=c.name)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def _pareto_chart(t: Theory) -> str:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = [p.per_user_tok_s for c in t.result.candidates for p in c.predictions]
    ys = [p.output_tok_s / c.gpus for c in t.result.candidates for p in c.predictions]
    ax.scatter(xs, ys, s=6, color="#bbb", label="every setup × concurrency")
    front = t.frontier
    ax.plot([q.per_user_tok_s for q in front], [q.tok_s_per_gpu for q in front], color="#c0392b", marker="o",
            markersize=4, label="Pareto frontier")  # fmt: skip
    ax.set_xlabel("output tokens/s per user")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(fig)


def _breakdown_chart(t: Theory) -> str:
    win = t.ranking.best
    assert win is not None
    setups = [s.candidate for s in t.ranking.scores[:CHARTED]]
    points = [c.at(win.at.concurrency) for c in setups]
    parts = [k for k in PART_NAMES if any(p.breakdown_s.get(k, 0) > 0 for p in points)]
    fig, ax = plt.subplots(figsize=(8, 0.55 * len(setups) + 1.2))
    left = [0.0] * len(setups)
    for part in parts:
        widths = [p.breakdown_s.get(part, 0.0) * 1e3 for p in points]
        ax.barh([c.name for c in setups], widths, left=left, label=PART_NAMES[part])
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel(f"ms per output token at {win.at.concurrency} clients")
    ax.legend(fontsize=8, ncols=min(4, len(parts)))
    return _svg(fig)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def theory_html(t: Theory, *, top: int) -> str:
    out = [f"<h1>{html.escape(headline(t))}</h1>", "<ul>"]
    out += [f"<li>{html.escape(line)}</li>" for line in narrative(t)]
    out.append("</ul>")
    if t.ranking.scores:
        out.append("<h2>Ranking</h2>")
        out.append(_table(
            ["#", "setup", "tok/s", "at C", "tok/s per GPU", "tok/s per user", "bound"],
            [[str(n), s.candidate.name, f"{s.at.output_tok_s:,.0f}", str(s.at.concurrency),
              f"{s.at.output_tok_s / s.candidate.gpus:,.0f}", f"{s.at.per_user_tok_s:,.1f}", s.at.bound]
             for n, s in enumerate(t.ranking.scores[:top], start=1)],
        ))  # fmt: skip
        charts = [
            ("throughput", _throughput_chart(t), "Output throughput against concurrency, best setups"),
            ("pareto", _pareto_chart(t), "Throughput per GPU against speed per user; the frontier in red"),
            ("breakdown", _breakdown_chart(t), "Where each output token's time goes, at the winner's concurrency"),
        ]
        for name, svg, caption in charts:
            out.append(f'<figure class="chart" id="chart-{name}">{svg}<figcaption>{html.escape(caption)}'
                       "</figcaption></figure>")  # fmt: skip
        out.append("<h2>The best setup at each concurrency</h2>")
        out.append(_table(["C", "setup", "tok/s", "tok/s per user"], [
            [str(w.concurrency), w.candidate.name, f"{w.prediction.output_tok_s:,.0f}",
             f"{w.prediction.per_user_tok_s:,.1f}"] for w in t.winners]))  # fmt: skip
    families = family_lines(t)
    if families:
        out.append("<h2>Why the others lose</h2><ul>")
        out += [f"<li>{html.escape(line)}</li>" for line in families]
        out.append("</ul>")
    if t.what_ifs:
        out.append("<h2>What would change it</h2>")
        out.append(_table(["what if", "tok/s", "gain", "how"], [
            [w.label, "—" if w.output_tok_s is None else f"{w.output_tok_s:,.0f}",
             "—" if w.gain is None else f"{w.gain:.2f}×", (w.setup + ": " if w.setup else "") + w.note]
            for w in t.what_ifs]))  # fmt: skip
    tried = [e for e in t.result.excluded if e.hand_tried]
    out.append(f"<h2>Excluded ({len(t.result.excluded)} setups; those tried by hand)</h2>")
    out.append(_table(["verdict", "command", "why"], [[e.verdict, command_text(list(e.launch)), e.reason]
                                                      for e in tried]))  # fmt: skip
    if t.verify:
        out.append("<h2>Start it and check it</h2><pre>")
        out += [html.escape(line) for line in t.verify_lines()]
        out.append("</pre>")
    body = "\n".join(out)
    title = html.escape(headline(t))
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{STYLE}</style></head><body>\n{body}\n</body></html>\n")  # fmt: skip
