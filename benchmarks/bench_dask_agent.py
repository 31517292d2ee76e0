"""A served horizontal agent's memory with its party on Dask, phase by phase (issue #29).

Institution north's config puts its party on a LocalCluster of `--workers` worker processes (`compute:
{dask: {local: ...}}`), and its table is a Parquet dataset of `--rows` x `--features` that the workers
read. The master and two 1,000-row institutions (south and east, from the dataset's sample) share the
process, as `HorizontalInstitutionAgent`s over the in-process transport: one session of FET (privacy
none), `--trees` trees of depth `--depth`. Prints the process's RSS and its own peak (VmHWM, not
getrusage's, which starts at the parent's peak) after each phase: imports; load (north's files opened,
profiled and validated against the contract on the workers); setup (holdout masks, blocks read);
training; evaluation. The dataset is written by another process, so its memory is not counted.

    .venv/bin/python -m benchmarks.bench_dask_agent [--rows 2000000] [--features 40] [--trees 3]
        [--depth 8] [--workers 2] [--block-rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_dask_party import _vm_hwm_mib, sample_path, write_dataset
from benchmarks.harness import add_forest_arguments, child_json

NAMES = ("north", "south", "east")


def _rss_mib() -> float:
    """This process's resident memory now (Linux VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _config(root: Path, args: argparse.Namespace):
    """North on Dask, south and east in process; one contract whose ranges hold every row's values."""
    import pandas as pd

    from fedcore.config import parse_config
    from fedcore.contracts.model import dump_contract, infer_contract
    from fedcore.models.signing import generate_signing_key, public_key_path

    sample = pd.read_parquet(sample_path(root / "north"))
    for name, rows in (("south", sample.iloc[:500]), ("east", sample.iloc[500:])):
        rows.assign(pid=rows["pid"] + (10**12 if name == "south" else 2 * 10**12)).to_parquet(
            root / f"{name}.parquet", index=False)
    wide = sample.head(2).copy()  # the sample's ranges are narrower than the whole table's: widen them
    for column in (c for c in sample.columns if c.startswith("f")):
        wide[column] = [-100.0, 100.0]
    contract = infer_contract(pd.concat([sample, wide]), "bench", id_column="pid", label="y")
    (root / "contract.yaml").write_text(dump_contract(contract))
    generate_signing_key(root / "master.key")
    common = {"id_column": "pid", "label": "y", "contract": str(root / "contract.yaml")}
    local = {"dask": {"local": {"workers": args.workers}, "block_rows": args.block_rows}}
    raw = {"federation": "bench", "setting": "horizontal", "consortium_key": {"env": "UNUSED"},
           "master": {"public_key": str(public_key_path(root / "master.key"))}, "training": {"holdout": 0.25},
           "institutions": [
               {"name": "north", "data": str(root / "north" / "*.parquet"),
                "registry": str(root / "reg-north"), "compute": local, **common},
               *({"name": name, "data": str(root / f"{name}.parquet"), "registry": str(root / f"reg-{name}"),
                  **common} for name in ("south", "east"))]}
    return parse_config(raw, root / "federation.yaml")


def run_agent(args: argparse.Namespace) -> dict:
    """One session with north's party on Dask; the process's RSS after each phase."""
    marks = [("started", _rss_mib(), _vm_hwm_mib())]

    def mark(phase: str) -> None:
        marks.append((phase, _rss_mib(), _vm_hwm_mib()))

    from fedcore.agents.data import institution_from_config
    from fedcore.compute.cluster import close_shared_clusters
    from fedcore.horizontal.agent import HorizontalInstitutionAgent
    from fedcore.horizontal.params import ExtraTreesParams
    from fedcore.horizontal.session import HorizontalSession
    from fedcore.privacy.keyauth import ephemeral_identities
    from fedcore.protocol.messages import Message
    from fedcore.transport.inprocess import InProcessTransport

    config = _config(Path(args.data), args)
    identities = ephemeral_identities(NAMES)
    agents = {name: HorizontalInstitutionAgent(lambda name=name: institution_from_config(config, name),
                                               name=name, identity=identities[name]) for name in NAMES}
    mark("imports")
    transport = InProcessTransport({name: agent.handle for name, agent in agents.items()})
    transport.exchange({name: Message("validation_report") for name in agents})
    assert agents["north"].data.valid, "north's table passes its contract"
    mark("load: open, profile, validate")
    session = HorizontalSession(transport, ExtraTreesParams(n_estimators=args.trees, max_depth=args.depth,
                                                            random_state=4), holdout_fraction=0.25)
    session.agree_schema()
    mark("setup: holdout masks, blocks read")
    session.train()
    mark("trained")
    metrics = session.evaluate()
    mark("evaluated")
    close_shared_clusters()
    return {"marks": marks, "north_rows": agents["north"].data.n_rows, "accuracy": metrics["accuracy"]}


def main() -> None:
    """Write the dataset (its own process), run the agents (another), print RSS per phase."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_forest_arguments(parser, rows=2_000_000, features=40, trees=3, depth=8, workers=2,
                         block_rows=1_000_000)
    parser.add_argument("--mode", choices=("write", "agent"), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode == "write":
        write_dataset(Path(args.data) / "north", args.rows, args.features, args.block_rows, ids=True)
        return
    if args.mode == "agent":
        print(json.dumps(run_agent(args)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "benchmarks.bench_dask_agent", *sys.argv[1:], "--data", tmp,
                   "--mode"]
        subprocess.run([*command, "write"], check=True, capture_output=True)  # the dataset: its own process
        result = child_json([*command, "agent"], quiet=True)
    print(f"{result['north_rows']:,} x {args.features} at north on {args.workers} Dask workers (blocks of "
          f"{args.block_rows:,} rows), {args.trees} trees of depth {args.depth}; accuracy "
          f"{result['accuracy']:.4f}\n")
    print("| after | RSS (MiB) | peak so far (MiB) |\n|---|---|---|")
    for phase, rss, peak in result["marks"]:
        print(f"| {phase} | {rss:,.0f} | {peak:,.0f} |")


if __name__ == "__main__":
    main()
