"""Pseudo-log-likelihood (PLL) scoring of sentences with a masked language model.

In: an ``MLMEncoder`` (eval mode), token-id lists without special tokens, the [MASK]/[CLS]/[SEP] ids.
Out: one PLL per sentence, PLL(W) = sum_t log P(w_t | W with w_t masked) (Salazar et al., 2020,
"Masked Language Model Scoring"), and the pseudo-perplexity PPPL = exp(-sum PLL / sum tokens).

A sentence of n tokens needs n forward passes (one masked copy per token). ``score_batched`` builds
every masked copy of every sentence, orders the copies by length (copies of one sentence share it, so
rows of a batch are nearly the same length and padding stays small) and runs ``batch`` copies per
forward pass; padding is excluded from attention with segment ids (1 = the sentence, 0 = padding).
The MLM head runs on the one masked position of each copy only. ``score_loop`` is the naive reference:
one copy per forward pass, no padding. Both compute the same numbers (to float rounding).

``compile=True`` (``score_batched``) runs the forward through ``torch.compile``: every pass has exactly
``batch`` rows (the last one topped up with all-padding rows whose scores are dropped) and segment ids
always, so the only changing dimension is the padded length T, compiled once as a dynamic dimension (no
recompile per length, no padding of T to buckets). Compiling costs ~10-40 s on a 2-core CPU, so
``evaluate_pll`` compiles only jobs of at least ``COMPILE_MIN_COPIES`` masked copies (when torch.compile
can run here: ``mlm_core.train.compiled.compile_support``); smaller ones (the demo) stay eager.
"""
from __future__ import annotations

import logging
import math
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)
COMPILE_MIN_COPIES = 50_000      # ~1-2 min of eager scoring for the small model on 2 cores: the compile pays off


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _check_lengths(model, token_id_lists: Sequence[Sequence[int]]) -> None:
    limit = model.arch.max_positions - 2
    for i, ids in enumerate(token_id_lists):
        if len(ids) > limit:
            raise ValueError(f"sentence {i} has {len(ids)} tokens; the model takes at most {limit} "
                             f"(max_positions {model.arch.max_positions} minus [CLS] and [SEP])")


def _masked_log_probs(model, ids: torch.Tensor, seg: torch.Tensor | None, where: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
    """log P(target) at the one True position of each row of ``where`` [B, T]; returns [B] float64."""
    hidden = model.encode(ids, seg)
    logits = model.mlm_logits(hidden, where).float()              # [B, V], rows in row-major order
    return F.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0].double()


def _row_log_probs(model, ids: torch.Tensor, seg: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor):
    """log P(target) at position pos[b] of each row b (the compiled pass: fixed rows, T dynamic)."""
    hidden = model.encode(ids, seg)
    h = hidden[torch.arange(ids.shape[0], device=ids.device), pos]
    logits = model.head(h).float()
    return F.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


_COMPILED = {}


def _compiled_scorer():
    if "fn" not in _COMPILED:
        # fullgraph: a graph break is an error; T is marked dynamic per call, every other size stays static
        _COMPILED["fn"] = torch.compile(_row_log_probs, fullgraph=True)
    return _COMPILED["fn"]


def _compiled_batch(model, ids, L, pj, targets, batch: int, pad: int, dev) -> torch.Tensor:
    B, T = ids.shape
    seg = (torch.arange(T)[None, :] < L[:, None]).to(torch.int32)
    if B < batch:                                  # top up to the fixed batch with all-padding rows
        extra = batch - B
        ids = torch.cat([ids, torch.full((extra, T), pad, dtype=ids.dtype)])
        seg = torch.cat([seg, torch.zeros(extra, T, dtype=seg.dtype)])
        pj = torch.cat([pj, torch.zeros(extra, dtype=pj.dtype)])
        targets = torch.cat([targets, torch.zeros(extra, dtype=targets.dtype)])
    ids, seg = ids.to(dev), seg.to(dev)
    torch._dynamo.mark_dynamic(ids, 1)            # one graph for every padded length
    torch._dynamo.mark_dynamic(seg, 1)
    lp = _compiled_scorer()(model, ids, seg, pj.to(dev), targets.to(dev))
    return lp[:B].double().cpu()


