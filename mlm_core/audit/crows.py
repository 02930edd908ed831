"""CrowS-Pairs: does a masked LM prefer the more stereotypical sentence of a minimal pair?

In: a CrowS-Pairs file with ``sent_more, sent_less, stereo_antistereo, bias_type`` (other columns
ignored; comma- or tab-separated), a model with ``encode`` + ``mlm_logits`` (our encoder) or
``full_logits(input_ids) -> [B, T, V]``, and a ``tokenizers.Tokenizer``. Out: the metric score
(% of pairs where the model gives ``sent_more`` the higher score; 50 = no preference), stereo and
anti-stereo scores, neutral share, per bias type, pairs with an empty sentence, and per-pair scores.

Reference: Nangia et al. (2020), "CrowS-Pairs", ``metric.py`` (``mask_unigram``) of
github.com/nyu-mll/crows-pairs (commit 8aaac11; line numbers below are that file's), followed exactly:
- sentences are read as the csv module gives them, never stripped (L19-47);
- both sentences are encoded with their special tokens; the positions they share are the "equal"
  blocks of ``difflib.SequenceMatcher(None, ids1, ids2).get_opcodes()`` over the full id sequences
  (``get_span``, L76-95), in the reference's (sent1, sent2) order; the first and last shared
  positions ([CLS], [SEP]) are skipped (L137-138);
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

Masked copies are batched many per forward pass, grouped by length so no padding (and no attention
mask) is needed: batched scores equal one-at-a-time scores (to float32 rounding). Only the target's
log-probability is kept per masked copy.
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
MAX_LOGIT_ELEMENTS = 2**26  # cap on the logits of one forward pass (B x T x V, or K masked x V; ~256 MiB fp32)


class AuditError(MlmError, ValueError):
    """Unusable audit input (missing column, short row, bad label or template); the message names file and row."""


@dataclass(frozen=True)
class Pair:
    """One minimal pair. ``sent_more`` is the more stereotypical sentence (CrowS-Pairs convention). The
    sentences are the file's cells verbatim (spaces kept, possibly empty), as the reference reads them."""

    sent_more: str
    sent_less: str
    direction: str      # stereo | antistereo
    bias_type: str
    row: int            # 1-based data row (header excluded)
    line: int           # line of the file where the row ends (1-based, header = line 1)


DELIMITERS = ("\t", ",", ";")  # tried in this order on the header line; the first that yields every column wins


def _delimiter(path: Path, header_line: str) -> str:
    """The delimiter that splits the header into the CrowS-Pairs columns. The published English file is
    comma-separated; the French one (Neveol et al., 2022) is tab-separated with a leading index column."""
    for d in DELIMITERS:
        names = next(csv.reader([header_line], delimiter=d), [])
        if all(c in names for c in COLUMNS):
            return d
    found = next(csv.reader([header_line]), [])
    raise AuditError(f"{path}: line 1 (header): missing column(s) {[c for c in COLUMNS if c not in found]}; "
                     f"expected {', '.join(COLUMNS)} separated by a tab, a comma or a semicolon, found {header_line!r}")


def check_decodes(path: Path, encoding: str) -> None:
    """AuditError naming the file, line, byte offset and byte when ``path`` does not decode with ``encoding``."""
    from mlm_core.textcheck import decode_message
    msg = decode_message("audit file", path, encoding, "give its encoding in the config, under audit.crows_pairs "
                         "or audit.templates: `<lang>: {path: ..., encoding: mac_roman}` (or cp1252, latin-1...)")
    if msg:
        raise AuditError(msg.removeprefix("audit file: "))


