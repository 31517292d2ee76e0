"""Vertical Federated Forest with encrypted labels against plain mode, in the same run.

Paillier and Okamoto-Uchiyama: time per tree, one-off setup (key generation, label encryption), bytes and peak
memory, for 2 parties on n x 30 binary classification tables at depth 6 and 10 (issue #6's grid). Every mode
grows the same trees (the benchmark checks it), so the ratio is the price of hiding the labels.

Growth time per tree excludes the setup; `amortized x` spreads the setup over `--amortize` trees (a
production forest), the way a scheduled retrain pays it. The setup table times what a training pays
once, from nothing: a fresh key, its fixed-base tables, and one encryption per row.

    .venv/bin/python -m benchmarks.bench_paillier [--rows 10000 50000] [--depths 6 10] [--trees 3]
        [--plain-trees 20] [--schemes paillier:2048 ou:3072] [--fedtree] [--json out.json]

`--fedtree` also grows one tree with FedTree 1.0.5 (vertical, homomorphic encryption, its own default key
size) on the same table, in the same run: `pip install -e '.[fedtree]'` and `apt install libntl44` first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

import pandas as pd

from benchmarks.markdown import markdown_table
from fedcore.data.split import split_vertical
from fedcore.privacy.gmp_workers import encrypt_over_workers
from fedcore.privacy.schemes import scheme
from fedcore.simulation import same_structure
from fedcore.vertical import master as master_module
from fedcore.vertical.estimators import FederatedForestClassifier


def make_table(rows: int, features: int = 30, seed: int = 0) -> pd.DataFrame:
    """A binary classification table (sklearn's make_classification)."""
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=features, n_informative=features // 2,
                               n_redundant=features // 4, n_classes=2, random_state=seed)
    frame = pd.DataFrame(x, columns=[f"f{i:02d}" for i in range(features)])
    frame["y"] = y
    return frame


class SetupTimer:
    """Times VerticalMaster.setup (key use, label encryption, relay) apart from growth."""

    def __init__(self) -> None:
        """Nothing timed yet; the unpatched `VerticalMaster.setup` is kept to restore."""
        self.seconds = 0.0
        self._original = master_module.VerticalMaster.setup

    def __enter__(self) -> SetupTimer:
        """Patch `VerticalMaster.setup` to add its time to this timer."""
        timer, original = self, self._original

        def timed(master):
            started = time.perf_counter()
            try:
                return original(master)
            finally:
                timer.seconds += time.perf_counter() - started

        master_module.VerticalMaster.setup = timed
        return self

    def __exit__(self, *exc) -> None:
        """Restore the original `VerticalMaster.setup`."""
        master_module.VerticalMaster.setup = self._original


def fresh_setup(rows: int, mode: str, key_bits: int) -> dict:
    """A fresh key, its encryption tables and `rows` label encryptions, timed from nothing."""
    import numpy as np

    labels = np.random.default_rng(0).integers(0, 2, rows).tolist()
    started = time.perf_counter()
    key = scheme(mode).generate(key_bits)
    keygen = time.perf_counter() - started
    key.encrypt([0])  # builds the tables
    tables = time.perf_counter() - started - keygen
    encrypt_over_workers(key, labels)  # as the label holder does: one worker per core
    total = time.perf_counter() - started
    return {"rows": rows, "mode": mode, "key bits": key_bits, "keygen s": keygen, "tables s": tables,
            "encryption s": total - keygen - tables, "encryptions/s": rows / (total - keygen - tables),
            "setup s": total}


def fit(parties, trees: int, depth: int, **mode) -> tuple[FederatedForestClassifier, dict]:
    """Fit a vertical forest on `parties`: the model, with setup seconds, growth seconds per tree and MB."""
    model = FederatedForestClassifier(n_estimators=trees, max_depth=depth, random_state=0, **mode)
    with SetupTimer() as setup:
        started = time.perf_counter()
        model.fit(parties, label="y")
        total = time.perf_counter() - started
    stats = model.communication_
    growth = total - setup.seconds
    return model, {"setup_s": setup.seconds, "growth_s_per_tree": growth / trees, "mb": stats["bytes"] / 1e6,
                   "mb_per_tree": stats["bytes"] / 1e6 / trees}


def peak_memory_mb(workers) -> dict:
    """Peak resident memory so far of this process and of the passive party's largest worker process.

    Read from /proc before the workers stop: a child's getrusage peak would count the parent's pages at fork.
    """
    peaks = [0.0]
    for process in (workers.processes if workers is not None else []):
        try:
            with open(f"/proc/{process.pid}/status") as status:
                peaks += [int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM:")]
        except OSError:
            pass
    return {"peak MB (this process)": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "peak MB (largest worker)": max(peaks)}


def fedtree_tree(table: pd.DataFrame, depth: int) -> dict | None:
    """Seconds FedTree takes for one vertical tree with encrypted gradients (privacy_tech "he").

    Over 2 parties on `table`; None when FedTree or its libntl44 is missing.
    """
    try:
        from fedtree import FLClassifier
    except (ImportError, OSError) as error:
        print(f"# FedTree skipped: {error} (pip install -e '.[fedtree]'; apt install libntl44)", flush=True)
        return None
    x, y = table.drop(columns=["y"]).to_numpy(), table["y"].to_numpy()
    model = FLClassifier(n_parties=2, mode="vertical", partition_mode="vertical", privacy_tech="he",
                         max_depth=depth, n_trees=1, verbose=0, max_num_bin=255)
    started = time.perf_counter()
    model.fit(x, y)
    return {"rows": len(table), "depth": depth, "mode": "FedTree 1.0.5 (he)",
            "encrypted s/tree": time.perf_counter() - started}


def parse_schemes(specs: list[str]) -> list[tuple[str, int]]:
    """`mode:bits` pairs (`paillier:2048`); a bare mode takes its default key size."""
    out = []
    for spec in specs:
        mode, _, bits = spec.partition(":")
        out.append((mode, int(bits) if bits else scheme(mode).default_key_bits))
    return out


def main() -> None:
    """Run the grid of rows, depths and schemes and print the growth and setup tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 10])
    parser.add_argument("--features", type=int, default=30)
    parser.add_argument("--trees", type=int, default=3,
                        help="trees grown per encrypted mode and configuration")
    parser.add_argument("--plain-trees", type=int, default=20, help="trees grown in plain mode")
    parser.add_argument("--amortize", type=int, default=100, help="forest size the setup is spread over")
    parser.add_argument("--schemes", nargs="+", default=["paillier:2048", "ou:3072"],
                        help="encrypted-label modes and key sizes, as mode:bits")
    parser.add_argument("--skip-fresh-setup", action="store_true",
                        help="time the setup inside training only (not again from a fresh key)")
    parser.add_argument("--fedtree", action="store_true", help="also time one FedTree tree per configuration")
    parser.add_argument("--json")
    args = parser.parse_args()

    schemes = parse_schemes(args.schemes)
    keys, keygen_s = {}, {}
    for mode, bits in schemes:
        started = time.perf_counter()
        keys[mode, bits] = scheme(mode).generate(bits)
        keygen_s[f"{mode}-{bits}"] = time.perf_counter() - started
    print(f"# {platform.machine()}, {os.cpu_count()} cores; keys: "
          + ", ".join(f"{name} in {seconds:.1f} s" for name, seconds in keygen_s.items()), flush=True)
    warm = split_vertical(make_table(500, args.features), 2, label="y", seed=0)
    FederatedForestClassifier(n_estimators=2, max_depth=4).fit(warm, label="y")  # compile the kernels first
    setups = [] if args.skip_fresh_setup else [fresh_setup(n, mode, bits) for n in args.rows
                                               for mode, bits in schemes]
    if setups:
        print(markdown_table(setups, digits=3), flush=True)
    rows_out = []
    for n_rows in args.rows:
        table = make_table(n_rows, args.features)
        parties = split_vertical(table, 2, label="y", seed=0)
        for depth in args.depths:
            _, p = fit(parties, args.plain_trees, depth)
            check = FederatedForestClassifier(n_estimators=args.trees, max_depth=depth, random_state=0)
            check.fit(parties, label="y")
            plain_amortized = p["growth_s_per_tree"] + p["setup_s"] / args.amortize
            for mode, bits in schemes:
                encrypted, e = fit(parties, args.trees, depth, privacy=mode, key_bits=bits,
                                   label_key=keys[mode, bits])
                passive = next(x._passive_crypto for x in encrypted.parties_ if not x.is_label_holder)
                amortized = e["growth_s_per_tree"] + e["setup_s"] / args.amortize
                row = {
                    "rows": n_rows, "depth": depth, "mode": f"{mode}-{bits}",
                    "plain s/tree": p["growth_s_per_tree"], "encrypted s/tree": e["growth_s_per_tree"],
                    "ratio (growth)": e["growth_s_per_tree"] / p["growth_s_per_tree"],
                    "setup s": e["setup_s"],
                    f"ratio (setup over {args.amortize} trees)": amortized / plain_amortized,
                    "plain MB/tree": p["mb_per_tree"], "encrypted MB/tree": e["mb_per_tree"],
                    "MB total": e["mb"],
                    "histograms derived":
                        f"{passive.pairs_derived}/{passive.pairs_derived + passive.pairs_computed}",
                    "same trees": same_structure(check.master_.structure, encrypted.master_.structure),
                }
                row.update(peak_memory_mb(passive.pool))
                passive.close()
                rows_out.append(row)
                print(markdown_table([row], digits=3), flush=True)
            peer = fedtree_tree(table, depth) if args.fedtree else None
            if peer is not None:
                rows_out.append(peer)
                print(markdown_table([peer], digits=3), flush=True)
    print()
    print(markdown_table(rows_out, digits=3))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"keygen_s": keygen_s, "schemes": schemes, "setup": setups, "rows": rows_out},
                      handle, indent=2)


if __name__ == "__main__":
    main()
