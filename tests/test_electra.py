"""ELECTRA as in the paper (Clark et al., 2020; google-research/electra) and scored honestly.

One short run of the real pretrain stage (module fixture: 600 steps, ~20 s on one thread) on a small structured
corpus built here: per language, documents are windows of a fixed cyclic sequence of 40 invented words
(distinct syllables per language), so held-out documents follow the same rule as the training ones.
The generator is trained with label smoothing 0.3: a smoothed generator keeps a share of implausible
samples, which a CI-sized discriminator can learn to spot within a few hundred steps. Measured without it
(tiny model, demo corpus, 300-2000 steps): the discriminator's AUC stays 0.52-0.59 and its accuracy equals
the all-original baseline, because the generator's plausible replacements are undetectable at that scale.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from test_train import LANGS, _lc, tiny_cfg, tiny_shards

import torch  # a required dependency: missing must fail loudly, not skip the module
pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEAVY_FIXTURES = {"run"}   # module fixture that trains an ELECTRA run: its tests are heavy (tests/conftest.py)

SYL = {"en": ["ka", "lo", "mi", "tu", "re", "sa", "no", "vi"], "fr": ["pe", "ri", "zo", "fa", "du", "mo", "la", "ni"],
       "ru": ["да", "ки", "мо", "ре", "лу", "со", "ни", "ва"]}
BERT_IDS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}       # tiny_shards' special ids


def cyclic_corpus(root: Path, n_docs: int = 600, n_words: int = 40, seed: int = 0) -> Path:
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for lg in LANGS:
        words: list[str] = []
        while len(words) < n_words:
            w = "".join(rng.choice(SYL[lg]) for _ in range(3))
            if w not in words:
                words.append(w)
        docs = []
        for _ in range(n_docs):
            start, n = rng.randrange(n_words), rng.randint(6, 14)
            docs.append(" ".join(words[(start + i) % n_words] for i in range(n)))
        (root / f"{lg}.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    return root


def electra_cfg(**over):
    base = dict(objective="electra", model={"hidden": 64, "layers": 2, "heads": 2, "dropout": 0.0}, steps=600,
                batch_size=16, lr=2e-3, warmup_steps=10, log_every=50, eval_every=1000, eval_batches=4,
                checkpoint_every=1000, label_smoothing=0.3, electra={"generator_fraction": 0.5})
    return base | over


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(pretrain manifest, output folder, shards Artifact) of one short ELECTRA stage run."""
    from mlm_core.train.stage import run_pretrain
    root = tmp_path_factory.mktemp("electra")
    shards, tok = tiny_shards(root / "data", n_docs=600, corpus=cyclic_corpus(root / "corpus", n_docs=600))
    lc = _lc(root, **electra_cfg())
    out = root / "out"
    out.mkdir()
    m = run_pretrain(lc, {"shards": shards, "tokenizer": tok}, out, checkpoint_dir=root / "ck")
    return m, out, shards


# ------------------------------------------------------------------------------------------------ learning
@pytest.mark.heavy
def test_short_run_beats_both_baselines_in_training_and_in_evaluate(run):
    """Held-out rows: the discriminator's replaced-token accuracy beats predicting "original" everywhere,
    and the generator's top-1 beats the unigram baseline, in the loop's validation and in evaluate."""
    from mlm_core.config import EvaluateConfig
    from mlm_core.evaluate.intrinsic import run_intrinsic
    m, out, shards = run
    assert set(m["eval"]) == set(LANGS)
    for lang, r in m["eval"].items():
        assert r["acc"] > r["baseline_acc"], (lang, r)
        assert r["disc_acc"] > r["disc_baseline_acc"], (lang, r)
        assert 0.5 < r["disc_baseline_acc"] < 0.95 and r["disc_auc"] > 0.55, (lang, r)
    ev = run_intrinsic(out, shards.path, None, EvaluateConfig(max_sequences=64, pll_sentences=0), seed=5)
    assert ev["mlm_model"] == "generator"
    for lang, r in ev["intrinsic"].items():
        assert r["top1"] > r["baseline_top1"], (lang, r)
        assert r["rtd_acc"] > r["rtd_baseline_acc"] and r["rtd_auc"] > 0.55, (lang, r)
        assert r["rtd_n"] > 200


