"""debias.projection (SentenceDebias, Liang et al. 2020; issue 13 part 1): the subspace, the projection, and the
evaluate and audit stages scoring projected representations.

Expected values come from independent computations written here: a planted bias direction (the toy encoder's
pair members differ only along it), numpy's projection formula I - V^T (V V^T)^-1 V, and an unprojected run.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LIST_EN = """language: en
groups: [male, female]
pairs:
  - [he, she]
  - [his, her]
  - [man, woman]
  - [father, mother]
"""


def write_list(path: Path, text: str = LIST_EN) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ a planted bias
def toy_tokenizer(words: list[str]):
    """A word-level tokenizer with BERT specials: [CLS] w1 .. wn [SEP]."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok, vocab


class ToyEncoder:
    """h_t = E[id_t] + 0.5 * mean of E over the row's tokens: a linear encoder with context mixing. The two words
    of each listed pair have embeddings differing only along ``v``, so a sentence and its counterfactual differ
    only along v; the other words have large random embeddings (the direction of most variance is not v)."""

    def __init__(self, emb):
        import torch
        self.E = torch.as_tensor(emb, dtype=torch.float32)
        self.arch = SimpleNamespace(max_positions=64, pad_id=0, hidden=self.E.shape[1])
        self.training = False

    def parameters(self):
        return iter(())

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def encode(self, ids, seg=None):
        h = self.E[ids]
        m = (ids != 0).unsqueeze(-1).float() if seg is None else (seg > 0).unsqueeze(-1).float()
        ctx = (h * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)
        return h + 0.5 * ctx


def planted(seed: int = 0, hidden: int = 16):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=hidden)
    v /= np.linalg.norm(v)
    pairs = [("he", "she"), ("his", "her"), ("man", "woman"), ("father", "mother")]
    other = [f"w{i}" for i in range(30)]
    tok, vocab = toy_tokenizer([w for p in pairs for w in p] + other)
    E = np.zeros((len(vocab), hidden))
    for w in other:                       # large, anisotropic: the top variance direction is far from v
        E[vocab[w]] = rng.normal(size=hidden) * np.linspace(8, 1, hidden)
    for a, b in pairs:
        base, amp = rng.normal(size=hidden), rng.uniform(0.5, 1.5)
        E[vocab[a]], E[vocab[b]] = base + amp * v, base - amp * v
    sentences = []
    for i in range(60):
        words = list(rng.choice(other, size=rng.integers(3, 9)))
        words.insert(int(rng.integers(0, len(words))), pairs[i % len(pairs)][int(rng.integers(0, 2))])
        sentences.append(" ".join(words) + ".")
    return ToyEncoder(E), tok, v, sentences


def test_subspace_recovers_a_planted_bias_direction(tmp_path):
    from mlm_core.bias.projection import fit_subspace, sentence_embeddings
    from mlm_core.bias.wordlists import load_wordlist
    model, tok, v, sentences = planted()
    wl = load_wordlist(write_list(tmp_path / "en.yaml"))
    sub = fit_subspace(model, tok, {"en": [" ".join(sentences)]}, {"en": wl}, k=2, max_sentences=1000)
    V = sub.basis.numpy().astype(np.float64)
    assert sub.sentences == {"en": 60}
    assert abs(V[0] @ v) > 0.99                                         # cosine with the planted direction
    assert np.allclose(V @ V.T, np.eye(2), atol=1e-5)                   # orthonormal rows
    assert sub.explained_variance[0] > 0.99                              # all the pair variance is along v
    # the test can fail: PCA of the raw sentence vectors (no pair centring) finds the big distractor instead
    raw = sentence_embeddings(model, tok, sentences).numpy().astype(np.float64)
    top = np.linalg.svd(raw - raw.mean(0), full_matrices=False)[2][0]
    assert abs(top @ v) < 0.5


def test_too_few_defining_sentences_is_an_error_naming_the_key(tmp_path):
    from mlm_core.bias.projection import ProjectionError, fit_subspace
    from mlm_core.bias.wordlists import load_wordlist
    model, tok, _, sentences = planted()
    wl = load_wordlist(write_list(tmp_path / "en.yaml"))
    with pytest.raises(ProjectionError, match=r"debias.projection.components = 3: 2 defining"):
        fit_subspace(model, tok, {"en": sentences}, {"en": wl}, k=3, max_sentences=2)


