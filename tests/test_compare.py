"""`mlm compare`: two models on the same held-out data, B - A, one plot, one MLflow run linking both versions.

Two tiny models of one pipeline (4 vs 80 pretraining steps, same tokenizer and shards); every value of the
comparison is checked against evaluate_model / run_audit run separately on each model (the code `mlm evaluate`
and `mlm audit` run), and B - A is recomputed here."""
from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from conftest import REPO, write_lines

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEAVY_FIXTURES = {"two_models"}   # module fixtures that train or run stages: their tests are heavy (tests/conftest.py)
LANGS = ("en", "ru")
DEMO = REPO / "configs" / "demo"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory, shared_data):
    """normalize -> tokenizer -> shards on ~150 real lines per language, then pretrain twice (4 and 80 steps)."""
    import yaml

    from mlm_core import stages
    from mlm_core.config.io import load_config
    root = tmp_path_factory.mktemp("compare")
    sources = {}
    for lang in LANGS:
        lines = [ln for ln in (shared_data / "text" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
                 if len(ln) > 40][:150]
        sources[lang] = {"paths": [str(write_lines(root / f"{lang}.txt", lines))]}
    raw = {"name": "cmptest", "workdir": str(root / "work"), "sources": sources, "normalize": {"workers": 1},
           "tokenizer": {"vocab_size": 400, "heldout_docs": 5, "min_vocab_fraction": 0.1, "max_fertility": 20},
           "shards": {"seq_len": 32, "workers": 1},
           "pretrain": {"model": {"size": "tiny", "max_positions": 64}, "steps": 4, "batch_size": 8, "lr": 3e-3,
                        "eval_every": 100, "checkpoint_every": 100, "warmup_steps": 1},
           "evaluate": {"max_sequences": 8, "pll_sentences": 4,
                        "classification": {"source_lang": "en", "train": str(DEMO / "parallel.jsonl"),
                                           "targets": {"ru": str(DEMO / "parallel.jsonl")}},
                        "finetune": {"epochs": 1}},
           "audit": {"crows_pairs": {"en": str(DEMO / "bias/crows_pairs_en.csv")},
                     "templates": {"en": str(DEMO / "bias/templates_en.yaml")}},
           "tracking": {"experiment": "cmptest"}}
    cfg = root / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    lc = load_config(cfg)
    plans = stages.plan(lc)
    arts = {name: stages.execute(lc, name, plans)[0] for name in ("normalize", "tokenizer", "shards", "pretrain")}
    lc_b = load_config(cfg, ["pretrain.steps=80"])
    b = stages.execute(lc_b, "pretrain", stages.plan(lc_b))[0]
    return {"cfg": cfg, "lc": lc, "arts": arts, "a": arts["pretrain"].path, "b": b.path, "root": root}


@pytest.fixture(scope="module")
def compared(two_models):
    from tasks.compare import run_compare
    out = run_compare(str(two_models["cfg"]), str(two_models["a"]), str(two_models["b"]),
                      out_dir=str(two_models["root"] / "cmp"))
    return out


def _rows(result: dict) -> dict:
    return {(r["metric"], r["lang"]): r for r in result["rows"]}


def test_table_equals_evaluate_and_audit_run_separately(two_models, compared):
    from mlm_core.audit import run_audit
    from mlm_core.evaluate.stage import evaluate_model, intrinsic_rows, transfer_rows
    lc, arts = two_models["lc"], two_models["arts"]
    rows = _rows(compared["result"])
    for side, folder in (("a", two_models["a"]), ("b", two_models["b"])):
        ev = evaluate_model(folder, arts["shards"].path, arts["normalize"].path, lc, None)
        for r in intrinsic_rows(ev):
            for metric in ("top1", "pseudo_perplexity", "perplexity", "top5"):
                assert r[metric] is not None and math.isfinite(r[metric])
                assert rows[(metric, r["lang"])][side] == pytest.approx(r[metric], rel=1e-9), (side, metric)
        (tr,) = transfer_rows(ev)        # classification en -> ru
        assert rows[("classification.score", "ru")][side] == pytest.approx(tr["score"])
        assert rows[("classification.score", "en")][side] == pytest.approx(tr["source_score"])
        au = run_audit(folder, lc.config.audit, lc.base_dir)
        assert rows[("crows.score", "en")][side] == pytest.approx(au["crows"]["en"]["metric_score"])
        for pair, v in au["templates"]["en"]["delta_bias"].items():
            assert rows[(f"template.delta_bias.{pair}", "en")][side] == pytest.approx(v)
        assert rows[("template.kl_to_neutral", "en")][side] == pytest.approx(au["templates"]["en"]["kl_to_neutral_mean"])
    for lang in LANGS:    # pseudo-perplexity per language is in the table for both models
        assert ("pseudo_perplexity", lang) in rows


def test_delta_is_b_minus_a_and_training_helps(compared):
    res = compared["result"]
    for r in res["rows"]:
        if r["a"] is None or r["b"] is None:
            assert r["delta"] is None
        else:
            assert r["delta"] == pytest.approx(r["b"] - r["a"], abs=1e-12)
    rows = _rows(res)
    for lang in LANGS:     # 80 steps vs 4: the held-out text is more predictable
        assert rows[("pseudo_perplexity", lang)]["b"] < rows[("pseudo_perplexity", lang)]["a"]
        assert rows[("pseudo_perplexity", lang)]["status"] == "original"    # both trained on en, ru (eval.json)
    assert res["training_languages"] == [list(LANGS), list(LANGS)]


def test_files_png_and_markdown(compared):
    paths = {k: Path(v) for k, v in compared["paths"].items()}
    png = paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])       # IHDR: a real image, not an empty file
    assert width > 300 and height > 200
    from PIL import Image
    Image.open(paths["png"]).verify()
    md = paths["md"].read_text(encoding="utf-8")
    assert "| metric | lang | status | A | B | B − A |" in md and "pseudo_perplexity" in md
    saved = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert saved["rows"] == json.loads(json.dumps(compared["result"]["rows"]))


