"""pretrain.bias_regularizer (issue 13 part 1): L = L_MLM + λ Σ_g ‖E[h(x_g)] − E[h(x)]‖².

The term against a numpy loop written here; group positions on hand-built rows (multi-piece words, a word that is
the prefix of a longer one, absent words, specials, pad) and on rows encoded exactly as the shards encode them
(WordPiece and byte-level BPE), checked against the tokenizer's own word spans; the gradient reaches the encoder
below the chosen layer and only there; the config's bounds; training with the term (MLM, ELECTRA, compiled, two
gloo processes == one with accumulation) logs ``bias_reg`` and adds exactly λ x it to the loss.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from test_train import read_metrics, run, tiny_cfg, tiny_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EN_LIST = "configs/bias/en.yaml"


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return tiny_shards(tmp_path_factory.mktemp("tiny-bias"))


# ------------------------------------------------------------------------------------------------ the term
def numpy_term(h: np.ndarray, content: np.ndarray, groups: list[np.ndarray]) -> float:
    """Σ_g ‖mean_{(b,t) ∈ g} h[b,t] − mean_{(b,t) ∈ content} h[b,t]‖², an absent group contributing 0."""
    B, T, _ = h.shape
    all_vecs = [h[b, t] for b in range(B) for t in range(T) if content[b, t]]
    mu = np.mean(all_vecs, axis=0)
    total = 0.0
    for g in groups:
        vecs = [h[b, t] for b in range(B) for t in range(T) if g[b, t]]
        if vecs:
            d = np.mean(vecs, axis=0) - mu
            total += float(np.dot(d, d))
    return total


def test_term_equals_a_numpy_computation():
    import torch

    from mlm_core.bias.regularizer import bias_term
    rng = np.random.default_rng(0)
    h = rng.normal(size=(3, 7, 5)).astype(np.float32)
    content = rng.random((3, 7)) < 0.8
    g1 = content & (rng.random((3, 7)) < 0.3)
    g2 = np.zeros((3, 7), bool)
    g2[1, 2:4] = True
    g3 = np.zeros((3, 7), bool)             # a group absent from the micro-batch: contributes 0
    masks = torch.from_numpy(np.stack([content, g1, g2, g3]))
    got = float(bias_term(torch.from_numpy(h), masks))
    assert got == pytest.approx(numpy_term(h.astype(np.float64), content, [g1, g2, g3]), rel=1e-5)
    assert got > 0
    # the absent group really adds nothing; no group at all gives exactly 0
    assert float(bias_term(torch.from_numpy(h), masks[:3])) == pytest.approx(got, rel=1e-6)
    assert float(bias_term(torch.from_numpy(h), masks[[0, 3]])) == 0.0


# ------------------------------------------------------------------------------------------------ positions
def test_group_positions_on_hand_built_ids():
    """ids: 1 [CLS], 2 [SEP], 0 [PAD]; group 0 = {he: (10), grandfather: (11, 12)}; group 1 = {she: (20),
    her: (10, 21)} ("he" + "##r" as one word). A start flag marks each word's first piece."""
    import torch

    from mlm_core.bias.regularizer import compile_sequences, find_group_positions
    entries = [((10,), (1,), (0,)), ((11, 12), (1, 0), (0,)), ((20,), (1,), (1,)), ((10, 21), (1, 0), (1,))]
    seqs = compile_sequences(entries, 2)
    #            CLS  he  gr  ##f  x  she SEP  he ##r  x  her-as-two-words  PAD PAD
    ids = [[1, 10, 11, 12, 5, 20, 2, 10, 21, 5, 10, 21, 0, 0],
           # "he" + "##q" (another word: hers...), 11 alone (prefix of grandfather), 12 alone, he at the row end
           [1, 10, 30, 11, 5, 12, 5, 6, 7, 8, 9, 5, 2, 10]]
    ws = [[0, 1, 1, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0],
          [0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1]]
    got = find_group_positions(torch.tensor(ids), torch.tensor(ws, dtype=torch.bool), torch.tensor([0, 1, 2, 4]),
                               seqs, 2)
    want0 = np.zeros((2, 14), bool)
    want1 = np.zeros((2, 14), bool)
    want0[0, [1, 2, 3]] = True              # he, grandfather (both pieces)
    want1[0, [5, 7, 8]] = True              # she, her (he + ##r: one word, so not "he")
    # row 0, positions 10-11: ids of "her" but flagged as two words: not "her" (start pattern), but 10 alone is a
    # whole word "he" (21 starts the next word). Row 1: "he" + a continuation (30) is not "he", 11 and 12 apart
    # are not "grandfather"
    want0[0, 10] = True
    want0[1, 13] = True                     # he at the row's end (the end is a boundary)
    assert got.shape == (2, 2, 14)
    np.testing.assert_array_equal(got[0].numpy(), want0)
    np.testing.assert_array_equal(got[1].numpy(), want1)


