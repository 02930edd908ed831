"""Replaced-token detection (ELECTRA's discriminator) on held-out rows, per language.

In: the generator (an MLMEncoder), the discriminator (``Discriminator``), a ``ShardDataset`` and the
``EvaluateConfig``. The validation rows are corrupted as in training: 15% of the non-special tokens
selected (static, keyed by (seed, row)), 85% of them replaced by [MASK] and 15% left unchanged; the
generator's sample (Gumbel-max, special ids excluded, a fixed seed per language) fills the selected
positions; the discriminator labels every non-pad token replaced / original. A sampled token equal
to the original counts as original, as in the paper.

Out per language: rtd_n (scored tokens), rtd_acc (logit > 0 = replaced), rtd_auc (ROC AUC of the
logit), rtd_baseline_acc (predict "original" everywhere = share of original tokens) and
rtd_replaced_rate; a language without validation rows is {"missing": True, "reason": ...}.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

ROWS_PER_BATCH = 32


def _electra_eval_masker(vocab: int, special_ids: Mapping[str, int], seed: int):
    from mlm_core.config import MaskingConfig
    from mlm_core.masking import Masker
    from mlm_core.model.electra import ELECTRA_MASK_PROB
    mcfg = MaskingConfig(strategy="token", rate=0.15, mask_token_prob=ELECTRA_MASK_PROB, random_token_prob=0.0,
                         mode="static", schedule="constant")
    return Masker(mcfg, vocab, sorted(int(i) for i in special_ids.values()), int(special_ids["mask"]), seed, 1)


def evaluate_rtd(gen, disc, shards, cfg, special_ids: Mapping[str, int], seed: int = 0) -> dict[str, dict]:
    import torch

    from mlm_core.model.electra import gumbel_sample, rtd_summary
    from mlm_core.train.evaluator import derive
    vocab = int(gen.arch.vocab_size)
    masker = _electra_eval_masker(vocab, special_ids, seed)
    disallowed = torch.zeros(vocab, dtype=torch.bool)
    disallowed[sorted({int(i) for i in special_ids.values()})] = True
    dev = next(disc.parameters()).device
    out: dict[str, dict] = {}
    langs = sorted(shards.languages("validation"))
    with torch.inference_mode():
        for li, lang in enumerate(langs):
            n_rows = min(shards.rows_per_lang("validation").get(lang, 0), cfg.max_sequences)
            if n_rows == 0:
                out[lang] = {"missing": True, "reason": "no validation rows"}
                continue
            g = torch.Generator(device=dev).manual_seed(derive(seed, 29, li))
            logits, target = [], []
            for start in range(0, n_rows, ROWS_PER_BATCH):
                idx = np.arange(start, min(start + ROWS_PER_BATCH, n_rows))
                b = shards.get_batch("validation", lang, idx)
                m = masker(b["input_ids"], b["word_start"], 0, seq_ids=torch.from_numpy(idx))
                seg = b["segment_ids"].to(torch.int32).to(dev)
                ids, sel = m.input_ids.to(dev), m.selected.to(dev)
                corrupted = ids.clone()
                if bool(sel.any()):
                    glog = gen.mlm_logits(gen.encode(ids, seg), sel)
                    corrupted[sel] = gumbel_sample(glog, disallowed, g)
                original = b["input_ids"].to(dev)
                real = seg != 0
                logits.append(disc.rtd_logits(disc.encode(corrupted, seg))[real].float().cpu().numpy())
                target.append((corrupted != original)[real].cpu().numpy())
            out[lang] = rtd_summary(np.concatenate(logits), np.concatenate(target))
    return out


__all__ = ["evaluate_rtd"]
