"""Packing of label statistics into homomorphic plaintexts, and of encrypted bin sums into few ciphertexts.

Both label-encryption schemes (Paillier and Okamoto-Uchiyama) use the same packing.

A sample's plaintext holds `n_slots` non-negative integers (the one-hot of classes 1..C-1, or a fixed-point
regression target q) at `slot_bits` spacing, wide enough that summing any node's samples never carries
into the next slot. A passive party sums ciphertexts per bin; each bin's total weight (it knows the
bootstrap weights, and class 0's count or the weight slot follow from it) goes to the label holder in
the sealed layout, not in the ciphertext, so the label holder learns nothing it would not learn from a
full one-hot, and a bin takes half the bits it would with the weight packed beside its slots.

A bin's width depends on its node: the top slot needs only as many bits as the node's weight, so bins
of small nodes are narrow. A passive party folds consecutive bin sums into one ciphertext
by Horner's rule (Enc(a)^(2^B) Enc(b) = Enc(a 2^B + b)) until the plaintext is full; the label holder
decrypts one ciphertext per group of bins instead of one per bin, and both sides cut the groups with the
same rule (`SlotLayout.groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import gmpy2
import numpy as np
from gmpy2 import mpz

from fedcore.errors import ProtocolError
from fedcore.privacy.homomorphic import CiphertextSpace, parallel_map

MPZ_OVERHEAD_BYTES = 48
"""A gmpy2 integer's header (sys.getsizeof of a 4096-bit mpz is 560 on 64-bit CPython)."""


@dataclass(frozen=True)
class SlotLayout:
    """Where each statistic sits in a plaintext, and how wide a bin of a node of a given weight is."""

    n_slots: int
    slot_bits: int
    top_max: int
    """The largest value a sample puts in the top encrypted slot (1 for one-hots, q_max for a target)."""
    plaintext_bits: int

    def __post_init__(self) -> None:
        """Refuse a layout without slots, slot bits or a top value."""
        if self.n_slots < 1 or self.slot_bits < 1 or self.top_max < 1:
            raise ProtocolError("a slot layout needs slots, slot bits and a top value >= 1, got "
                                f"{self.n_slots}, {self.slot_bits} and {self.top_max}")

    @classmethod
    def for_values(cls, values: np.ndarray, max_weight: int, public: CiphertextSpace) -> SlotLayout:
        """The narrowest layout for per-sample `values` (rows, n_slots) summed over up to `max_weight` draws.

        Refuses one whose widest bin would not fit a plaintext.
        """
        values = np.asarray(values)
        largest = max((int(v) for v in values.ravel()), default=1)
        top = max((int(v) for v in values[:, -1]), default=1) if values.size else 1
        layout = cls(values.shape[1], max(largest * max(max_weight, 1), 1).bit_length(), max(top, 1),
                     public.plaintext_bits)
        if layout.bin_bits(max_weight) > layout.plaintext_bits:
            raise ProtocolError(f"{layout.n_slots} slots of {layout.slot_bits} bits do not fit a "
                                f"{layout.plaintext_bits}-bit plaintext")
        return layout

    def bin_bits(self, node_weight: int) -> int:
        """Width of one bin's statistics in a node of this (bootstrap-weighted) size.

        The full slots, then a top slot that holds up to weight x top_max.
        """
        return self.slot_bits * (self.n_slots - 1) + (max(int(node_weight), 1) * self.top_max).bit_length()

    def encode(self, values: np.ndarray) -> list[int]:
        """One plaintext per row of `values` (rows, n_slots) of non-negative integers."""
        values = np.asarray(values)
        if values.ndim != 2 or values.shape[1] != self.n_slots:
            raise ProtocolError(f"values must have {self.n_slots} columns, got shape {values.shape}")
        shifts = [k * self.slot_bits for k in range(self.n_slots)]
        return [sum(int(v) << s for v, s in zip(row, shifts, strict=True)) for row in values.tolist()]

    def groups(self, widths: Sequence[int]) -> list[tuple[int, int]]:
        """Consecutive bins that share a ciphertext: (start, stop) ranges filled up to the plaintext size."""
        out, start, used = [], 0, 0
        for j, width in enumerate(widths):
            if width > self.plaintext_bits:
                raise ProtocolError(f"a bin of {width} bits does not fit a {self.plaintext_bits}-bit "
                                    "plaintext")
            if used + width > self.plaintext_bits:
                out.append((start, j))
                start, used = j, 0
            used += width
        if len(widths):
            out.append((start, len(widths)))
        return out

    def unpack(self, plaintexts: Sequence[int], node_weights: Sequence[int],
               bin_weights: Sequence[int]) -> np.ndarray:
        """Per bin (packing order): its slot sums and its total weight, as Python ints.

        `node_weights` gives each bin's node weight, `bin_weights` its total weight, both from the sealed
        layout. Returns an (n_bins, n_slots + 1) array.
        """
        widths = [self.bin_bits(w) for w in node_weights]
        if len(bin_weights) != len(widths):
            raise ProtocolError(f"{len(bin_weights)} bin weights for {len(widths)} bins")
        groups = self.groups(widths)
        if len(plaintexts) != len(groups):
            raise ProtocolError(f"{len(plaintexts)} packed ciphertexts cannot carry {len(widths)} bins")
        out = np.empty((len(widths), self.n_slots + 1), dtype=object)
        slot_mask = (1 << self.slot_bits) - 1
        for (start, stop), plaintext in zip(groups, plaintexts, strict=True):
            offset = sum(widths[start:stop])
            if plaintext >> offset:
                raise ProtocolError("a packed histogram overflows its slots")
            for j in range(start, stop):
                offset -= widths[j]
                value = (plaintext >> offset) & ((1 << widths[j]) - 1)
                for k in range(self.n_slots - 1):
                    out[j, k] = (value >> (k * self.slot_bits)) & slot_mask
                out[j, self.n_slots - 1] = value >> (self.slot_bits * (self.n_slots - 1))
                out[j, self.n_slots] = int(bin_weights[j])
        return out

    def to_json(self) -> dict:
        """The layout's sizes (the plaintext width follows from the public key)."""
        return {"n_slots": self.n_slots, "slot_bits": self.slot_bits, "top_max": self.top_max}


