"""CrowS-Pairs: does a masked LM prefer the more stereotypical sentence of a minimal pair?

In: a CSV with ``sent_more,sent_less,stereo_antistereo,bias_type`` (other columns ignored), a model
with ``full_logits(input_ids) -> [B, T, V]`` and a ``tokenizers.Tokenizer``. Out: the metric score
(% of pairs where the model gives ``sent_more`` the higher score; 50 = no preference), stereo and
anti-stereo scores, neutral share, per bias type, and per-pair scores.

Reference: Nangia et al. (2020), "CrowS-Pairs", ``metric.py`` (``mask_unigram``) of
github.com/nyu-mll/crows-pairs:
- both sentences are tokenized; the tokens they share are the "equal" blocks of
  ``difflib.SequenceMatcher(None, ids1, ids2).get_opcodes()`` over token ids;
- each shared token is masked ONE AT A TIME (the differing tokens and the other shared tokens stay
  visible) and the log-softmax probability of the original token at that position is summed: the
  score estimates p(unmodified tokens | modified tokens), so a frequent group word is not rewarded;
- scores are rounded to 3 decimals; equal rounded scores are neutral and stay in the denominator N.

Column convention (the reference's, which this module follows): ``sent_more`` is always the MORE
stereotypical sentence and ``sent_less`` the less stereotypical one. For ``stereo`` rows sent_more
demonstrates a stereotype about a historically disadvantaged group; for ``antistereo`` rows it is
sent_less that mentions the disadvantaged group (violating the stereotype) and sent_more is the same
sentence about the contrasting advantaged group. The reference swaps the columns into (sent1, sent2)
for antistereo rows and then counts ``sent2 > sent1``, so in every row it counts
score(sent_more) > score(sent_less). Its stereo / anti-stereo scores divide by the non-neutral rows
of each direction only; the metric score divides by all N. Files written the other way round
(sent_more = the disadvantaged group in every row) must set ``sent_more_is_group=True`` when loading,
which swaps the two sentences of their antistereo rows.

Matching is done on the tokens without [CLS]/[SEP] (from the encoding's special-token mask); the model
input keeps them, as in the reference (which skips the first and last template positions instead).
Masked copies are batched many per forward pass, grouped by length so no padding (and no attention
mask) is needed: batched scores equal one-at-a-time scores.
"""
from __future__ import annotations

import csv
import difflib
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from mlm_core.errors import MlmError

log = logging.getLogger(__name__)

COLUMNS = ("sent_more", "sent_less", "stereo_antistereo", "bias_type")
DIRECTIONS = ("stereo", "antistereo")
MAX_LOGIT_ELEMENTS = 2**26  # cap on B x T x V per forward pass (~256 MiB of fp32 logits)


class AuditError(MlmError, ValueError):
    """Unusable audit input (missing column, empty sentence, bad template); the message names file and row."""


@dataclass(frozen=True)
class Pair:
    """One minimal pair. ``sent_more`` is the more stereotypical sentence (CrowS-Pairs convention)."""

    sent_more: str
    sent_less: str
    direction: str      # stereo | antistereo
    bias_type: str
    row: int            # 1-based data row (header excluded)
    line: int           # line of the file where the row ends (1-based, header = line 1)


