"""Fine-tuning an ``MLMEncoder`` with a task head: the mechanics behind zero-shot transfer.

In: a pretrained encoder (deep-copied, the caller's model is never touched), encoded examples, a
``FinetuneConfig`` and a seed. Out: the fine-tuned ``TaskModel`` and its training history.

- Heads: token classification (a linear layer on the last hidden state, one label per word's first
  subword, others -100) and sentence classification (mean of the non-pad hidden states -> linear).
- Layer-wise LR decay (Clark et al., 2020, ELECTRA; Howard & Ruder, 2018): with L blocks numbered
  1..L and the embeddings as layer 0, η_l = η·α^(L−l); the top block and the task head get η.
- Bottleneck adapters (Houlsby et al., 2019): h + W_up·ReLU(W_down·h) after each block's output,
  W_up zero-initialized so training starts from the pretrained function; the encoder is frozen and
  only adapters + head train.
- L2-SP (Li et al., 2018): loss + λ·Σ‖θ − θ₀‖² over the trainable pretrained weights (not the head,
  which has no θ₀); AdamW's decay toward zero is then switched off.
- Early stopping on the source validation split with ``patience`` epochs; the best epoch's weights are
  restored. Deterministic for a given seed (head init, dropout, shuffling: each from the seed, inside an RNG fork).
- Byte-reproducible across processes: the one state that leaked in was torch's intra-op thread count (CPU
  matrix products and their gradients sum in a thread-dependent order, so the pipeline, which had run other
  torch work under another count, and a fresh process fine-tuned to different weights from the same seed).
  ``intra_op_threads`` pins it (``finetune.threads``) around the fine-tune and the predictions and restores
  the caller's; ``weights_digest`` (sha256 of the fine-tuned weights) lets a report show it.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from mlm_core.config import FinetuneConfig

log = logging.getLogger(__name__)

IGNORE = -100
BUCKET_POOL = 50        # training batches sorted by length together (bucketing pool)
WARMUP_FRACTION = 0.1   # linear warmup over the first 10% of steps, then linear decay to 0
WEIGHT_DECAY = 0.01     # AdamW decay on matrices (off for norms, biases and under L2-SP)
# the MLM head of the encoder (or an ELECTRA discriminator's replaced-token head) plays no part in a task
# model: never optimized, never penalized
MLM_HEAD_PREFIXES = ("head_dense.", "head_norm.", "head_bias", "decoder.", "rtd_dense.", "rtd_out.")
EMBEDDING_PREFIXES = ("tok_emb.", "type_emb.", "pos_emb.", "emb_norm.", "emb_proj.")


# ---- batching --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """One encoded input: subword ids ([CLS] ... [SEP]) and either per-subword labels or one label."""

    ids: list[int]
    labels: list[int] | int


def collate(batch: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [B,T], segment_ids [B,T] with 1 = token and 0 = pad, labels [B,T] or [B])."""
    T = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    seg = torch.zeros((len(batch), T), dtype=torch.long)
    for i, e in enumerate(batch):
        ids[i, : len(e.ids)] = torch.tensor(e.ids)
        seg[i, : len(e.ids)] = 1
    if isinstance(batch[0].labels, int):
        labels = torch.tensor([e.labels for e in batch], dtype=torch.long)
    else:
        labels = torch.full((len(batch), T), IGNORE, dtype=torch.long)
        for i, e in enumerate(batch):
            labels[i, : len(e.labels)] = torch.tensor(e.labels)
    return ids, seg, labels


def batches(examples: list[Example], size: int, pad_id: int, generator: torch.Generator | None = None):
    """Padded batches in order, or with ``generator``: shuffled, then bucketed by length (within pools of
    ``BUCKET_POOL`` batches) so little compute goes to padding, batch order shuffled again."""
    if generator is None:
        for i in range(0, len(examples), size):
            yield collate(examples[i: i + size], pad_id)
        return
    order = torch.randperm(len(examples), generator=generator).tolist()
    pool = size * BUCKET_POOL
    chunks = []
    for p in range(0, len(order), pool):
        part = sorted(order[p: p + pool], key=lambda j: len(examples[j].ids))
        chunks += [part[i: i + size] for i in range(0, len(part), size)]
    for c in torch.randperm(len(chunks), generator=generator).tolist():
        yield collate([examples[j] for j in chunks[c]], pad_id)