def pack_bin_sums(public: CiphertextSpace, sums: Sequence[mpz], node_weights: Sequence[int],
                  layout: SlotLayout, workers: int | None = None) -> list[mpz]:
    """Fold consecutive bins' encrypted sums into as few ciphertexts as the plaintext allows (Horner).

    The groups are spread over `workers` threads.
    """
    n2 = public.modulus
    widths = [layout.bin_bits(w) for w in node_weights]

    def fold(ranges: list[tuple[int, int]]) -> list[mpz]:
        packed = []
        for start, stop in ranges:
            acc = None
            for j in range(start, stop):
                term = sums[j]
                acc = term if acc is None else gmpy2.powmod(acc, mpz(1) << widths[j], n2) * term % n2
            packed.append(acc)
        return packed

    return parallel_map(fold, layout.groups(widths), workers)


def weight_powers(public: CiphertextSpace, ciphertexts: Sequence[mpz], largest: int = 3) -> list[list[mpz]]:
    """Enc(x)^w for w = 1..largest and every ciphertext: bootstrap weights then cost one multiplication."""
    n2 = public.modulus
    powers = [list(ciphertexts)]
    for _ in range(2, largest + 1):
        powers.append([a * c % n2 for a, c in zip(powers[-1], ciphertexts, strict=True)])
    return powers


def weight_powers_bytes(ciphertext_bytes: int, rows: int, largest: int = 3) -> int:
    """An upper bound on the memory `weight_powers` takes for `rows` ciphertexts of `ciphertext_bytes`.

    `largest` gmpy2 integers and list slots a row. A product reduced modulo n keeps spare limbs: measured,
    an integer holds 1.08 to 1.5 times its digits on average (Paillier and Okamoto-Uchiyama, 1024 to 3072
    bits), so 1.5 is counted.
    """
    return rows * largest * (ciphertext_bytes * 3 // 2 + MPZ_OVERHEAD_BYTES + 8)


def encrypted_bin_sums(public: CiphertextSpace, powers: list[list[mpz]], rows: np.ndarray,
                       weights: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, list[mpz], list[int]]:
    """Each non-empty bin's product of its samples' ciphertexts raised to their weights, and its weight.

    Bins in ascending order; the weight is the bin's total weight. `powers` is `weight_powers` of the label
    ciphertexts; `rows`, `weights` and `bins` describe one node's in-bag samples on one feature.
    """
    n2 = public.modulus
    order = np.argsort(bins, kind="stable")
    sorted_bins = bins[order]
    bounds = np.flatnonzero(np.diff(sorted_bins)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(order)]])
    rows_sorted = rows[order].tolist()
    weights_sorted = weights[order].tolist()
    largest = len(powers)
    sums, totals = [], []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        acc = None
        for r, w in zip(rows_sorted[a:b], weights_sorted[a:b], strict=True):
            term = powers[w - 1][r] if w <= largest else gmpy2.powmod(powers[0][r], w, n2)
            acc = term if acc is None else acc * term % n2
        sums.append(acc)
        totals.append(int(sum(weights_sorted[a:b])))
    return sorted_bins[starts].astype(np.uint8), sums, totals
