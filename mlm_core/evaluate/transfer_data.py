"""The model-free half of zero-shot transfer (``mlm_core.evaluate.transfer``, which re-exports all of it): text to
model inputs (a plain tokenizer; UPOS sentences as overlapping word windows when longer than the input), the
source-language splits (training, early-stopping validation, held-out source test), and the per-target report
(accuracy, macro-F1, majority baseline, unseen labels, source score and gap). No model runs here.
"""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from mlm_core.config import TransferTask
from mlm_core.evaluate.conll import ConllError
from mlm_core.evaluate.protocols import per_class_prf
from mlm_core.register.gates import transfer_gap

VALIDATION_FRACTION = 0.1


# ---- tokenization ----------------------------------------------------------------------------------
def plain_tokenizer(tok):
    """A copy of ``tok`` with padding and truncation off (we pad per batch and truncate ourselves)."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_str(tok.to_str())
    t.no_padding()
    t.no_truncation()
    return t


def word_windows(n: int, width: int, stride: int) -> list[int]:
    """Start offsets of windows of ``width`` over ``n`` content subwords: 0, stride, 2*stride, ..., the last
    one reaching the end (a single window when everything fits)."""
    starts = [0]
    while starts[-1] + width < n:
        starts.append(starts[-1] + stride)
    return starts


def best_window(pos: int, starts: list[int], width: int, n: int) -> int:
    """The window scoring subword ``pos``: the most context on its nearer side (min of left and right
    context), ties to the longer window, then the earlier (BERT's ``_check_is_max_context``)."""
    best, best_score = -1, None
    for k, a in enumerate(starts):
        length = min(width, n - a)
        if a <= pos < a + length:
            score = min(pos - a, a + length - 1 - pos) + 0.01 * length
            if best_score is None or score > best_score:
                best, best_score = k, score
    return best


class Window(NamedTuple):
    ids: list[int]     # at most max_len subword ids, the tokenizer's specials included
    first: list[int]   # per word of the sentence: position of its first subword if this window scores it, else -1
    start: int         # offset of the window in the sentence's subwords (position p here is start + p there)


def encode_words(tok, sentences: list[list[str]], max_len: int) -> list[list[Window]]:
    """Per sentence, its windows (one when the sentence fits). Every word with a subword is scored in
    exactly one window."""
    out = []
    for enc, words in zip(tok.encode_batch(sentences, is_pretokenized=True), sentences):
        ids, wids, special = enc.ids, enc.word_ids, enc.special_tokens_mask
        content = [i for i, m in enumerate(special) if not m]
        lo, hi = (content[0], content[-1] + 1) if content else (len(ids), len(ids))
        prefix, body, suffix = ids[:lo], ids[lo:hi], ids[hi:]
        body_w = wids[lo:hi]
        width = max(1, max_len - len(prefix) - len(suffix))
        starts = word_windows(len(body), width, max(1, width // 2))
        firsts = [[-1] * len(words) for _ in starts]
        seen = set()
        for p, w in enumerate(body_w):
            if w is not None and w not in seen:
                seen.add(w)
                k = best_window(p, starts, width, len(body))
                firsts[k][w] = len(prefix) + p - starts[k]
        out.append([Window(prefix + body[a: a + width] + suffix, f, a) for a, f in zip(starts, firsts)])
    return out


def flat_windows(encoded: list[list[Window]]) -> list[Window]:
    return [w for windows in encoded for w in windows]


def window_counts(encoded: list[list[Window]], max_len: int) -> dict:
    """Sentences that needed more than one window, and the words whose first subword lies at or past
    ``max_len`` in the whole sentence (those a single truncated input scored wrong)."""
    past = sum(w.start + p >= max_len for ws in encoded for w in ws for p in w.first if p >= 0)
    return {"long_sentences": sum(len(ws) > 1 for ws in encoded), "words_past_max_len": past}


def encode_texts(tok, texts: list[str], max_len: int) -> list[list[int]]:
    return [enc.ids[:max_len] or [0] for enc in tok.encode_batch(texts)]


# ---- splits and scores -----------------------------------------------------------------------------
def source_splits(train: list, dev: list | None, cap: int | None, seed: int,
                  test_fraction: float = 0.0) -> tuple[list, list, list]:
    """(train, validation, test): the dev list, or a seeded 10% of train, for early stopping; a seeded
    ``test_fraction`` of train held out from both for the source score (empty when 0); each capped at ``cap``."""
    rng = random.Random(seed)
    train = list(train)
    rng.shuffle(train)
    need = (1 if test_fraction else 0) + (1 if dev is None else 0)
    if len(train) < need + 1:
        raise ConllError(f"the source training data has {len(train)} example(s): too few to hold out "
                         f"{'validation and test' if need == 2 else 'validation' if dev is None else 'a test split'}")
    n_test = max(1, round(test_fraction * len(train))) if test_fraction else 0
    test, train = train[:n_test], train[n_test:]
    if dev is None:
        n_val = max(1, round(VALIDATION_FRACTION * (len(train) + n_test)))
        dev, train = train[:n_val], train[n_val:]
    if cap is not None and len(dev) > cap:     # the held-out 10% too (it was 1,254 EWT sentences at a cap of 200)
        dev = rng.sample(dev, cap)
    if cap is not None and len(test) > cap:
        test = rng.sample(test, cap)
    if cap is not None and len(train) > cap:
        train = rng.sample(train, cap)
    return train, list(dev), test


def needs_source_test(task: TransferTask, base_dir: Path) -> bool:
    """A held-out source test split is needed unless a target file scores the source language on other data:
    a source-language target that is the training file itself would score the model on what it was fit on."""
    path = task.targets.get(task.source_lang)
    return path is None or _same_file(path, task.train, base_dir)


def _same_file(a: str, b: str, base_dir: Path) -> bool:
    return (Path(base_dir) / a.split("#", 1)[0]).resolve() == (Path(base_dir) / b.split("#", 1)[0]).resolve()


def accuracy(pred: list[str | None], gold: list[str]) -> float:
    return sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))


def target_report(pred: list[str | None], gold: list[str], source_labels: set[str], majority: str) -> dict:
    """score (accuracy), macro-F1 and per-class precision/recall/F1 (``protocols.per_class_prf``), majority
    baseline, n, unseen labels (gold labels absent from the source training data)."""
    unseen = Counter(g for g in gold if g not in source_labels)
    prf = per_class_prf(pred, gold)
    return {"score": round(accuracy(pred, gold), 5), "macro_f1": prf["macro_f1"], "per_class": prf["per_class"],
            "majority_baseline": round(accuracy([majority] * len(gold), gold), 5), "n": len(gold),
            "unseen_labels": {"count": sum(unseen.values()), "labels": sorted(unseen)}}


def finish_report(kind: str, task: TransferTask, res, targets: dict[str, dict], labels: list[str], majority: str,
                  n_train: int, n_val: int, source_test: dict | None) -> dict:
    """Add source score and gap to each target; assemble the task's report. The source score is never the
    early-stopping validation score (the best of several epochs is biased upward) nor a score on training
    data: it is the source-language target file when that is not the training file, else ``source_test``
    (a held-out split of the training file, seen neither in fitting nor in early stopping), which then also
    replaces a source-language target that named the training file."""
    if source_test is not None:
        if task.source_lang in targets:
            targets[task.source_lang] = dict(source_test, scored_on="held-out source test split")
        src, source_on = source_test, "held-out"
    else:
        src, source_on = targets[task.source_lang], "test"
    source_score, source_majority = src["score"], src["majority_baseline"]
    for t in targets.values():
        t["source_score"] = source_score
        t["gap"] = round(transfer_gap(source_score, t["score"]), 5)
    return {"task": kind, "metric": "accuracy", "source_lang": task.source_lang, "source_score": source_score,
            "source_macro_f1": src.get("macro_f1"),
            "source_score_on": source_on, "n_source_test": src["n"], "source_majority_baseline": source_majority,
            "validation_score": round(res.best_score, 5), "n_train": n_train, "n_validation": n_val,
            "labels": labels, "majority_label": majority, "best_epoch": res.best_epoch,
            "epochs_run": len(res.history), "stopped_early": res.stopped_early, "steps": res.steps,
            "history": res.history, "targets": targets}