def _tokenizers():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    texts = ["He said his grandfather was an engineer.", "She told her mother that hers is here.",
             "The man and the woman met his sister and her brother.", "Her grandmother and his father."] * 40
    wp = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    wp.normalizer, wp.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.BertPreTokenizer()
    wp.train_from_iterator(texts, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        continuing_subword_prefix="##", show_progress=False))
    bl = Tokenizer(models.BPE())
    bl.pre_tokenizer, bl.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bl.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=330, special_tokens=["<pad>", "<unk>", "<s>", "</s>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return {"wordpiece": wp, "bytelevel": bl}


@pytest.mark.parametrize("kind", ["wordpiece", "bytelevel"])
def test_group_positions_on_rows_encoded_like_the_shards(kind):
    """Documents encoded by the shards' own ``encode_texts`` and packed [CLS] d1 [SEP] d2 [SEP] [PAD]...: the found
    positions are exactly the tokens whose word (the tokenizer's word span) is a listed word, case folded."""
    import torch

    from mlm_core.bias.regularizer import GroupFinder, build_group_table
    from mlm_core.bias.wordlists import load_wordlist
    from mlm_core.shards.encode import encode_texts, prepare_tokenizer
    from conftest import REPO
    tok = prepare_tokenizer(_tokenizers()[kind])
    wl = load_wordlist(REPO / EN_LIST)
    words = wl.group_words()
    docs = ["He said his grandfather was an engineer.", "SHE told her mother that hers is here.",
            "The man and the woman met his sister and her brother.", "no group word at all here."]
    table = build_group_table({"en": wl}, tok, [0, 1, 2, 3, 4])
    enc = encode_texts(tok, docs, np.int64)
    cls, sep, pad, T = 2, 3, 0, 64
    ids, ws, want = [cls], [0], {g: [False] for g in wl.groups}
    encs = tok.encode_batch(docs, add_special_tokens=False)
    off = 0
    for doc, e, n in zip(docs, encs, enc.lens):
        ids += enc.ids[off:off + n].tolist() + [sep]
        ws += enc.word_start[off:off + n].tolist() + [0]
        for wid in e.word_ids:
            a, b = e.word_to_chars(wid)
            # a word with an [UNK] piece cannot be told from other unknown words: never matched
            unk = any(t == 1 for t, w in zip(e.ids, e.word_ids) if w == wid)
            for g in wl.groups:
                want[g].append(doc[a:b].strip().lower() in words[g] and not unk)
        for g in wl.groups:
            want[g].append(False)
        off += n
    ids += [pad] * (T - len(ids))
    ws += [0] * (T - len(ws))
    for g in wl.groups:
        want[g] += [False] * (T - len(want[g]))
    finder = GroupFinder(table, ["de", "en"], [0, 1, 2, 3, 4])
    # two rows: the same row as English (index 1) and as German (index 0, no German list: no group position)
    got = finder(torch.tensor([ids, ids]), torch.tensor([ws, ws], dtype=torch.bool), np.array([1, 0]))
    assert got.shape == (3, 2, T)
    np.testing.assert_array_equal(got[0, 0].numpy(), np.array(ids) > 4)        # content: no special, no pad
    for gi, g in enumerate(wl.groups):
        np.testing.assert_array_equal(got[1 + gi, 0].numpy(), np.array(want[g]), err_msg=g)
        assert not got[1 + gi, 1].any()
    assert sum(want["male"]) >= 4 and sum(want["female"]) >= 5      # he, his x2, grandfather, man / she, her...


def test_word_sequences_cover_cases_and_the_leading_space():
    from mlm_core.bias.regularizer import word_sequences
    tk = _tokenizers()
    bl = tk["bytelevel"]
    got = {"".join(bl.id_to_token(i) for i in ids).replace("Ġ", " ") for ids, _ in word_sequences(bl, "he")}
    assert got == {"he", " he", "He", " He", "HE", " HE"}       # at a document's start and after a space
    wp = tk["wordpiece"]
    seqs = {(ids, st) for ids, st in word_sequences(wp, "grandson") if 1 not in ids}     # not in the training text
    assert seqs and all(len(ids) > 1 and st == (1,) + (0,) * (len(ids) - 1) for ids, st in seqs)   # one word
    assert {"".join(wp.id_to_token(i) for i in ids).replace("##", "") for ids, _ in seqs} == {"grandson"}


# ------------------------------------------------------------------------------------------------ the model
def test_return_layer_is_that_block_and_the_gradient_reaches_only_the_blocks_below():
    import torch

    from mlm_core.bias.regularizer import bias_term
    from mlm_core.model import MLMEncoder, resolve_arch
    from mlm_core.config import PretrainConfig
    arch = resolve_arch(PretrainConfig.model_validate({"model": {"size": "tiny", "layers": 3, "hidden": 32,
                                                                  "heads": 2, "dropout": 0.0}}).model, 50, 0)
    torch.manual_seed(0)
    m = MLMEncoder(arch)
    ids = torch.randint(5, 50, (2, 9))
    seg = torch.ones(2, 9, dtype=torch.int32)
    plain = m.encode(ids, seg)
    final, h1 = m.encode(ids, seg, 1)
    assert torch.equal(final, plain)                        # asking for a layer changes nothing else
    x = m.drop(m.emb_norm(m.tok_emb(ids) + m.type_emb.weight[0] + m.pos_emb.weight[:9]))
    from mlm_core.model.encoder import segment_mask
    for b in m.blocks[:2]:
        x = b(x, segment_mask(seg), None)
    assert torch.allclose(h1, x, atol=1e-6)
    assert torch.equal(m.encode(ids, seg, 2)[1], plain)    # the last block: the final hidden states
    masks = torch.zeros(3, 2, 9, dtype=torch.bool)
    masks[0] = True
    masks[1, 0, 2] = masks[2, 1, 5] = True
    bias_term(h1, masks).backward()
    norm = {n: (p.grad.abs().sum().item() if p.grad is not None else 0.0) for n, p in m.named_parameters()}
    assert norm["tok_emb.weight"] > 0 and norm["blocks.0.ffn_in.weight"] > 0 and norm["blocks.1.attn.qkv.weight"] > 0
    assert all(v == 0 for n, v in norm.items() if n.startswith("blocks.2.") or n.startswith("head"))


def test_config_weight_must_be_positive_and_layer_in_range():
    import torch
    from pydantic import ValidationError

    from mlm_core.errors import MlmError
    from mlm_core.train.objectives import objective_for
    for w in (0, -0.5):
        with pytest.raises(ValidationError, match="weight"):
            tiny_cfg(bias_regularizer={"weight": w, "lists": {"en": EN_LIST}})
    with pytest.raises(ValidationError, match="lists"):
        tiny_cfg(bias_regularizer={"weight": 1.0})
    for obj in ("mlm", "electra"):
        for layer, ok in ((0, True), (-2, True), (1, True), (2, False), (-3, False)):
            cfg = tiny_cfg(objective=obj, model={"layers": 2},
                           bias_regularizer={"weight": 1.0, "layer": layer, "lists": {"en": EN_LIST}})
            o = objective_for(cfg)
            torch.manual_seed(0)
            core = o.build(60, 0, [0, 1, 2, 3, 4])
            if ok:
                assert o.enable_bias(core) == layer % 2 and o.parts[-1] == "bias_reg"
            else:
                with pytest.raises(MlmError, match=r"pretrain\.bias_regularizer\.layer = -?\d+ is out of range"):
                    o.enable_bias(core)


# ------------------------------------------------------------------------------------------------ training
def _table(shards):
    from mlm_core.bias.regularizer import load_group_table
    from conftest import REPO
    tok = shards[1]
    cfg = tiny_cfg(bias_regularizer={"weight": 1.0, "lists": {"en": EN_LIST}}).bias_regularizer
    return load_group_table(cfg, REPO, tok.path / "tokenizer.json", list(range(5)))


@pytest.mark.parametrize("objective", ["mlm", "electra"])
def test_training_logs_bias_reg_and_adds_weight_times_it(shards, tmp_path, objective):
    from mlm_core.errors import MlmError
    table = _table(shards)
    assert table.entries["en"]          # the demo corpus' tokenizer writes the English list's words
    lam = 3.0
    cfg = tiny_cfg(objective=objective, steps=6, log_every=1, model={"layers": 2},
                   bias_regularizer={"weight": lam, "layer": 0, "lists": {"en": EN_LIST}})
    with pytest.raises(MlmError, match="group table"):
        run(cfg, shards[0], tmp_path / "none")
    run(cfg, shards[0], tmp_path / "a", bias=table)
    recs = read_metrics(tmp_path / "a")
    assert len(recs) == 6 and all(math.isfinite(r["bias_reg"]) and r["bias_reg"] >= 0 for r in recs)
    assert any(r["bias_reg"] > 0 for r in recs)
    dw = cfg.electra.disc_weight
    for r in recs:
        base = r["mlm_loss"] + (dw * r["disc_loss"] if objective == "electra" else 0.0)
        assert r["loss"] == pytest.approx(base + lam * r["bias_reg"], rel=1e-5)
    # without the regularizer there is no bias_reg part
    run(tiny_cfg(objective=objective, steps=2, log_every=1, model={"layers": 2}), shards[0], tmp_path / "b")
    assert all("bias_reg" not in r for r in read_metrics(tmp_path / "b"))


def test_stage_fingerprint_reads_the_lists_content(shards, tmp_path):
    """The list's content (not its path) enters the pretrain inputs and the trajectory key; unset: no input."""
    from mlm_core.config.io import load_config
    from mlm_core.stages import STAGES
    from mlm_core.train.stage import trajectory_key
    from conftest import REPO
    (tmp_path / "unused.txt").write_text("x\n")
    lst = tmp_path / "en.yaml"
    lst.write_text((REPO / EN_LIST).read_text(encoding="utf-8"), encoding="utf-8")

    def lc(bias):
        pre = tiny_cfg().model_dump(mode="json") | ({"bias_regularizer": bias} if bias else {})
        return load_config(raw={"workdir": str(tmp_path / "w"), "shards": {"seq_len": 32},
                                "sources": {"en": {"paths": [str(tmp_path / "unused.txt")]}}, "pretrain": pre})
    assert STAGES["pretrain"].inputs(lc(None)) is None
    on = lc({"weight": 1.0, "lists": {"en": str(lst)}})
    up = {"shards": shards[0], "tokenizer": shards[1]}
    first, key1 = STAGES["pretrain"].inputs(on), trajectory_key(on, up)
    assert set(first) == {"bias_regularizer_lists"} and set(first["bias_regularizer_lists"]) == {"en"}
    lst.write_text(lst.read_text(encoding="utf-8") + "  - [lord, lady]\n", encoding="utf-8")
    assert STAGES["pretrain"].inputs(on) != first and trajectory_key(on, up) != key1
    lst.unlink()
    with pytest.raises(Exception, match=r"pretrain\.bias_regularizer\.lists\.en"):
        STAGES["pretrain"].inputs(on)


def test_stage_trains_with_the_regularizer(shards, tmp_path):
    """The stage builds the group table from the config's lists and the run's tokenizer, and says so."""
    from mlm_core.config.io import load_config
    from mlm_core.train.stage import run_pretrain
    from conftest import REPO
    (tmp_path / "unused.txt").write_text("x\n")
    pre = tiny_cfg(steps=3).model_dump(mode="json") | {
        "bias_regularizer": {"weight": 0.5, "lists": {"en": str(REPO / EN_LIST)}}}
    lc = load_config(raw={"workdir": str(tmp_path / "work"), "seed": 3, "shards": {"seq_len": 32},
                          "sources": {lg: {"paths": [str(tmp_path / "unused.txt")]} for lg in ("en", "fr", "ru")},
                          "pretrain": pre})
    out = tmp_path / "out"
    out.mkdir()
    m = run_pretrain(lc, {"shards": shards[0], "tokenizer": shards[1]}, out)
    assert m["bias_regularizer"]["groups"] == ["male", "female"] and m["bias_regularizer"]["sequences"]["en"] > 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("bias_reg" in r for r in recs if r["type"] == "train")


@pytest.mark.parametrize("objective", ["mlm", "electra"])
def test_compiled_forward_code_path_with_the_term_runs_eagerly(shards, tmp_path, monkeypatch, objective):
    """The compiled step's functions (fixed budget, layer output returned) run uncompiled (torch.compile made the
    identity: seconds instead of a compile): same bias_reg and losses as the eager path."""
    import torch

    from mlm_core.train import compiled
    table = _table(shards)
    kw = dict(objective=objective, steps=4, log_every=1, model={"layers": 2, "dropout": 0.0},
              bias_regularizer={"weight": 2.0, "layer": 0, "lists": {"en": EN_LIST}})
    run(tiny_cfg(compile="off", **kw), shards[0], tmp_path / "e", bias=table)
    monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    monkeypatch.setattr(compiled, "compile_support", lambda device: None)
    calls = []
    name = "electra_loss" if objective == "electra" else "mlm_loss"
    fn = getattr(compiled, name)
    monkeypatch.setattr(compiled, name, lambda *a: calls.append(a[-1]) or fn(*a))
    run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / "c", bias=table)
    assert calls == [0] * 4                     # every step went through the compiled step's function, layer 0
    e, c = read_metrics(tmp_path / "e"), read_metrics(tmp_path / "c")
    parts = ("loss", "mlm_loss", "bias_reg") + (("disc_loss",) if objective == "electra" else ())
    for part in parts:
        for x, y in zip(e, c):
            assert math.isclose(x[part], y[part], rel_tol=1e-4, abs_tol=1e-7), (part, x[part], y[part])
    assert any(r["bias_reg"] > 0 for r in c)