def test_project_removes_exactly_the_subspace_component():
    import torch

    from mlm_core.bias.projection import project
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(16, 2)))
    V = q.T                                                             # [2, 16], orthonormal rows
    h = rng.normal(size=(3, 5, 16))
    expected = h @ (np.eye(16) - V.T @ np.linalg.inv(V @ V.T) @ V)      # I - V^T (V V^T)^-1 V
    got = project(torch.tensor(h, dtype=torch.float64), torch.tensor(V, dtype=torch.float64)).numpy()
    assert np.allclose(got, expected, atol=1e-12)
    assert np.abs(got @ V.T).max() < 1e-12                              # nothing left in the subspace
    w = rng.normal(size=16)
    w -= V.T @ (V @ w)                                                  # a vector orthogonal to V is untouched
    assert np.allclose(project(torch.tensor(w), torch.tensor(V)).numpy(), w, atol=1e-12)


def test_applied_projection_reaches_encode_the_head_and_the_transfer_model():
    """A real tiny encoder: encode, full_logits and a fine-tuning task model (deep copy, adapters) all see
    projected states; the parameters and the state dict are unchanged."""
    import torch

    from mlm_core.bias.projection import apply_projection, project
    from mlm_core.evaluate.finetune import build_task_model
    from mlm_core.model.encoder import Arch, MLMEncoder
    torch.manual_seed(0)
    # pre-norm: the final norm is a LayerNorm (post-norm's is an Identity; both are wrapped the same way)
    model = MLMEncoder(Arch(layers=2, hidden=32, heads=2, ffn=64, dropout=0.0, max_positions=32, position="learned",
                            norm="pre", tie_embeddings=True, vocab_size=50, pad_id=0)).eval()
    keys = list(model.state_dict())
    ids = torch.randint(5, 50, (2, 7))
    h0, logits0 = model.encode(ids), model.full_logits(ids)
    V = torch.linalg.qr(torch.randn(model.arch.hidden, 2))[0].T.contiguous()
    apply_projection(model, V)
    assert list(model.state_dict()) == keys
    h1 = model.encode(ids)
    assert torch.allclose(h1, project(h0, V), atol=1e-5) and (h1 @ V.T).abs().max() < 1e-4
    assert torch.allclose(model.full_logits(ids), model.head(project(h0, V)), atol=1e-5)
    assert not torch.allclose(model.full_logits(ids), logits0, atol=1e-3)
    ft = SimpleNamespace(adapters=True, adapter_dim=4)
    task = build_task_model(model, 3, "token", ft, seed=0).eval()
    assert (task.encoder.encode(ids) @ V.T).abs().max() < 1e-4