def test_mlflow_run_has_both_refs_and_the_metrics(two_models, compared):
    from tasks.tracking import mlflow_client, resolve_tracking_uri
    lc = two_models["lc"]
    run = mlflow_client(resolve_tracking_uri(lc.config.tracking, lc.workdir)).get_run(compared["run_id"])
    assert run.data.tags["model_a"] == str(two_models["a"]) and run.data.tags["model_b"] == str(two_models["b"])
    assert run.data.tags["model_a.content_hash"] != run.data.tags["model_b.content_hash"]
    m = run.data.metrics
    for r in compared["result"]["rows"]:
        if r["delta"] is not None and r["metric"] in ("top1", "pseudo_perplexity"):
            assert m[f"a.{r['lang']}.{r['metric']}"] == pytest.approx(r["a"])
            assert m[f"b.{r['lang']}.{r['metric']}"] == pytest.approx(r["b"])
            assert m[f"delta.{r['lang']}.{r['metric']}"] == pytest.approx(r["delta"])
    artifacts = {f.path for f in mlflow_client(resolve_tracking_uri(lc.config.tracking, lc.workdir)).list_artifacts(run.info.run_id)}
    assert {"compare.md", "compare.png", "compare.json"} <= artifacts


def test_language_status():
    from mlm_core.compare import language_status
    st = language_status(["de", "en", "es"], ["en"], ["de", "en"])
    assert st == {"de": "new", "en": "original", "es": "unseen"}
    assert language_status(["en"], None, ["en"]) == {"en": ""}


def test_registry_versions_are_resolved_and_linked(two_models, compared, tmp_path):
    """models:/NAME@ALIAS and models:/NAME/latest: the run records the version numbers and the producing runs."""
    from tasks import tracking
    from tasks.compare import run_compare
    from tasks.mlflow_model import log_and_register
    lc = two_models["lc"]
    tr = tracking.Tracker(lc.config.tracking, lc.workdir)
    versions = []
    for folder in (two_models["a"], two_models["b"]):
        run_id = tr.start_stage("pretrain", "f" * 16)
        tr.log_stage("pretrain", fingerprint="f" * 16, cache_hit=False, params={},
                     metrics={"en.val_acc": 0.1, "ru.val_acc": 0.1}, run_id=run_id)
        versions.append(log_and_register(folder, run_id, "cmp-model", {"pretrain_fingerprint": "f" * 16}, "test",
                                         tr.uri))
    tracking.set_alias(tr, "cmp-model", "champion", versions[0])
    out = run_compare(str(two_models["cfg"]), "models:/cmp-model@champion", "models:/cmp-model/latest",
                      out_dir=str(tmp_path / "reg"))
    tags = tr.client.get_run(out["run_id"]).data.tags
    assert tags["model_a"] == "models:/cmp-model@champion" and tags["model_b"] == "models:/cmp-model/latest"
    assert tags["model_a.version"] == str(versions[0]) and tags["model_b.version"] == str(versions[1])
    assert tags["model_a.pinned"] == f"models:/cmp-model/{versions[0]}"
    assert tags["model_a.run_id"] == tr.client.get_model_version("cmp-model", str(versions[0])).run_id
    assert tags["model_a.training_languages"] == "en,ru"
    # the run's model inputs are the two versions' MLflow models (the UI links the run to both)
    run = tr.client.get_run(out["run_id"])
    linked = {m.model_id for m in run.inputs.model_inputs}
    sources = {tr.client.get_model_version("cmp-model", str(v)).source for v in versions}   # models:/m-<id>
    assert {f"models:/{m}" for m in linked} == sources and len(linked) == 2
    # the registered versions hold the same weights as the folders (their hf/ export): the same numbers
    reg, folders = _rows(out["result"]), _rows(compared["result"])
    for lang in LANGS:
        for metric in ("top1", "pseudo_perplexity"):
            for side in ("a", "b"):
                assert reg[(metric, lang)][side] == pytest.approx(folders[(metric, lang)][side], rel=1e-4), \
                    (metric, lang, side)


