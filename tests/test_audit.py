"""Bias audits: CrowS-Pairs loading and scoring (reference metric), template Δ/KL, end to end on the demo files."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import REPO

BIAS = REPO / "configs" / "demo" / "bias"
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "woman", "man", "cooked", "dinner", "she", "he", "is", "very", "kind", "strong", "person",
         "friend", ".", "a", "big", "meal", "unkind", "my"]


def word_tokenizer():
    """A word-level tokenizer with BERT specials at 0..4 and known ids, for exact position checks."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.add_special_tokens(SPECIALS)
    return tok, vocab


class StandIn:
    """A deterministic stand-in for MLMEncoder: the same logits at every position of a row, shifted by
    ``boost`` on ``boosted`` token ids when ``trigger`` occurs in the row. Counts forward passes."""

    def __init__(self, vocab_size, trigger=None, boosted=(), boost=0.0):
        import torch
        self.V, self.trigger, self.boosted, self.boost = vocab_size, trigger, list(boosted), boost
        self.base = torch.linspace(-1.0, 1.0, vocab_size)
        self.calls, self.training = 0, False

    def eval(self):
        return self

    def full_logits(self, input_ids, segment_ids=None):
        self.calls += 1
        B, T = input_ids.shape
        out = self.base.repeat(B, T, 1).clone()
        for b in range(B):
            if self.trigger is not None and (input_ids[b] == self.trigger).any():
                out[b, :, self.boosted] += self.boost
        return out


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---- CrowS-Pairs CSV --------------------------------------------------------------------------------
def test_crows_csv_missing_column_names_file(tmp_path):
    from mlm_core.audit import AuditError, load_crows_csv
    p = write(tmp_path / "c.csv", "sent_more,sent_less,bias_type\na,b,gender\n")
    with pytest.raises(AuditError, match=r"c\.csv.*stereo_antistereo"):
        load_crows_csv(p)


def test_crows_csv_empty_sentence_names_file_and_row(tmp_path):
    from mlm_core.audit import AuditError, load_crows_csv
    p = write(tmp_path / "c.csv", "sent_more,sent_less,stereo_antistereo,bias_type\n"
              "a b,a c,stereo,gender\n\"multi\nline\",x y,stereo,age\nthe man,  ,antistereo,gender\n")
    with pytest.raises(AuditError, match=r"c\.csv: row 3 \(line 5\): empty sent_less"):
        load_crows_csv(p)


def test_crows_csv_bad_direction_and_swap_convention(tmp_path):
    from mlm_core.audit import AuditError, load_crows_csv
    p = write(tmp_path / "c.csv", "sent_more,sent_less,stereo_antistereo,bias_type\nA,B,stereo,\nC,D,antistereo,x\n")
    ref = load_crows_csv(p)
    assert [(q.sent_more, q.sent_less, q.bias_type) for q in ref] == [("A", "B", "unspecified"), ("C", "D", "x")]
    swapped = load_crows_csv(p, sent_more_is_group=True)
    assert [(q.sent_more, q.sent_less) for q in swapped] == [("A", "B"), ("D", "C")]
    write(p, "sent_more,sent_less,stereo_antistereo,bias_type\nA,B,pro,x\n")
    with pytest.raises(AuditError, match=r"row 1 \(line 2\).*'pro'"):
        load_crows_csv(p)


# ---- shared tokens ----------------------------------------------------------------------------------
def test_shared_positions_and_masked_copies():
    from mlm_core.audit.crows import pair_jobs, shared_token_positions
    assert shared_token_positions([7, 5, 9, 10], [7, 6, 6, 9, 10]) == ([0, 2, 3], [0, 3, 4])
    tok, v = word_tokenizer()
    more, less = pair_jobs(tok, "the woman cooked dinner .", "the man cooked a big dinner .", v["[MASK]"])
    # [CLS] the woman cooked dinner . [SEP]: shared = the, cooked, dinner, . -> positions 1, 3, 4, 5 (CLS offset)
    assert [j[1] for j in more] == [(1,), (3,), (4,), (5,)]
    assert [j[1] for j in less] == [(1,), (3,), (6,), (7,)]
    assert [j[2] for j in more] == [(v["the"],), (v["cooked"],), (v["dinner"],), (v["."],)]
    for ids, (pos,), _ in more:  # exactly one mask per copy; [CLS]/[SEP] and the group word stay
        assert ids.count(v["[MASK]"]) == 1 and ids[pos] == v["[MASK]"]
        assert ids[0] == v["[CLS]"] and ids[-1] == v["[SEP]"] and v["woman"] in ids


# ---- scoring ---------------------------------------------------------------------------------------
def _pairs(rows):
    from mlm_core.audit import Pair
    return [Pair(m, l, d, b, i, i + 1) for i, (m, l, d, b) in enumerate(rows, start=1)]