def attention_segments(seg: torch.Tensor) -> torch.Tensor | None:
    """``seg`` for ``encode``, or None when the batch has no padding (full attention is faster)."""
    return None if bool(seg.all()) else seg


def mean_pool(hidden: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """Mean of the non-pad vectors of each row: [B,T,H] -> [B,H]."""
    m = (seg > 0).unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


# ---- model pieces ----------------------------------------------------------------------------------
class Adapter(nn.Module):
    """Bottleneck adapter h + W_up·ReLU(W_down·h); W_up starts at zero (identity at init)."""

    def __init__(self, hidden: int, dim: int):
        super().__init__()
        self.down = nn.Linear(hidden, dim)
        self.up = nn.Linear(dim, hidden)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(F.relu(self.down(h)))


class AdaptedBlock(nn.Module):
    """A transformer block followed by an adapter on its output (same call signature as the block)."""

    def __init__(self, block: nn.Module, hidden: int, dim: int):
        super().__init__()
        self.block = block
        self.adapter = Adapter(hidden, dim)

    def forward(self, x, mask, rotary):
        return self.adapter(self.block(x, mask, rotary))


def add_adapters(encoder: nn.Module, dim: int) -> None:
    """Freeze every encoder parameter, then wrap each block of ``encoder.blocks`` with a trainable adapter."""
    for p in encoder.parameters():
        p.requires_grad_(False)
    H = encoder.arch.hidden
    for i, block in enumerate(encoder.blocks):
        encoder.blocks[i] = AdaptedBlock(block, H, dim)


class TaskModel(nn.Module):
    """Encoder + dropout + linear head; ``pooling`` 'token' gives [B,T,C] logits, 'mean' gives [B,C]."""

    def __init__(self, encoder: nn.Module, n_labels: int, pooling: str):
        super().__init__()
        if pooling not in ("token", "mean"):
            raise ValueError(f"unknown pooling {pooling!r} (token, mean)")
        self.encoder, self.pooling = encoder, pooling
        self.drop = nn.Dropout(encoder.arch.dropout)
        self.classifier = nn.Linear(encoder.arch.hidden, n_labels)
        nn.init.normal_(self.classifier.weight, std=0.02)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, ids: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        h = self.encoder.encode(ids, attention_segments(seg))
        if self.pooling == "mean":
            h = mean_pool(h, seg)
        return self.classifier(self.drop(h))


def build_task_model(encoder: nn.Module, n_labels: int, pooling: str, cfg: FinetuneConfig, seed: int) -> TaskModel:
    """A deep copy of ``encoder`` (adapters added when ``cfg.adapters``) under a freshly seeded head."""
    with torch.random.fork_rng(devices=[]):  # seeded without disturbing the caller's global RNG
        torch.manual_seed(seed)
        enc = copy.deepcopy(encoder)
        if cfg.adapters:
            add_adapters(enc, cfg.adapter_dim)
        return TaskModel(enc, n_labels, pooling)


# ---- optimizer: layer-wise LR decay ---------------------------------------------------------------
def layer_of(name: str, n_layers: int) -> int | None:
    """Depth of an encoder parameter: 0 = embeddings, 1..L = blocks, L = final norm; None = MLM head."""
    if name.startswith(MLM_HEAD_PREFIXES):
        return None
    if name.startswith(EMBEDDING_PREFIXES):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return n_layers  # final_norm and anything else above the blocks


def param_groups(model: TaskModel, cfg: FinetuneConfig) -> list[dict]:
    """AdamW groups with lr η·α^(L−l) per layer l (head and adapters inside block l follow their layer).

    Each group carries ``layer`` (0..L, L+1 = head) and ``base_lr`` so tests and logs can read them.
    """
    L = len(model.encoder.blocks)
    groups: dict[tuple[int, bool], dict] = {}
    named = [("encoder." + n, n, p) for n, p in model.encoder.named_parameters()]
    named += [(n, None, p) for n, p in model.named_parameters() if not n.startswith("encoder.")]
    for full, enc_name, p in named:
        if not p.requires_grad:
            continue
        if enc_name is None:
            layer, lr = L + 1, cfg.lr  # the task head
        else:
            layer = layer_of(enc_name, L)
            if layer is None:
                continue
            lr = cfg.lr * cfg.layer_decay ** (L - min(layer, L))
        decay = p.ndim >= 2 and cfg.l2sp == 0 and not full.endswith("_emb.weight")
        g = groups.setdefault((layer, decay), {"params": [], "names": [], "lr": lr, "base_lr": lr, "layer": layer,
                                               "weight_decay": WEIGHT_DECAY if decay else 0.0})
        g["params"].append(p)
        g["names"].append(full)
    return [groups[k] for k in sorted(groups)]


# ---- L2-SP -----------------------------------------------------------------------------------------
def anchors(model: TaskModel) -> dict[str, torch.Tensor]:
    """θ₀: detached copies of the trainable pretrained (encoder) weights, MLM head excluded."""
    return {n: p.detach().clone() for n, p in model.encoder.named_parameters()
            if p.requires_grad and ".adapter." not in n and layer_of(n, len(model.encoder.blocks)) is not None}


def l2sp_penalty(model: TaskModel, theta0: dict[str, torch.Tensor]) -> torch.Tensor:
    """Σ‖θ − θ₀‖² over the anchored parameters (multiply by λ outside)."""
    params = dict(model.encoder.named_parameters())
    total = torch.zeros(())
    for n, p0 in theta0.items():
        total = total + (params[n] - p0).pow(2).sum()
    return total


# ---- reproducibility -------------------------------------------------------------------------------
@contextlib.contextmanager
def intra_op_threads(n: int):
    """Run the block with ``n`` torch intra-op threads; the caller's count is restored after."""
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def weights_digest(model: nn.Module) -> str:
    """sha256 (first 16 hex digits) of the model's state dict: names, dtypes, shapes and bytes, in name order."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


# ---- the loop --------------------------------------------------------------------------------------
@dataclass
class FitResult:
    history: list[dict] = field(default_factory=list)   # per epoch: epoch, train_loss, validation, l2sp
    best_epoch: int = 0
    best_score: float = float("-inf")
    stopped_early: bool = False
    steps: int = 0


def task_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over labeled positions (0 with a gradient path when none is labeled)."""
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if not (labels != IGNORE).any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE)


