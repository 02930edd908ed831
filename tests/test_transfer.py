"""Zero-shot transfer: CoNLL-U / labeled readers, UPOS transfer on real UD treebanks, classification and
retrieval on the demo parallel file, and the fine-tuning options (layer decay, adapters, L2-SP, early stopping)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, write_lines

import torch  # a required dependency: missing must fail loudly, not skip the module

from mlm_core.config import EvaluateConfig, FinetuneConfig, ModelConfig, TokenizerConfig, TransferTask  # noqa: E402
from mlm_core.evaluate.conll import (ConllError, read_conllu, read_demo_parallel, read_labeled,  # noqa: E402
                                     read_tagged)

DEMO = REPO / "configs" / "demo"
PARALLEL = DEMO / "parallel.jsonl"


# ---- fixtures ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A random tiny encoder + a WordPiece tokenizer trained on the demo corpus, saved as a pretrain output."""
    from mlm_core.model import MLMEncoder, resolve_arch, save_weights
    from mlm_core.tokenizer.build import train
    texts = [line for f in sorted((DEMO / "corpus").glob("*.txt")) for line in f.read_text("utf-8").splitlines()[:400]]
    tok = train(TokenizerConfig(algorithm="wordpiece", vocab_size=3000), texts)
    arch = resolve_arch(ModelConfig(layers=2, hidden=32, heads=2, ffn=64, max_positions=256, dropout=0.1),
                        vocab_size=tok.get_vocab_size(), pad_id=0)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("model")
    save_weights(MLMEncoder(arch), folder / "model.safetensors")
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def loaded(model_dir):
    from mlm_core.fillmask import load_model_dir
    model, tok, _ = load_model_dir(model_dir)
    return model, tok


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- CoNLL-U -----------------------------------------------------------------------------------------
def count_word_lines(path: Path) -> int:
    return sum(1 for line in path.read_text("utf-8").splitlines() if line.split("\t", 1)[0].isdigit())


def test_real_treebanks_parse(shared_data):
    pud = sorted((shared_data / "ud-pud").glob("*_pud-ud-test.conllu"))
    assert {p.name[:2] for p in pud} >= {"en", "fr", "de", "es", "ru", "ar", "hi", "zh"}
    for path in pud:
        sents = read_conllu(path)
        assert len(sents) == 1000, path
        assert sum(len(s.tokens) for s in sents) == count_word_lines(path)  # syntactic words, ranges skipped
        assert all(len(s.tokens) == len(s.upos) and s.text for s in sents)
    train = read_conllu(shared_data / "ud-train" / "en_ewt-ud-train.conllu")
    assert len(train) == 12544
    assert train[0].id.startswith("weblog-juancole.com") and train[0].text.startswith("Al-Zaman")
    assert len(read_conllu(shared_data / "ud-train" / "en_ewt-ud-dev.conllu")) == 2001


def test_multiword_tokens_split_into_syntactic_words(shared_data):
    de = {s.id: s for s in read_conllu(shared_data / "ud-pud" / "de_pud-ud-test.conllu")}
    first = de["n01001011"]
    assert "am" not in first.tokens and first.tokens[25:27] == ["an", "dem"] and first.upos[25:27] == ["ADP", "DET"]
    for lang in ("de", "fr", "es"):  # every range line: its syntactic words kept in place, the surface form not
        path = shared_data / "ud-pud" / f"{lang}_pud-ud-test.conllu"
        sents, n_ranges = read_conllu(path), 0
        blocks = [[c.split("\t") for c in b.splitlines() if c and not c.startswith("#")]
                  for b in path.read_text("utf-8").split("\n\n")]
        for sent, rows in zip(sents, [b for b in blocks if b]):
            assert len(sent.tokens) == max(int(r[0]) for r in rows if r[0].isdigit())
            for r in rows:
                if "-" in r[0]:
                    lo, hi = map(int, r[0].split("-"))
                    n_ranges += 1
                    parts = {str(i) for i in range(lo, hi + 1)}
                    assert sent.tokens[lo - 1: hi] == [x[1] for x in rows if x[0] in parts]
        assert n_ranges > 100, lang