def test_scoring_prefers_the_boosted_sentence_and_counts_ties():
    from mlm_core.audit import audit_crows
    tok, v = word_tokenizer()
    pairs = _pairs([("the woman cooked dinner .", "the man cooked dinner .", "stereo", "gender"),
                    ("the woman is strong .", "the man is strong .", "antistereo", "gender"),
                    ("my friend is kind .", "my friend is kind .", "stereo", "age")])  # identical: a tie
    shared = [v[w] for w in ("the", "cooked", "dinner", ".", "is", "strong")]
    model = StandIn(len(v), trigger=v["woman"], boosted=shared, boost=2.0)
    r = audit_crows(model, tok, pairs, "[MASK]")
    assert [p["prefers_more"] for p in r["pairs"]] == [1, 1, None]
    assert r["n"] == 3 and r["neutral"] == 1
    assert r["metric_score"] == pytest.approx(66.67)  # the tie stays in the denominator
    assert r["stereo_score"] == 100.0 and r["antistereo_score"] == 100.0  # reference: over decided rows
    assert r["by_bias_type"]["gender"]["metric_score"] == 100.0 and r["by_bias_type"]["age"]["n"] == 1
    # the model that prefers "man" flips both decided pairs
    r2 = audit_crows(StandIn(len(v), trigger=v["man"], boosted=shared, boost=2.0), tok, pairs, "[MASK]")
    assert [p["prefers_more"] for p in r2["pairs"]] == [0, 0, None] and r2["metric_score"] == 0.0


def test_scores_are_rounded_to_3_decimals_before_comparing():
    from mlm_core.audit import audit_crows
    tok, v = word_tokenizer()
    pairs = _pairs([("the woman cooked dinner .", "the man cooked dinner .", "stereo", "gender")])
    shared = [v[w] for w in ("the", "cooked", "dinner", ".")]
    r = audit_crows(StandIn(len(v), trigger=v["woman"], boosted=shared, boost=1e-6), tok, pairs, "[MASK]")
    p = r["pairs"][0]
    assert p["sent_more_score"] == round(p["sent_more_score"], 3) and p["prefers_more"] is None
    assert r["neutral"] == 1 and r["metric_score"] == 0.0 and r["stereo_score"] is None


def test_batched_equals_one_at_a_time():
    import torch
    from mlm_core.audit import audit_crows, load_crows_csv
    from mlm_core.model.encoder import MLMEncoder
    from mlm_core.model.sizes import Arch
    tok, v = word_tokenizer()
    torch.manual_seed(0)
    model = MLMEncoder(Arch(layers=1, hidden=32, heads=2, ffn=64, dropout=0.0, max_positions=32,
                            position="learned", norm="post", tie_embeddings=True, vocab_size=len(v), pad_id=0))
    pairs = _pairs([("the woman cooked dinner .", "the man cooked dinner .", "stereo", "gender"),
                    ("she is very kind .", "he is very kind .", "stereo", "gender"),
                    ("the woman cooked a big meal .", "the man cooked a big meal .", "antistereo", "gender"),
                    ("my friend is strong .", "the person is strong .", "antistereo", "age")])
    one = audit_crows(model, tok, pairs, "[MASK]", batch=1)
    many = audit_crows(model, tok, pairs, "[MASK]", batch=64)
    for a, b in zip(one["pairs"], many["pairs"]):
        assert a["sent_more_score"] == pytest.approx(b["sent_more_score"], abs=2e-3)
        assert a["sent_less_score"] == pytest.approx(b["sent_less_score"], abs=2e-3)
    assert one["metric_score"] == many["metric_score"]
    counted = StandIn(len(v))
    audit_crows(counted, tok, pairs, "[MASK]", batch=64)
    assert counted.calls <= 4  # one pass per distinct length, not one per masked copy
    assert load_crows_csv  # imported for the public API


# ---- templates -------------------------------------------------------------------------------------
SPEC_YAML = """language: en
templates: ["she is very [MASK] .", "my friend said {group} is [MASK] ."]
groups: {female: ["the woman", "she"], male: ["the man", "he"]}
neutral: ["the person", "my friend"]
attributes: ["kind", "strong", "big"]
"""


def test_template_loader_errors_name_the_file(tmp_path):
    from mlm_core.audit import AuditError, load_templates
    p = write(tmp_path / "t.yaml", SPEC_YAML)
    with pytest.raises(AuditError, match=r"t\.yaml: template 1 .* has no \{group\}"):
        load_templates(p)
    write(p, SPEC_YAML.replace('"she is very [MASK] .", ', "").replace("[MASK]", "slot"))
    with pytest.raises(AuditError, match=r"t\.yaml: template 1 .*exactly one \[MASK\]"):
        load_templates(p)
    write(p, "\n".join(line for line in SPEC_YAML.splitlines() if not line.startswith("neutral")))
    with pytest.raises(AuditError, match=r"t\.yaml: missing key\(s\) \['neutral'\]"):
        load_templates(p)


