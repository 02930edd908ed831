"""The Masker: corrupts a batch for MLM pretraining with the configured strategy (``strategies``).

In:  ``input_ids`` LongTensor [B, T] (packed rows ``[CLS] doc [SEP] doc [SEP] ... [PAD]...``), ``word_start``
     uint8/bool [B, T] (1 where a token starts a word), the step (for the rate schedule, ``schedule``) and, for
     static masking, ``seq_ids`` [B].
Out: ``MaskedBatch`` (corrupted ids, labels with -100 where not selected, the selection mask, the rate used).

The Masker owns what every strategy shares: the candidates (never a special id, except UNK when given), the
randomness (row keys and one 64-bit hash per position) and the 80/10/10 replacement, decided per token (also
inside whole words and spans, as BERT's original WWM code does); random replacements are drawn uniformly from
the vocabulary without special ids. Which tokens are selected is the strategy's (picked once from
``strategies.STRATEGIES``).

Randomness: a counter-based hash (splitmix64 finalizer in wrapping int64 torch arithmetic) of (row key, stream,
position). Static mode: row key = f(seed, seq_id, copy), so the same sequence gets the same mask whatever the
batch or step on the same pass over the data; RoBERTa's static masking (k masks per sequence, cycled over
epochs): copy = pass mod ``static_copies``, the pass given by the caller (the sampler's pass over that
sequence's language, ``passes``). Copy 0 has the key f(seed, seq_id) of the single static mask of earlier
versions, so static_copies 1 (or no ``passes``) reproduces it bit for bit. Dynamic mode: row keys are B int64
drawn from the caller's ``generator``; the generator advances by exactly that per call, so resuming its state
is exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mlm_core.config import MaskingConfig
from mlm_core.masking import primitives as mp
from mlm_core.masking.schedule import masking_rate
from mlm_core.masking.strategies import Draw, strategy_class

IGNORE_INDEX = -100


# static masking: copy c of a sequence's mask adds c * _COPY to its row state (an odd constant, so the k copies of
# one sequence have distinct states; copy 0 is the state of the single static mask of earlier versions)
_COPY = mp.i64(0xA0761D6478BD642F)


@dataclass
class MaskedBatch:
    input_ids: torch.Tensor   # LongTensor [B, T], corrupted
    labels: torch.Tensor      # LongTensor [B, T], original id where selected, -100 elsewhere
    selected: torch.Tensor    # BoolTensor [B, T]
    rate: float               # the scheduled selection rate p used for this batch


class Masker:
    """Corrupts a batch for MLM. Stateless: all randomness comes from the seed (static) or the caller's generator.

    ``special_ids``: PAD/UNK/CLS/SEP/MASK ids. They are never selected, except ``unk_id`` when given (UNK is
    then an ordinary candidate); random replacements never produce any of them.
    """

    def __init__(self, cfg: MaskingConfig, vocab_size: int, special_ids: list[int], mask_id: int,
                 seed: int = 0, total_steps: int = 1, *, unk_id: int | None = None,
                 collocations: dict[int, torch.Tensor] | None = None):
        specials = sorted({int(i) for i in special_ids} | {int(mask_id)})
        if not all(0 <= i < vocab_size for i in specials):
            raise ValueError(f"special ids {specials} outside the vocabulary [0, {vocab_size})")
        if len(specials) >= vocab_size:
            raise ValueError("the vocabulary has no non-special token to draw random replacements from")
        if vocab_size > 1 << 35:
            raise ValueError(f"vocab_size {vocab_size} too large for the {mp.RID_BITS}-bit random-id draw")
        self.strategy = strategy_class(cfg.strategy)(cfg, collocations)     # the one lookup of the name
        self.cfg, self.vocab_size, self.mask_id = cfg, int(vocab_size), int(mask_id)
        self.special_ids, self.unk_id = specials, unk_id
        self.seed, self.total_steps = int(seed), int(total_steps)
        never = torch.zeros(vocab_size, dtype=torch.bool)
        never[[i for i in specials if i != unk_id]] = True
        allowed = torch.ones(vocab_size, dtype=torch.bool)
        allowed[specials] = False
        self._never_cpu, self._allowed_cpu = never, allowed.nonzero().squeeze(1)
        self._const = mp.DeviceConstants()
        self._seed_key = mp.mix_int(self.seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019)
        pm, pr = cfg.mask_token_prob, cfg.random_token_prob
        self._act_mask, self._act_rand = mp.threshold(pm, mp.ACT_BITS), mp.threshold(pm + pr, mp.ACT_BITS)

    # -- randomness -----------------------------------------------------------------------------------
    def _row_keys(self, b: int, device: torch.device, seq_ids, generator, passes=None) -> torch.Tensor:
        if self.cfg.mode == "static":
            if seq_ids is None:
                raise ValueError("static masking needs seq_ids (the mask is a function of the sequence id)")
            seq = torch.as_tensor(seq_ids, dtype=torch.int64, device=device).reshape(-1)
            if seq.numel() != b:
                raise ValueError(f"seq_ids has {seq.numel()} entries for a batch of {b}")
            state = seq * mp.GOLDEN + self._seed_key
            if passes is not None and self.cfg.static_copies > 1:
                pas = torch.as_tensor(passes, dtype=torch.int64, device=device).reshape(-1)
                if pas.numel() != b or bool((pas < 0).any()):
                    raise ValueError(f"passes must hold {b} non-negative pass indices, got {pas.numel()} entries")
                state += (pas % self.cfg.static_copies) * _COPY     # copy 0 adds nothing: the old key
            return mp.mix(state)
        gdev = generator.device if generator is not None else torch.device("cpu")
        keys = torch.randint(-(1 << 63), (1 << 63) - 1, (b,), generator=generator, dtype=torch.int64, device=gdev)
        return keys.to(device)

    # -- public -----------------------------------------------------------------------------------------
    def __call__(self, input_ids: torch.Tensor, word_start: torch.Tensor, step: int,
                 seq_ids: torch.Tensor | None = None, generator: torch.Generator | None = None,
                 passes: torch.Tensor | None = None) -> MaskedBatch:
        """Corrupt a batch. Static mode reads ``seq_ids`` [B] and, when given, ``passes`` [B] (each row's pass
        over its language's rows: copy pass mod static_copies; None = copy 0); dynamic mode reads ``generator``."""
        if input_ids.dim() != 2 or word_start.shape != input_ids.shape:
            raise ValueError(f"expected input_ids and word_start of the same shape [B, T], got "
                             f"{tuple(input_ids.shape)} and {tuple(word_start.shape)}")
        ids = input_ids.to(torch.int64)
        dev = ids.device
        b, t = ids.shape
        p = masking_rate(self.cfg, step, self.total_steps)
        cand = ~torch.take(self._const.get("never", dev, lambda: self._never_cpu), ids)
        ws = word_start.to(device=dev, dtype=torch.bool)
        row_key = self._row_keys(b, dev, seq_ids, generator, passes)
        h = mp.stream_hash(row_key, self._const.get(("pos", t), dev, lambda: mp.weyl(mp.STREAM_POS, t)))  # per position
        sel = self.strategy.select(Draw(ids, cand, ws, h, row_key, p))
        # 80/10/10, decided per token (also inside whole words and spans)
        act = (h >> mp.ACT_SHIFT) & ((1 << mp.ACT_BITS) - 1)
        to_mask = sel & (act < self._act_mask)
        to_rand = sel & (act < self._act_rand) & ~to_mask
        allowed = self._const.get("allowed", dev, lambda: self._allowed_cpu)
        rid = torch.take(allowed, ((h & ((1 << mp.RID_BITS) - 1)) * allowed.numel()) >> mp.RID_BITS)
        out = mp.blend(ids, to_mask, self.mask_id)
        out = mp.blend(out, to_rand, rid)
        labels = mp.blend(ids, ~sel, IGNORE_INDEX)
        return MaskedBatch(out, labels, sel, p)

    def state_dict(self) -> dict:
        """Stateless: nothing to save (static masks are a function of the seed; dynamic ones of the caller's RNG)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        if state:
            raise ValueError(f"Masker is stateless; unexpected state keys {sorted(state)}")


__all__ = ["IGNORE_INDEX", "MaskedBatch", "Masker"]
