"""Fine-tuning evaluation protocols for small downstream sets: per-class precision / recall / F1 and macro-F1
next to accuracy, stratified k-fold cross-validation (mean ± std over folds), the primary metric early stopping
tracks.

- Per class c (gold labels and predicted labels; a missing prediction, None, is wrong and predicts nothing):
  precision = TP / (TP + FP), recall = TP / (TP + FN), F1 = 2PR / (P + R), each 0 when its denominator is 0
  (scikit-learn's ``zero_division=0``). macro-F1 = the unweighted mean of F1 over the classes present in the
  gold labels or the predictions (scikit-learn's default label set).
- Stratified folds: each class's examples, shuffled with the seed, are dealt round-robin over the k folds,
  each class continuing where the previous one stopped, so every fold holds floor or ceil of n_c / k examples
  of class c (within 1 of its share) and fold sizes differ by at most 1.
- Cross-validation (``finetune.cv``, ``transfer.classification_cv``): fold i is the test fold, fold i+1 (mod k) the held-out fold early stopping
  tracks the primary metric on, the other k-2 folds train. Reported per fold and as mean ± std (sample std,
  n-1) of accuracy and macro-F1, and the mean per-class F1.
"""
from __future__ import annotations

import logging
import math
import random
from collections import Counter

log = logging.getLogger(__name__)

METRICS = ("accuracy", "macro_f1")


def per_class_prf(pred: list, gold: list) -> dict:
    """{"accuracy", "macro_f1", "per_class": {label: {"precision", "recall", "f1", "support"}}} (module doc)."""
    labels = sorted({g for g in gold} | {p for p in pred if p is not None})
    tp, fp, fn = Counter(), Counter(), Counter()
    for p, g in zip(pred, gold):
        if p == g:
            tp[g] += 1
        else:
            fn[g] += 1
            if p is not None:
                fp[p] += 1
    per_class = {}
    for c in labels:
        prec = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else 0.0
        rec = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        per_class[c] = {"precision": round(prec, 5), "recall": round(rec, 5), "f1": round(f1, 5),
                        "support": tp[c] + fn[c]}
    macro = sum(v["f1"] for v in per_class.values()) / len(per_class) if per_class else 0.0
    acc = sum(p == g for p, g in zip(pred, gold)) / max(1, len(gold))
    return {"accuracy": round(acc, 5), "macro_f1": round(macro, 5), "per_class": per_class}


def primary_score(metric: str, pred: list, gold: list) -> float:
    """The primary metric (``finetune.primary_metric``) of predictions: what early stopping maximizes."""
    if metric not in METRICS:
        raise ValueError(f"finetune.primary_metric {metric!r}: one of {', '.join(METRICS)}")
    m = per_class_prf(pred, gold)
    return m[metric]


def stratified_folds(labels: list, k: int, seed: int) -> list[list[int]]:
    """k lists of example indices (module doc); every index in exactly one fold."""
    if k < 2:
        raise ValueError(f"stratified folds need k >= 2, got {k}")
    rng = random.Random(seed)
    by_class: dict = {}
    for i, lab in enumerate(labels):
        by_class.setdefault(lab, []).append(i)
    folds: list[list[int]] = [[] for _ in range(k)]
    nxt = 0
    for lab in sorted(by_class, key=str):
        idx = by_class[lab]
        rng.shuffle(idx)
        for i in idx:
            folds[nxt].append(i)
            nxt = (nxt + 1) % k
    return [sorted(f) for f in folds]


def mean_std(values: list[float]) -> dict:
    n = len(values)
    mean = sum(values) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": round(mean, 5), "std": round(std, 5)}


def cross_validate(examples: list, labels: list, k: int, seed: int, run_fold) -> dict:
    """``run_fold(train, validation, test, fold) -> per_class_prf dict (+ best_epoch...)`` over stratified folds:
    test = fold i, validation = fold i+1 (mod k), train = the rest. Returns folds and mean ± std."""
    if k < 3:
        raise ValueError(f"finetune.cv_folds must be >= 3 (a test, a validation and a training fold), got {k}")
    if len(examples) < k:
        raise ValueError(f"cross-validation with finetune.cv_folds={k} needs at least {k} source examples, "
                         f"got {len(examples)}")
    folds = stratified_folds(labels, k, seed)
    results = []
    for i in range(k):
        test = [examples[j] for j in folds[i]]
        val = [examples[j] for j in folds[(i + 1) % k]]
        train = [examples[j] for f in range(k) if f not in (i, (i + 1) % k) for j in folds[f]]
        res = run_fold(train, val, test, i)
        results.append({"fold": i, "n_train": len(train), "n_validation": len(val), "n_test": len(test), **res})
    classes = sorted({c for r in results for c in r["per_class"]}, key=str)
    return {"k": k, "folds": results,
            **{m: mean_std([r[m] for r in results]) for m in METRICS},
            "per_class_f1": {c: mean_std([r["per_class"].get(c, {}).get("f1", 0.0) for r in results]) for c in classes}}


__all__ = ["METRICS", "cross_validate", "mean_std", "per_class_prf", "primary_score", "stratified_folds"]
