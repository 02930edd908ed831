"""The adapt demo (configs/adapt.yaml) at a small size: continued pretraining of a base model on real German and
Hindi text it never saw, with replay of the base's own corpus in its other languages and an extended tokenizer,
then `mlm compare` before vs after.

The base is a tiny model trained here on the demo corpus in all seven languages (a local folder instead of the
registry's models:/mlm-demo@champion, which needs `make demo`); the adapt run is configs/adapt.yaml itself, with
overrides for size only (fewer lines and steps, fewer new tokens, shorter rows, no transfer fine-tuning, no
tracking; the replay sources point at the base's own cut of the demo corpus). Checked: the tokenizer was extended
after the base's ids and passes the default UNK limit on the new text; pseudo-perplexity on the new text's held-out
documents drops below the base model's in both languages; the comparison on the base's own held-out data reports
every base language for both models (what the demo languages lost)."""
from __future__ import annotations

import pytest

from conftest import REPO, write_lines

pytestmark = pytest.mark.usefixtures("one_torch_thread")
HEAVY_FIXTURES = {"adapted"}   # module fixtures that train or run stages: their tests are heavy (tests/conftest.py)
DEMO_LANGS = ("en", "fr", "de", "ru", "ar", "hi", "zh")
BASE_LANGS = ("en", "de", "hi")     # three of the demo's seven keep the test fast: one replay language (en)
NEW = ("de", "hi")
REPLAY = tuple(lang for lang in BASE_LANGS if lang not in NEW)
EXTEND = 200
SMALL = ["pretrain.steps=80", "pretrain.batch_size=16", "pretrain.warmup_steps=8", "pretrain.eval_every=80",
         "pretrain.checkpoint_every=80", "pretrain.lr=1e-3", "shards.seq_len=64", "shards.min_validation_tokens=600",
         "tokenizer.heldout_docs=10", f"tokenizer.extend={EXTEND}", "evaluate.max_sequences=16", "evaluate.pll_sentences=10",
         "evaluate.upos=null", "evaluate.classification=null", "evaluate.retrieval=null", "tracking.enabled=false"]


@pytest.fixture(scope="module")
def adapted(tmp_path_factory, shared_data):
    import yaml

    from mlm_core import stages
    from mlm_core.config.io import load_config
    root = tmp_path_factory.mktemp("adapt")
    # the base: the demo's recipe (WordPiece, token masking) on 150 demo-corpus lines per language
    sources = {}
    for lang in BASE_LANGS:
        lines = (REPO / "configs/demo/corpus" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:150]
        sources[lang] = {"paths": [str(write_lines(root / "base" / f"{lang}.txt", lines))]}
    base_raw = {"name": "base", "workdir": str(root / "base-work"), "sources": sources, "normalize": {"workers": 1},
                "tokenizer": {"algorithm": "wordpiece", "vocab_size": 700, "heldout_docs": 10, "min_vocab_fraction": 0.1,
                              "max_unk_rate": 0.5, "max_fertility": 20.0},
                "shards": {"seq_len": 64, "workers": 1, "min_validation_tokens": 600},
                "pretrain": {"model": {"size": "tiny", "max_positions": 64, "dropout": 0.0}, "steps": 150,
                             "batch_size": 16, "lr": 2e-3, "warmup_steps": 10, "eval_every": 150,
                             "checkpoint_every": 150, "masking": {"strategy": "token"}},
                "evaluate": {"max_sequences": 16, "pll_sentences": 10}, "tracking": {"enabled": False}}
    base_cfg = root / "base.yaml"
    base_cfg.write_text(yaml.safe_dump(base_raw), encoding="utf-8")
    base_lc = load_config(base_cfg)
    plans = stages.plan(base_lc)
    base = {n: stages.execute(base_lc, n, plans)[0] for n in ("normalize", "tokenizer", "shards", "pretrain")}
    # the adapt run: configs/adapt.yaml with its real text cut to a few hundred lines and its replay cut to the
    # base's languages (the base's own lines); a copy in the temporary folder, its other relative paths made absolute
    adapt_raw = yaml.safe_load((REPO / "configs" / "adapt.yaml").read_text(encoding="utf-8"))
    # the shipped demo: the new text plus replay of every other demo language (the same files as configs/demo.yaml)
    demo_raw = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text(encoding="utf-8"))
    assert sorted(adapt_raw["sources"]) == sorted(DEMO_LANGS)
    assert all(adapt_raw["sources"][lang] == demo_raw["sources"][lang] for lang in DEMO_LANGS if lang not in NEW)
    assert all("shared/data/text" in adapt_raw["sources"][lang]["paths"][0] for lang in NEW)
    assert adapt_raw["tokenizer"]["extend"] > 0 and "max_unk_rate" not in adapt_raw["tokenizer"]
    new_sources = {lang: {"paths": sources[lang]["paths"]} for lang in REPLAY}
    for lang, n in (("de", 400), ("hi", 60)):
        lines = (shared_data / "text" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:n]
        new_sources[lang] = {"paths": [str(write_lines(root / "new" / f"{lang}.txt", lines))]}
    adapt_raw["sources"] = new_sources
    for kind in ("crows_pairs", "templates"):
        adapt_raw["audit"][kind] = {k: str(REPO / "configs" / v) for k, v in adapt_raw["audit"][kind].items()}
    adapt_cfg = root / "adapt.yaml"
    adapt_cfg.write_text(yaml.safe_dump(adapt_raw, allow_unicode=True), encoding="utf-8")
    over = [f"workdir={root / 'adapt-work'}", f"pretrain.init_from={base['pretrain'].path}", *SMALL,
            "normalize.workers=1", "shards.workers=1"]
    lc = load_config(adapt_cfg, over)
    plans = stages.plan(lc)
    arts = {n: stages.execute(lc, n, plans)[0] for n in ("normalize", "tokenizer", "shards", "pretrain", "evaluate")}
    return {"base_cfg": base_cfg, "base": base["pretrain"].path, "lc": lc, "arts": arts, "over": over, "root": root,
            "adapt_cfg": adapt_cfg}