def test_rtd_metrics_flow_into_the_evaluate_outputs_and_the_gates():
    from mlm_core.config import GatesConfig
    from mlm_core.evaluate.stage import flat_metrics, intrinsic_rows
    from mlm_core.register.gates import evaluate_gates
    ev = {"intrinsic": {"en": {"top1": 0.3, "baseline_top1": 0.1, "rtd_acc": 0.9, "rtd_baseline_acc": 0.86,
                               "rtd_auc": 0.7},
                        "fr": {"top1": 0.3, "baseline_top1": 0.1, "rtd_acc": 0.85, "rtd_baseline_acc": 0.86,
                               "rtd_auc": 0.52}}}
    assert {"en.rtd_acc", "en.rtd_auc", "fr.rtd_baseline_acc"} <= set(flat_metrics(ev))
    assert intrinsic_rows(ev)[0]["rtd_auc"] == 0.7
    res = {r.name: r for r in evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_rtd_auc=0.6,
                                                         min_rtd_acc_over_baseline=0.0), ev, {})}
    assert res["min_rtd_auc/en"].passed and not res["min_rtd_auc/fr"].passed
    assert res["min_rtd_acc_over_baseline/en"].passed and not res["min_rtd_acc_over_baseline/fr"].passed
    assert res["min_rtd_acc_over_baseline/en"].value == pytest.approx(0.04)
    mlm_only = {"intrinsic": {"en": {"top1": 0.3, "baseline_top1": 0.1}}}
    (g,) = evaluate_gates(GatesConfig(min_top1_over_baseline=None, min_rtd_auc=0.6), mlm_only, {})
    assert not g.passed and "not an ELECTRA discriminator" in g.detail


def test_roc_auc_is_the_pairwise_probability():
    from mlm_core.model.electra import roc_auc
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=300), 1)                   # rounded: many ties
    y = rng.random(300) < 0.3 + 0.2 * (s > 0)
    pos, neg = s[y], s[~y]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (len(pos) * len(neg))
    assert roc_auc(s, y) == pytest.approx(pairwise, abs=1e-12)
    assert roc_auc(s, np.zeros(300, bool)) is None


# ------------------------------------------------------------------------------------------------ the paper
def _tiny_electra(position="learned", tie=True, seed=0):
    from mlm_core.config import PretrainConfig
    from mlm_core.train.loop import build_model
    cfg = PretrainConfig.model_validate(electra_cfg(model={"size": "tiny", "layers": 2, "hidden": 32, "heads": 2,
                                                           "max_positions": 64, "position": position,
                                                           "tie_embeddings": tie}))
    torch.manual_seed(seed)
    model, _ = build_model(cfg, 200, 0, special_ids=list(BERT_IDS.values()))
    return cfg, model


def test_generator_and_discriminator_share_the_whole_embedding_block(run):
    from safetensors.torch import load_file
    _, model = _tiny_electra()
    for name in ("tok_emb", "pos_emb", "type_emb", "emb_norm"):
        for (a, pa), (b, pb) in zip(getattr(model.gen, name).named_parameters(), getattr(model.disc, name).named_parameters()):
            assert pa is pb, f"{name}.{a} is not shared"
    if model.gen.arch.tie_embeddings:
        assert model.gen.decoder.weight is model.disc.tok_emb.weight
    # the E-wide shared tables reach the narrower generator through a projection (ElectraConfig.embedding_size)
    assert model.gen.arch.embedding_size == 32 and model.gen.arch.hidden == 16 and model.gen.emb_proj.in_features == 32
    # and after a real run, both saved networks hold the same trained tables
    from mlm_core.evaluate.intrinsic import load_discriminator
    from mlm_core.fillmask import load_model_dir
    _, out, _ = run
    g, d = load_model_dir(out)[0].state_dict(), load_discriminator(out).state_dict()
    for k in ("tok_emb.weight", "pos_emb.weight", "type_emb.weight", "emb_norm.weight", "emb_norm.bias"):
        assert torch.equal(g[k], d[k]), k
    assert not any(k.startswith(("head_", "decoder")) for k in load_file(str(out / "discriminator.safetensors"))), \
        "the discriminator has no MLM head"


def test_generator_input_is_85_mask_15_unchanged(tmp_path):
    """Counted on the batches the training loop really feeds the generator: of the selected positions,
    85% [MASK], 15% the original token, none replaced at random (reference pretrain_helpers.mask)."""
    from mlm_core.model.electra import ElectraModel
    from mlm_core.shards import ShardDataset
    from mlm_core.train.loop import build_model, train
    shards, _ = tiny_shards(tmp_path / "data")
    cfg = tiny_cfg(objective="electra", steps=3, batch_size=96, checkpoint_every=100, eval_batches=1)
    seen = []
    real_forward = ElectraModel.forward

    def spy(self, input_ids, segment_ids, labels, *a, **k):
        if self.training:
            seen.append((input_ids.clone(), labels.clone()))
        return real_forward(self, input_ids, segment_ids, labels, *a, **k)

    ds = ShardDataset(shards)
    torch.manual_seed(0)
    model, _ = build_model(cfg, int(ds.manifest["vocab_size"]), 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ElectraModel, "forward", spy)
        train(cfg, ds, model, tmp_path / "run")
    ids = torch.cat([s[0].flatten() for s in seen])
    labels = torch.cat([s[1].flatten() for s in seen])
    sel = labels != -100
    n = int(sel.sum())
    n_masked, n_kept = int((ids[sel] == BERT_IDS["mask"]).sum()), int((ids[sel] == labels[sel]).sum())
    masked, kept, other = n_masked / n, n_kept / n, n - n_masked - n_kept      # other: replaced at random
    sd = (0.85 * 0.15 / n) ** 0.5
    assert n > 1000 and len(seen) == 3
    assert abs(masked - 0.85) < 5 * sd and abs(kept - 0.15) < 5 * sd and other == 0, (n, masked, kept, other)


