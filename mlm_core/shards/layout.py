"""Shard file format v3 (compact): what is stored per position, and how a row is decoded at read time.

Stored per row (Arrow ``fixed_size_list`` columns, one record batch per file, see ``pack.py``):
  tokens           the token ids, uint16 when vocab_size <= 65536, else uint32. When the vocabulary leaves the
                   type's top bit unused (vocab_size <= 32768 in uint16; always in uint32), that bit holds the
                   word-start flag ("folded"): stored = id | flag << 15 (<< 31).
  word_start_bits  only when the flag is not folded (uint16 ids with 32768 < vocab_size <= 65536, e.g. RoBERTa's
                   50265): the flags bit-packed, ceil(seq_len / 8) bytes per row, little bit order
                   (``np.packbits(..., bitorder="little")``).
So a position costs 2 bytes (folded uint16), 2.125 (uint16 + bits) or 4 (folded uint32, e.g. XLM-R's 250k
vocabulary), against 4 in format v2 (uint16 ids + uint8 segment id + uint8 word start) and ~6+ in the HF recipe.

Not stored: segment ids. They are rebuilt from the [SEP] positions, which the packer guarantees are exactly the
document ends (content never holds the [SEP] or [PAD] id: ``encode.prepare_tokenizer`` encodes special-token
strings as text, and the packer refuses any that slip through): [CLS] is segment 1, every position after the
j-th [SEP] of the row is segment j + 1 (a [SEP] belongs to the document it ends), [PAD] is 0. This equals the
v2 column, which came from document indices.

Format v2 (``segment_ids`` and ``word_start`` stored as columns, no ``format_version`` in the manifest) is still
read, as before; anything newer than ``FORMAT_VERSION`` is refused with the rebuild command.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

FORMAT_VERSION = 3
TOKENS, WS_BITS = "tokens", "word_start_bits"
V2_COLUMNS = ("input_ids", "segment_ids", "word_start")


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type holding every token id."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def id_capacity(vocab_size: int) -> int:
    """How many ids the token dtype chosen for ``vocab_size`` holds (65536 for uint16): the room a
    vocabulary has to grow (tokenizer.extend) without changing the dtype of its stored ids."""
    return int(np.iinfo(token_dtype(vocab_size)).max) + 1


def segment_dtype(seq_len: int) -> np.dtype:
    """A row holds fewer than seq_len segments, so uint8 is enough up to seq_len 256."""
    return np.dtype(np.uint8) if seq_len <= 256 else np.dtype(np.uint16)


def shard_schema(seq_len: int, ids: np.dtype, seg: np.dtype) -> pa.Schema:
    """The format v2 schema (three columns), still read; kept for writers of v2 test/benchmark data."""
    return pa.schema([
        ("input_ids", pa.list_(pa.from_numpy_dtype(ids), seq_len)),
        ("segment_ids", pa.list_(pa.from_numpy_dtype(seg), seq_len)),
        ("word_start", pa.list_(pa.uint8(), seq_len)),
    ])


class ShardFormatError(ValueError):
    """A shard set in a format this code cannot read."""


@dataclass(frozen=True)
class Layout:
    """How one shard set stores its rows. ``version`` 2 = legacy three columns, 3 = compact."""

    seq_len: int
    ids: np.dtype
    sep: int
    pad: int
    folded: bool = True
    version: int = FORMAT_VERSION

    # ------------------------------------------------------------------------------------- construction
    @classmethod
    def for_vocab(cls, vocab_size: int, seq_len: int, sep: int, pad: int) -> "Layout":
        ids = token_dtype(vocab_size)
        return cls(seq_len, ids, int(sep), int(pad), folded=vocab_size <= id_capacity(vocab_size) // 2)

    @classmethod
    def from_manifest(cls, manifest: dict, where: str = "shards") -> "Layout":
        version = int(manifest.get("format_version", 2))
        rebuild = "rebuild it with `mlm run <config> --only shards --force`"
        if version > FORMAT_VERSION or version < 2:
            raise ShardFormatError(f"shard set {where}: format version {version}, this code reads 2..{FORMAT_VERSION}:"
                                   f" {rebuild}")
        sp = manifest.get("special_tokens") or {}
        lay = manifest.get("layout") or {}

        def special(role: str) -> int:
            if f"{role}_id" in lay:
                return int(lay[f"{role}_id"])
            e = sp.get(role)
            if e is None:
                raise ShardFormatError(f"shard set {where}: the manifest names no '{role}' token: {rebuild}")
            return int(e["id"] if isinstance(e, dict) else e)
        ids = np.dtype(manifest.get("dtype") or token_dtype(int(manifest["vocab_size"])))
        if version == 2:
            return cls(int(manifest["seq_len"]), ids, special("sep"), special("pad"), folded=False, version=2)
        return cls(int(manifest["seq_len"]), ids, special("sep"), special("pad"),
                   folded=lay.get("word_start") == "folded", version=version)

    def manifest_fields(self) -> dict:
        return {"format_version": self.version, "dtype": self.ids.name, "segment_dtype": self.seg_dtype.name,
                "layout": {"tokens": self.ids.name, "word_start": "folded" if self.folded else "bitpacked",
                           "segment_ids": "rebuilt from [SEP]", "sep_id": self.sep, "pad_id": self.pad}}

    # ------------------------------------------------------------------------------------- properties
    @property
    def seg_dtype(self) -> np.dtype:
        return segment_dtype(self.seq_len)

    @property
    def flag(self) -> int:
        return 1 << (8 * self.ids.itemsize - 1)

    @property
    def columns(self) -> tuple[str, ...]:
        if self.version == 2:
            return V2_COLUMNS
        return (TOKENS,) if self.folded else (TOKENS, WS_BITS)

    def widths(self) -> dict[str, int]:
        return {c: (-(-self.seq_len // 8) if c == WS_BITS else self.seq_len) for c in self.columns}

    def schema(self) -> pa.Schema:
        if self.version == 2:
            return shard_schema(self.seq_len, self.ids, self.seg_dtype)
        fields = [(TOKENS, pa.list_(pa.from_numpy_dtype(self.ids), self.seq_len))]
        if not self.folded:
            fields.append((WS_BITS, pa.list_(pa.uint8(), self.widths()[WS_BITS])))
        return pa.schema(fields, metadata={"mlm.shards.format_version": str(self.version)})

    # ------------------------------------------------------------------------------------- encode / decode
    def encode(self, ids: np.ndarray, ws: np.ndarray) -> list[np.ndarray]:
        """(rows, seq_len) ids and 0/1 word starts -> the stored columns, in ``columns`` order."""
        ids = ids.astype(self.ids, copy=False)
        if self.version == 2:
            return [ids, self._segments(ids), ws.astype(np.uint8, copy=False)]
        if self.folded:
            return [ids | (ws.astype(self.ids) << self.ids.type(8 * self.ids.itemsize - 1))]
        return [ids, np.packbits(ws.astype(np.bool_), axis=1, bitorder="little")]

    def decode(self, stored: dict[str, np.ndarray], ids_dtype=np.int64
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stored rows (column -> (B, width) arrays) -> (input_ids ``ids_dtype``, segment_ids ``seg_dtype``,
        word_start bool), each (B, seq_len)."""
        if self.version == 2:
            return (stored["input_ids"].astype(ids_dtype), stored["segment_ids"].astype(self.seg_dtype, copy=False),
                    stored["word_start"].view(np.bool_))
        raw = stored[TOKENS]
        T = raw.shape[1]
        if self.folded:
            small = raw & raw.dtype.type(self.flag - 1)    # the comparisons below run on the narrow type
            ws = raw >= raw.dtype.type(self.flag)
        else:
            small = raw
            ws = np.unpackbits(stored[WS_BITS], axis=1, count=T, bitorder="little").view(np.bool_)
        return small.astype(ids_dtype), self._segments(small), ws

    def decode_field(self, stored: dict[str, np.ndarray], name: str) -> np.ndarray:
        """One of input_ids (stored dtype), segment_ids, word_start (uint8), decoding only what it needs."""
        if self.version == 2:
            return stored[name]
        if name == "word_start":
            if self.folded:
                return (stored[TOKENS] >= self.ids.type(self.flag)).view(np.uint8)
            T = self.seq_len
            return np.unpackbits(stored[WS_BITS], axis=1, count=T, bitorder="little")
        raw = stored[TOKENS]
        ids = raw & self.ids.type(self.flag - 1) if self.folded else raw.copy()
        return ids if name == "input_ids" else self._segments(ids)

    def _segments(self, ids: np.ndarray, use_torch: bool | None = None) -> np.ndarray:
        """Segment = 1 + number of [SEP] strictly before the position ([CLS] at 0 is never one); [PAD] = 0.

        The running count is along rows: numpy's cumsum/accumulate along the last axis runs ~7x slower than
        torch.cumsum at (64, 128) (measured 37 vs 5 us), which made the reader slower than format v2; so torch
        does it when it is already imported (every training/evaluation reader), numpy otherwise (same integers)."""
        import sys
        is_sep = ids == self.sep
        is_sep[:, 0] = False
        u8 = is_sep.view(np.uint8)
        if use_torch if use_torch is not None else "torch" in sys.modules:
            import torch
            tdt = torch.uint8 if self.seg_dtype == np.uint8 else torch.int32
            seg = torch.cumsum(torch.from_numpy(u8), 1, dtype=tdt).numpy().astype(self.seg_dtype, copy=False)
        else:
            seg = np.cumsum(u8, axis=1, dtype=self.seg_dtype)
        seg -= u8                            # the SEPs up to and including t, minus its own ...
        seg += 1                             # ... plus one
        padded = np.flatnonzero(ids[:, -1] == self.pad)     # padding is trailing: only rows ending in [PAD]
        if len(padded):
            seg[padded] *= ids[padded] != self.pad
        return seg


__all__ = ["FORMAT_VERSION", "Layout", "ShardFormatError", "TOKENS", "WS_BITS", "V2_COLUMNS", "token_dtype",
           "id_capacity", "segment_dtype", "shard_schema"]