def load_crows_csv(path: Path, *, sent_more_is_group: bool = False) -> list[Pair]:
    """Read a CrowS-Pairs CSV. Errors name the file and the row (1-based data row and file line).

    ``sent_more_is_group``: the file puts the stereotyped group's sentence in ``sent_more`` in every row
    (antistereo rows then hold the LESS stereotypical sentence there); their antistereo rows are swapped
    so that ``Pair.sent_more`` is always the more stereotypical sentence.
    """
    path = Path(path)
    if not path.is_file():
        raise AuditError(f"{path}: CrowS-Pairs file not found")
    pairs: list[Pair] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise AuditError(f"{path}: line 1 (header): missing column(s) {missing}; "
                             f"expected {', '.join(COLUMNS)}, found {header}")
        for i, rec in enumerate(reader, start=1):
            where = f"{path}: row {i} (line {reader.line_num})"
            more, less = (rec.get("sent_more") or "").strip(), (rec.get("sent_less") or "").strip()
            for name, text in (("sent_more", more), ("sent_less", less)):
                if not text:
                    raise AuditError(f"{where}: empty {name}")
            direction = (rec.get("stereo_antistereo") or "").strip()
            if direction not in DIRECTIONS:
                raise AuditError(f"{where}: stereo_antistereo is {direction!r}; expected 'stereo' or 'antistereo'")
            if sent_more_is_group and direction == "antistereo":
                more, less = less, more
            bias = (rec.get("bias_type") or "").strip() or "unspecified"
            pairs.append(Pair(more, less, direction, bias, i, reader.line_num))
    if not pairs:
        raise AuditError(f"{path}: no pairs (only a header)")
    return pairs


def shared_token_positions(ids_a: list[int], ids_b: list[int]) -> tuple[list[int], list[int]]:
    """Indices (into ``ids_a`` and ``ids_b``) of the tokens the two sequences share: the "equal" opcodes
    of difflib's SequenceMatcher over token ids, as the reference's ``get_span``."""
    matcher = difflib.SequenceMatcher(None, [str(x) for x in ids_a], [str(x) for x in ids_b])
    pos_a, pos_b = [], []
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            pos_a += range(a0, a1)
            pos_b += range(b0, b1)
    return pos_a, pos_b