def test_conllu_edge_cases_and_errors(tmp_path):
    row = "\t".join
    ok = write_lines(tmp_path / "ok.conllu", [
        "# sent_id = s1", "# text = Au revoir", row(["1-2", "Au", "_", "_", "_", "_", "_", "_", "_", "_"]),
        row(["1", "À", "à", "ADP", "_", "_", "3", "case", "_", "_"]),
        row(["2", "le", "le", "DET", "_", "_", "3", "det", "_", "_"]),
        row(["2.1", "x", "x", "NOUN", "_", "_", "_", "_", "_", "_"]),
        row(["3", "revoir", "revoir", "NOUN", "_", "_", "0", "root", "_", "_"]), "",
        row(["1", "Hi", "hi", "INTJ", "_", "_", "0", "root", "_", "_"]), ""])
    sents = read_conllu(ok)
    assert [s.tokens for s in sents] == [["À", "le", "revoir"], ["Hi"]]
    assert sents[0].id == "s1" and sents[0].text == "Au revoir" and sents[1].text == "Hi"
    nine = row(["1", "a", "a", "DET", "_", "_", "0", "root", "_"])
    bad = write_lines(tmp_path / "bad.conllu", ["# sent_id = s1", nine])
    with pytest.raises(ConllError, match=r"bad\.conllu:2: expected 10 tab-separated columns, got 9"):
        read_conllu(bad)
    bad_id = write_lines(tmp_path / "badid.conllu", ["", row(["x1", "a", "a", "DET", "_", "_", "0", "root", "_", "_"])])
    with pytest.raises(ConllError, match=r"badid\.conllu:2: word id 'x1' is not a number"):
        read_conllu(bad_id)


def test_demo_and_labeled_readers(tmp_path):
    fr = read_demo_parallel(PARALLEL, "fr")
    assert len(fr) == 252 and fr[0].topic and len(fr[0].tokens) == len(fr[0].upos)
    assert [s.id for s in read_tagged(f"{PARALLEL}#lang=de")] == [s.id for s in read_tagged(PARALLEL, "de")]
    demo = read_labeled(PARALLEL, "zh")
    assert len(demo) == 252 and {lab for _, lab in demo} == {"food", "animals", "family", "travel", "sport", "weather"}
    tsv = write_lines(tmp_path / "c.tsv", ["text\tlabel", "Il pleut.\tweather", "", "Le chat dort.\tanimals"])
    assert read_labeled(tsv) == [("Il pleut.", "weather"), ("Le chat dort.", "animals")]
    jl = write_lines(tmp_path / "c.jsonl", [json.dumps({"text": "a", "label": "x", "lang": "en"}),
                                            json.dumps({"text": "b", "label": "y", "lang": "fr"})])
    assert read_labeled(f"{jl}#lang=fr") == [("b", "y")]
    with pytest.raises(ConllError, match=r"bad\.tsv:2: expected 2 tab-separated columns"):
        read_labeled(write_lines(tmp_path / "bad.tsv", ["a\tb", "no label here"]))
    with pytest.raises(ConllError, match=r"bad\.jsonl:2: missing field"):
        read_labeled(write_lines(tmp_path / "bad.jsonl",
                                 [json.dumps({"text": "a", "label": "x"}), json.dumps({"text": "b"})]))
    with pytest.raises(ConllError, match=r"bad2\.jsonl:1: invalid JSON"):
        read_labeled(write_lines(tmp_path / "bad2.jsonl", ["{oops"]))