@torch.inference_mode()
def score_batched(model, token_id_lists: Sequence[Sequence[int]], mask_id: int, cls_id: int, sep_id: int,
                  batch: int = 64, compile: bool = False) -> list[float]:
    """PLL of each sentence (natural log), running ``batch`` masked copies per forward pass; ``compile``:
    through the compiled pass (module docstring; same numbers to float rounding)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    _check_lengths(model, token_id_lists)
    dev, pad = _device(model), int(model.arch.pad_id)
    n_sent = len(token_id_lists)
    scores = torch.zeros(n_sent, dtype=torch.float64)
    lens = torch.tensor([len(x) + 2 for x in token_id_lists], dtype=torch.int64).reshape(-1)  # + [CLS], [SEP]
    if n_sent == 0 or int(lens.max()) == 2:
        return scores.tolist()
    table = torch.full((n_sent, int(lens.max())), pad, dtype=torch.int64)    # every sentence, padded once
    for i, ids in enumerate(token_id_lists):
        table[i, :len(ids) + 2] = torch.tensor([cls_id, *ids, sep_id], dtype=torch.int64)
    # copies as (sentence, masked position 1..n), sentences by length: a batch's rows pad little
    order = torch.argsort(lens, stable=True)
    n_tok = lens[order] - 2
    sent = torch.repeat_interleave(order, n_tok)
    starts = torch.cumsum(n_tok, 0) - n_tok
    pos = torch.arange(len(sent)) - torch.repeat_interleave(starts, n_tok) + 1   # +1: [CLS] sits at 0
    was = model.training
    model.eval()
    try:
        for start in range(0, len(sent), batch):
            si, pj = sent[start:start + batch], pos[start:start + batch]
            L = lens[si]
            T, B = int(L.max()), len(si)
            ids = table[si, :T]                                          # a copy (advanced indexing)
            rows = torch.arange(B)
            targets = ids[rows, pj].clone()
            ids[rows, pj] = mask_id
            if compile:
                scores.index_add_(0, si, _compiled_batch(model, ids, L, pj, targets, batch, pad, dev))
                continue
            where = torch.zeros(B, T, dtype=torch.bool)
            where[rows, pj] = True
            # segment ids only when some row is padded: without padding, full attention is the same thing
            seg = (torch.arange(T)[None, :] < L[:, None]).to(torch.int32) if bool((L < T).any()) else None
            lp = _masked_log_probs(model, ids.to(dev), None if seg is None else seg.to(dev), where.to(dev),
                                   targets.to(dev)).cpu()
            scores.index_add_(0, si, lp)
    finally:
        model.train(was)
    return scores.tolist()


@torch.inference_mode()
def score_loop(model, token_id_lists: Sequence[Sequence[int]], mask_id: int, cls_id: int, sep_id: int) -> list[float]:
    """Reference PLL: one masked copy per forward pass (no batching, no padding)."""
    _check_lengths(model, token_id_lists)
    was = model.training
    model.eval()
    dev = _device(model)
    scores = []
    try:
        for ids_list in token_id_lists:
            seq = torch.tensor([[cls_id, *ids_list, sep_id]], dtype=torch.int64, device=dev)
            total = 0.0
            for j in range(1, len(ids_list) + 1):
                ids = seq.clone()
                target = ids[:, j].clone()
                ids[0, j] = mask_id
                where = torch.zeros_like(ids, dtype=torch.bool)
                where[0, j] = True
                total += float(_masked_log_probs(model, ids, None, where, target)[0])
            scores.append(total)
    finally:
        model.train(was)
    return scores


def _can_compile(model) -> bool:
    from mlm_core.train.compiled import compile_support
    return compile_support(_device(model)) is None


def pseudo_perplexity(pll: float, n_tokens: int) -> float:
    """PPPL = exp(-PLL / N) (NaN for N = 0). Pass summed PLL and summed tokens for a corpus-level value.
    A mean loss beyond exp's float range (~709 nats: a broken or adversarial model) is +inf, as for the
    intrinsic perplexity, rather than an OverflowError that would abort evaluate or compare."""
    if n_tokens <= 0:
        return float("nan")
    nll = -pll / n_tokens
    return math.exp(nll) if nll < 700 else float("inf")


def tokenizer_special_ids(tokenizer) -> dict[str, int]:
    """mask/cls/sep ids from a tokenizers.Tokenizer with BERT ([MASK]) or RoBERTa (<mask>) special tokens."""
    for names in ({"mask": "[MASK]", "cls": "[CLS]", "sep": "[SEP]"}, {"mask": "<mask>", "cls": "<s>", "sep": "</s>"}):
        ids = {role: tokenizer.token_to_id(tok) for role, tok in names.items()}
        if all(v is not None for v in ids.values()):
            return {k: int(v) for k, v in ids.items()}
    raise ValueError("the tokenizer has neither [MASK]/[CLS]/[SEP] nor <mask>/<s>/</s>: pass special_ids")


def encode_plain(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids without special tokens, truncation or padding (on a copy: the caller's tokenizer is untouched);
    special-token strings in the text are encoded as text, as the shards stage does."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    return [list(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]


def evaluate_pll(model, tokenizer, texts_by_lang: Mapping[str, Sequence[str]], cfg,
                 special_ids: Mapping[str, int] | None = None, max_tokens: int | None = None) -> dict:
    """Per language: {"sentences", "tokens", "pll_mean" (per sentence), "pll_per_token", "pseudo_perplexity"
    (corpus-level: exp(-sum PLL / sum tokens))}; a language with no text -> {"missing": True}.

    At most ``cfg.pll_sentences`` texts per language (0 = skip: returns {}), each truncated to ``max_tokens``
    tokens (default and ceiling: max_positions - 2); empty texts are skipped.
    """
    if cfg.pll_sentences == 0:
        return {}
    ids = dict(special_ids) if special_ids is not None else tokenizer_special_ids(tokenizer)
    limit = model.arch.max_positions - 2
    limit = min(limit, max_tokens) if max_tokens is not None else limit
    out: dict[str, dict] = {}
    for lang in sorted(texts_by_lang):
        texts = [t for t in texts_by_lang[lang] if t and t.strip()][: cfg.pll_sentences]
        lists = [x[:limit] for x in encode_plain(tokenizer, texts)] if texts else []
        lists = [x for x in lists if x]
        if not lists:
            out[lang] = {"missing": True, "reason": "no text to score"}
            continue
        n_tok = sum(len(x) for x in lists)
        scores = score_batched(model, lists, ids["mask"], ids["cls"], ids["sep"], batch=cfg.pll_batch,
                               compile=n_tok >= COMPILE_MIN_COPIES and _can_compile(model))
        out[lang] = {"sentences": len(lists), "tokens": n_tok, "pll_mean": sum(scores) / len(scores),
                     "pll_per_token": sum(scores) / n_tok, "pseudo_perplexity": pseudo_perplexity(sum(scores), n_tok)}
        log.info("pll: %s: %d sentences, %d tokens, PPPL %.2f", lang, len(lists), n_tok, out[lang]["pseudo_perplexity"])
    return out


__all__ = ["score_batched", "score_loop", "pseudo_perplexity", "evaluate_pll", "encode_plain", "tokenizer_special_ids"]
