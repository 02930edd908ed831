"""The untrained-encoder control of zero-shot transfer: what fine-tuning alone reaches without pretraining.

A transfer score means little on its own: an English-trained tagger on a randomly initialised encoder already
reaches most of the pretrained model's English UPOS accuracy (word identity is most of the signal), and on
targets the two can cross. So every transfer task (``evaluate.untrained_control``) also fine-tunes the
untrained encoder and reports, per target, ``untrained_score`` and ``gain_over_untrained`` = score −
untrained_score with a 95% interval.

In: the loaded encoder and the run's training seed (``untrained_like``); per target, the two models'
predictions, the gold labels and the sentence of each item (``paired_gain``). Out: a fresh encoder; the gain
and its interval.

- The untrained encoder is the same class and architecture as the evaluated one, built right after
  ``torch.manual_seed(seed)``: exactly the weights pretraining starts from at step 0 (``train.stage`` seeds
  torch with the run's training seed, then ``build_model``; an ELECTRA run builds its discriminator, the
  encoder transfer uses, first). The caller's global RNG is left as it was. With ``pretrain.init_from`` it is
  still this random initialisation (the control measures the checkpoint and the pretraining together), and
  ``debias.projection`` is not applied to it (the subspace is the pretrained model's).
- Interval: a paired percentile bootstrap over target *sentences* (the words of one sentence are not
  independent draws): per word d = [pretrained correct] − [untrained correct]; each of
  ``resample.BOOTSTRAP_SAMPLES`` replicates resamples the sentences with replacement and takes
  sum(d) / words over the drawn sentences (``resample.bootstrap_ci``, seeded with the run's training seed, so
  the interval is a function of the config). For sentence classification each example is its own sentence.
- ``zero_shot``: the mean over the targets other than the source language of score, untrained_score and gain,
  with an interval from the per-target replicates averaged (``mean_gain``).
"""
from __future__ import annotations

import numpy as np

ROUND = 5       # decimals, as the transfer scores


def untrained_like(model, seed: int):
    """A fresh ``type(model)(model.arch)`` built right after ``torch.manual_seed(seed)``, in eval mode."""
    import torch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = type(model)(model.arch)
    return fresh.eval()


def correct(pred: list, gold: list) -> np.ndarray:
    """1.0 where the prediction equals the gold label (a missing prediction, None, is wrong)."""
    if len(pred) != len(gold):
        raise ValueError(f"{len(pred)} predictions for {len(gold)} gold labels")
    return np.fromiter((p is not None and p == g for p, g in zip(pred, gold)), dtype=np.float64, count=len(gold))


def paired_gain(pred: list, untrained: list, gold: list, groups: list[int], seed: int) -> dict:
    """{"untrained_score", "gain_over_untrained", "gain_over_untrained_ci_low", "..._ci_high"} (module doc)."""
    from mlm_core.evaluate.resample import bootstrap_ci
    if len(groups) != len(gold):
        raise ValueError(f"{len(groups)} sentence ids for {len(gold)} gold labels")
    a, b = correct(pred, gold), correct(untrained, gold)
    d = a - b
    lo, hi = bootstrap_ci(np.asarray(groups), d, seed=seed) if len(d) else (None, None)
    mean = float(d.mean()) if len(d) else None
    r = lambda v: None if v is None else round(v, ROUND)      # noqa: E731
    return {"untrained_score": r(float(b.mean()) if len(b) else None), "gain_over_untrained": r(mean),
            "gain_over_untrained_ci_low": r(lo), "gain_over_untrained_ci_high": r(hi)}


def mean_gain(parts: list[tuple], seed: int) -> dict:
    """The zero-shot mean over targets: per target (pred, untrained, gold, groups), the unweighted mean of the
    targets' scores, untrained scores and gains, and a 95% interval of the mean gain: the replicates of each
    target's sentence bootstrap (``resample.bootstrap_replicates``, the same seed for every target, so the
    parallel PUD treebanks, the same sentences in every language, are resampled jointly) averaged over targets."""
    from mlm_core.evaluate.resample import bootstrap_replicates
    scores, untrained, reps = [], [], []
    for pred, ctrl, gold, groups in parts:
        a, b = correct(pred, gold), correct(ctrl, gold)
        scores.append(float(a.mean()))
        untrained.append(float(b.mean()))
        reps.append(bootstrap_replicates(np.asarray(groups), a - b, seed))
    lo, hi = np.quantile(np.mean(reps, axis=0), [0.025, 0.975])
    n = len(parts)
    return {"score": round(sum(scores) / n, ROUND), "untrained_score": round(sum(untrained) / n, ROUND),
            "gain_over_untrained": round(sum(scores) / n - sum(untrained) / n, ROUND),
            "gain_over_untrained_ci_low": round(float(lo), ROUND), "gain_over_untrained_ci_high": round(float(hi), ROUND)}


def attach(report: dict, reported: dict[str, str], source_key: str, pred: dict, control: tuple, gold: dict,
           groups: dict, seed: int) -> dict:
    """Add the control to a task ``report`` (``transfer.finish_report``'s) in place and return it.

    ``reported``: target language -> the key of the split its figures were scored on (``pred``, ``gold``,
    ``groups``: per split key, flat over its items); ``source_key``: the split the source score comes from;
    ``control``: (FitResult, weights digest, predictions per split key) of the untrained encoder. Each target gets
    ``paired_gain``; the report gets ``untrained`` (its source and validation scores, epochs, steps, history,
    digest), ``source_gain_over_untrained`` and, over the targets other than the source language,
    ``zero_shot`` (``mean_gain``, with the target list)."""
    res, digest, c_pred = control
    for lang, key in reported.items():
        report["targets"][lang].update(paired_gain(pred[key], c_pred[key], gold[key], groups[key], seed))
    src = paired_gain(pred[source_key], c_pred[source_key], gold[source_key], groups[source_key], seed)
    report["untrained"] = {"source_score": src["untrained_score"], "validation_score": round(res.best_score, ROUND),
                           "best_epoch": res.best_epoch, "steps": res.steps, "history": res.history,
                           "finetuned_sha256": digest}
    report["source_gain_over_untrained"] = {k: src[k] for k in CONTROL_KEYS[1:]}
    zero_shot = sorted(lang for lang in reported if lang != report["source_lang"])
    if zero_shot:
        parts = [(pred[reported[k]], c_pred[reported[k]], gold[reported[k]], groups[reported[k]]) for k in zero_shot]
        report["zero_shot"] = {"targets": zero_shot, **mean_gain(parts, seed)}
    return report


CONTROL_KEYS = ("untrained_score", "gain_over_untrained", "gain_over_untrained_ci_low", "gain_over_untrained_ci_high")

__all__ = ["CONTROL_KEYS", "attach", "correct", "mean_gain", "paired_gain", "untrained_like"]