def test_cli_prints_the_table(two_models, tmp_path, capsys):
    from flows.cli import main
    code = main(["compare", str(two_models["a"]), str(two_models["b"]), "--config", str(two_models["cfg"]),
                 "--set", "tracking.enabled=false", "--out", str(tmp_path / "cli")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "pseudo_perplexity" in out and "B-A" in out and "en (original): pseudo-perplexity" in out and "(x0." in out
    assert (tmp_path / "cli" / "compare.png").is_file() and (tmp_path / "cli" / "compare.md").is_file()
    code = main(["compare", str(two_models["a"]), str(two_models["b"]), "--config", str(two_models["cfg"]),
                 "--set", "tracking.enabled=false", "--out", str(tmp_path / "cli"), "--json"])
    got = json.loads(capsys.readouterr().out)
    assert code == 0 and got["run_id"] is None and got["languages"] == {"en": "original", "ru": "original"}
    assert {(r["metric"], r["lang"]) for r in got["rows"]} >= {("top1", "en"), ("pseudo_perplexity", "ru")}


def test_bad_references_are_clear_errors(two_models, compared, tmp_path, capsys):
    """(``compared`` logged to the config's registry, so it exists: the unknown name is what fails.)"""
    from flows.cli import main
    code = main(["compare", str(tmp_path / "nope"), str(two_models["b"]), "--config", str(two_models["cfg"])])
    err = capsys.readouterr().err
    assert code != 0 and "nope: no such model folder" in err and "Traceback" not in err
    code = main(["compare", "models:/no-such-model@champion", str(two_models["b"]), "--config", str(two_models["cfg"])])
    err = capsys.readouterr().err
    assert code != 0 and "models:/no-such-model@champion: not found in the registry" in err, err
    assert "registered models:" in err


def test_prefect_flow_publishes_the_table(two_models, prefect_harness, tmp_path):
    """The mlm-compare flow runs the CLI's function and publishes the table as a markdown artifact."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    from flows.compare import compare_flow
    out = compare_flow(config_path=str(two_models["cfg"]), model_a=str(two_models["a"]), model_b=str(two_models["b"]),
                       overrides=["tracking.enabled=false"])
    assert out["published"] is True and out["run_id"] is None          # tracking off: files and artifact only
    with get_client(sync_client=True) as c:
        art = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["model-compare"])),
                               sort=ArtifactSort.CREATED_DESC, limit=1)[0]
    assert art.type == "markdown" and "| pseudo_perplexity | en | original |" in art.data, art.data
    assert Path(out["paths"]["png"]).is_file()


def test_a_model_with_another_tokenizer_gets_pseudo_perplexity_only(two_models, tmp_path):
    """A model whose tokenizer differs from the held-out shards' (e.g. an extended one): no masked-token metrics
    (its ids would mean other tokens), pseudo-perplexity through its own tokenizer on the same held-out texts."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from mlm_core.compare import compare_models
    from mlm_core.config import ModelConfig
    from mlm_core.evaluate.intrinsic import validation_texts
    from mlm_core.evaluate.pll import evaluate_pll
    from mlm_core.model import MLMEncoder, resolve_arch, save_weights
    from mlm_core.shards import ShardDataset
    lc, arts = two_models["lc"], two_models["arts"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    texts = [ln for lang in LANGS for ln in (two_models["root"] / f"{lang}.txt").read_text(encoding="utf-8").splitlines()]
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    folder = tmp_path / "other"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    model = MLMEncoder(resolve_arch(ModelConfig(size="tiny", max_positions=64, dropout=0.0), tok.get_vocab_size(), 0))
    save_weights(model.eval(), folder / "model.safetensors")
    res = compare_models(two_models["a"], folder, lc, labels=("a", "other"))
    rows = _rows(res)
    assert res["notes"] and "tokenizer differs" in res["notes"][0] and str(folder) in res["notes"][0]
    with ShardDataset(arts["shards"].path) as ds:
        fraction = ds.manifest["config"]["shards"]["validation_fraction"]
        held = validation_texts(arts["normalize"].path, list(LANGS), fraction, lc.config.evaluate.pll_sentences,
                                ds.manifest.get("validation_docs"))
        seq_len = ds.seq_len
    want = evaluate_pll(model, tok, held, lc.config.evaluate, max_tokens=seq_len - 2)
    for lang in LANGS:
        assert rows[("top1", lang)]["b"] is None and rows[("top1", lang)]["delta"] is None
        assert rows[("top1", lang)]["a"] is not None
        assert rows[("pseudo_perplexity", lang)]["b"] == pytest.approx(want[lang]["pseudo_perplexity"], rel=1e-9)


# ------------------------------------------------------------------------------------------ extended tokenizer
K_NEW = 3


def _extended_b(two_models, folder: Path, new_bias: float, k: int = K_NEW) -> Path:
    """A's model with k vocabulary rows appended after its last id (what ``tokenizer.extend`` produces): its
    tokenizer is A's plus k new tokens, its new output rows get the head bias ``new_bias`` (the decoder is tied
    to the embeddings, the bias is per row: -1e4 keeps a new token from ever being the argmax, a large one makes one
    the argmax everywhere, +300 here). The old rows are A's, bit for bit."""
    import dataclasses

    import torch
    from tokenizers import Tokenizer

    from mlm_core.fillmask import load_model_dir
    from mlm_core.model import MLMEncoder, save_weights
    model, _, _ = load_model_dir(two_models["a"])
    tok = Tokenizer.from_file(str(two_models["a"] / "tokenizer.json"))
    V = int(model.arch.vocab_size)
    assert tok.get_vocab_size(with_added_tokens=True) == V
    assert tok.add_tokens([f"qqxnew{i}" for i in range(k)]) == k
    assert sorted(tok.token_to_id(f"qqxnew{i}") for i in range(k)) == list(range(V, V + k))   # appended
    big = MLMEncoder(dataclasses.replace(model.arch, vocab_size=V + k))
    state = {}
    for name, t in model.state_dict().items():
        if name in ("tok_emb.weight", "decoder.weight"):
            t = torch.cat([t, t[:k].clone()])          # any new rows: the bias below decides their logits
        elif name == "head_bias":
            t = torch.cat([t, torch.full((k,), float(new_bias))])
        state[name] = t
    big.load_state_dict(state, strict=True)
    folder.mkdir(parents=True)
    tok.save(str(folder / "tokenizer.json"))
    save_weights(big.eval(), folder / "model.safetensors")
    return folder


def _score_b(two_models, folder: Path):
    from mlm_core import stages
    from mlm_core.compare import score_model
    lc, arts = two_models["lc"], two_models["arts"]
    plans = stages.plan(lc)
    return score_model(folder, arts["shards"].path, arts["normalize"].path, lc, plans["tokenizer"].path)


def test_an_extended_tokenizer_is_scored_on_the_token_rows(two_models, compared, tmp_path):
    """B = A plus new vocabulary rows that are never the argmax: B predicts exactly what A predicts at every
    position, so its top-1 / top-5 / MRR are A's; the note says it is scored on the base segmentation."""
    from mlm_core.compare import tokenizer_relation
    b = _extended_b(two_models, tmp_path / "ext_low", -1e4)
    assert tokenizer_relation(b, two_models["arts"]["tokenizer"].path) == "extension"
    ev, _, notes = _score_b(two_models, b)
    a = compared["result"]["evaluation"]["a"]["intrinsic"]
    assert len(notes) == 1 and "extends" in notes[0] and "base segmentation" in notes[0] and str(b) in notes[0]
    assert "own extended tokenizer" in notes[0]
    for lang in LANGS:
        got = ev["intrinsic"][lang]
        assert got["top1"] is not None and got["n_positions"] == a[lang]["n_positions"] > 0
        for key in ("top1", "top5", "mrr", "baseline_top1"):
            assert got[key] == a[lang][key], (lang, key)
        assert ev["pll"][lang]["pseudo_perplexity"] is not None
    # the comparison table carries B's masked-token metrics (not empty, as for an unrelated tokenizer)
    from mlm_core.compare import metric_values
    values = metric_values(ev, {})
    for lang in LANGS:
        assert values[("top1", lang)][0] == a[lang]["top1"]


def test_an_extended_model_that_predicts_its_new_tokens_scores_zero(two_models, tmp_path):
    """The same B with the new rows always the argmax: every position is wrong (a predicted new token counts
    as wrong), so the extension path really scores B's own logits over its whole vocabulary."""
    # +300: far above any old logit of this tiny model, yet the per-token loss (~300 nats) keeps exp() finite
    # for the pseudo-perplexity (pll.pseudo_perplexity overflows past ~709)
    b = _extended_b(two_models, tmp_path / "ext_high", 300.0, k=5)
    ev, _, notes = _score_b(two_models, b)
    assert "extends" in notes[0]
    for lang in LANGS:      # five new tokens above every old one: the true token ranks 6th or lower
        r = ev["intrinsic"][lang]
        assert r["n_positions"] > 0 and r["top1"] == 0.0 and r["top5"] == 0.0 and 0 < r["mrr"] <= 1 / 6


def _edited_tokenizer(two_models, folder: Path, swap: tuple[str, str] | None, special_swap: bool = False) -> Path:
    """A's tokenizer.json plus two appended tokens, with two tokens' ids exchanged (``swap``: two vocabulary
    strings; ``special_swap``: [MASK] and an ordinary token) so a shared token sits at another id."""
    base = json.loads((two_models["a"] / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = base["model"]["vocab"]
    if special_swap:
        plain = next(t for t, i in sorted(vocab.items(), key=lambda kv: -kv[1]) if not t.startswith("["))
        swap = ("[MASK]", plain)
    x, y = swap
    vocab[x], vocab[y] = vocab[y], vocab[x]
    for added in base["added_tokens"]:
        if added["content"] in (x, y):
            added["id"] = vocab[added["content"]]
    n = max(vocab.values()) + 1
    vocab["qqxnew0"], vocab["qqxnew1"] = n, n + 1
    folder.mkdir(parents=True)
    (folder / "tokenizer.json").write_text(json.dumps(base), encoding="utf-8")
    return folder


def test_a_shared_token_at_another_id_is_not_an_extension(two_models, tmp_path):
    from tokenizers import Tokenizer

    from mlm_core.compare import tokenizer_relation
    tok_dir = two_models["arts"]["tokenizer"].path
    base = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    plain = sorted((i, t) for t, i in base.get_vocab().items() if not t.startswith("["))
    moved = _edited_tokenizer(two_models, tmp_path / "moved", (plain[10][1], plain[11][1]))
    special = _edited_tokenizer(two_models, tmp_path / "special", None, special_swap=True)
    loaded = Tokenizer.from_file(str(special / "tokenizer.json"))
    assert loaded.token_to_id("[MASK]") != base.token_to_id("[MASK]")           # the edit took
    assert tokenizer_relation(moved, tok_dir) == "other" and tokenizer_relation(special, tok_dir) == "other"
    assert tokenizer_relation(two_models["a"], tok_dir) == "same"
    # the model behind the moved tokenizer: an extended model (ids appended) with the id-swapped tokenizer
    b = _extended_b(two_models, tmp_path / "ext", -1e4, k=2)
    (b / "tokenizer.json").write_text((moved / "tokenizer.json").read_text(encoding="utf-8"), encoding="utf-8")
    ev, _, notes = _score_b(two_models, b)
    assert len(notes) == 1 and "tokenizer differs" in notes[0] and "masked-token metrics not computed" in notes[0]
    for lang in LANGS:
        assert ev["intrinsic"][lang].get("missing") and ev["intrinsic"][lang].get("top1") is None
        assert ev["pll"][lang]["pseudo_perplexity"] is not None


def test_evaluate_refuses_another_vocabulary_size_unless_told_the_tokenizer_extends():
    """The evaluate stage (no flag) keeps refusing a model whose vocabulary differs from the shards'; the flag
    admits a larger one only, never a smaller."""
    from types import SimpleNamespace

    from mlm_core.evaluate.intrinsic import evaluate_intrinsic

    class Stop(Exception):
        pass

    class Shards:                   # what evaluate_intrinsic reads before scoring; then stop
        manifest = {"vocab_size": 400}

        def languages(self, split):
            raise Stop

    specials = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    for vocab, flag, refused in ((403, False, True), (397, False, True), (397, True, True), (403, True, False)):
        model = SimpleNamespace(arch=SimpleNamespace(vocab_size=vocab))
        if refused:
            with pytest.raises(ValueError, match=f"the shards were encoded with a vocabulary of 400 tokens, "
                                                 f"the model has {vocab}"):
                evaluate_intrinsic(model, Shards(), None, specials, counts={}, extended_tokenizer=flag)
        else:
            with pytest.raises(Stop):       # past the check
                evaluate_intrinsic(model, Shards(), None, specials, counts={}, extended_tokenizer=flag)
