"""This rank's input to the training step: ``Rows`` gathers (language, row) draws from the memory-mapped shards,
``Feed`` draws a step's micro-batches (sampler -> rows -> masking, both timed) and moves them to the device as
``step.Micro``. A leaf of ``loop``: of the training code it imports only ``step.Micro``."""
from __future__ import annotations

import time

import numpy as np
import torch

from mlm_core.train.step import Micro


class Rows:
    """Batches of (language index, row) draws gathered from the memory-mapped shards (one fancy-index per language)."""

    def __init__(self, ds, split: str, langs: list[str]):
        self.cols = [ds.columns(split, lang) for lang in langs]
        self.seq_len = ds.seq_len
        sizes = [len(c["input_ids"]) for c in self.cols]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)   # global sequence ids

    def gather(self, li: np.ndarray, rows: np.ndarray) -> dict[str, torch.Tensor]:
        from mlm_core.shards.reader import gather_rows
        ids, seg, ws = gather_rows(self.cols, li, rows)     # stored rows gathered, then decoded once for the batch
        seg = seg.astype(np.int32)
        return {"input_ids": torch.from_numpy(ids), "segment_ids": torch.from_numpy(seg),
                "word_start": torch.from_numpy(ws), "seq_ids": torch.from_numpy(self.offsets[li] + rows)}


class Feed:
    """Draws this rank's micro-batches: sampler -> rows from the shards -> masking; times both parts.
    ``groups``: a ``bias.regularizer.GroupFinder`` (pretrain.bias_regularizer) run on the original rows."""

    def __init__(self, sampler, rows: Rows, masker, generator: torch.Generator, batch_size: int, device,
                 groups=None):
        self.sampler, self.rows, self.masker, self.gen, self.groups = sampler, rows, masker, generator, groups
        self.B, self.device, self.nb = batch_size, device, device.type == "cuda"
        self.t_data = self.t_mask = self.rate = 0.0

    def draw(self, step: int, n: int) -> list[Micro]:
        """n masked micro-batches on the device (``step.Micro``)."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            li, rows, passes = self.sampler.next_indices(self.B, passes=True)
            b = self.rows.gather(li, rows)
            t1 = time.perf_counter()
            m = self.masker(b["input_ids"], b["word_start"], step, seq_ids=b["seq_ids"], generator=self.gen,
                            passes=torch.from_numpy(passes))   # static masking: copy = pass mod static_copies
            self.t_data, self.t_mask, self.rate = self.t_data + t1 - t0, self.t_mask + time.perf_counter() - t1, m.rate
            seg = b["segment_ids"]
            gm = None if self.groups is None else self.groups(b["input_ids"], b["word_start"], li).to(self.device)
            out.append(Micro(m.input_ids.to(self.device, non_blocking=self.nb),
                             seg.to(self.device, non_blocking=self.nb), m.labels.to(self.device, non_blocking=self.nb),
                             int(m.selected.sum()), int((seg != 0).sum()), gm))
        return out
