"""A worker process for homomorphic (Paillier or Okamoto-Uchiyama) arithmetic.

Started by `fedcore.privacy.gmp_workers` as `python -m fedcore.privacy.gmp_worker`: gmpy2 keeps the GIL for
the multiplications behind bin sums and fixed-base encryption, so threads cannot share them over the cores;
processes can.

It reads requests from stdin and writes answers to stdout, each a pickle behind an 8-byte length. Only
the process that started it is on the other end of these pipes (never a network peer). It keeps state
between requests (the label ciphertexts' weight powers, or the private key and its tables) and exits when
stdin closes, so it never outlives its parent.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from typing import IO, Any, BinaryIO

from fedcore.privacy.packing import encrypted_bin_sums, weight_powers
from fedcore.privacy.schemes import private_key_from_worker_fields, public_key_from_any_json

HEADER_BYTES = 8


def read_frame(stream: IO[bytes]) -> Any | None:
    """One length-prefixed pickle from `stream`, or None at end of stream."""
    header = stream.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES:
        return None
    size = int.from_bytes(header, "big")
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)  # noqa: S301 - written by this worker's own parent process


def write_frame(stream: IO[bytes], value: Any) -> None:
    """`value` as one length-prefixed pickle on `stream`."""
    body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(body).to_bytes(HEADER_BYTES, "big") + body)
    stream.flush()


def _load_labels(state: dict, public_key: dict, ciphertexts: list) -> int:
    public = public_key_from_any_json(public_key)
    state["public"], state["powers"] = public, weight_powers(public, ciphertexts)
    return len(ciphertexts)


def _bin_sums(state: dict, pairs: list[tuple]) -> list[tuple]:
    public, powers = state["public"], state["powers"]
    return [encrypted_bin_sums(public, powers, rows, weights, bins) for rows, weights, bins in pairs]


def _load_key(state: dict, fields: dict) -> int:
    state["key"] = private_key_from_worker_fields(fields)
    return 0


def _encrypt(state: dict, plaintexts: list[int]) -> list:
    return state["key"].encrypt(plaintexts)  # here: this process is the worker


OPERATIONS: dict[str, Callable[..., Any]] = {"load_labels": _load_labels, "bin_sums": _bin_sums,
                                             "load_key": _load_key, "encrypt": _encrypt}


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer ("ok", result) or ("error", message) to each (operation, arguments) until `requests` ends."""
    state: dict = {}
    while (request := read_frame(requests)) is not None:
        operation, arguments = request
        try:
            answer = ("ok", OPERATIONS[operation](state, *arguments))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
            answer = ("error", f"{type(error).__name__}: {error}")
        write_frame(answers, answer)


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