def load_crows_csv(path: Path, *, sent_more_is_group: bool = False, encoding: str = "utf-8") -> list[Pair]:
    """Read a CrowS-Pairs file (comma- or tab-separated, detected from the header). Errors name the file
    and the row (1-based data row and file line).

    Sentences are kept byte for byte, as the reference's ``read_data`` (metric.py L19-47: ``csv.DictReader``
    values, no strip): with byte-level BPE a leading or trailing space changes the tokens. An empty
    sentence is kept too; the reference scores such a pair (both scores 0: neutral) and so does
    ``audit_crows``, which counts them. The labels (direction, bias type) are compared stripped.

    ``sent_more_is_group``: the file puts the stereotyped group's sentence in ``sent_more`` in every row
    (antistereo rows then hold the LESS stereotypical sentence there); their antistereo rows are swapped
    so that ``Pair.sent_more`` is always the more stereotypical sentence.

    ``encoding``: the file's codec (``audit.crows_pairs.<lang>.encoding``); UTF-8 may start with a BOM. Bytes
    that do not decode are an AuditError naming the file, line, byte offset and byte.
    """
    path = Path(path)
    if not path.is_file():
        raise AuditError(f"{path}: CrowS-Pairs file not found")
    check_decodes(path, encoding)
    if encoding.replace("-", "").replace("_", "").lower() in ("utf8", "u8"):
        encoding = "utf-8-sig"
    pairs: list[Pair] = []
    with path.open(encoding=encoding, newline="") as f:
        delimiter = _delimiter(path, f.readline().rstrip("\r\n"))
        f.seek(0)
        reader = csv.DictReader(f, delimiter=delimiter)
        for i, rec in enumerate(reader, start=1):
            where = f"{path}: row {i} (line {reader.line_num})"
            more, less = rec.get("sent_more"), rec.get("sent_less")
            for name, text in (("sent_more", more), ("sent_less", less)):
                if text is None:   # a short row (DictReader's restval), not an empty cell
                    raise AuditError(f"{where}: no {name} field (the row has fewer fields than the header)")
            direction = (rec.get("stereo_antistereo") or "").strip()
            if direction not in DIRECTIONS:
                raise AuditError(f"{where}: stereo_antistereo is {direction!r}; expected 'stereo' or 'antistereo'")
            if sent_more_is_group and direction == "antistereo":
                more, less = less, more
            bias = (rec.get("bias_type") or "").strip() or "unspecified"
            pairs.append(Pair(more, less, direction, bias, i, reader.line_num))
    if not pairs:
        raise AuditError(f"{path}: no pairs (only a header)")
    empty = [p.row for p in pairs if not p.sent_more.strip() or not p.sent_less.strip()]
    if empty:
        log.warning("%s: %d pair(s) with an empty sentence (rows %s); scored as the reference does (neutral)",
                    path, len(empty), ", ".join(map(str, empty[:10])))
    return pairs


def shared_token_positions(ids_a: list[int], ids_b: list[int]) -> tuple[list[int], list[int]]:
    """Indices (into ``ids_a`` and ``ids_b``) of the tokens the two sequences share: the "equal" opcodes
    of difflib's SequenceMatcher over the ids as strings (metric.py ``get_span``, L76-95)."""
    matcher = difflib.SequenceMatcher(None, [str(x) for x in ids_a], [str(x) for x in ids_b])
    pos_a, pos_b = [], []
    for op, a0, a1, b0, b1 in matcher.get_opcodes():
        if op == "equal":
            pos_a += range(a0, a1)
            pos_b += range(b0, b1)
    return pos_a, pos_b


def _use_head_at_positions(model) -> bool:
    """Our encoder can run its vocabulary head at the masked positions only (no [B, T, V] tensor)."""
    return callable(getattr(model, "encode", None)) and callable(getattr(model, "mlm_logits", None))