# ---- transfer on real and demo data -------------------------------------------------------------------
def test_upos_transfer_on_ud(model_dir, loaded, shared_data, tmp_path):
    from mlm_core.evaluate.conll import read_conllu as rc
    from mlm_core.evaluate.transfer import run_transfer
    odd = write_lines(tmp_path / "odd.conllu", [  # a target with a tag the source never has
        "\t".join(["1", "Zorp", "zorp", "ZZZ", "_", "_", "0", "root", "_", "_"]),
        "\t".join(["2", "the", "the", "DET", "_", "_", "1", "det", "_", "_"]), ""])
    task = TransferTask(source_lang="en", train="ud-train/en_ewt-ud-train.conllu", dev="ud-train/en_ewt-ud-dev.conllu",
                        targets={"fr": "ud-pud/fr_pud-ud-test.conllu", "de": "ud-pud/de_pud-ud-test.conllu",
                                 "es": "ud-pud/es_pud-ud-test.conllu", "xx": str(odd)})
    cfg = EvaluateConfig(upos=task, finetune=FinetuneConfig(lr=3e-3, epochs=2, batch_size=32, max_train_examples=200))
    before = snapshot(loaded[0])
    out = run_transfer(model_dir, cfg, shared_data, seed=0)
    assert set(out) == {"upos"}
    rep = out["upos"]
    # no English target: the source score comes from 20% of en_ewt-train held out from fine-tuning and dev
    assert rep["n_train"] == 200 and rep["n_validation"] == 200 and rep["source_score_on"] == "held-out"
    assert rep["n_source_test"] > 0 and rep["source_score"] != rep["validation_score"]
    assert 1 <= rep["epochs_run"] <= 2 and len(rep["history"]) == rep["epochs_run"]
    assert rep["majority_label"] == "NOUN" and "PUNCT" in rep["labels"]
    assert rep["source_score"] > 0.3  # a random encoder + 20 steps still learns word -> tag far above chance
    for lang in ("fr", "de", "es"):
        t = rep["targets"][lang]
        gold = [u for s in rc(shared_data / "ud-pud" / f"{lang}_pud-ud-test.conllu") for u in s.upos]
        assert t["n"] == len(gold) and t["sentences"] == 1000
        assert 0 <= t["score"] <= 1 and t["gap"] == pytest.approx(rep["source_score"] - t["score"], abs=1e-4)
        assert t["majority_baseline"] == pytest.approx(gold.count("NOUN") / len(gold), abs=1e-4)
        assert t["unseen_labels"]["count"] == sum(g not in rep["labels"] for g in gold)
    assert rep["targets"]["xx"]["unseen_labels"] == {"count": 1, "labels": ["ZZZ"]}
    assert rep["targets"]["xx"]["score"] <= 0.5
    assert same(before, snapshot(loaded[0]))  # the caller's model is untouched (fine-tuning works on a copy)


def test_classification_and_retrieval_on_demo(model_dir):
    from mlm_core.evaluate.transfer import run_transfer
    cfg = EvaluateConfig(
        classification=TransferTask(source_lang="en", train="parallel.jsonl",
                                    targets={"en": "parallel.jsonl", "fr": "parallel.jsonl",
                                             "de": "parallel.jsonl#lang=de"}),
        upos=TransferTask(source_lang="en", train="parallel.jsonl", targets={"ru": "parallel.jsonl"}),
        retrieval={"en": "parallel.jsonl", "fr": "parallel.jsonl", "zh": "parallel.jsonl"}, retrieval_layer=1,
        finetune=FinetuneConfig(lr=3e-3, epochs=2, batch_size=32, max_train_examples=200))
    out = run_transfer(model_dir, cfg, DEMO, seed=1)
    clf = out["classification"]
    # the English target names the training file: the source is scored on 20% of it held out (50 of 252 ids),
    # the remaining 10% stops early, the rest (177) trains
    assert clf["n_train"] == 177 and clf["n_validation"] == 25 and len(clf["labels"]) == 6
    assert clf["source_score_on"] == "held-out" and clf["source_score"] == clf["targets"]["en"]["score"]
    assert clf["targets"]["en"]["n"] == clf["n_source_test"] == 50
    assert clf["targets"]["en"]["scored_on"] == "held-out source test split"
    for lang in ("fr", "de"):
        t = clf["targets"][lang]
        assert t["n"] == 252 and 0 <= t["score"] <= 1 and t["unseen_labels"]["count"] == 0
        assert t["gap"] == pytest.approx(clf["source_score"] - t["score"], abs=1e-4)
        assert 0.1 < t["majority_baseline"] < 0.25  # six balanced topics
    assert out["upos"]["targets"]["ru"]["n"] > 1000
    ret = out["retrieval"]
    assert ret["pivot"] == "en" and ret["layer"] == 1 and set(ret["pairs"]) == {"fr", "zh"}
    for pair in ret["pairs"].values():
        assert pair["n"] == 252 and 0 <= pair["src_to_tgt"] <= 1 and 0 <= pair["tgt_to_src"] <= 1
    assert run_transfer(model_dir, EvaluateConfig(), DEMO, seed=0) == {}