# ------------------------------------------------------------------------------------------------ through the stages
def tiny_config(tmp_path: Path, **extra):
    """en + fr from the demo corpus (gender words in most sentences), a 3-step tiny model, the demo's en CrowS
    set and templates; ``extra`` sections added (debias)."""
    from conftest import REPO

    from mlm_core.config.io import load_config
    sources = {}
    for lang in ("en", "fr"):
        lines = (REPO / "configs/demo/corpus" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:200]
        (tmp_path / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        sources[lang] = {"paths": [str(tmp_path / f"{lang}.txt")]}
    bias = REPO / "configs/demo/bias"
    raw = {"workdir": str(tmp_path / "work"), "seed": 3, "sources": sources, "normalize": {"workers": 1},
           "tokenizer": {"algorithm": "wordpiece", "vocab_size": 600, "heldout_docs": 10, "sample_mb": 1.0,
                         "min_vocab_fraction": 0.1, "max_unk_rate": 0.5, "max_fertility": 20.0},
           "shards": {"seq_len": 32, "validation_fraction": 0.15, "workers": 1, "rows_per_shard": 64},
           "pretrain": {"steps": 3, "batch_size": 4, "model": {"size": "tiny", "max_positions": 64}},
           "evaluate": {"max_sequences": 4, "pll_sentences": 3},
           "audit": {"crows_pairs": {"en": str(bias / "crows_pairs_en.csv")},
                     "templates": {"en": str(bias / "templates_en.yaml")}}} | extra
    return load_config(raw=raw)


def test_pipeline_scores_projected_representations_and_unset_changes_nothing(tmp_path):
    """evaluate + audit with debias.projection: both store the subspace (the same bytes: one deterministic
    estimate from the normalized corpus) and record it in the manifest; their metrics are those of the projected
    model, so they differ from the unprojected run's on the same pretrain output. Unset: no record, no file, and
    the stage inputs are exactly the file stats they were."""
    from conftest import REPO

    from mlm_core.bias.projection import SUBSPACE_FILE, load_subspace
    from mlm_core.stage_calls import file_stats
    from mlm_core.stages import STAGES, execute, plan
    lists = {"en": str(REPO / "configs/bias/en.yaml"), "fr": str(REPO / "configs/bias/fr.yaml")}
    plain = tiny_config(tmp_path)
    proj = tiny_config(tmp_path, debias={"projection": {"lists": lists, "components": 2, "max_sentences": 40}})
    p_plain, p_proj = plan(plain), plan(proj)
    for s in ("normalize", "tokenizer", "shards", "pretrain"):          # the projection shares the training
        assert p_plain[s].fingerprint == p_proj[s].fingerprint
    for s in ("evaluate", "audit"):
        assert p_plain[s].fingerprint != p_proj[s].fingerprint
    a = plain.config.audit
    assert STAGES["audit"].inputs(plain) == file_stats(plain, [*a.crows_pairs.values(), *a.templates.values()])
    assert STAGES["evaluate"].inputs(plain) == file_stats(plain, [])
    arts = {s: execute(plain, s, p_plain)[0] for s in ("normalize", "tokenizer", "shards", "pretrain", "evaluate",
                                                        "audit")}
    proj_arts = {s: execute(proj, s, p_proj)[0] for s in ("evaluate", "audit", "register")}

    for s in ("evaluate", "audit"):
        assert "debias" not in arts[s].manifest and not (arts[s].path / SUBSPACE_FILE).exists()
        rec = proj_arts[s].manifest["debias"]["projection"]
        assert rec["components"] == 2 and rec["file"] == SUBSPACE_FILE
        assert rec["sentences"]["en"] == 40 and rec["sentences"]["fr"] == 40     # the demo has plenty
        assert len(rec["explained_variance"]) == 2 and 0 < sum(rec["explained_variance"]) <= 1 + 1e-9
        assert set(proj_arts[s].manifest["metrics"]) == set(arts[s].manifest["metrics"])
    ev_file, au_file = (proj_arts[s].path / SUBSPACE_FILE for s in ("evaluate", "audit"))
    assert ev_file.read_bytes() == au_file.read_bytes()
    V = load_subspace(ev_file).double().numpy()
    assert V.shape == (2, 128) and np.allclose(V @ V.T, np.eye(2), atol=1e-5)
    ev = json.loads((proj_arts["evaluate"].path / "evaluation.json").read_text(encoding="utf-8"))
    au = json.loads((proj_arts["audit"].path / "audit.json").read_text(encoding="utf-8"))
    assert ev["debias"]["projection"]["file"] == au["debias"]["projection"]["file"] == SUBSPACE_FILE
    # the scores are of another model: top-1 / PLL and the template audit move
    m0, m1 = arts["evaluate"].manifest["metrics"], proj_arts["evaluate"].manifest["metrics"]
    assert m0["en.pseudo_perplexity"] != m1["en.pseudo_perplexity"]
    a0, a1 = arts["audit"].manifest["metrics"], proj_arts["audit"].manifest["metrics"]
    assert a0["en.kl_to_neutral"] != a1["en.kl_to_neutral"]
    card = (proj_arts["register"].path / "model_card.md").read_text(encoding="utf-8")
    assert "SentenceDebias projection (`debias.projection`)" in card and "NOT projected" in card
    assert "sentence pairs en 40, fr 40" in card


def test_model_card_bias_section_names_the_mitigations_and_is_unchanged_without_them():
    from mlm_core.register.modelcard import bias_mitigations, model_card
    audit = {"crows": {"en": {"n": 10, "metric_score": 60.0}}, "limits": "L.",
             "debias": {"projection": {"components": 1, "sentences": {"en": 7}, "explained_variance": [0.5],
                                       "file": "projection.safetensors"}}}
    shards = {"cda": {"share": 0.5, "languages": {"en": {"selected": 9, "swapped": 4, "words": 11}}}}
    training = {"config": {"pretrain": {"bias_regularizer": {"weight": 0.1, "layer": -1, "lists": {"en": "x"}}}}}
    kw = dict(name="m", version=1, fingerprints={}, data={}, tokenizer={}, training=training, evaluation={},
              gates=[], promoted=False)
    card = model_card(audit=audit, mitigations=bias_mitigations(shards, training, audit), **kw)
    section = card[card.index("## Bias audit"):card.index("### CrowS-Pairs")]
    assert "en: 4 documents, 11 words swapped" in section
    assert "λ 0.1000, layer -1, lists: en" in section
    assert "k = 1 components" in section and "sentence pairs en 7" in section and "NOT projected" in section
    bare = {k: v for k, v in audit.items() if k != "debias"}
    assert bias_mitigations({}, {"config": {"pretrain": {"bias_regularizer": None}}}, bare) == {}
    assert model_card(audit=bare, mitigations={}, **kw) == model_card(audit=bare, **kw)
    assert "### Mitigation" not in model_card(audit=bare, mitigations={}, **kw)


@pytest.mark.parametrize("lists, message", [
    ({"en": "missing.yaml"}, r"missing.yaml: word-pair list file not found \(config key debias.projection.lists.en\)"),
    ({"xx": "configs/bias/en.yaml"}, r"debias.projection.lists.xx: language 'xx' is not in sources"),
    ({"en": "configs/bias/en.yaml", "electra": True}, r"debias.projection: not available with pretrain.objective electra"),
])
def test_a_bad_list_fails_before_any_stage_runs_naming_the_key(tmp_path, lists, message):
    """A missing file fails at planning (the stage inputs hash it), a language outside sources at loading."""
    from conftest import REPO

    from mlm_core.stages import plan
    electra = lists.pop("electra", False)
    lists = {k: (v if v == "missing.yaml" else str(REPO / v)) for k, v in lists.items()}
    extra = {"pretrain": {"steps": 3, "model": {"size": "tiny"}, "objective": "electra"}} if electra else {}
    with pytest.raises(ValueError, match=message):
        plan(tiny_config(tmp_path, debias={"projection": {"lists": lists}}, **extra))
    assert not (tmp_path / "work").exists()


def test_the_bias_mitigation_sweep_shares_training_as_declared(tmp_path, shared_data):
    """configs/experiments/bias_mitigation.yaml: every variant validates against base.yaml; at each seed
    `projection` reuses `none`'s pretrain output and only re-scores it; `cda` trains on other shards; every run's
    audit has the en/fr/de templates. (Planning only: nothing runs.)"""
    from conftest import REPO

    from mlm_core.stages import plan
    from mlm_core.store import StageStore
    from mlm_core.sweep import load_sweep
    sweep = load_sweep(REPO / "configs/experiments/bias_mitigation.yaml")
    assert sweep.variant_names == ["none", "cda", "regularizer", "regularizer-0.01", "projection"]
    assert sweep.config.baseline == "none"
    store = StageStore(tmp_path)
    plans = {(r.variant, r.seed): plan(sweep.load_run(r), store) for r in sweep.runs if r.seed in (0, 1)}
    fp = {k: {s: p.fingerprint for s, p in v.items()} for k, v in plans.items()}
    for seed in (0, 1):
        none, proj, cda, reg = (fp[(v, seed)] for v in ("none", "projection", "cda", "regularizer"))
        assert proj["pretrain"] == none["pretrain"] and proj["shards"] == none["shards"]
        assert proj["evaluate"] != none["evaluate"] and proj["audit"] != none["audit"]
        assert cda["shards"] != none["shards"] and cda["pretrain"] != none["pretrain"]
        assert reg["shards"] == none["shards"] and reg["pretrain"] != none["pretrain"]
        assert fp[("regularizer-0.01", seed)]["pretrain"] not in (reg["pretrain"], none["pretrain"])
    assert fp[("none", 0)]["pretrain"] != fp[("none", 1)]["pretrain"]
    for r in sweep.runs:
        assert set(sweep.load_run(r).config.audit.templates) == {"en", "fr", "de"}
