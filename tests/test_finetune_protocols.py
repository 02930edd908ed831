"""Fine-tuning evaluation protocols (issue 13 part 3): per-class precision / recall / F1 and macro-F1 against a
hand computation, stratified folds, cross-validation mean ± std, early stopping on the primary metric."""
from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest
import torch

from conftest import REPO

from mlm_core.config import EvaluateConfig, FinetuneConfig, ModelConfig, TokenizerConfig, TransferTask

DEMO = REPO / "configs" / "demo"


def test_per_class_prf_by_hand():
    from mlm_core.evaluate.protocols import per_class_prf
    gold = ["a", "a", "a", "b", "b", "c", "c"]
    pred = ["a", "a", "b", "b", "c", None, "d"]
    m = per_class_prf(pred, gold)
    # a: TP 2, FP 0, FN 1 -> P 1, R 2/3, F1 0.8
    # b: TP 1 (#4), FP 1 (#3), FN 1 (#5) -> P 1/2, R 1/2, F1 1/2
    # c: TP 0, FP 1 (#5), FN 2 (#6 missing, #7) -> 0, 0, 0
    # d: predicted once, never gold: TP 0, FP 1, FN 0 -> 0, 0, 0 (support 0)
    assert m["per_class"]["a"] == {"precision": 1.0, "recall": pytest.approx(0.66667), "f1": 0.8, "support": 3}
    assert m["per_class"]["b"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert m["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2}
    assert m["per_class"]["d"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0}
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5) / 4, abs=1e-5)
    assert m["accuracy"] == pytest.approx(3 / 7, abs=1e-5)


def test_perfect_and_empty_predictions():
    from mlm_core.evaluate.protocols import per_class_prf, primary_score
    assert per_class_prf(["x", "y"], ["x", "y"])["macro_f1"] == 1.0
    assert primary_score("macro_f1", [None, None], ["x", "y"]) == 0.0
    with pytest.raises(ValueError, match="primary_metric"):
        primary_score("f2", ["x"], ["x"])


@pytest.mark.parametrize("k", [3, 5, 7])
def test_folds_are_stratified(k):
    from mlm_core.evaluate.protocols import stratified_folds
    labels = ["a"] * 23 + ["b"] * 11 + ["c"] * 7 + ["d"] * 3 + ["e"]
    folds = stratified_folds(labels, k, seed=4)
    flat = [i for f in folds for i in f]
    assert sorted(flat) == list(range(len(labels)))              # a partition
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    total = Counter(labels)
    for f in folds:
        got = Counter(labels[i] for i in f)
        for c, n in total.items():   # each fold holds its share n_c / k of every class, within one example
            assert abs(got.get(c, 0) - n / k) < 1, (c, got, k)
    assert stratified_folds(labels, k, seed=4) == folds and stratified_folds(labels, k, seed=5) != folds


def test_mean_std_is_the_sample_statistic():
    from mlm_core.evaluate.protocols import mean_std
    v = [0.5, 0.7, 0.6, 0.9]
    assert mean_std(v) == {"mean": pytest.approx(statistics.mean(v)), "std": pytest.approx(statistics.stdev(v), abs=1e-5)}


