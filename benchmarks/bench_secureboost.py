"""Vertical SecureBoost (encrypted gradients) per round against the encrypted forest's tree, in the same run.

Issue #32's target: on n x 30, 2 parties, depth 6, a boosting round under Okamoto-Uchiyama at most 2x the
encrypted forest's tree plus that round's gradient encryption. One key for both (generated before timing);
the forest's label encryption is its setup, boosting encrypts every round (timed apart). Plain boosting runs
too, and the encrypted model must be the plain one (checked).

    .venv/bin/python -m benchmarks.bench_secureboost [--rows 50000] [--rounds 2] [--depth 6]
        [--colsample 1.0] [--scheme ou:3072] [--json out.json]

The forest samples sqrt(30) = 5 candidate features per node; boosting takes `--colsample` of them per tree
(XGBoost's default 1.0: all 30), so `--colsample 0.2` (6) compares the same work per node.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from benchmarks.bench_paillier import fit, make_table, parse_schemes
from benchmarks.markdown import markdown_table
from fedcore.data.split import split_vertical
from fedcore.privacy.schemes import scheme
from fedcore.simulation import same_structure
from fedcore.vertical.boosting_estimators import FederatedBoostingClassifier
from fedcore.vertical.encrypted import LabelHolderCrypto


class EncryptionTimer:
    """Adds up the seconds `LabelHolderCrypto.encrypt_gradients` takes (each round's encryption)."""

    def __init__(self) -> None:
        """Nothing timed yet."""
        self.seconds = 0.0
        self._original = LabelHolderCrypto.encrypt_gradients

    def __enter__(self) -> EncryptionTimer:
        """Patch `encrypt_gradients` to add its time here."""
        timer, original = self, self._original

        def timed(crypto, *args):
            started = time.perf_counter()
            try:
                return original(crypto, *args)
            finally:
                timer.seconds += time.perf_counter() - started

        LabelHolderCrypto.encrypt_gradients = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc) -> None:
        """Restore the original."""
        LabelHolderCrypto.encrypt_gradients = self._original  # type: ignore[method-assign]


def boost(parties, rounds: int, depth: int, colsample: float,
          **mode) -> tuple[FederatedBoostingClassifier, dict]:
    """Fit `rounds` boosting rounds: the model, seconds per round and the encryption's share of them."""
    model = FederatedBoostingClassifier(n_estimators=rounds, max_depth=depth, colsample_bytree=colsample,
                                        random_state=0, **mode)
    with EncryptionTimer() as encryption:
        started = time.perf_counter()
        model.fit(parties, label="y")
        total = time.perf_counter() - started
    return model, {"s_per_round": total / rounds, "encryption_s_per_round": encryption.seconds / rounds,
                   "mb_per_round": model.communication_["bytes"] / 1e6 / rounds}


def main() -> None:
    """Run the comparison and print a markdown table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--colsample", type=float, default=1.0, help="boosting's colsample_bytree")
    parser.add_argument("--scheme", default="ou:3072", help="mode:key_bits, e.g. ou:3072 or paillier:2048")
    parser.add_argument("--json")
    args = parser.parse_args()
    [(mode, bits)] = parse_schemes([args.scheme])
    parties = split_vertical(make_table(args.rows), 2, label="y", seed=0)
    key = scheme(mode).generate(bits)
    encrypted = {"privacy": mode, "key_bits": bits, "label_key": key}
    _, forest = fit(parties, 1, args.depth, **encrypted)
    plain_model, plain = boost(parties, args.rounds, args.depth, args.colsample)
    model, secure = boost(parties, args.rounds, args.depth, args.colsample, **encrypted)
    same = same_structure(plain_model.master_.structure, model.master_.structure)
    growth = secure["s_per_round"] - secure["encryption_s_per_round"]
    # s: a tree's growth, or a whole round; encryption s: the labels once, or a round's (g, h)
    rows = [
        {"run": f"forest, {mode}-{bits}, 1 tree", "s": forest["growth_s_per_tree"],
         "encryption s": forest["setup_s"], "MB": forest["mb_per_tree"]},
        {"run": "boosting, plain, per round", "s": plain["s_per_round"], "encryption s": "",
         "MB": plain["mb_per_round"]},
        {"run": f"boosting, {mode}-{bits}, per round", "s": secure["s_per_round"],
         "encryption s": secure["encryption_s_per_round"], "MB": secure["mb_per_round"]},
    ]
    ratio = growth / forest["growth_s_per_tree"]
    print(f"{args.rows:,} x 30, 2 parties, depth {args.depth}, {args.rounds} rounds, colsample "
          f"{args.colsample}; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(markdown_table(rows))
    print(f"round without its encryption / forest tree: {ratio:.2f}x (target <= 2x); same model as plain: "
          f"{same}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows, "ratio": ratio, "same_as_plain": same}, out, indent=2)


if __name__ == "__main__":
    main()
