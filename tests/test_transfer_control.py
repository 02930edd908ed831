"""The untrained-encoder control of zero-shot transfer, predictions.parquet, and a fine-tune that depends only on
(model, seed, config): the same bytes from two processes whatever torch work and thread count came before."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, write_lines
from mlm_core.config import EvaluateConfig, FinetuneConfig, ModelConfig, PretrainConfig, TokenizerConfig, TransferTask

DEMO = REPO / "configs" / "demo"
MODEL = ModelConfig(layers=2, hidden=32, heads=2, ffn=64, max_positions=64, dropout=0.1)
INIT_SEED = 0         # the fixture's weights are exactly this seed's initialisation


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny encoder saved as a pretrain output: a WordPiece tokenizer on the demo corpus, and weights that are
    ``torch.manual_seed(INIT_SEED)`` + ``build_model`` (what pretraining starts from) trained for a few steps
    of a toy objective, so they are neither the initialisation nor random."""
    from mlm_core.model import save_weights
    from mlm_core.tokenizer.build import train as train_tokenizer
    from mlm_core.train.loop import build_model
    texts = [ln for f in sorted((DEMO / "corpus").glob("*.txt")) for ln in f.read_text("utf-8").splitlines()[:300]]
    tok = train_tokenizer(TokenizerConfig(algorithm="wordpiece", vocab_size=1500), texts)
    torch.manual_seed(INIT_SEED)
    model, _ = build_model(PretrainConfig(model=MODEL), tok.get_vocab_size(), 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.tensor([tok.encode(t).ids[:16] for t in texts[:8] if len(tok.encode(t).ids) >= 16][:4])
    for _ in range(3):                      # move the weights away from the initialisation
        opt.zero_grad()
        model.encode(ids, None).pow(2).mean().backward()
        opt.step()
    folder = tmp_path_factory.mktemp("model")
    save_weights(model, folder / "model.safetensors")
    tok.save(str(folder / "tokenizer.json"))
    return folder


def head_conllu(shared_data: Path, src: str, n: int, dest: Path) -> Path:
    blocks = (shared_data / src).read_text("utf-8").split("\n\n")[:n]
    return write_lines(dest, ["\n\n".join(blocks), ""])


def small_cfg(train: Path, targets: dict[str, Path], **ft) -> EvaluateConfig:
    return EvaluateConfig(upos=TransferTask(source_lang="en", train=str(train), targets={k: str(v) for k, v in targets.items()}),
                          finetune=FinetuneConfig(lr=3e-3, epochs=2, batch_size=16, max_train_examples=60, **ft))


def gold_words(path: Path) -> list[tuple[int, str, str]]:
    """(sentence index, form, UPOS) of every syntactic word, read here from the CoNLL-U columns (not with the code
    under test): word lines have a numeric id; ``1-2`` multiword ranges and ``1.1`` empty nodes are skipped."""
    out, sent = [], 0
    for block in path.read_text("utf-8").split("\n\n"):
        rows = [ln.split("\t") for ln in block.splitlines() if ln and not ln.startswith("#")]
        words = [r for r in rows if r[0].isdigit()]
        if not words:
            continue
        out += [(sent, r[1], r[3]) for r in words]
        sent += 1
    return out


# ---- the untrained encoder -----------------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["mlm", "electra"])
def test_untrained_encoder_is_what_pretraining_starts_from(objective):
    """Pretraining seeds torch with the run's seed, then ``build_model``; the control rebuilds the encoder that
    transfer uses (ELECTRA: the discriminator) with the same weights, and leaves the global RNG alone."""
    from mlm_core.evaluate.control import untrained_like
    from mlm_core.train.loop import build_model
    cfg = PretrainConfig(model=MODEL, objective=objective)
    torch.manual_seed(7)
    core, _ = build_model(cfg, 500, 0)
    encoder = core.disc if objective == "electra" else core
    expected = {k: v.clone() for k, v in encoder.state_dict().items()}
    with torch.no_grad():                   # the evaluated model: same architecture, other weights
        for p in encoder.parameters():
            p.add_(1.0)
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    fresh = untrained_like(encoder, 7)
    assert torch.equal(torch.random.get_rng_state(), state)
    got = fresh.state_dict()
    assert type(fresh) is type(encoder) and got.keys() == expected.keys() and not fresh.training
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    other = untrained_like(encoder, 8).state_dict()
    assert not torch.equal(other["tok_emb.weight"], expected["tok_emb.weight"])


def test_paired_gain_matches_a_hand_computed_bootstrap():
    from mlm_core.evaluate.control import paired_gain
    from mlm_core.evaluate.intrinsic import BOOTSTRAP_SAMPLES
    gold = ["A", "B", "A", "C", "A", "B", "C"]
    pred = ["A", "B", "A", "A", "A", None, "C"]            # 5 of 7 right
    ctrl = ["A", "A", "B", "C", "B", "B", "A"]             # 3 of 7 right
    groups = [0, 0, 1, 1, 2, 2, 2]                         # three sentences
    r = paired_gain(pred, ctrl, gold, groups, seed=11)
    assert r["untrained_score"] == round(3 / 7, 5) and r["gain_over_untrained"] == round(2 / 7, 5)
    # per sentence: sum of (pred right - ctrl right), words; resample sentences with numpy's generator
    d_sum, words = np.array([0.0, 1.0, 1.0]), np.array([2.0, 2.0, 3.0])
    draws = np.random.default_rng(11).integers(0, 3, size=(BOOTSTRAP_SAMPLES, 3))
    stats = d_sum[draws].sum(1) / words[draws].sum(1)
    lo, hi = np.quantile(stats, [0.025, 0.975])
    assert r["gain_over_untrained_ci_low"] == round(float(lo), 5)
    assert r["gain_over_untrained_ci_high"] == round(float(hi), 5)
    with pytest.raises(ValueError, match="sentence ids"):
        paired_gain(pred, ctrl, gold, groups[:-1], seed=0)



def test_zero_shot_mean_gain_averages_the_targets_replicates():
    """Two targets of three sentences each: the mean gain's interval comes from the per-target replicates (the
    same draws for both: parallel sentences resampled jointly), averaged; computed here with numpy."""
    from mlm_core.evaluate.control import mean_gain
    from mlm_core.evaluate.intrinsic import BOOTSTRAP_SAMPLES
    gold = ["A", "B", "A", "C"]
    t1 = (["A", "B", "A", "A"], ["A", "A", "A", "C"], gold, [0, 1, 1, 2])   # 3/4 vs 3/4
    t2 = (["A", "B", "C", "C"], ["B", "B", "C", "A"], gold, [0, 0, 1, 2])   # 3/4 vs 1/4
    r = mean_gain([t1, t2], seed=4)
    assert r["score"] == 0.75 and r["untrained_score"] == 0.5 and r["gain_over_untrained"] == 0.25
    draws = np.random.default_rng(4).integers(0, 3, size=(BOOTSTRAP_SAMPLES, 3))
    d1, n1 = np.array([0.0, 1.0, -1.0]), np.array([1.0, 2.0, 1.0])     # per sentence: sum of d, words
    d2, n2 = np.array([1.0, 0.0, 1.0]), np.array([2.0, 1.0, 1.0])
    reps = (d1[draws].sum(1) / n1[draws].sum(1) + d2[draws].sum(1) / n2[draws].sum(1)) / 2
    lo, hi = np.quantile(reps, [0.025, 0.975])
    assert (r["gain_over_untrained_ci_low"], r["gain_over_untrained_ci_high"]) == (round(lo, 5), round(hi, 5))


# ---- the control, reported; predictions.parquet -------------------------------------------------------------
def test_control_reported_and_predictions_recompute_the_scores(model_dir, shared_data, tmp_path, monkeypatch):
    """A 24-subword input so that long PUD sentences are windowed; fr, and the English PUD as the source target."""
    from mlm_core.evaluate import transfer
    from mlm_core.evaluate.predictions import write
    monkeypatch.setattr(transfer, "MAX_LEN", 24)
    train = head_conllu(shared_data, "ud-train/en_ewt-ud-train.conllu", 120, tmp_path / "en_train.conllu")
    fr = head_conllu(shared_data, "ud-pud/fr_pud-ud-test.conllu", 40, tmp_path / "fr.conllu")
    en = head_conllu(shared_data, "ud-pud/en_pud-ud-test.conllu", 40, tmp_path / "en.conllu")
    rows: list = []
    rep = transfer.run_transfer(model_dir, small_cfg(train, {"fr": fr, "en": en}), tmp_path, seed=INIT_SEED,
                                predictions=rows)["upos"]
    pq_path = write(rows, tmp_path / "predictions.parquet")
    import pyarrow.parquet as pq
    table = pq.read_table(pq_path).to_pylist()
    assert rep["untrained"]["finetuned_sha256"] != rep["finetuned_sha256"]
    zs = rep["zero_shot"]            # the source language's target is not a zero-shot one: fr alone
    assert zs["targets"] == ["fr"] and zs["untrained_score"] == rep["targets"]["fr"]["untrained_score"]
    assert zs["gain_over_untrained_ci_low"] == rep["targets"]["fr"]["gain_over_untrained_ci_low"]
    assert rep["untrained"]["source_score"] == rep["targets"]["en"]["untrained_score"]
    for lang, path in (("fr", fr), ("en", en)):
        t = rep["targets"][lang]
        gold = gold_words(path)
        got = [r for r in table if r["lang"] == lang]
        assert [(r["sentence_index"], r["form"], r["gold"]) for r in got] == gold and {r["split"] for r in got} == {"test"}
        assert [r["word_index"] for r in got] == [i for s in range(gold[-1][0] + 1)
                                                  for i in range(sum(g[0] == s for g in gold))]
        # the reported scores, recomputed from the file and the gold file (a missing prediction is wrong)
        acc = sum(r["predicted"] == g for r, (_, _, g) in zip(got, gold)) / len(gold)
        untrained = sum(r["untrained_predicted"] == g for r, (_, _, g) in zip(got, gold)) / len(gold)
        assert t["score"] == round(acc, 5) and t["untrained_score"] == round(untrained, 5)
        assert t["gain_over_untrained"] == round(acc - untrained, 5) and t["n"] == len(gold)
        assert t["gain_over_untrained_ci_low"] <= t["gain_over_untrained_ci_high"]
        # windows: a sentence is windowed iff it has a word scored past window 0
        by_sent: dict = {}
        for r in got:
            by_sent.setdefault(r["sentence_index"], []).append(r)
        assert t["long_sentences"] == sum(ws[0]["windowed"] for ws in by_sent.values())
        for ws in by_sent.values():
            assert all(w["windowed"] == ws[0]["windowed"] for w in ws)
            assert ws[0]["windowed"] == any((w["window"] or 0) > 0 for w in ws)
    assert rep["targets"]["fr"]["long_sentences"] > 0
    ids = [r["sentence_id"] for r in table if r["lang"] == "fr" and r["word_index"] == 0]
    assert ids[:2] == [ln.split("=", 1)[1].strip() for ln in fr.read_text("utf-8").splitlines()
                       if ln.startswith("# sent_id")][:2]
    # the evaluate contract checks the file against transfer.parquet; one changed tag fails it
    import pyarrow as pa
    import tasks.validation.contracts  # noqa: F401  (registers the table providers)
    from mlm_core.evaluate.stage import intrinsic_rows, write_transfer_table
    from tasks.validation import ValidationFailed, validate_stage
    result = {"intrinsic": {"en": {"n_positions": 10, "top1": 0.5, "top5": 0.7, "ece": 0.1, "baseline_top1": 0.2}},
              "transfer": {"upos": rep}}
    pq.write_table(pa.Table.from_pylist(intrinsic_rows(result)), tmp_path / "intrinsic.parquet")
    write_transfer_table(result, tmp_path / "transfer.parquet")
    (tmp_path / "evaluation.json").write_text(json.dumps(result))
    checked = validate_stage("evaluate", tmp_path, {"languages": {"en": {}}})
    assert checked.success and checked.n_rows_sampled["prediction_scores"] == 2
    i = next(k for k, r in enumerate(table) if r["lang"] == "fr" and r["predicted"] == r["gold"])
    pq.write_table(pa.Table.from_pylist([dict(r, predicted="X") if k == i else r for k, r in enumerate(table)],
                                        schema=pq.read_schema(pq_path)), pq_path)
    with pytest.raises(ValidationFailed, match="score_diff"):
        validate_stage("evaluate", tmp_path, {"languages": {"en": {}}})


def test_control_off_and_the_seeds_own_initialisation(model_dir, shared_data, tmp_path):
    """untrained_control off: no control fields, untrained_predicted null. A model that *is* the seed's
    initialisation (its own control) gains exactly 0 with identical fine-tuned weights."""
    from mlm_core.evaluate import transfer
    from mlm_core.evaluate.control import untrained_like
    from mlm_core.fillmask import load_model_dir
    from mlm_core.model import save_weights
    train = head_conllu(shared_data, "ud-train/en_ewt-ud-train.conllu", 80, tmp_path / "en_train.conllu")
    de = head_conllu(shared_data, "ud-pud/de_pud-ud-test.conllu", 20, tmp_path / "de.conllu")
    cfg = small_cfg(train, {"de": de}).model_copy(update={"untrained_control": False})
    rows: list = []
    rep = transfer.run_transfer(model_dir, cfg, tmp_path, seed=1, predictions=rows)["upos"]
    assert "untrained" not in rep and "untrained_score" not in rep["targets"]["de"]
    assert rows and all(v is None for part in rows for v in part["untrained_predicted"])
    # the held-out source split (no English target) is in the predictions too
    assert {(p["lang"][0], p["split"][0]) for p in rows} == {("de", "test"), ("en", "held-out")}
    init = tmp_path / "init"
    init.mkdir()
    model, _, _ = load_model_dir(model_dir)
    save_weights(untrained_like(model, 5), init / "model.safetensors")
    (init / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    same = transfer.run_transfer(init, small_cfg(train, {"de": de}), tmp_path, seed=5)["upos"]
    assert same["untrained"]["finetuned_sha256"] == same["finetuned_sha256"]
    t = same["targets"]["de"]
    assert t["untrained_score"] == t["score"] and t["gain_over_untrained"] == 0.0
    assert t["gain_over_untrained_ci_low"] == t["gain_over_untrained_ci_high"] == 0.0


def test_classification_reports_the_control_too(model_dir):
    from mlm_core.evaluate.transfer import run_transfer
    cfg = EvaluateConfig(classification=TransferTask(source_lang="en", train="parallel.jsonl",
                                                     targets={"en": "parallel.jsonl", "fr": "parallel.jsonl"}),
                         finetune=FinetuneConfig(lr=3e-3, epochs=1, batch_size=32, max_train_examples=120))
    clf = run_transfer(model_dir, cfg, DEMO, seed=2)["classification"]
    assert clf["untrained"]["source_score"] == clf["targets"]["en"]["untrained_score"]     # the held-out split
    for t in clf["targets"].values():
        assert 0 <= t["untrained_score"] <= 1
        assert t["gain_over_untrained"] == pytest.approx(t["score"] - t["untrained_score"], abs=2e-5)
        assert t["gain_over_untrained_ci_low"] <= t["gain_over_untrained_ci_high"]
    assert clf["source_gain_over_untrained"]["gain_over_untrained"] == clf["targets"]["en"]["gain_over_untrained"]


# ---- byte-reproducible across processes ---------------------------------------------------------------------
RUN = """
import json, sys, torch
from pathlib import Path
if sys.argv[3] == "disturbed":        # other torch work first: the global RNG consumed, another thread count
    torch.rand(1000)
    torch.randn(64, 64).matmul(torch.randn(64, 64))
    torch.set_num_threads(2)
else:
    torch.set_num_threads(1)
threads = torch.get_num_threads()
from mlm_core.config import EvaluateConfig
from mlm_core.evaluate.predictions import write
from mlm_core.evaluate.transfer import run_transfer
out = Path(sys.argv[4])
rows = []
rep = run_transfer(Path(sys.argv[1]), EvaluateConfig.model_validate_json(sys.argv[2]), out, seed=3, predictions=rows)
write(rows, out / "predictions.parquet")
assert torch.get_num_threads() == threads, "the caller's thread count was not restored"
(out / "report.json").write_text(json.dumps(rep, sort_keys=True))
"""


@pytest.mark.heavy
def test_two_processes_give_identical_scores_and_prediction_bytes(model_dir, shared_data, tmp_path):
    train = head_conllu(shared_data, "ud-train/en_ewt-ud-train.conllu", 80, tmp_path / "en_train.conllu")
    fr = head_conllu(shared_data, "ud-pud/fr_pud-ud-test.conllu", 30, tmp_path / "fr.conllu")
    cfg = small_cfg(train, {"fr": fr}).model_dump_json()
    got = {}
    for mode in ("plain", "disturbed"):
        out = tmp_path / mode
        out.mkdir()
        r = subprocess.run([sys.executable, "-c", RUN, str(model_dir), cfg, mode, str(out)], capture_output=True,
                           text=True, cwd=REPO, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        got[mode] = (json.loads((out / "report.json").read_text()), (out / "predictions.parquet").read_bytes())
    (a, a_bytes), (b, b_bytes) = got["plain"], got["disturbed"]
    assert a["upos"]["finetuned_sha256"] == b["upos"]["finetuned_sha256"]
    assert a["upos"]["untrained"]["finetuned_sha256"] == b["upos"]["untrained"]["finetuned_sha256"]
    assert a == b and a_bytes == b_bytes