def test_gumbel_sample_never_writes_a_special_token():
    from mlm_core.model.electra import gumbel_sample
    _, model = _tiny_electra()
    with torch.no_grad():                     # make the specials overwhelmingly the generator's favourites
        model.gen.head_bias[list(BERT_IDS.values())] = 1e4
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 200, (8, 24), generator=g)
    seg = torch.ones_like(ids, dtype=torch.int32)
    labels = torch.full_like(ids, -100)
    pick = torch.rand(ids.shape, generator=g) < 0.3
    labels[pick], ids[pick] = ids[pick], BERT_IDS["mask"]
    out = model(ids, seg, labels, sample_generator=g)
    assert len(out["sampled"]) == int(pick.sum()) > 20
    assert not set(out["sampled"].tolist()) & set(BERT_IDS.values())
    logits = torch.zeros(1000, 200)
    logits[:, :5] = 50.0
    banned = torch.zeros(200, dtype=torch.bool)
    banned[:5] = True
    assert int(gumbel_sample(logits, banned, g).min()) >= 5
    assert int(gumbel_sample(logits, None, g).max()) < 5         # without the ban they would win


# ------------------------------------------------------------------------------------------------ export
def _check_export(gen, disc, folder: Path, vocab: int):
    import transformers  # the test extra: missing must fail, not skip
    transformers.logging.set_verbosity_error()
    from mlm_core.model import load_export
    hg, info = transformers.AutoModelForMaskedLM.from_pretrained(folder / "hf", output_loading_info=True)
    assert type(hg).__name__ == "ElectraForMaskedLM" and not any(info.values()), info
    hd, info = transformers.ElectraForPreTraining.from_pretrained(folder / "hf-discriminator", output_loading_info=True)
    assert not any(info.values()), info
    ids = torch.randint(5, vocab, (2, 20), generator=torch.Generator().manual_seed(1))
    ids[:, 0], ids[:, -1] = BERT_IDS["cls"], BERT_IDS["sep"]
    with torch.no_grad():
        theirs_g, theirs_d = hg.eval()(input_ids=ids).logits, hd.eval()(input_ids=ids).logits
    ours_g, ours_d = gen.eval().full_logits(ids), disc.eval().full_rtd_logits(ids)
    assert (theirs_g - ours_g).abs().max().item() < 1e-4
    assert (theirs_d - ours_d).abs().max().item() < 1e-4
    torch.testing.assert_close(load_export(folder / "hf").full_logits(ids), ours_g, atol=1e-5, rtol=0)
    torch.testing.assert_close(load_export(folder / "hf-discriminator").full_rtd_logits(ids), ours_d, atol=1e-5, rtol=0)


def test_trained_run_exports_to_transformers_with_equal_logits(run):
    from mlm_core.fillmask import load_model_dir
    from mlm_core.evaluate.intrinsic import load_discriminator
    _, out, _ = run
    gen, _tok, _ = load_model_dir(out)
    cfg = json.loads((out / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["ElectraForMaskedLM"] and cfg["embedding_size"] == 64 and cfg["hidden_size"] == 32
    _check_export(gen, load_discriminator(out), out, gen.arch.vocab_size)


@pytest.mark.parametrize("position,tie", [("sinusoidal", True), ("learned", False)])
def test_export_variants_have_equal_logits(tmp_path, position, tie):
    from test_export import wordpiece

    from mlm_core.model.export_electra import export_electra
    specials = wordpiece(tmp_path / "tokenizer.json")
    _, model = _tiny_electra(position, tie)
    with torch.no_grad():                     # non-trivial norms and biases so a wrong mapping shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    export_electra(model.gen, model.disc, tmp_path, tmp_path / "tokenizer.json", specials)
    _check_export(model.gen, model.disc, tmp_path, 100)


def test_transfer_fine_tunes_the_discriminator(run, monkeypatch):
    """Zero-shot transfer evaluates the encoder ELECTRA is meant to provide: the discriminator."""
    from mlm_core.config import EvaluateConfig
    from mlm_core.evaluate import transfer
    from mlm_core.model.electra import Discriminator
    _, out, _ = run
    seen = []
    monkeypatch.setattr(transfer, "run_retrieval", lambda model, *a, **k: seen.append(model) or {})
    transfer.run_transfer(out, EvaluateConfig.model_validate({"retrieval": {"en": "x.jsonl", "fr": "x.jsonl"}}),
                          Path("."), 0)
    assert len(seen) == 1 and isinstance(seen[0], Discriminator) and seen[0].arch.hidden == 64
