"""The pretraining loop and stage: exact resume, beating the unigram baseline, the stage's outputs, AdamW groups.

A tiny shard set (3 languages x 120 lines of the demo corpus, WordPiece vocab 400, seq_len 32) is built
with the real shards stage; ``tiny_shards`` is imported by test_checkpoint.py and test_distributed.py.
Torch runs on one thread: the CI box has 2 shared cores and oversubscription is ~20x slower.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import REPO

BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROLES = ["pad", "unk", "cls", "sep", "mask"]
LANGS = ("en", "fr", "ru")


def tiny_shards(root: Path, n_docs: int = 120, vocab: int = 400, seq_len: int = 32, corpus: Path | None = None):
    """(shards Artifact, tokenizer Artifact) built by the real shards stage from the first demo-corpus lines
    (or the first lines of ``corpus``/<lang>.txt)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from mlm_core.config.io import load_config
    from mlm_core.shards import run_shards
    from mlm_core.artifacts import parse
    from mlm_core.store import MANIFEST, write_json_atomic

    root.mkdir(parents=True, exist_ok=True)
    corpus = corpus or REPO / "configs/demo/corpus"
    docs = {lg: [t for t in (corpus / f"{lg}.txt").read_text(encoding="utf-8").splitlines() if t.strip()][:n_docs]
            for lg in LANGS}
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer, tok.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator([d for v in docs.values() for d in v], trainers.WordPieceTrainer(
        vocab_size=vocab, min_frequency=2, special_tokens=BERT, continuing_subword_prefix="##", show_progress=False))
    (root / "tok").mkdir()
    tok.save(str(root / "tok" / "tokenizer.json"))
    tart = parse("tokenizer", root / "tok", {
        "vocab_size": tok.get_vocab_size(True),
        "special_tokens": {r: {"token": t, "id": i} for i, (r, t) in enumerate(zip(ROLES, BERT))}},
        "toktiny", strict=False)
    (root / "norm" / "docs").mkdir(parents=True)
    for lg, texts in docs.items():
        pq.write_table(pa.table({
            "doc_id": pa.array(range(len(texts)), pa.int64()), "lang": [lg] * len(texts), "text": texts,
            "n_chars": pa.array([len(t) for t in texts], pa.int32()),
            "hash": [hashlib.md5(t.encode()).hexdigest() for t in texts]}), root / "norm" / "docs" / f"{lg}.parquet")
    nart = parse("normalize", root / "norm", {}, "normtiny", strict=False)
    (root / "unused.txt").write_text("x\n")
    lc = load_config(raw={"sources": {lg: {"paths": [str(root / "unused.txt")]} for lg in LANGS},
                          "shards": {"seq_len": seq_len, "workers": 1, "validation_fraction": 0.1}})
    (root / "shards").mkdir()
    from mlm_core.store import file_table
    manifest = {**run_shards(lc, {"normalize": nart, "tokenizer": tart}, root / "shards"), "fingerprint": "shardtiny"}
    manifest["files"] = file_table(root / "shards")          # as the store records it on commit
    write_json_atomic(root / "shards" / MANIFEST, manifest)
    return parse("shards", root / "shards", manifest, "shardtiny", strict=False), tart


def tiny_cfg(**over):
    from mlm_core.config import PretrainConfig
    model = {"size": "tiny", "layers": 1, "hidden": 64, "heads": 2, "max_positions": 64, **over.pop("model", {})}
    base = {"model": model, "steps": 20, "batch_size": 4, "log_every": 1, "eval_every": 1000, "eval_batches": 2,
            "checkpoint_every": 10, "warmup_steps": 5, "lr": 1e-3}
    return PretrainConfig.model_validate({**base, **over})


def read_metrics(d: Path, kind: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines()) if r["type"] == kind]


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tiny"))


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run(cfg, shard_art, out: Path, seed: int = 0, tokenizer_dir: Path | None = None, **kw) -> dict:
    import torch

    from mlm_core.shards import ShardDataset
    from mlm_core.train.loop import build_model, train
    ds = ShardDataset(shard_art, tokenizer_dir=tokenizer_dir)
    torch.manual_seed(seed)
    model, _ = build_model(cfg, int(ds.manifest["vocab_size"]), 0)
    return train(cfg, ds, model, out, seed=seed, **kw)