def test_source_splits_hold_out_a_test_split_seen_by_neither_fitting_nor_early_stopping():
    from mlm_core.evaluate.transfer import needs_source_test, source_splits
    data = [f"s{i}" for i in range(100)]
    train, val, test = source_splits(data, None, None, seed=3, test_fraction=0.2)
    assert (len(train), len(val), len(test)) == (70, 10, 20)
    assert not set(test) & (set(train) | set(val)) and not set(train) & set(val)
    assert sorted(train + val + test) == sorted(data)
    assert source_splits(data, None, None, seed=3, test_fraction=0.2) == (train, val, test)     # seeded
    train, val, test = source_splits(data, ["d1", "d2"], None, seed=3, test_fraction=0.2)
    assert val == ["d1", "d2"] and len(test) == 20 and not set(test) & set(train)
    assert source_splits(data, None, None, seed=3)[2] == []
    with pytest.raises(ConllError, match="too few"):
        source_splits(["a", "b"], None, None, seed=0, test_fraction=0.2)
    task = TransferTask(source_lang="en", train="parallel.jsonl", targets={"en": "./parallel.jsonl#lang=en"})
    assert needs_source_test(task, DEMO)                      # the training file itself: not a test
    assert needs_source_test(TransferTask(source_lang="en", train="a.tsv", targets={"fr": "b.tsv"}), DEMO)
    assert not needs_source_test(TransferTask(source_lang="en", train="a.tsv", targets={"en": "t.tsv"}), DEMO)


def test_retrieval_helpers(loaded):
    from mlm_core.evaluate.finetune import collate, Example
    from mlm_core.evaluate.transfer import layer_states, retrieval_accuracy, sentence_vectors
    model, tok = loaded
    ids, seg, _ = collate([Example([2, 10, 11, 3], 0), Example([2, 12, 3], 0)], pad_id=0)
    with torch.no_grad():
        last = model.encode(ids, seg)
    assert torch.equal(layer_states(model, ids, seg, -1), last) and torch.equal(layer_states(model, ids, seg, 2), last)
    assert not torch.equal(layer_states(model, ids, seg, 1), last)
    with pytest.raises(ValueError, match="outside"):
        layer_states(model, ids, seg, 3)
    v = sentence_vectors(model, tok, ["The cat sleeps.", "Il pleut.", "Der Hund bellt laut."], layer=0)
    assert v.shape == (3, 32) and torch.allclose(v.norm(dim=-1), torch.ones(3))
    assert retrieval_accuracy(v, v) == (1.0, 1.0)
    assert retrieval_accuracy(v, v[[1, 0, 2]]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))


# ---- fine-tuning options -------------------------------------------------------------------------------
def toy_examples(n: int = 24) -> list:
    from mlm_core.evaluate.finetune import Example
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = [2] + torch.randint(5, 200, (6,), generator=g).tolist() + [3]
        out.append(Example(ids, i % 2))
    return out