def test_compiled_step_carries_the_term(shards, tmp_path):
    """pretrain.compile: on keeps the regularized step compiled (the graph returns the layer output); its losses
    follow the eager run's within the compile tests' tolerance."""
    table = _table(shards)
    kw = dict(steps=8, log_every=1, model={"layers": 2, "dropout": 0.0},
              bias_regularizer={"weight": 2.0, "layer": 0, "lists": {"en": EN_LIST}})
    run(tiny_cfg(compile="off", **kw), shards[0], tmp_path / "e", bias=table)
    run(tiny_cfg(compile="on", **kw), shards[0], tmp_path / "c", bias=table)
    e, c = read_metrics(tmp_path / "e"), read_metrics(tmp_path / "c")
    for part in ("loss", "mlm_loss", "bias_reg"):
        for x, y in zip(e, c):
            assert math.isclose(x[part], y[part], rel_tol=2e-4, abs_tol=1e-7), (part, x[part], y[part])


@pytest.mark.heavy
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp2"])
def test_two_gloo_processes_equal_one_process_with_accumulation(shards, tmp_path, fsdp):
    """The term is per micro-batch and weighted 1/grad_accum, DDP averaging over ranks: 2 ranks x 1 == 1 rank x 2
    accumulation steps (parameters and the logged bias_reg). Batch 1: then both hold the same micro-batches (rank r
    takes draws r, r+2, ...; one process takes them in order), which the term, unlike the MLM loss, depends on."""
    import torch
    from safetensors.torch import load_file

    from mlm_core.train.distributed import launch
    table = _table(shards)
    common = {"steps": 6, "checkpoint_every": 6, "masking": {"mode": "static"}, "model": {"dropout": 0.0},
              "warmup_steps": 0, "lr": 1e-3, "log_every": 1, "batch_size": 1,
              "bias_regularizer": {"weight": 5.0, "lists": {"en": EN_LIST}}}
    one = tiny_cfg(grad_accum=2, **common)
    two = tiny_cfg(distributed={"nproc_per_node": 2, "fsdp": fsdp, "timeout_s": 60}, **common)
    torch.set_num_threads(1)
    ref = run(one, shards[0], tmp_path / "one", bias=table)
    args = {"config": two.model_dump(mode="json"), "seed": 0, "shards": str(shards[0].path),
            "out_dir": str(tmp_path / "two"), "tokenizer_fingerprint": shards[1].fingerprint, "print_metrics": True,
            "bias": table.to_json()}
    got = launch(args, two.distributed, tmp_path / "two", env={"OMP_NUM_THREADS": "1"})
    a = load_file(ref["checkpoint"] + "/model.safetensors")
    b = load_file(got["checkpoint"] + "/model.safetensors")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
    ra, rb = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [r["bias_reg"] for r in rb] == pytest.approx([r["bias_reg"] for r in ra], rel=1e-5)
    assert any(r["bias_reg"] > 0 for r in ra)


def test_resume_with_the_term_is_exact(shards, tmp_path):
    """6 steps straight == 3, stop, resume to 6: every logged loss, MLM part and bias_reg identical."""
    table = _table(shards)
    cfg = tiny_cfg(steps=6, log_every=1, checkpoint_every=3, model={"layers": 2},
                   bias_regularizer={"weight": 1.0, "lists": {"en": EN_LIST}})
    run(cfg, shards[0], tmp_path / "a", bias=table)
    assert run(cfg, shards[0], tmp_path / "b", bias=table, stop_after=3)["step"] == 3
    assert run(cfg, shards[0], tmp_path / "b", bias=table)["resumed_from"] == 3
    key = lambda r: (r["step"], r["loss"], r["mlm_loss"], r["bias_reg"])  # noqa: E731
    assert [key(r) for r in read_metrics(tmp_path / "a")] == [key(r) for r in read_metrics(tmp_path / "b")]