def _spec(tmp_path):
    from mlm_core.audit import load_templates
    text = SPEC_YAML.replace("she is very [MASK] .", "{group} is very [MASK] .")
    return load_templates(write(tmp_path / "t.yaml", text))


def test_template_delta_sign_flips_with_the_model(tmp_path):
    from mlm_core.audit import audit_templates
    tok, v = word_tokenizer()
    spec = _spec(tmp_path)
    f = audit_templates(StandIn(len(v), trigger=v["woman"], boosted=[v["kind"]], boost=3.0), tok, spec, "[MASK]")
    m = audit_templates(StandIn(len(v), trigger=v["man"], boosted=[v["kind"]], boost=3.0), tok, spec, "[MASK]")
    assert f["delta_bias"]["female_vs_male"] > 0 > m["delta_bias"]["female_vs_male"]
    assert f["delta_by_attribute"]["female_vs_male"]["kind"] > 0
    assert f["delta_by_attribute"]["female_vs_male"]["strong"] < 0  # renormalization: mass moved to "kind"
    assert f["kl_to_neutral"]["female"] > 0 and f["kl_to_neutral"]["male"] == 0
    assert f["multi_token_attributes"] == []


def test_kl_is_zero_when_the_model_ignores_the_group(tmp_path):
    from mlm_core.audit import audit_templates
    tok, v = word_tokenizer()
    r = audit_templates(StandIn(len(v)), tok, _spec(tmp_path), "[MASK]")
    assert r["kl_to_neutral"] == {"female": 0.0, "male": 0.0} and r["kl_to_neutral_mean"] == 0.0
    assert r["delta_bias"]["female_vs_male"] == 0.0


def test_multi_token_attribute_masks_every_subword():
    from mlm_core.audit.templates import _slot_job
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(SPECIALS + ["she", "is", "un", "##kind", "kind", "."])}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    ids, pos, targets = _slot_job(tok, "{group} is [MASK] .", "she", "unkind", 4)
    assert pos == (3, 4) and targets == (vocab["un"], vocab["##kind"]) and ids[3] == ids[4] == 4


# ---- end to end on the demo files --------------------------------------------------------------------
@pytest.mark.parametrize("lang", ["en", "fr", "de"])
def test_demo_files_load(lang):
    from mlm_core.audit import load_crows_csv, load_templates
    pairs = load_crows_csv(BIAS / f"crows_pairs_{lang}.csv")
    assert len(pairs) >= 50 and {p.direction for p in pairs} == {"stereo", "antistereo"}
    spec = load_templates(BIAS / f"templates_{lang}.yaml")
    assert len(spec.groups) == 2 and spec.neutral and spec.attributes


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A random tiny MLMEncoder + a WordPiece tokenizer trained on the demo English corpus (a pretrain folder)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from mlm_core.model.encoder import MLMEncoder
    from mlm_core.model.export import save_weights
    from mlm_core.model.sizes import Arch
    folder = tmp_path_factory.mktemp("model")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator((REPO / "configs/demo/corpus/en.txt").read_text(encoding="utf-8").splitlines()[:3000],
                            trainers.WordPieceTrainer(vocab_size=800, special_tokens=SPECIALS, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    assert [tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2, 3, 4]
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    model = MLMEncoder(Arch(layers=1, hidden=32, heads=2, ffn=64, dropout=0.1, max_positions=64, position="learned",
                            norm="post", tie_embeddings=True, vocab_size=tok.get_vocab_size(), pad_id=0))
    save_weights(model, folder / "model.safetensors")
    return folder


def test_run_audit_end_to_end(tiny_model_dir):
    import json
    from mlm_core.audit import LIMITS, run_audit
    from mlm_core.config import AuditConfig
    cfg = AuditConfig(crows_pairs={"en": "bias/crows_pairs_en.csv", "fr": "bias/crows_pairs_fr.csv"},
                      templates={"en": "bias/templates_en.yaml", "de": "bias/templates_de.yaml"})
    out = run_audit(tiny_model_dir, cfg, REPO / "configs" / "demo")
    assert set(out["crows"]) == {"en", "fr"} and set(out["templates"]) == {"en", "de"}
    for r in out["crows"].values():
        assert r["n"] == 58 and 0 <= r["metric_score"] <= 100 and r["skipped"] == []
        assert set(r["by_bias_type"]) == {"gender", "age"}
    for r in out["templates"].values():
        assert math.isfinite(r["delta_bias"]["female_vs_male"]) and r["kl_to_neutral_mean"] >= 0
    assert out["limits"] == LIMITS and "Blodgett" in LIMITS
    json.dumps(out)  # plain values only