def test_layer_decay_groups(loaded):
    from mlm_core.evaluate.finetune import build_task_model, param_groups
    model = loaded[0]
    cfg = FinetuneConfig(lr=1e-3, layer_decay=0.5)
    tm = build_task_model(model, 3, "mean", cfg, seed=0)
    groups = param_groups(tm, cfg)
    L = len(model.blocks)
    lr_by_layer = {g["layer"]: g["lr"] for g in groups}
    assert lr_by_layer == {0: pytest.approx(1e-3 * 0.5 ** L), 1: pytest.approx(1e-3 * 0.5), 2: pytest.approx(1e-3),
                           L + 1: pytest.approx(1e-3)}
    names = {n for g in groups for n in g["names"]}
    assert "encoder.tok_emb.weight" in names and "classifier.weight" in names
    assert not any(n.startswith(("encoder.head_", "encoder.decoder")) for n in names)  # MLM head stays out
    emb = next(g for g in groups if "encoder.tok_emb.weight" in g["names"])
    assert emb["layer"] == 0 and emb["weight_decay"] == 0.0


def test_adapters_train_only_adapters_and_head(loaded):
    from mlm_core.evaluate.finetune import AdaptedBlock, build_task_model, fit, param_groups
    model = loaded[0]
    cfg = FinetuneConfig(lr=1e-2, epochs=2, batch_size=8, adapters=True, adapter_dim=8)
    tm = build_task_model(model, 2, "mean", cfg, seed=0)
    assert all(isinstance(b, AdaptedBlock) for b in tm.encoder.blocks)
    frozen = {n: p.detach().clone() for n, p in tm.encoder.named_parameters() if ".adapter." not in n}
    assert all(not p.requires_grad for n, p in tm.encoder.named_parameters() if ".adapter." not in n)
    trained = {n for g in param_groups(tm, cfg) for n in g["names"]}
    assert trained and all(".adapter." in n or n.startswith("classifier.") for n in trained)
    adapters0 = {n: p.detach().clone() for n, p in tm.named_parameters() if ".adapter." in n}
    fit(tm, toy_examples(), lambda m: 0.0, cfg, seed=0, pad_id=0)
    params = dict(tm.encoder.named_parameters())
    assert all(torch.equal(params[n], p0) for n, p0 in frozen.items())
    now = dict(tm.named_parameters())
    assert any(not torch.equal(now[n], p0) for n, p0 in adapters0.items())
    assert not any(isinstance(b, AdaptedBlock) for b in model.blocks)  # the caller's model is not modified


def test_l2sp_penalty_grows_from_zero(loaded):
    from mlm_core.evaluate.finetune import anchors, build_task_model, fit, l2sp_penalty
    cfg = FinetuneConfig(lr=1e-2, epochs=2, batch_size=8, l2sp=0.1, patience=5)
    tm = build_task_model(loaded[0], 2, "mean", cfg, seed=0)
    theta0 = anchors(tm)
    assert "tok_emb.weight" in theta0 and not any(n.startswith(("head_", "decoder")) for n in theta0)
    assert float(l2sp_penalty(tm, theta0).detach()) == 0.0
    res = fit(tm, toy_examples(), lambda m: 0.0, cfg, seed=0, pad_id=0)
    assert res.history[0]["l2sp"] > 0 and float(l2sp_penalty(tm, theta0).detach()) > 0


def test_early_stopping_and_determinism(loaded):
    from mlm_core.evaluate.finetune import build_task_model, fit
    scores = iter([0.5, 0.6, 0.55, 0.58, 0.9, 0.95])
    kept = {}

    def validate(m):
        s = next(scores)
        kept[s] = m.classifier.weight.detach().clone()
        return s

    cfg = FinetuneConfig(lr=1e-2, epochs=6, batch_size=8, patience=2)
    tm = build_task_model(loaded[0], 2, "mean", cfg, seed=3)
    res = fit(tm, toy_examples(), validate, cfg, seed=3, pad_id=0)
    assert [h["epoch"] for h in res.history] == [1, 2, 3, 4] and res.stopped_early
    assert res.best_epoch == 2 and res.best_score == 0.6
    assert torch.equal(tm.classifier.weight, kept[0.6])  # the best epoch's weights are restored
    again = build_task_model(loaded[0], 2, "mean", cfg, seed=3)
    scores = iter([0.5, 0.6, 0.55, 0.58])
    res2 = fit(again, toy_examples(), validate, cfg, seed=3, pad_id=0)
    assert res2.history == res.history and same(snapshot(again), snapshot(tm))


