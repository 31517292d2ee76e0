"""Reference peer: XGBoost's own federated vertical (column-split) mode training a random forest on loopback.

Why: the vertical Federated Forest engine is benchmarked against the closest off-the-shelf system. XGBoost's
federated plugin runs one gRPC server and one worker process per party; each worker holds a vertical slice of
the columns (``data_split_mode=1``), rank 0 holds the label and broadcasts gradients, each party finds its
best local split from its own histograms, and candidates and row-partition bits go through the server. A
random forest is ``num_parallel_tree`` trees in a single boosting round with ``learning_rate=1`` (XGBoost
docs, "Random Forests in XGBoost").

The server is insecure and binds 0.0.0.0 (``run_federated_server`` has no host argument), so run this only
for local benchmarks; workers connect to 127.0.0.1. Needs the ``bench`` extra (``make bench-venv``).

    .venv/bin/python benchmarks/reference_xgboost_federated.py --rows 20000 --depth 6 --parties 3
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

_CTX = mp.get_context("spawn")  # fresh interpreters: no OpenMP/gRPC state inherited through fork
_STARTUP_TIMEOUT_S = 60.0
# the server and clients set this receive cap; protobuf's own limit is 2 GiB
GRPC_MAX_MESSAGE_BYTES = 2**31 - 1


def _redirect_output(log_path: str) -> None:
    """Send this process's stdout/stderr (including the C++ library's) to a log file the parent can read."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _server_main(n_workers: int, port: int, timeout_s: int, port_queue: Any, log_path: str) -> None:
    """Child: start XGBoost's insecure federated server, report its port and serve until killed.

    Port 0 asks for a free one.
    """
    _redirect_output(log_path)
    try:
        import xgboost.federated

        args = xgboost.federated.run_federated_server(n_workers=n_workers, port=port, blocking=False,
                                                      timeout=timeout_s)
        assert args is not None  # e.g. {"n_workers": 3, "dmlc_tracker_port": 40125, "dmlc_tracker_uri": ...}
        port_queue.put(("ok", int(args["dmlc_tracker_port"])))
    except BaseException:  # noqa: B036 - report anything to the parent, then die
        port_queue.put(("error", traceback.format_exc()))
        raise
    while True:  # the tracker serves from a daemon thread; the parent terminates this process
        time.sleep(3600)


