"""Peak memory of a Dask worker reading one Parquet block into pandas (issue #30).

A Parquet file of `--rows` x `--columns` (float64; the last `--text` columns text, 500 distinct values),
one row group: one block of the default 1,048,576 rows. Each read runs in a child process of its own
(its peak resident memory, ru_maxrss, is then its own), the two in turn per round (A B A B ...):

- `fedforest`: `fedcore.compute.blocks.read_block` of this checkout (batch by batch, pages streamed);
- `before`: the block's row group read whole, sliced, `to_pandas()` (what `read_block` did before).

The peak is reported above the child's resident memory after its imports, with the CPU seconds of the read.

    .venv/bin/python -m benchmarks.bench_block_read [--rows 1048576] [--columns 40] [--text 0] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import child_json, interleaved, machine_line

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import pyarrow.parquet as pq
from fedcore.compute.blocks import parquet_blocks, read_block

block = parquet_blocks({path!r}, {rows})[0]
columns = pq.ParquetFile({path!r}).schema_arrow.names
base = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
start = time.process_time()
if {how!r} == "before":
    frame = pq.ParquetFile(block.path).read_row_group(block.row_group, columns=columns).slice(
        block.group_start, block.n_rows).to_pandas()
else:
    frame = read_block(block, columns)
cpu = time.process_time() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({{"above_mib": peak - base, "peak_mib": peak, "cpu_s": cpu,
                  "frame_mib": frame.memory_usage(deep=False).sum() / 2**20}}))
"""


def make_file(path: Path, rows: int, columns: int, text: int) -> None:
    """Write the benchmark's Parquet file (one row group)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    words = np.array([f"value-{i:04d}" for i in range(500)], dtype=object)
    table = pa.table({f"f{j}": (pa.array(words[rng.integers(0, 500, rows)]) if j >= columns - text
                                else pa.array(rng.standard_normal(rows))) for j in range(columns)})
    pq.write_table(table, path, row_group_size=rows)


def main() -> None:
    """Interleaved rounds of the two reads; medians and the ratio of the peaks above the imports."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1 << 20)
    parser.add_argument("--columns", type=int, default=40)
    parser.add_argument("--text", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "block.parquet"
        make_file(path, args.rows, args.columns, args.text)

        def read(how: str) -> dict:
            code = CHILD.format(root=root, path=str(path), rows=args.rows, how=how)
            return child_json([sys.executable, "-c", code])

        pairs = interleaved(lambda: read("fedforest"), lambda: read("before"), args.repeat)
    print(machine_line())
    for name, runs in (("fedforest", [a for a, _ in pairs]), ("before", [b for _, b in pairs])):
        print(f"{name:10s} peak above imports {statistics.median(r['above_mib'] for r in runs):6.0f} MiB "
              f"(peak {statistics.median(r['peak_mib'] for r in runs):6.0f})  "
              f"cpu {statistics.median(r['cpu_s'] for r in runs):5.2f} s  "
              f"frame {runs[0]['frame_mib']:.0f} MiB")
    ratio = statistics.median(a["above_mib"] / b["above_mib"] for a, b in pairs)
    print(f"fedforest / before, peak above imports (median of pairs): {ratio:.2f}")


if __name__ == "__main__":
    main()
