"""Peak memory of building a frame with categorical columns from record batches (issue #30).

A Parquet file of rows x 40 columns (the last `--categoricals` dictionary-encoded text, per-batch
dictionaries; the rest float32) is read batch by batch into pandas, each way in a child process of its
own (peak resident memory, ru_maxrss, is then its own), in interleaved rounds:

- `fedforest`: `frame_of_batches` of this checkout (categorical codes in growing maps);
- `before`: `frame_of_batches` of `--before` (a git revision: categoricals gathered and converted at the end);
  with `--plain-text` the text columns are read as plain strings (as PostgreSQL sends text), not
  dictionaries (`--before 69faf2e`: text gathered and converted at the end);
- `arrow`: the reference, `reader.read_all().to_pandas()`.

    .venv/bin/python -m benchmarks.bench_batch_frame --rows 2000000 [--repeat 3] [--before 0cb3bb0]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import child_json, machine_line

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
import pyarrow as pa, pyarrow.parquet as pq
from fedcore.data.batch_frame import frame_of_batches
from fedcore.data.sql import owned_batches

file = pq.ParquetFile({path!r}, read_dictionary={dictionary!r})
reader = pa.RecordBatchReader.from_batches(file.schema_arrow, file.iter_batches(batch_size=65536))
start = time.process_time()
frame = reader.read_all().to_pandas() if {how!r} == "arrow" else frame_of_batches(reader, owned_batches)
cpu = time.process_time() - start
print(json.dumps({{"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "cpu_s": cpu,
                  "frame_mib": frame.memory_usage(deep=False).sum() / 2**20, "rows": len(frame)}}))
"""


def make_file(path: Path, rows: int, columns: int, categoricals: int) -> list[str]:
    """Write the benchmark's Parquet file; the categorical columns' names."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    names = [f"c{i:02d}" for i in range(columns)]
    text = names[columns - categoricals:]
    words = np.array([f"value-{i:04d}" for i in range(500)], dtype=object)
    table = pa.table({n: (pa.array(words[rng.integers(0, 500, rows)]) if n in text
                          else pa.array(rng.standard_normal(rows, dtype=np.float32))) for n in names})
    pq.write_table(table, path, row_group_size=262_144)
    return text


def run(root: str, path: Path, dictionary: list[str], how: str) -> dict:
    """One read in a child process (`dictionary`: columns read as Arrow dictionaries): its JSON summary."""
    code = CHILD.format(root=root, path=str(path), dictionary=dictionary, how=how)
    return child_json([sys.executable, "-c", code])


def main() -> None:
    """Interleaved rounds of the three reads; medians and ratios against the Arrow reference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--columns", type=int, default=40)
    parser.add_argument("--categoricals", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", default="0cb3bb0", help="git revision measured as `before`")
    parser.add_argument("--plain-text", action="store_true",
                        help="read the text columns as plain strings (as PostgreSQL sends text)")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory() as scratch:
        old = Path(scratch) / "before"
        old.mkdir()
        archive = subprocess.run(["git", "-C", here, "archive", args.before, "fedcore"],
                                 stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        path = Path(scratch) / "frame.parquet"
        text = make_file(path, args.rows, args.columns, args.categoricals)
        roots = {"fedforest": here, "before": str(old), "arrow": here}
        runs: dict[str, list[dict]] = {how: [] for how in roots}
        for _ in range(args.repeat):
            for how, root in roots.items():
                runs[how].append(run(root, path, [] if args.plain_text else text, how))
    print(machine_line())
    arrow = statistics.median(r["peak_mib"] for r in runs["arrow"])
    for how, results in runs.items():
        peak = statistics.median(r["peak_mib"] for r in results)
        cpu = statistics.median(r["cpu_s"] for r in results)
        print(f"{how:10s} peak {peak:7.0f} MiB ({peak / arrow:.2f} x arrow)  cpu {cpu:6.2f} s  "
              f"frame {results[0]['frame_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