def test_pseudo_perplexity_on_the_new_text_drops_below_the_base(adapted):
    from tasks.compare import run_compare
    out = run_compare(str(adapted["adapt_cfg"]), str(adapted["base"]), str(adapted["arts"]["pretrain"].path),
                      adapted["over"], str(adapted["root"] / "cmp-new"))
    rows = {(r["metric"], r["lang"]): r for r in out["result"]["rows"]}
    for lang in NEW:
        r = rows[("pseudo_perplexity", lang)]
        assert r["b"] < 0.9 * r["a"], (lang, r)        # adapted: clearly lower on the held-out new text
        assert r["status"] == "original"               # the base was trained on de and hi (its demo-style text)
    assert out["result"]["training_languages"] == [sorted(BASE_LANGS), sorted(BASE_LANGS)]
    # the adapt run's own evaluate stage measured the same held-out texts the comparison did
    ev = adapted["arts"]["evaluate"].manifest["languages"]
    for lang in NEW:
        assert ev[lang]["pseudo_perplexity"] == pytest.approx(rows[("pseudo_perplexity", lang)]["b"], rel=1e-9)


def test_the_tokenizer_is_extended_and_stops_unking_the_new_text(adapted):
    """extend: new ids after every base id, and the new text's UNK rate within the default limit (0.02)."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from mlm_core.config import TokenizerConfig
    tok_dir = adapted["arts"]["tokenizer"].path
    ext = adapted["arts"]["tokenizer"].manifest["extension"]
    base_vocab = Tokenizer.from_file(str(adapted["base"] / "tokenizer.json")).get_vocab(with_added_tokens=True)
    assert ext["base_vocab_size"] == len(base_vocab) and 0 < ext["added"] <= EXTEND
    new_vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab(with_added_tokens=True)
    assert {t: new_vocab[t] for t in base_vocab} == base_vocab
    stats = pq.read_table(tok_dir / "stats.parquet").to_pylist()
    unk = {r["lang"]: r["unk_rate"] for r in stats}
    assert adapted["lc"].config.tokenizer.max_unk_rate == TokenizerConfig().max_unk_rate   # the default limit
    assert all(unk[lang] <= TokenizerConfig().max_unk_rate for lang in NEW), unk


def test_forgetting_is_reported_on_the_base_languages(adapted):
    """The comparison on the base's own held-out data: every base language, both models' pseudo-perplexity, B - A.
    The adapted model's tokenizer extends the base's (old ids kept), so it is scored on the base's token rows
    too: both models' masked top-1, with the note saying B is scored on the base segmentation."""
    from tasks.compare import run_compare
    out = run_compare(str(adapted["base_cfg"]), str(adapted["base"]), str(adapted["arts"]["pretrain"].path),
                      ["tracking.enabled=false"], str(adapted["root"] / "cmp-base"))
    rows = {(r["metric"], r["lang"]): r for r in out["result"]["rows"]}
    for lang in BASE_LANGS:
        r = rows[("pseudo_perplexity", lang)]
        assert r["a"] is not None and r["b"] is not None and r["delta"] == pytest.approx(r["b"] - r["a"])
        assert r["status"] == "original"
        r = rows[("top1", lang)]
        assert r["a"] is not None and r["b"] is not None and r["delta"] == pytest.approx(r["b"] - r["a"])
    assert any("extends the one the held-out shards were encoded with" in n for n in out["result"]["notes"])
    assert not any("tokenizer differs" in n for n in out["result"]["notes"])