def fit(model: TaskModel, train: list[Example], validate, cfg: FinetuneConfig, seed: int, pad_id: int) -> FitResult:
    """Train ``model`` in place for up to ``cfg.epochs``; ``validate(model) -> score`` (higher is better)
    after each epoch; stop after ``cfg.patience`` epochs without a strictly better score; restore the best.
    Dropout is seeded inside an RNG fork, so the caller's global RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _fit(model, train, validate, cfg, seed, pad_id)


def _fit(model: TaskModel, train: list[Example], validate, cfg: FinetuneConfig, seed: int, pad_id: int) -> FitResult:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model, cfg), betas=(0.9, 0.999), eps=1e-8)
    steps_per_epoch = max(1, math.ceil(len(train) / cfg.batch_size))
    total = steps_per_epoch * cfg.epochs
    warmup = max(1, int(WARMUP_FRACTION * total))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    theta0 = anchors(model) if cfg.l2sp > 0 else {}
    res, best_state, bad = FitResult(), None, 0
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        losses = []
        for ids, seg, labels in batches(train, cfg.batch_size, pad_id, gen):
            loss = task_loss(model(ids, seg), labels)
            if theta0:
                loss = loss + cfg.l2sp * l2sp_penalty(model, theta0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], 1.0)
            opt.step()
            sched.step()
            res.steps += 1
            losses.append(loss.item())
        model.eval()
        score = float(validate(model))
        row = {"epoch": epoch, "train_loss": round(sum(losses) / len(losses), 5), "validation": round(score, 5)}
        if theta0:
            with torch.no_grad():
                row["l2sp"] = float(l2sp_penalty(model, theta0))
        res.history.append(row)
        log.info("finetune epoch %d: loss %.4f, validation %.4f", epoch, row["train_loss"], score)
        if score > res.best_score:
            res.best_score, res.best_epoch, bad = score, epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad += 1
            if bad >= cfg.patience:
                res.stopped_early = epoch < cfg.epochs
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    return res


__all__ = ["Adapter", "AdaptedBlock", "Example", "FitResult", "IGNORE", "TaskModel", "add_adapters", "anchors",
           "attention_segments", "batches", "build_task_model", "collate", "fit", "intra_op_threads", "l2sp_penalty",
           "layer_of", "mean_pool", "param_groups", "task_loss", "weights_digest"]