# ---- with a model ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from mlm_core.model import MLMEncoder, resolve_arch, save_weights
    from mlm_core.tokenizer.build import train
    texts = [line for f in sorted((DEMO / "corpus").glob("*.txt")) for line in f.read_text("utf-8").splitlines()[:200]]
    tok = train(TokenizerConfig(algorithm="wordpiece", vocab_size=1500), texts)
    arch = resolve_arch(ModelConfig(layers=1, hidden=32, heads=2, ffn=64, max_positions=128, dropout=0.1),
                        vocab_size=tok.get_vocab_size(), pad_id=0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model")
    save_weights(MLMEncoder(arch), folder / "model.safetensors")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def test_early_stopping_picks_the_best_epoch_of_the_primary_metric(model_dir, one_torch_thread):
    """The real macro-F1 on a held-out fold: the best epoch is the argmax of the history, and the restored
    weights score that value again."""
    from mlm_core.evaluate.conll import read_labeled
    from mlm_core.evaluate.finetune import Example, build_task_model, fit
    from mlm_core.evaluate.protocols import primary_score, stratified_folds
    from mlm_core.evaluate.transfer import encode_texts, plain_tokenizer, predict_classes
    from mlm_core.fillmask import load_model_dir
    model, tok, _ = load_model_dir(model_dir)
    data = read_labeled(DEMO / "parallel.jsonl", "en")[:90]
    labels = sorted({lab for _, lab in data})
    ids = encode_texts(plain_tokenizer(tok), [t for t, _ in data], 64)
    folds = stratified_folds([lab for _, lab in data], 3, seed=0)
    train = [Example(ids[i], labels.index(data[i][1])) for i in folds[0] + folds[1]]
    held = folds[2]
    score = lambda m: primary_score("macro_f1", predict_classes(m, [ids[i] for i in held], labels, 0),  # noqa: E731
                                    [data[i][1] for i in held])
    cfg = FinetuneConfig(lr=5e-3, epochs=6, batch_size=16, patience=6, primary_metric="macro_f1")
    tm = build_task_model(model, len(labels), "mean", cfg, seed=1)
    res = fit(tm, train, score, cfg, seed=1, pad_id=0)
    vals = [h["validation"] for h in res.history]
    assert len(vals) == 6 and len(set(vals)) > 1          # the metric moved over the epochs
    assert res.best_epoch == 1 + vals.index(max(vals))
    assert score(tm) == pytest.approx(max(vals), abs=1e-5)


def test_classification_cross_validation(model_dir, one_torch_thread):
    from mlm_core.evaluate.stage import flat_metrics, transfer_rows
    from mlm_core.evaluate.transfer import run_transfer
    cfg = EvaluateConfig(
        classification=TransferTask(source_lang="en", train="parallel.jsonl", targets={"fr": "parallel.jsonl"}),
        upos=TransferTask(source_lang="en", train="parallel.jsonl", targets={"fr": "parallel.jsonl"}),
        finetune=FinetuneConfig(lr=3e-3, epochs=1, batch_size=32, max_train_examples=60, cv=True, cv_folds=4))
    out = run_transfer(model_dir, cfg, DEMO, seed=2)
    cv = out["classification"]["cv"]
    assert cv["k"] == 4 and cv["n"] == 60 and len(cv["folds"]) == 4
    assert sum(f["n_test"] for f in cv["folds"]) == 60
    for f in cv["folds"]:
        assert f["n_train"] + f["n_validation"] + f["n_test"] == 60 and 1 <= f["best_epoch"] <= 1
        assert 0 <= f["macro_f1"] <= 1 and set(f["per_class"]) <= set(out["classification"]["labels"]) | set(f["per_class"])
    acc = [f["accuracy"] for f in cv["folds"]]
    assert cv["accuracy"]["mean"] == pytest.approx(statistics.mean(acc), abs=1e-5)
    assert cv["accuracy"]["std"] == pytest.approx(statistics.stdev(acc), abs=1e-5)
    assert cv["macro_f1"]["mean"] == pytest.approx(statistics.mean(f["macro_f1"] for f in cv["folds"]), abs=1e-5)
    # per-class (per-tag for UPOS) metrics and macro-F1 next to accuracy in every target
    for task in ("classification", "upos"):
        t = out[task]["targets"]["fr"]
        assert 0 <= t["macro_f1"] <= 1 and t["per_class"]
        assert sum(v["support"] for v in t["per_class"].values()) == t["n"]
    assert "NOUN" in out["upos"]["targets"]["fr"]["per_class"]
    rows = transfer_rows({"transfer": out})
    assert all(r["macro_f1"] is not None for r in rows)
    flat = flat_metrics({"transfer": out})
    assert flat["classification.cv.accuracy.mean"] == cv["accuracy"]["mean"] and "upos.fr.macro_f1" in flat


def test_cross_validation_refuses_too_few_folds_or_examples():
    from mlm_core.evaluate.protocols import cross_validate
    with pytest.raises(ValueError, match="cv_folds must be >= 3"):
        cross_validate([1, 2, 3], ["a", "b", "a"], 2, 0, None)
    with pytest.raises(ValueError, match="at least 5"):
        cross_validate([1, 2, 3], ["a", "b", "a"], 5, 0, None)
    with pytest.raises(Exception):
        FinetuneConfig(cv_folds=2)