def _release_freed_memory() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim; a no-op elsewhere). Why: every length group
    allocates activations of new shapes; glibc keeps the freed ones in a fragmented heap, so on the French
    file (114k masked copies) the peak RSS still grew by ~600 MB although less than 5 MB was live."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def masked_log_probs(model, jobs: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
                     batch: int = 64) -> list[float]:
    """For each job (input_ids with the positions already masked, positions, original ids at those
    positions): the sum of log-softmax probabilities of the originals at their positions (float32
    log-softmax as the reference's ``get_log_prob_unigram``, metric.py L50-73; summed in Python floats).

    Jobs are grouped by length (no padding), identical (input, positions) run once, and at most ``batch``
    rows (fewer when the logits would exceed MAX_LOGIT_ELEMENTS) go through the model at a time. Memory:
    right after each forward pass the target's log-probability is gathered and only that float is kept
    (not a vocabulary-sized row per masked copy).
    """
    import torch

    groups: dict[int, dict[tuple, list[int]]] = defaultdict(dict)   # length -> (ids, positions) -> job indices
    for j, (ids, positions, _) in enumerate(jobs):
        groups[len(ids)].setdefault((tuple(ids), tuple(positions)), []).append(j)
    arch = getattr(model, "arch", None)
    max_pos, vocab = getattr(arch, "max_positions", None), getattr(arch, "vocab_size", None)
    if max_pos is not None and groups and max(groups) > max_pos:
        raise AuditError(f"a sequence of {max(groups)} tokens exceeds the model's max_positions {max_pos}")
    at_positions = _use_head_at_positions(model)
    out = [0.0] * len(jobs)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with torch.no_grad():
            for length, uniq in sorted(groups.items()):
                keys = list(uniq)
                per_row = length if not at_positions else max(len(pos) for _, pos in keys)
                step = batch if vocab is None else min(batch, MAX_LOGIT_ELEMENTS // max(1, per_row * vocab))
                step = max(1, step)
                for start in range(0, len(keys), step):
                    chunk = keys[start:start + step]
                    x = torch.tensor([ids for ids, _ in chunk], dtype=torch.long)
                    where = torch.zeros(x.shape, dtype=torch.bool)
                    for r, (_, positions) in enumerate(chunk):
                        where[r, list(positions)] = True
                    if at_positions:
                        logits = model.mlm_logits(model.encode(x), where)      # [K, V], row-major order
                    else:
                        logits = model.full_logits(x)[where]                   # [K, V], row-major order
                    lp = logits.float().log_softmax(-1)
                    # row-major order: row r's positions ascending; k_of maps (r, position) -> row of lp
                    k_of, k = {}, 0
                    for r, (_, positions) in enumerate(chunk):
                        for p in sorted(set(positions)):
                            k_of[(r, p)] = k
                            k += 1
                    k_idx, t_idx, owner = [], [], []
                    for r, key in enumerate(chunk):
                        for j in uniq[key]:
                            _, positions, targets = jobs[j]
                            for p, t in zip(positions, targets):
                                k_idx.append(k_of[(r, p)])
                                t_idx.append(t)
                                owner.append(j)
                    vals = lp[torch.tensor(k_idx), torch.tensor(t_idx)].tolist()
                    del logits, lp
                    for j, v in zip(owner, vals):       # positions in the job's order, as the reference sums
                        out[j] += v
                _release_freed_memory()
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    return out


def pair_jobs(tokenizer, sent_a: str, sent_b: str, mask_id: int) -> tuple[list, list]:
    """The masked copies of both sentences, as metric.py ``mask_unigram`` (L98-157) builds them.

    Both sentences are encoded WITH their special tokens (L122-123), the shared positions come from
    ``get_span`` over those full id sequences (L126), and the first and last shared positions (the
    [CLS] and [SEP] the two sequences always share) are skipped (L137-138: ``range(1, N-1)``). Each
    remaining shared token is masked alone (L139-143) and its original id is the target (L70).
    """
    ids_a, ids_b = list(tokenizer.encode(sent_a).ids), list(tokenizer.encode(sent_b).ids)
    span_a, span_b = shared_token_positions(ids_a, ids_b)

    def jobs(ids, span):
        out = []
        for i in range(1, len(span) - 1):
            masked = list(ids)
            masked[span[i]] = mask_id
            out.append((tuple(masked), (span[i],), (ids[span[i]],)))
        return out
    return jobs(ids_a, span_a), jobs(ids_b, span_b)


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


def score_pairs(model, tokenizer, pairs: list[Pair], mask_token: str, batch: int = 64) -> tuple[list, list]:
    """Unrounded reference scores: ([(pair, score(sent_more), score(sent_less))], skipped [{"row", "reason"}]).

    The reference puts (sent1, sent2) = (sent_more, sent_less) for stereo rows and (sent_less, sent_more)
    for antistereo rows (metric.py L34-39) and matches get_span(sent1, sent2) in that order (L126);
    difflib is not symmetric, so the same order is used here. Pairs longer than the model's
    max_positions are skipped and listed (the reference, made for 512-position models, has no such case).
    """
    mask_id = tokenizer.token_to_id(mask_token)
    if mask_id is None:
        raise AuditError(f"the tokenizer has no mask token {mask_token!r}")
    max_pos = getattr(getattr(model, "arch", None), "max_positions", None)
    all_jobs, spans, skipped = [], [], []
    for pair in pairs:
        if pair.direction == "stereo":
            jm, jl = pair_jobs(tokenizer, pair.sent_more, pair.sent_less, mask_id)
        else:
            jl, jm = pair_jobs(tokenizer, pair.sent_less, pair.sent_more, mask_id)
        longest = max([len(j[0]) for j in jm + jl], default=0)
        if max_pos is not None and longest > max_pos:
            skipped.append({"row": pair.row, "reason": f"{longest} tokens > max_positions {max_pos}"})
            continue
        spans.append((pair, len(all_jobs), len(jm), len(jl)))
        all_jobs += jm + jl
    if skipped:
        log.warning("crows: %d pair(s) skipped (longer than the model's max_positions)", len(skipped))
    scores = masked_log_probs(model, all_jobs, batch=batch)
    return ([(pair, sum(scores[start:start + n_more]), sum(scores[start + n_more:start + n_more + n_less]))
             for pair, start, n_more, n_less in spans], skipped)


def audit_crows(model, tokenizer, pairs: list[Pair], mask_token: str, batch: int = 64) -> dict:
    """Score every pair (reference metric) and summarize.

    Returns {"n", "metric_score" (% of all N pairs where score(sent_more) > score(sent_less); 50 = no
    preference), "stereo_score" / "antistereo_score" (same, over the non-neutral rows of each direction,
    as the reference; None when there are none), "n_stereo", "n_antistereo", "neutral", "neutral_pct",
    "by_bias_type": {type: same keys}, "empty_sentence_rows": rows whose sent_more or sent_less is empty
    or blank (scored, as the reference does: an empty sentence shares only [CLS]/[SEP], so both scores are
    0 and the pair is neutral), "n_empty_sentence", "skipped": [{"row", "reason"}], "pairs": [{"row",
    "direction", "bias_type", "sent_more_score", "sent_less_score", "prefers_more": 1 | 0 | None (tie)}]}.
    Percentages are rounded to 2 decimals, sentence scores to 3 (metric.py L225-226; the rounding decides ties).
    """
    scored, skipped = score_pairs(model, tokenizer, pairs, mask_token, batch=batch)
    rows = []
    for pair, raw_more, raw_less in scored:
        s_more, s_less = round(raw_more, 3), round(raw_less, 3)
        prefers = None if s_more == s_less else int(s_more > s_less)
        rows.append({"row": pair.row, "direction": pair.direction, "bias_type": pair.bias_type,
                     "sent_more_score": s_more, "sent_less_score": s_less, "prefers_more": prefers})
    out = _summary(rows)
    out["by_bias_type"] = {b: _summary([r for r in rows if r["bias_type"] == b])
                           for b in sorted({r["bias_type"] for r in rows})}
    empty = [p.row for p in pairs if not p.sent_more.strip() or not p.sent_less.strip()]
    out["empty_sentence_rows"] = empty
    out["n_empty_sentence"] = len(empty)
    out["skipped"] = skipped
    out["pairs"] = rows
    return out


__all__ = ["AuditError", "Pair", "load_crows_csv", "shared_token_positions", "masked_log_probs", "pair_jobs",
           "score_pairs", "audit_crows"]
