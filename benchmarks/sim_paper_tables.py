"""The simulator against the paper's serving tables (Tables 1 and 3: both models, every gmu), cell by cell (CPU).

    python -m benchmarks.sim_paper_tables --out benchmarks/results/sim_vs_paper_tables_b200_2026-12-01.txt

For each (model, tp, gmu) of ``treewy.sim.paper_tables.PAPER_TABLES``: the simulator's sweep on the paper's GPU
(B200), its five workloads, both modes, concurrency 1-256, the default acceptance (the paper's 35B chain) and the
newest measured kernel table; then TreeWY / store-all per cell beside the paper's, and the cells more than 10 % off
marked with *. SIMULATED against the paper's measured B200 figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path



def main(argv=None) -> int:
    from treewy.sim.paper_tables import PAPER_TABLES
    from treewy.sim.predict import sim_commit
    from treewy.sim.sweep import ratio_table, sweep

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    lines = [f"SIMULATED (B200, 'b200') vs the paper's measured B200 tables; {dt.date.today().isoformat()}, "
             f"simulator at commit {sim_commit()}; cells: simulated [paper], * = more than 10 % off", ""]
    misses = 0
    for (model, tp, gmu), paper in PAPER_TABLES.items():
        table = ratio_table(sweep(model, "b200", tp=tp, gmu=gmu))
        concs = table["concurrency"].to_list()
        lines += [f"{model}, TP{tp}, gmu {gmu}", "", f"| {'concurrency':24s}|" + "".join(f"{c:>16d} |" for c in concs)]
        for m, ref in paper.items():
            cells = ""
            for v, p in zip(table[m].to_list(), ref):
                off = abs(v / p - 1) > 0.10
                misses += off
                cells += f"{v:7.2f} [{p:.2f}]{'*' if off else ' '} |"
            lines.append(f"| {m:24s}|" + cells)
        lines.append("")
    lines.append(f"{misses} of {5 * 6 * len(PAPER_TABLES)} cells more than 10 % off")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