def masked_log_probs(model, jobs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
                     batch: int = 64) -> list[float]:
    """For each job (input_ids with the positions already masked, positions, original ids at those
    positions): the sum of log-softmax probabilities of the originals at their positions.

    Jobs are grouped by length (no padding), identical inputs run once, and at most ``batch`` rows
    (fewer when B x T x V would exceed MAX_LOGIT_ELEMENTS) go through ``model.full_logits`` at a time.
    """
    import torch

    by_len: dict[int, dict[tuple[int, ...], int]] = defaultdict(dict)
    for ids, _, _ in jobs:
        by_len[len(ids)].setdefault(tuple(ids), len(by_len[len(ids)]))
    max_pos = getattr(getattr(model, "arch", None), "max_positions", None)
    vocab = getattr(getattr(model, "arch", None), "vocab_size", None)
    if max_pos is not None and by_len and max(by_len) > max_pos:
        raise AuditError(f"a sequence of {max(by_len)} tokens exceeds the model's max_positions {max_pos}")
    needed: dict[tuple[int, ...], set[int]] = defaultdict(set)
    for ids, positions, _ in jobs:
        needed[tuple(ids)].update(positions)
    logp: dict[tuple[tuple[int, ...], int], torch.Tensor] = {}  # (input, position) -> log-probs [V]
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.no_grad():
            for length, uniq in sorted(by_len.items()):
                rows = list(uniq)
                step = max(1, batch if vocab is None else min(batch, MAX_LOGIT_ELEMENTS // max(1, length * vocab)))
                for start in range(0, len(rows), step):
                    chunk = rows[start:start + step]
                    x = torch.tensor(chunk, dtype=torch.long)
                    logits = model.full_logits(x)
                    r_idx, p_idx, keys = [], [], []
                    for r, ids in enumerate(chunk):
                        for p in sorted(needed[ids]):
                            r_idx.append(r)
                            p_idx.append(p)
                            keys.append((ids, p))
                    lp = logits[r_idx, p_idx].float().log_softmax(-1)
                    for k, key in enumerate(keys):
                        logp[key] = lp[k]
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    return [float(sum(logp[(tuple(ids), p)][t].item() for p, t in zip(positions, targets)))
            for ids, positions, targets in jobs]


def _content(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(full ids with the post-processor's specials, indices of the non-special tokens in them)."""
    enc = tokenizer.encode(text)
    return list(enc.ids), [i for i, s in enumerate(enc.special_tokens_mask) if not s]


def pair_jobs(tokenizer, sent_a: str, sent_b: str, mask_id: int) -> tuple[list, list]:
    """The masked copies of both sentences: one job per shared token (mask it alone, target = original)."""
    full_a, cont_a = _content(tokenizer, sent_a)
    full_b, cont_b = _content(tokenizer, sent_b)
    shared_a, shared_b = shared_token_positions([full_a[i] for i in cont_a], [full_b[i] for i in cont_b])

    def jobs(full, cont, shared):
        out = []
        for k in shared:
            pos = cont[k]
            masked = list(full)
            masked[pos] = mask_id
            out.append((tuple(masked), (pos,), (full[pos],)))
        return out
    return jobs(full_a, cont_a, shared_a), jobs(full_b, cont_b, shared_b)


def _pct(num: int, den: int) -> float | None:
    return round(num / den * 100, 2) if den else None


def _summary(rows: list[dict]) -> dict:
    n = len(rows)
    neutral = sum(r["prefers_more"] is None for r in rows)
    hits = sum(r["prefers_more"] == 1 for r in rows)
    out = {"n": n, "metric_score": _pct(hits, n), "neutral": neutral, "neutral_pct": _pct(neutral, n)}
    for d, key in (("stereo", "stereo_score"), ("antistereo", "antistereo_score")):
        rs = [r for r in rows if r["direction"] == d]
        decided = [r for r in rs if r["prefers_more"] is not None]
        out[f"n_{d}"] = len(rs)
        out[key] = _pct(sum(r["prefers_more"] for r in decided), len(decided))
    return out


def audit_crows(model, tokenizer, pairs: list[Pair], mask_token: str, batch: int = 64) -> dict:
    """Score every pair (reference metric) and summarize.

    Returns {"n", "metric_score" (% of all N pairs where score(sent_more) > score(sent_less); 50 = no
    preference), "stereo_score" / "antistereo_score" (same, over the non-neutral rows of each direction,
    as the reference; None when there are none), "n_stereo", "n_antistereo", "neutral", "neutral_pct",
    "by_bias_type": {type: same keys}, "skipped": [{"row", "reason"}], "pairs": [{"row", "direction",
    "bias_type", "sent_more_score", "sent_less_score", "prefers_more": 1 | 0 | None (tie)}]}.
    Percentages are rounded to 2 decimals, sentence scores to 3 (the rounding decides ties).
    """
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise AuditError(f"the tokenizer has no mask token {mask_token!r}")
    max_pos = getattr(getattr(model, "arch", None), "max_positions", None)
    all_jobs, spans, skipped = [], [], []
    for pair in pairs:
        jm, jl = pair_jobs(tokenizer, pair.sent_more, pair.sent_less, mask_id)
        longest = max([len(j[0]) for j in jm + jl], default=0)
        if max_pos is not None and longest > max_pos:
            skipped.append({"row": pair.row, "reason": f"{longest} tokens > max_positions {max_pos}"})
            continue
        spans.append((pair, len(all_jobs), len(jm), len(jl)))
        all_jobs += jm + jl
    if skipped:
        log.warning("crows: %d pair(s) skipped (longer than the model's max_positions)", len(skipped))
    scores = masked_log_probs(model, all_jobs, batch=batch)
    rows = []
    for pair, start, n_more, n_less in spans:
        s_more = round(sum(scores[start:start + n_more]), 3)
        s_less = round(sum(scores[start + n_more:start + n_more + n_less]), 3)
        prefers = None if s_more == s_less else int(s_more > s_less)
        rows.append({"row": pair.row, "direction": pair.direction, "bias_type": pair.bias_type,
                     "sent_more_score": s_more, "sent_less_score": s_less, "prefers_more": prefers})
    out = _summary(rows)
    out["by_bias_type"] = {b: _summary([r for r in rows if r["bias_type"] == b])
                           for b in sorted({r["bias_type"] for r in rows})}
    out["skipped"] = skipped
    out["pairs"] = rows
    return out


__all__ = ["AuditError", "Pair", "load_crows_csv", "shared_token_positions", "masked_log_probs", "pair_jobs",
           "audit_crows"]