def _available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else all physical memory."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def bitvector_limit_bytes(n_parties: int) -> int:
    """Largest column-split prediction bit vector to attempt: under gRPC's cap and ~1/(8 n) of free memory.

    Measured here (3 parties, 0.70 GiB vectors = 40k rows x 150k nodes): ~17 GB in use at the peak, the server
    alone ~7 GB, i.e. ~6 copies per party in flight; past memory/(8 n) the OOM killer, not an error, ends the
    run.
    """
    return min(GRPC_MAX_MESSAGE_BYTES, _available_memory_bytes() // (8 * n_parties))


def _count_nodes(booster: Any) -> int:
    """Total node count over all trees (the bits per row of XGBoost's column-split prediction bit vectors)."""
    model = json.loads(booster.save_raw("json"))
    return sum(int(tree["tree_param"]["num_nodes"])
               for tree in model["learner"]["gradient_booster"]["model"]["trees"])


def _worker_main(
    rank: int,
    port: int,
    n_parties: int,
    x_train: np.ndarray,
    y_train: np.ndarray | None,
    x_test: np.ndarray,
    params: dict[str, Any],
    predict_batch_rows: int | None,
    bitvector_limit: int,
    result_queue: Any,
    log_path: str,
) -> None:
    """Child: one party; builds column-split DMatrix objects, trains the forest, predicts the test set."""
    _redirect_output(log_path)
    try:
        import xgboost as xgb
        from xgboost.collective import Op, allreduce

        comm_args = {
            "dmlc_communicator": "federated",
            "federated_server_address": f"127.0.0.1:{port}",
            "federated_world_size": n_parties,
            "federated_rank": rank,
        }
        col = xgb.core.DataSplitMode.COL
        with xgb.collective.CommunicatorContext(**comm_args):
            allreduce(np.zeros(1), Op.SUM)  # barrier: every party is up before the clock starts
            t0 = time.perf_counter()
            dtrain = xgb.DMatrix(x_train, label=y_train, data_split_mode=col)
            t1 = time.perf_counter()
            booster = xgb.train(params, dtrain, num_boost_round=1)
            t2 = time.perf_counter()
            # Every rank holds the same trees, so every rank takes the same branch below.
            nodes = _count_nodes(booster)
            step = predict_batch_rows or max(1, len(x_test))
            payload: dict[str, Any] = {
                "dmatrix_s": t1 - t0, "boost_s": t2 - t1, "train_s": t2 - t0, "model_nodes": nodes,
                "predict_batch_rows": step, "bitvector_bytes": -(-step * nodes // 8),
            }
            if predict_batch_rows is None and payload["bitvector_bytes"] > bitvector_limit:
                payload["error"] = (
                    "prediction not attempted: column-split prediction would allreduce "
                    f"{payload['bitvector_bytes'] / 2**30:.2f} GiB bit vectors ({step} rows x {nodes} "
                    f"nodes), over the {bitvector_limit / 2**30:.2f} GiB limit (gRPC message cap, or memory "
                    "for ~8 copies per party); pass predict_batch_rows <= "
                    f"{max(1, bitvector_limit * 8 // nodes)} to predict in slices"
                )
            else:
                t3 = time.perf_counter()
                raw = np.concatenate([
                    booster.predict(xgb.DMatrix(x_test[i:i + step], data_split_mode=col))
                    for i in range(0, len(x_test), step)
                ])
                payload["predict_s"] = time.perf_counter() - t3
                if rank == 0:
                    payload["predicted"] = (raw.argmax(axis=1) if raw.ndim == 2
                                            else (raw > 0.5).astype(np.int64))
        result_queue.put((rank, "ok", payload))
    except BaseException:  # noqa: B036 - any failure goes back to the parent as text
        result_queue.put((rank, "error", traceback.format_exc()))


def _log_tail(path: Path, n_chars: int = 2000) -> str:
    """Last characters of a child's log, for error messages."""
    try:
        return path.read_text(errors="replace")[-n_chars:].strip()
    except OSError:
        return ""


def _stop(processes: list[Any]) -> None:
    """Terminate, then kill, every child process that is still alive."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def forest_params(n_features: int, n_classes: int, n_trees: int, max_depth: int, seed: int,
                  n_parties: int) -> dict[str, Any]:
    """XGBoost random-forest parameters: one round of bagged trees, sqrt-feature sampling per node, eta 1."""
    params: dict[str, Any] = {
        "tree_method": "hist",
        "num_parallel_tree": n_trees,
        "max_depth": max_depth,
        "learning_rate": 1.0,
        "subsample": 0.632,  # without replacement: the expected share of distinct rows in a bootstrap
        "colsample_bynode": math.sqrt(n_features) / n_features,
        "reg_lambda": 1e-5,  # XGBRFClassifier's default: leaf values close to plain class frequencies
        "seed": seed,
        "nthread": max(1, (os.cpu_count() or 1) // n_parties),
        "verbosity": 1,
    }
    if n_classes > 2:
        params.update(objective="multi:softprob", num_class=n_classes)
    else:
        params["objective"] = "binary:logistic"
    return params


def run_xgboost_federated_vertical(
    X_train: np.ndarray,
    y_train: np.ndarray,
    X_test: np.ndarray,
    n_parties: int = 3,
    n_trees: int = 100,
    max_depth: int = 10,
    seed: int = 0,
    port: int | None = None,
    *,
    y_test: np.ndarray | None = None,
    predict_batch_rows: int | None = None,
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Train and predict with XGBoost federated vertical RF on loopback; never raises, failures go in `error`.

    Columns are dealt to `n_parties` workers in contiguous blocks; rank 0 holds the label. `port=None`
    lets the server pick a free port. `accuracy` needs `y_test` (labels in the same coding as `y_train`);
    without it it is None. Times are rank 0's, measured after a barrier: `train_s` = column-split DMatrix
    construction (sketching) + training, `predict_s` = test DMatrix + federated prediction.

    Column-split prediction allreduces two bit vectors of (rows in the DMatrix) x (nodes in all trees) bits
    through the server, so a deep forest on a large test set makes multi-GB gRPC messages (and server
    memory). `predict_batch_rows=None` predicts the whole test set at once, as plain XGBoost would; if its bit
    vectors would pass `bitvector_limit_bytes`, prediction is not attempted (it would fail or wake the OOM
    killer) and `error` says so, with `train_s` still filled in. An int predicts in slices of that many rows.
    """
    result: dict[str, Any] = {"train_s": None, "predict_s": None, "accuracy": None, "error": None}
    processes: list[Any] = []
    logs = tempfile.TemporaryDirectory(prefix="xgb-federated-")
    started = time.perf_counter()
    try:
        X_train = np.ascontiguousarray(X_train, dtype=np.float32)
        X_test = np.ascontiguousarray(X_test, dtype=np.float32)
        classes, y_codes = np.unique(np.asarray(y_train), return_inverse=True)
        if X_train.shape[1] < n_parties:
            raise ValueError(f"{X_train.shape[1]} columns cannot be split across {n_parties} parties")
        params = forest_params(X_train.shape[1], len(classes), n_trees, max_depth, seed, n_parties)
        log_dir = Path(logs.name)

        port_queue = _CTX.Queue()
        server = _CTX.Process(
            target=_server_main,
            args=(n_parties, port or 0, int(timeout_s), port_queue, str(log_dir / "server.log")),
            daemon=True,
        )
        server.start()
        processes.append(server)
        status, value = port_queue.get(timeout=_STARTUP_TIMEOUT_S)
        if status != "ok":
            raise RuntimeError(f"federated server failed to start:\n{value}")
        server_port = int(value)

        result_queue = _CTX.Queue()
        limit = bitvector_limit_bytes(n_parties)
        for rank, columns in enumerate(np.array_split(np.arange(X_train.shape[1]), n_parties)):
            worker = _CTX.Process(
                target=_worker_main,
                args=(rank, server_port, n_parties, X_train[:, columns], y_codes if rank == 0 else None,
                      X_test[:, columns], params, predict_batch_rows, limit, result_queue,
                      str(log_dir / f"worker{rank}.log")),
                daemon=True,
            )
            worker.start()
            processes.append(worker)

        outcomes = _collect(processes[1:], result_queue, log_dir, started + timeout_s)
        rank0 = outcomes[0]
        result.update({key: value for key, value in rank0.items() if key != "predicted"})
        if y_test is not None and "predicted" in rank0:
            predicted = classes[rank0["predicted"]]
            result["accuracy"] = float(np.mean(predicted == np.asarray(y_test)))
    except Exception as exc:  # the contract: report, never raise
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        _stop(processes)
        logs.cleanup()
    result["wall_s"] = time.perf_counter() - started
    return result


def _collect(workers: list[Any], result_queue: Any, log_dir: Path,
             deadline: float) -> dict[int, dict[str, Any]]:
    """Wait for every worker's result.

    Raises with the worker's log tail on the first error, death or timeout.
    """
    outcomes: dict[int, dict[str, Any]] = {}
    while len(outcomes) < len(workers):
        try:
            rank, status, payload = result_queue.get(timeout=0.5)
        except queue.Empty:
            for rank, worker in enumerate(workers):
                if rank not in outcomes and worker.exitcode is not None:
                    raise RuntimeError(
                        f"worker {rank} died (exit code {worker.exitcode}) without a result; log tail:\n"
                        f"{_log_tail(log_dir / f'worker{rank}.log')}"
                    ) from None
            if time.perf_counter() > deadline:
                raise TimeoutError(f"no result after the time limit; {len(outcomes)} of {len(workers)} "
                                   "workers done") from None
            continue
        if status != "ok":
            raise RuntimeError(f"worker {rank} failed:\n{payload}\nlog "
                               f"tail:\n{_log_tail(log_dir / f'worker{rank}.log')}")
        outcomes[rank] = payload
    return outcomes


def main(argv: list[str] | None = None) -> None:
    """CLI: make_classification data (40 features, 20 informative), 80/20 split, print the result as JSON."""
    from sklearn.datasets import make_classification
    from sklearn.model_selection import train_test_split

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--predict-batch-rows", type=int, default=None,
                        help="predict in slices of this many rows (default: all at once, refused past "
                             "bitvector_limit_bytes)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the run is abandoned")
    args = parser.parse_args(argv)
    # A plain SIGTERM would skip the cleanup in `finally`; turn it into SystemExit so children are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    X, y = make_classification(n_samples=args.rows, n_features=40, n_informative=20, random_state=0)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.2, random_state=args.seed)
    result = run_xgboost_federated_vertical(
        X_train, y_train, X_test, n_parties=args.parties, n_trees=args.trees, max_depth=args.depth,
        seed=args.seed, y_test=y_test, predict_batch_rows=args.predict_batch_rows, timeout_s=args.timeout,
    )
    import xgboost

    report = {"reference": "xgboost-federated-vertical-rf", "xgboost": xgboost.__version__,
              "rows": args.rows, "train_rows": len(y_train), "test_rows": len(y_test), "features": 40,
              "parties": args.parties, "trees": args.trees, "max_depth": args.depth, "seed": args.seed,
              "cpu_count": os.cpu_count(), **result}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