# ---- long sentences: overlapping windows ------------------------------------------------------------
def test_long_sentence_windows_score_every_word_once(loaded):
    """A sentence far longer than the input: every word is scored, in exactly one window, at its own subword."""
    from mlm_core.evaluate.transfer import encode_words, plain_tokenizer, predict_tags, window_counts
    model, tok = loaded
    tok = plain_tokenizer(tok)
    words = ("The old man walked slowly along the river and looked at the boats in the evening light "
             "while children played near the unbelievably crowded marketplace").split() * 6     # ~140 words
    max_len = 24
    full = tok.encode(words, is_pretokenized=True)
    assert len(full.ids) > 5 * max_len
    # independent expectation: each word's first subword id and its position in the whole encoding
    first_pos = {}
    for pos, w in enumerate(full.word_ids):
        if w is not None and w not in first_pos:
            first_pos[w] = pos
    windows = encode_words(tok, [words], max_len)[0]
    assert len(windows) > 5 and all(len(w.ids) <= max_len for w in windows)
    assert all(w.ids[0] == full.ids[0] and w.ids[-1] == full.ids[-1] for w in windows)   # [CLS] ... [SEP]
    owners = {}
    for k, w in enumerate(windows):
        for i, p in enumerate(w.first):
            if p >= 0:
                assert i not in owners, f"word {i} scored in windows {owners[i]} and {k}"
                owners[i] = k
                assert w.ids[p] == full.ids[first_pos[i]]          # the right subword
                # most context: at least a quarter window on the nearer side, except at the sentence's ends
                inner = len(w.ids) - 2
                near = min(p - 1, inner - p)
                assert near >= (max_len - 2) // 4 - 1 or first_pos[i] - 1 < max_len // 2 \
                    or len(full.ids) - 1 - first_pos[i] < max_len // 2
    assert sorted(owners) == list(range(len(words)))                 # every word exactly once
    from mlm_core.evaluate.finetune import build_task_model
    tagger = build_task_model(model, 3, "token", FinetuneConfig(), 0)
    pred = predict_tags(tagger, [windows], ["A", "B", "C"], model.arch.pad_id)
    assert len(pred) == len(words) and None not in pred
    counts = window_counts([windows], max_len)
    assert counts["long_sentences"] == 1
    assert counts["words_past_max_len"] == sum(p >= max_len for p in first_pos.values()) > 100


def test_upos_report_counts_long_sentences(model_dir, shared_data, monkeypatch, tmp_path):
    """With a 24-subword input the PUD sentences need windows; none of their words is left unscored."""
    from mlm_core.evaluate import transfer
    from mlm_core.evaluate.conll import read_conllu as rc
    monkeypatch.setattr(transfer, "MAX_LEN", 24)
    def head(src: str, n: int, name: str) -> str:
        sents = (shared_data / src).read_text("utf-8").split("\n\n")[:n]
        return str(write_lines(tmp_path / name, ["\n\n".join(sents), ""]))
    target = Path(head("ud-pud/de_pud-ud-test.conllu", 30, "de.conllu"))
    task = TransferTask(source_lang="en", train=head("ud-train/en_ewt-ud-train.conllu", 40, "en.conllu"),
                        targets={"de": str(target)})
    cfg = EvaluateConfig(upos=task, finetune=FinetuneConfig(lr=3e-3, epochs=1, batch_size=32, max_train_examples=20))
    t = transfer.run_transfer(model_dir, cfg, shared_data, seed=0)["upos"]["targets"]["de"]
    assert t["sentences"] == len(rc(target)) == 30 and t["uncovered_words"] == 0
    assert 0 < t["long_sentences"] <= 30 and t["words_past_max_len"] > 0