# ------------------------------------------------------------------------------------------------ resume
@pytest.mark.parametrize("objective,steps", [("mlm", 100), ("electra", 30)])
def test_resume_is_bitwise_exact(shards, tmp_path, objective, steps):
    """N steps straight == N/2 steps, stop, resume to N: every logged loss identical (dropout on, dynamic
    span masking with a rate schedule, so every RNG stream has to be restored)."""
    cfg = tiny_cfg(steps=steps, objective=objective, eval_every=steps // 2, checkpoint_every=steps // 5,
                   masking={"strategy": "span", "schedule": "cosine"}, model={"dropout": 0.1})
    straight = run(cfg, shards[0], tmp_path / "a")
    first = run(cfg, shards[0], tmp_path / "b", stop_after=steps // 2)
    assert first["step"] == steps // 2 and not first["completed"]
    second = run(cfg, shards[0], tmp_path / "b")
    assert second["resumed_from"] == steps // 2 and second["completed"]
    a, b = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert [r["step"] for r in b] == list(range(1, steps + 1))
    assert [(r["step"], r["loss"], r["lr"], r["masking_rate"]) for r in a] == \
           [(r["step"], r["loss"], r["lr"], r["masking_rate"]) for r in b]
    assert read_metrics(tmp_path / "a", "eval") == read_metrics(tmp_path / "b", "eval")
    assert straight["final_loss"] == second["final_loss"] and straight["eval"] == second["eval"]


def test_resume_of_a_finished_run_trains_nothing(shards, tmp_path):
    cfg = tiny_cfg(steps=6, checkpoint_every=3)
    done = run(cfg, shards[0], tmp_path)
    again = run(cfg, shards[0], tmp_path)
    assert again["resumed_from"] == 6 and again["step"] == 6
    assert again["final_loss"] == done["final_loss"] and again["eval"] == done["eval"]
    assert len(read_metrics(tmp_path)) == 6


# ------------------------------------------------------------------------------------------------ learning
@pytest.mark.heavy
def test_tiny_model_beats_the_unigram_baseline(shards, tmp_path):
    cfg = tiny_cfg(model={"hidden": 128, "layers": 2, "dropout": 0.0}, steps=300, batch_size=16, lr=1e-3,
                   warmup_steps=0, decay="constant", log_every=50, eval_batches=8, checkpoint_every=1000)
    res = run(cfg, shards[0], tmp_path, seed=1)
    assert set(res["eval"]) == set(LANGS)
    for lang, r in res["eval"].items():
        assert r["n"] > 100 and 0 < r["baseline_acc"] < 0.2
        assert r["acc"] > r["baseline_acc"], (lang, r)
    margin = sum(r["acc"] - r["baseline_acc"] for r in res["eval"].values()) / len(LANGS)
    assert margin > 0.02, res["eval"]
    first, last = read_metrics(tmp_path)[0], read_metrics(tmp_path)[-1]
    assert last["loss"] < first["loss"] - 0.5
    assert {"lr", "masking_rate", "tokens_per_s", "mfu", "grad_norm"} <= set(last)


# ------------------------------------------------------------------------------------------------ the stage
def _lc(tmp_path, **pretrain):
    from mlm_core.config.io import load_config
    (tmp_path / "unused.txt").write_text("x\n")
    return load_config(raw={"workdir": str(tmp_path / "work"), "seed": 3,
                            "sources": {lg: {"paths": [str(tmp_path / "unused.txt")]} for lg in LANGS},
                            "shards": {"seq_len": 32},
                            "pretrain": tiny_cfg(**pretrain).model_dump(mode="json")})


def test_stage_writes_the_model_folder_and_resumes(shards, tmp_path):
    from mlm_core.model import load_export, read_arch
    from mlm_core.train.stage import run_pretrain
    lc = _lc(tmp_path, steps=8, checkpoint_every=4, eval_every=4)
    out = tmp_path / "work" / "pretrain" / ".tmp-0123456789abcdef-42-aaaa"
    out.mkdir(parents=True)
    seen = []
    m = run_pretrain(lc, {"shards": shards[0], "tokenizer": shards[1]}, out, metrics_cb=seen.append)
    for f in ("model.safetensors", "model_config.json", "tokenizer.json", "metrics.jsonl", "eval.json",
              "hf/config.json", "hf/model.safetensors"):
        assert (out / f).is_file(), f
    assert Path(m["checkpoint_dir"]).parent == tmp_path / "work" / "pretrain-checkpoints"   # keyed by trajectory
    assert m["export"] == "hf" and m["counts"]["steps"] == 8 and m["counts"]["tokens"] == 8 * 4 * 32
    assert m["counts"]["params"] > 0 and m["arch"]["hidden"] == 64 and read_arch(out / "model.safetensors").hidden == 64
    assert set(m["eval"]) == set(LANGS) and set(m["baseline"]) == set(LANGS)
    assert {f"{lg}.val_acc" for lg in LANGS} <= set(m["metrics"]) and m["metrics"]["final_loss"] == m["final_loss"]
    assert json.loads((out / "eval.json").read_text())["eval"] == m["eval"]
    assert [r["step"] for r in seen if r["type"] == "train"] == list(range(1, 9))
    assert load_export(out / "hf").arch.hidden == 64
    # a second attempt (new temp folder, same fingerprint) resumes from the finished checkpoint
    out2 = out.with_name(".tmp-0123456789abcdef-43-bbbb")
    out2.mkdir()
    m2 = run_pretrain(lc, {"shards": shards[0], "tokenizer": shards[1]}, out2)
    assert m2["resumed_from"] == 8 and m2["final_loss"] == m["final_loss"] and m2["eval"] == m["eval"]


def test_stage_refuses_mismatched_inputs(shards, tmp_path):
    from dataclasses import replace

    from mlm_core.errors import StageError
    from mlm_core.train.stage import run_pretrain
    lc = _lc(tmp_path)
    with pytest.raises(StageError, match="encoded with tokenizer toktiny, but the tokenizer upstream is other"):
        run_pretrain(lc, {"shards": shards[0], "tokenizer": replace(shards[1], fingerprint="other")}, tmp_path / "o")
    long = replace(shards[0], seq_len=128, manifest={**shards[0].manifest, "seq_len": 128})
    with pytest.raises(StageError, match=r"seq_len \(128\) exceeds pretrain.model.max_positions \(64\)"):
        run_pretrain(lc, {"shards": long, "tokenizer": shards[1]}, tmp_path / "o")


def test_stage_electra_saves_the_generator_as_the_mlm_and_both_exports(shards, tmp_path):
    """model.safetensors is the trained generator (what evaluate / fill-mask / the audit load), the
    discriminator sits beside it, and both transformers folders are written."""
    from mlm_core.fillmask import load_model_dir
    from mlm_core.model import load_weights, read_arch
    from mlm_core.model.electra import Discriminator
    from mlm_core.train.stage import run_pretrain
    lc = _lc(tmp_path, steps=4, objective="electra", checkpoint_every=4)
    out = tmp_path / "out"
    out.mkdir()
    m = run_pretrain(lc, {"shards": shards[0], "tokenizer": shards[1]}, out, checkpoint_dir=tmp_path / "ck")
    assert m["mlm_model"] == "generator" and m["export"] == "hf" and m["export_discriminator"] == "hf-discriminator"
    assert (out / "hf" / "config.json").is_file() and (out / "hf-discriminator" / "model.safetensors").is_file()
    gen, _tok, _mask = load_model_dir(out)
    assert gen.arch.hidden == 16 and gen.arch.embedding_size == 64       # generator_fraction 0.25 of 64
    disc = Discriminator(read_arch(out / "discriminator.safetensors"))
    load_weights(disc, out / "discriminator.safetensors")
    assert disc.arch.hidden == 64 and not hasattr(disc, "head_dense")
    cfgjson = json.loads((out / "model_config.json").read_text())
    assert cfgjson["mlm_model"] == "generator" and cfgjson["objective"] == "electra" and cfgjson["discriminator"]["hidden"] == 64
    assert all("disc_acc" in r for r in m["eval"].values())


# ------------------------------------------------------------------------------------------------ optim
def test_adamw_groups_and_schedule():
    from mlm_core.train.loop import build_model
    from mlm_core.train.optim import build_optimizer, lr_lambda
    cfg = tiny_cfg(steps=100, warmup_steps=10, weight_decay=0.01)
    model, _ = build_model(cfg, 400, 0)
    opt, sched = build_optimizer(model, cfg)
    decay, no_decay = opt.param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all("emb" not in names[id(p)] for p in decay["params"])
    assert {names[id(p)] for p in no_decay["params"]} >= {"tok_emb.weight", "emb_norm.weight", "head_bias"}
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == sum(p.numel() for p in model.parameters())
    assert [round(lr_lambda(s, warmup=10, total=100, decay="linear"), 4) for s in (0, 9, 10, 55, 100)] == \
           [0.1, 1.0, 1.0, 0.5, 0.0]
    assert round(lr_lambda(55, warmup=10, total=100, decay="cosine"), 4) == 0.5
    assert lr_lambda(99, warmup=10, total=100, decay="constant") == 1.0
    assert sched.get_last_lr()[0] == pytest.approx(1e-3 * 0.1)


# ------------------------------------------------------------------------------------------------ loop defects
class _FakeShards:
    """A shard set whose first 2,048 train rows are all token 7 and the remaining 3,000 rows token 9."""

    manifest = {"vocab_size": 20}

    def __init__(self):
        import numpy as np
        self.parts = [np.full((2048, 4), 7, np.int32), np.full((3000, 4), 9, np.int32)]

    def languages(self, split):
        return ["en"]

    def input_ids(self, split, lang):
        from types import SimpleNamespace
        return SimpleNamespace(parts=self.parts)


def test_unigram_baseline_counts_the_whole_train_split_for_loop_and_evaluate(shards):
    """One definition: the most frequent token over every train row (not the first 2,048 rows), the same
    in the training loop's validation and in evaluate's baseline ranking."""
    import numpy as np

    from mlm_core.evaluate.intrinsic import frequency_ranks, unigram_counts
    from mlm_core.shards import ShardDataset
    from mlm_core.train.evaluator import Evaluator
    from mlm_core.unigram import unigram_top
    fake = _FakeShards()
    assert unigram_top(fake, [0, 1, 2, 3, 4]) == {"en": 9}                 # 3,000 x 4 nines beat 2,048 x 4 sevens
    assert int(np.argmin(frequency_ranks(unigram_counts(fake, [0, 1, 2, 3, 4])["en"]))) == 9
    # on the real tiny shards: the loop's prediction is an independent full count's argmax
    ds = ShardDataset(shards[0])
    specials = {r: int(e["id"]) for r, e in ds.manifest["special_tokens"].items()}
    from mlm_core.masking import Masker
    from mlm_core.train.objectives import objective_for
    cfg = tiny_cfg()
    ev = Evaluator(cfg, ds, Masker, int(ds.manifest["vocab_size"]), specials, 0, objective_for(cfg))
    for lang in LANGS:
        col = ds.columns("train", lang)["input_ids"]
        rows = np.asarray(col.take(np.arange(len(col)))).reshape(-1)
        counts = np.bincount(rows, minlength=int(ds.manifest["vocab_size"]))
        counts[sorted(specials.values())] = 0
        assert ev.top[lang] == int(np.argmax(counts)), lang


def test_logged_loss_is_the_mean_over_the_interval_and_resumes_exactly(shards, tmp_path):
    """log_every=5 logs the mean of the five per-step losses (log_every=1 shows them; the trajectory is the
    same), also across a resume from a checkpoint in mid-interval (step 6: its partial sum is restored)."""
    every = read_metrics
    run(tiny_cfg(steps=15, log_every=1, checkpoint_every=100), shards[0], tmp_path / "each")
    per_step = {r["step"]: r["loss"] for r in every(tmp_path / "each")}
    cfg5 = tiny_cfg(steps=15, log_every=5, checkpoint_every=6)
    run(cfg5, shards[0], tmp_path / "five", stop_after=8)
    from mlm_core.train.checkpoint import step_dir_name
    shutil.rmtree(tmp_path / "five" / "checkpoints" / step_dir_name(8))   # as if killed after step 8's work
    res = run(cfg5, shards[0], tmp_path / "five")
    assert res["resumed_from"] == 6                                  # mid-interval: step 6 before, 7-10 after
    logged = {r["step"]: r["loss"] for r in every(tmp_path / "five")}
    assert sorted(logged) == [5, 10, 15]
    for end in (5, 10, 15):
        mean = sum(per_step[s] for s in range(end - 4, end + 1)) / 5
        assert logged[end] == pytest.approx(mean, rel=1e-9, abs=1e-12), end
        assert logged[end] != pytest.approx(per_step[end], rel=1e-6)
    assert res["final_loss"] == logged[15]


def _fake_checkpoint(root: Path, name: str, step: int) -> None:
    (root / name).mkdir(parents=True)
    from mlm_core.train.checkpoint import FORMAT
    (root / name / "meta.json").write_text(json.dumps({"format": FORMAT, "step": step, "files": {}}))


def test_checkpoint_names_sort_by_step_past_ten_million(tmp_path):
    from mlm_core.train.checkpoint import find_latest, prune, step_dir_name
    names = [step_dir_name(s) for s in (9_999_999, 10_000_000, 123_456_789_012)]
    assert names == sorted(names)                                     # the names themselves sort like the steps
    root = tmp_path / "ck"
    _fake_checkpoint(root, "step-9999999", 9_999_999)                # a 7-digit name from an older run
    _fake_checkpoint(root, "step-0000100", 100)
    assert find_latest(root)[0].name == "step-9999999"              # old names are still found
    _fake_checkpoint(root, step_dir_name(10_000_001), 10_000_001)
    assert find_latest(root)[0].name == step_dir_name(10_000_001)
    prune(root, keep=2)
    assert sorted(p.name for p in root.iterdir()) == sorted(["step-9999999", step_dir_name(10_000_001)])


def test_resuming_on_more_ranks_seeds_each_new_rank(shards, tmp_path, monkeypatch):
    """A checkpoint written by one process has no RNG state for ranks 1-3: each new rank derives its
    own streams from (seed, rank, step), so their dropout streams differ from each other and from the
    state a fresh build leaves (the same on every rank: all ranks seed the init identically)."""
    import torch

    from mlm_core.shards import ShardDataset
    from mlm_core.train import distributed
    from mlm_core.train.loop import build_model, train
    cfg = tiny_cfg(steps=8, checkpoint_every=4, model={"dropout": 0.1})
    run(cfg, shards[0], tmp_path, stop_after=4)
    monkeypatch.setattr(distributed, "wrap_model", lambda model, *a, **k: model)      # no process group here
    monkeypatch.setattr(distributed, "all_reduce_sum", lambda t, *a, **k: t)
    states = {}
    for rank in (1, 2, 3):
        ds = ShardDataset(shards[0])
        torch.manual_seed(0)
        model, _ = build_model(cfg, int(ds.manifest["vocab_size"]), 0)
        after_build = torch.get_rng_state().clone()
        res = train(cfg, ds, model, tmp_path, seed=0, rank=rank, world_size=4, stop_after=4)
        assert res["resumed_from"] == 4
        states[rank] = torch.get_rng_state().clone()
        assert not torch.equal(states[rank], after_build), rank
    assert not torch.equal(states[1], states[2]) and not torch.equal(states[2], states[3])


def test_resume_is_said_on_the_console(shards, tmp_path, capsys, monkeypatch):
    """Issue 24 item 4: a resumed pretrain prints "resumed from step N" (not only an INFO log record)."""
    monkeypatch.setenv("MLM_PROGRESS", "on")
    cfg = tiny_cfg(steps=6, checkpoint_every=3)
    run(cfg, shards[0], tmp_path, stop_after=3)
    assert "resumed from step" not in capsys.readouterr().err
    assert run(cfg, shards[0], tmp_path)["resumed_from"] == 3
    err = capsys.readouterr().err
    assert "pretrain: resumed from step 3 of 6" in err, err
