"""Accuracy of the performance model on the bundled measurements, as `shardwise validate` reports it: the error
of every row, and per metric over every row of plain and of speculative decoding, beside the figure validate states
over every validated row (serve/accuracy.py stated_median), and how long the validation takes.

Run: python benchmarks/bench_accuracy.py   (prints the table; tests/measure/test_accuracy.py guards the medians;
not a test)
"""

from __future__ import annotations

import time

from shardwise.measure.reference import check_row, group_of_row, headline, load_rows
from shardwise.serve.accuracy import stated_median


def main() -> None:
    start = time.perf_counter()
    checked = [check_row(row) for row in load_rows()]
    elapsed = time.perf_counter() - start
    print(f"{'row':<11} {'group':<14} {'tok/s err':>9} {'TPOT err':>9} {'tables':>7}")
    for c in checked:
        errors = [c.error(m) for m in ("output_tok_s", "tpot_ms")]
        cells = ["—" if e is None else f"{e:+.0%}" for e in errors]
        share = "—" if c.coverage is None else f"{c.coverage['measured_share']:.0%}"
        print(f"{c.row.id:<11} {group_of_row(c):<14} {cells[0]:>9} {cells[1]:>9} {share:>7}")
    print()
    for s in headline(checked):
        stated = stated_median(s.group, s.metric)
        said = "" if stated is None else f" (over every validated row {stated:.0%})"
        print(f"{s.group} {s.metric}: median {s.median_ape:.1%}{said}, mean {s.mape:.1%} over {s.rows} rows")
    print(f"\n{len(checked)} rows predicted in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
