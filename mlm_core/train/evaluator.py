"""Validation during pretraining: fixed batches per language, masked once with a fixed seed, so every pass
is comparable (and a resumed run scores exactly what a straight run scores).

Per language: masked loss and top-1 accuracy of the MLM (the generator for ELECTRA), the unigram
baseline's accuracy at the same positions (``mlm_core.unigram``: the whole train split), and for ELECTRA
the discriminator's replaced-token accuracy, AUC and the all-original baseline.

``acc`` / ``baseline_acc`` score every selected target of the 80/10/10 corruption, including the ~10% left
unchanged, which a model learns to copy (90-98% right) and the baseline cannot: a frequency model reads
"acc 0.12 vs baseline 0.045". What measures learning is scored on the ``[MASK]`` inputs only (``mask_scores``):
``mask_acc`` vs ``mask_baseline_acc`` on the same positions, ``mask_n`` positions, ``distinct_predictions``
(distinct argmax tokens there; a frequency model makes a handful) and ``top_prediction_share``, and a 95%
interval of ``mask_acc - mask_baseline_acc`` (``mask_over_baseline_ci_low`` / ``_high``): the positions are
paired (the same position scored by model and baseline) and positions of one row are not independent, so
whole validation rows are resampled (a paired cluster bootstrap, ``BOOTSTRAP`` draws, percentile interval,
a fixed seed per language: every pass and every resume draws the same resamples).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mlm_core.config import PretrainConfig

BOOTSTRAP = 1000          # resamples of validation rows for the interval of mask_acc - mask_baseline_acc


def derive(*words: int) -> int:
    """A 62-bit seed from integer words (seed, rank, step, stream...), independent across words."""
    return int(np.random.SeedSequence([int(w) % 2**63 for w in words]).generate_state(1, np.uint64)[0] % 2**62)


def mask_scores(pred, target, rows, top: int, seed: int, draws: int = BOOTSTRAP) -> dict:
    """Scores at the [MASK] positions of one language: the model's argmax ``pred`` against ``target`` (the
    original tokens), the unigram baseline's ``top`` on the same positions, and the 95% paired bootstrap
    interval of the difference, resampling the validation ``rows`` the positions belong to (clusters).

    -> {mask_acc, mask_baseline_acc, mask_n, distinct_predictions, top_prediction_share,
    mask_over_baseline_ci_low, mask_over_baseline_ci_high}; with no [MASK] position: mask_n 0 and no figures."""
    pred, target, rows = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (pred, target, rows))
    n = len(target)
    if n == 0:
        return {"mask_n": 0}
    hit_m, hit_b = pred == target, target == top
    _, counts = np.unique(pred, return_counts=True)
    out = {"mask_acc": float(hit_m.mean()), "mask_baseline_acc": float(hit_b.mean()), "mask_n": int(n),
           "distinct_predictions": int(len(counts)), "top_prediction_share": float(counts.max() / n)}
    # per row: summed paired difference and position count; a resample of rows -> sum(d) / sum(n)
    _, inv = np.unique(rows, return_inverse=True)
    d_row = np.bincount(inv, weights=hit_m.astype(np.float64) - hit_b)
    n_row = np.bincount(inv).astype(np.float64)
    pick = np.random.default_rng(seed).integers(0, len(n_row), size=(draws, len(n_row)))
    diffs = d_row[pick].sum(1) / n_row[pick].sum(1)
    lo, hi = np.quantile(diffs, [0.025, 0.975])
    return out | {"mask_over_baseline_ci_low": float(lo), "mask_over_baseline_ci_high": float(hi)}


class Evaluator:
    def __init__(self, cfg: PretrainConfig, ds, masker_cls, vocab: int, specials: dict, seed: int, objective):
        from mlm_core.unigram import unigram_top
        fixed = objective.masking(cfg.masking.model_copy(update={"mode": "dynamic", "schedule": "constant"}))
        from mlm_core.masking.pmi import collocations_for          # strategy pmi: the tokenizer's n-gram vocabulary
        masker = masker_cls(fixed, vocab, sorted(specials.values()), specials["mask"], seed, 1,
                            unk_id=specials.get("unk"), collocations=collocations_for(fixed, ds))
        langs = ds.languages("validation")
        self.objective = objective
        self.mask_id = int(specials["mask"])
        self.top = unigram_top(ds, sorted(specials.values()), [lg for lg in langs if lg in ds.languages("train")])
        self.batches: dict[str, list] = {}
        self.distinct: dict[str, dict] = {}
        B = cfg.batch_size
        for i, lang in enumerate(langs):
            n = len(ds.columns("validation", lang)["input_ids"])
            if n == 0 or lang not in self.top:
                continue
            g = torch.Generator().manual_seed(derive(seed, 17, i))
            idx = np.arange(B * cfg.eval_batches) % n
            out = []
            seen = np.zeros((n, ds.seq_len), dtype=bool)      # distinct (row, position) pairs ever masked
            for k in range(cfg.eval_batches):
                b = ds.get_batch("validation", lang, idx[k * B:(k + 1) * B])
                m = masker(b["input_ids"], b["word_start"], 0, generator=g)
                out.append((m.input_ids, b["segment_ids"].to(torch.int32), m.labels,
                            torch.from_numpy(idx[k * B:(k + 1) * B].astype(np.int64))))
                np.logical_or.at(seen, idx[k * B:(k + 1) * B], (m.labels != -100).numpy())   # rows may repeat
            self.batches[lang] = out
            # fewer rows than batch_size * eval_batches: rows repeat with fresh masks, so `n` (masked
            # predictions) overstates how much text was scored; `rows` and `positions` say it
            self.distinct[lang] = {"rows": int(min(n, len(idx))), "positions": int(seen.sum())}
        self.seed = seed

    @torch.no_grad()
    def __call__(self, model: nn.Module, device: torch.device, precision: str) -> dict[str, dict]:
        from mlm_core.model.electra import rtd_summary
        from mlm_core.train.step import autocast
        was = model.training
        model.eval()
        res = {}
        for i, (lang, batches) in enumerate(self.batches.items()):
            sg = torch.Generator(device=device).manual_seed(derive(self.seed, 23, i))
            loss = correct = base = n = 0.0
            d_logits, d_target = [], []
            at_mask = []                               # (prediction, target, row) at the [MASK] inputs
            for ids, seg, labels, rows in batches:
                ids, seg, labels = ids.to(device), seg.to(device), labels.to(device)
                with autocast(device, precision):
                    out = self.objective.forward(model, ids, seg, labels, 0.0, sample_generator=sg)
                y = labels[labels != -100]
                logits = out["logits"].float()
                loss += float(F.cross_entropy(logits, y, reduction="sum")) if len(y) else 0.0
                pred = logits.argmax(-1)
                correct += float((pred == y).sum())
                sel = labels != -100                   # logits are the selected positions, row-major
                masked = (ids[sel] == self.mask_id).cpu()
                row = rows[sel.nonzero()[:, 0].cpu()]
                at_mask.append((pred.cpu()[masked], y.cpu()[masked], row[masked]))
                base += float((y == self.top[lang]).sum())
                n += len(y)
                if "disc_logits" in out:
                    d_logits.append(out["disc_logits"].float().cpu().numpy())
                    d_target.append(out["disc_target"].cpu().numpy())
            r = {"loss": loss / max(n, 1), "acc": correct / max(n, 1), "baseline_acc": base / max(n, 1), "n": int(n),
                 **self.distinct[lang]}
            r |= mask_scores(*(torch.cat(parts).numpy() for parts in zip(*at_mask)), self.top[lang],
                             derive(self.seed, 29, i))
            if d_logits:
                s = rtd_summary(np.concatenate(d_logits), np.concatenate(d_target) > 0.5)
                r |= {"disc_acc": s["rtd_acc"], "disc_baseline_acc": s["rtd_baseline_acc"]}
                if s["rtd_auc"] is not None:        # one class only (nothing replaced): no AUC, not a zero
                    r["disc_auc"] = s["rtd_auc"]
            res[lang] = r
        model.train(was)
        return res


__all__ = ["Evaluator", "derive", "mask_scores", "BOOTSTRAP"]
