"""Profile a vertical agent on Dask stage by stage, at several row counts (issue #29).

    nice -n 19 .venv/bin/python -m benchmarks.profile_vertical_agent --rows 500000 2000000

One vertical session (hash alignment, or `--alignment psi`, holdout 0.2) per row count, every party's
agent its own process over Flight on its own LocalCluster (`benchmarks/vertical_parties.py`), each
agent's answers profiled by `benchmarks.agent_profile.StageProfile`: per stage, peak RSS, RSS after,
tracemalloc's peak, seconds.
The last table is each agent's peak and its bytes a row between the sizes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchmarks.agent_profile import merged
from benchmarks.harness import add_forest_arguments
from benchmarks.markdown import markdown_table
from benchmarks.vertical_parties import run_on_dask, write_parties


def main() -> None:
    """Run the session at each `--rows`, print the stages of every agent and the per-row growth."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forest_arguments(parser, rows=[500_000, 2_000_000], features=8, trees=1, depth=4, workers=2,
                         block_rows=250_000)
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--limit", default="1GiB")
    parser.add_argument("--alignment", choices=["hash", "psi"], default="hash")
    parser.add_argument("--tmp", default=None)
    args = parser.parse_args()
    args.profile = True
    peaks = {}
    for rows in args.rows:
        with tempfile.TemporaryDirectory(dir=args.tmp) as name:
            args.data = Path(name)
            write_parties(args.data, rows, args.features, args.parties, args.block_rows)
            result = run_on_dask(args)
        peaks[rows] = result["agents_peak_mib"]
        print(f"\n### {rows:,} rows: align {result['align_seconds']:.1f} s, train {result['seconds']:.1f} s, "
              f"digest {result['digest']}\n")
        for party, stages in result["stages"].items():
            print(f"{party}:\n")
            print(markdown_table([{"stage": s["stage"], "calls": s.get("calls", 1),
                                   "peak RSS (MiB)": f"{s['peak_rss']:.0f}", "RSS after": f"{s['rss']:.0f}",
                                   "traced peak (MiB)": f"{s['traced_peak']:.1f}",
                                   "traced after": f"{s['traced']:.1f}",
                                   "Arrow pool after": f"{s['arrow']:.1f}",
                                   "seconds": f"{s['seconds']:.1f}"}
                                  for s in merged(stages)]))
            print()
    sizes = sorted(peaks)
    print(markdown_table([{"rows": f"{n:,}", "agents' peak RSS (MiB)":
                           ", ".join(f"{m:.0f}" for m in peaks[n])}
                          for n in sizes]))
    if len(sizes) > 1:
        a, b = sizes[0], sizes[-1]
        per_row = [(pb - pa) * 2**20 / (b - a) for pa, pb in zip(peaks[a], peaks[b], strict=True)]
        print("\nbytes a row between the sizes, per agent: " + ", ".join(f"{x:.1f}" for x in per_row))


if __name__ == "__main__":
    main()
