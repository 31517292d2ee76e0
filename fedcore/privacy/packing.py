"""Packing of label statistics into Paillier plaintexts, and of encrypted bin sums into few ciphertexts.

A sample's plaintext holds `n_slots` non-negative integers (class one-hots, or 1, q, q^2 for a fixed-point
target q) at `slot_bits` spacing, wide enough that summing any node's samples never carries into the next
slot. A passive party sums ciphertexts per bin, then folds `bins_per_ciphertext` bin sums into one
ciphertext by Horner's rule (Enc(a)^(2^B) Enc(b) = Enc(a 2^B + b)), so the label holder decrypts one
ciphertext per group of bins instead of one per bin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gmpy2
import numpy as np
from gmpy2 import mpz

from fedcore.errors import ProtocolError
from fedcore.privacy.paillier import PaillierPublicKey, parallel_map


@dataclass(frozen=True)
class SlotLayout:
    """Where each statistic sits in a plaintext, and how many bin sums share one ciphertext."""

    n_slots: int
    slot_bits: int
    plaintext_bits: int

    def __post_init__(self) -> None:
        if self.n_slots < 1 or self.slot_bits < 1 or self.bin_bits > self.plaintext_bits:
            raise ProtocolError(f"{self.n_slots} slots of {self.slot_bits} bits do not fit a "
                                f"{self.plaintext_bits}-bit plaintext")

    @classmethod
    def for_sums(cls, n_slots: int, largest_sum: int, public: PaillierPublicKey) -> SlotLayout:
        """The narrowest layout whose slots hold sums up to `largest_sum`."""
        return cls(n_slots, max(int(largest_sum).bit_length(), 1), public.plaintext_bits)

    @property
    def bin_bits(self) -> int:
        """Width of one bin's statistics (all its slots)."""
        return self.n_slots * self.slot_bits

    @property
    def bins_per_ciphertext(self) -> int:
        """How many bin sums one packed ciphertext carries."""
        return self.plaintext_bits // self.bin_bits

    def encode(self, values: np.ndarray) -> list[int]:
        """One plaintext per row of `values` (rows, n_slots) of non-negative integers."""
        values = np.asarray(values)
        if values.ndim != 2 or values.shape[1] != self.n_slots:
            raise ProtocolError(f"values must have {self.n_slots} columns, got shape {values.shape}")
        shifts = [k * self.slot_bits for k in range(self.n_slots)]
        return [sum(int(v) << s for v, s in zip(row, shifts, strict=True)) for row in values.tolist()]

    def unpack(self, plaintexts: Sequence[int], n_bins: int) -> np.ndarray:
        """The (n_bins, n_slots) Python-int statistics carried by packed plaintexts, in packing order."""
        per = self.bins_per_ciphertext
        if len(plaintexts) != -(-n_bins // per):
            raise ProtocolError(f"{len(plaintexts)} packed ciphertexts cannot carry {n_bins} bins")
        out = np.empty((n_bins, self.n_slots), dtype=object)
        bin_mask, slot_mask = (1 << self.bin_bits) - 1, (1 << self.slot_bits) - 1
        for g, plaintext in enumerate(plaintexts):
            first = g * per
            size = min(per, n_bins - first)
            if plaintext >> (size * self.bin_bits):
                raise ProtocolError("a packed histogram overflows its slots")
            for j in range(size):
                value = (plaintext >> ((size - 1 - j) * self.bin_bits)) & bin_mask
                for k in range(self.n_slots):
                    out[first + j, k] = (value >> (k * self.slot_bits)) & slot_mask
        return out

    def to_json(self) -> dict:
        """The layout's sizes (the plaintext width follows from the public key)."""
        return {"n_slots": self.n_slots, "slot_bits": self.slot_bits}


def pack_bin_sums(public: PaillierPublicKey, sums: Sequence[mpz], layout: SlotLayout,
                  workers: int | None = None) -> list[mpz]:
    """Fold consecutive encrypted bin sums into ceil(len / bins_per_ciphertext) ciphertexts (Horner), the
    groups spread over `workers` threads."""
    per, shift, n2 = layout.bins_per_ciphertext, mpz(1) << layout.bin_bits, public.n_square

    def fold(groups: list[Sequence[mpz]]) -> list[mpz]:
        packed = []
        for group in groups:
            acc = group[0]
            for c in group[1:]:
                acc = gmpy2.powmod(acc, shift, n2) * c % n2
            packed.append(acc)
        return packed

    return parallel_map(fold, [sums[first:first + per] for first in range(0, len(sums), per)], workers)


def encrypted_bin_sums(public: PaillierPublicKey, ciphertexts: Sequence[mpz], rows: np.ndarray,
                       weights: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, list[mpz]]:
    """Per non-empty bin (ascending): the product of the samples' ciphertexts raised to their weights.

    `rows`, `weights` and `bins` describe one node's in-bag samples on one feature.
    """
    n2 = public.n_square
    order = np.argsort(bins, kind="stable")
    sorted_bins = bins[order]
    bounds = np.flatnonzero(np.diff(sorted_bins)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(order)]])
    rows_sorted = rows[order].tolist()
    weights_sorted = weights[order].tolist()
    sums = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        acc = None
        for r, w in zip(rows_sorted[a:b], weights_sorted[a:b], strict=True):
            term = ciphertexts[r] if w == 1 else gmpy2.powmod(ciphertexts[r], w, n2)
            acc = term if acc is None else acc * term % n2
        sums.append(acc)
    return sorted_bins[starts].astype(np.uint8), sums
