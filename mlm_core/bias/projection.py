"""Post-hoc projection: SentenceDebias (Liang et al., 2020, "Towards Debiasing Sentence Representations").

A bias subspace is estimated from counterfactual sentence pairs and removed from the trained encoder's final
hidden states before the MLM head, when the evaluate and audit stages score the model (``debias.projection``).

Estimation (``fit_subspace``), as the paper:
1. defining sentences: every corpus sentence (normalize output, file order) containing a listed word, up to
   ``max_sentences`` per language, with its counterfactual from the CDA swap (``mlm_core.bias.cda``), so each
   defining set is a pair {s_group1, s_group2} that differs in the group words only;
2. each sentence is encoded by the trained encoder (eval mode) and mean-pooled over its tokens (special tokens
   excluded: they are the same in every sentence);
3. each pair is centred on its own mean (v - mean(pair)): what is left is the difference the swap made;
4. PCA of the centred vectors (SVD); the top ``k`` right singular vectors are the subspace V [k, hidden]
   (orthonormal rows; each row's sign fixed so its largest-magnitude entry is positive, so the stored file is
   the same on every run).
Removal (``project``): h - (h V^T) V, at every token position (Meade et al., 2022 apply SentenceDebias to MLMs
the same way). ``apply_projection`` puts it on the output of the encoder's final norm (a forward hook), so
``encode`` (and with it ``full_logits``, ``mlm_logits`` callers, the compiled PLL pass and transfer fine-tuning)
sees projected states; the parameters and the state dict are untouched: the stored and exported model are not
projected (the subspace is stored next to the scores, ``projection.safetensors``).
Deterministic: fixed sentence order, no sampling, eval-mode encoder.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from mlm_core.errors import MlmError

KEY = "debias.projection"
SUBSPACE_FILE = "projection.safetensors"
# A line without sentence punctuation can be a whole paragraph: longer ones are skipped, they would not fit the
# encoder and their mean would barely move with one swapped word.
MAX_SENTENCE_CHARS = 400
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")
EMBED_BATCH = 32


class ProjectionError(MlmError, ValueError):
    """Too few defining sentences, a bad ``debias.projection`` setting; the message names the config key."""


# ---- the math --------------------------------------------------------------------------------------------------
def project(h: "torch.Tensor", V: "torch.Tensor") -> "torch.Tensor":
    """h - (h V^T) V: ``h`` [..., H] without its component in the row space of ``V`` [k, H] (orthonormal rows)."""
    V = V.to(device=h.device, dtype=h.dtype)
    return h - (h @ V.T) @ V


def principal_components(X: torch.Tensor, k: int) -> tuple[torch.Tensor, list[float]]:
    """Top-``k`` principal directions of the rows of ``X`` [N, H] (already centred: the rows are pair-centred
    vectors whose mean is zero) and each one's share of the variance. float64 SVD; signs canonical."""
    import torch
    X = X.double()
    _, S, Vh = torch.linalg.svd(X, full_matrices=False)
    V = Vh[:k].clone()
    idx = V.abs().argmax(dim=1)
    signs = torch.sign(V[torch.arange(V.shape[0]), idx])
    V = V * signs[:, None]
    total = float((S ** 2).sum())
    ratio = [float(s) ** 2 / total if total > 0 else 0.0 for s in S[:k]]
    return V.float(), ratio


# ---- defining sentences ----------------------------------------------------------------------------------------
def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def counterfactual(sentence: str, wordlist) -> str:
    """The sentence with every listed word swapped for its partner (the CDA swap, case kept)."""
    from mlm_core.bias.cda import swap_text
    return swap_text(sentence, wordlist)[0]


def defining_pairs(texts: Iterable[str], wordlist, max_sentences: int) -> list[tuple[str, str]]:
    """(sentence, counterfactual) for the first ``max_sentences`` sentences of ``texts`` that the swap changes."""
    out: list[tuple[str, str]] = []
    for text in texts:
        for s in split_sentences(text):
            if len(s) > MAX_SENTENCE_CHARS:
                continue
            c = counterfactual(s, wordlist)
            if c != s:
                out.append((s, c))
                if len(out) >= max_sentences:
                    return out
    return out


def sentence_embeddings(model, tokenizer, sentences: list[str], batch: int = EMBED_BATCH) -> torch.Tensor:
    """Mean over each sentence's non-special tokens of the encoder's final hidden states: [N, H] float32.
    Sentences are encoded with their special tokens and cut to the model's max_positions (end token kept)."""
    import torch
    max_pos, pad = int(model.arch.max_positions), int(model.arch.pad_id)
    encs = [tokenizer.encode(s) for s in sentences]
    rows = []
    for e in encs:
        ids, special = list(e.ids), list(e.special_tokens_mask)
        if len(ids) > max_pos:
            ids, special = ids[:max_pos - 1] + ids[-1:], special[:max_pos - 1] + special[-1:]
        rows.append((ids, special))
    was = getattr(model, "training", False)
    model.eval()
    out = torch.zeros(len(rows), int(model.arch.hidden))
    try:
        with torch.no_grad():
            for start in range(0, len(rows), batch):
                chunk = rows[start:start + batch]
                T = max(len(ids) for ids, _ in chunk)
                x = torch.full((len(chunk), T), pad, dtype=torch.long)
                seg = torch.zeros((len(chunk), T), dtype=torch.int32)
                keep = torch.zeros((len(chunk), T), dtype=torch.bool)
                for r, (ids, special) in enumerate(chunk):
                    x[r, :len(ids)] = torch.tensor(ids)
                    seg[r, :len(ids)] = 1
                    keep[r, :len(ids)] = torch.tensor([not s for s in special])
                # segment ids only with padding: without it full attention is the same and faster
                dev = next(iter(model.parameters()), x).device
                h = model.encode(x.to(dev), seg.to(dev) if bool((seg == 0).any()) else None).float().cpu()
                m = keep.unsqueeze(-1).to(h.dtype)
                out[start:start + len(chunk)] = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
    finally:
        model.train(was)
    return out


@dataclass(frozen=True)
class Subspace:
    basis: torch.Tensor                 # V [k, hidden], orthonormal rows
    explained_variance: list[float]     # each component's share of the pair-centred variance
    sentences: dict[str, int]           # language -> defining sentence pairs used

    def record(self) -> dict:
        return {"components": int(self.basis.shape[0]), "hidden": int(self.basis.shape[1]),
                "sentences": dict(self.sentences), "explained_variance": [round(v, 6) for v in self.explained_variance]}


def fit_subspace(model, tokenizer, sentences_by_lang: Mapping[str, Iterable[str]], wordlists: Mapping[str, object],
                 k: int, max_sentences: int = 1000) -> Subspace:
    """The SentenceDebias subspace (module docstring) from the texts of every language that has a list."""
    import torch
    centred, counts = [], {}
    for lang in sorted(wordlists):
        pairs = defining_pairs(sentences_by_lang.get(lang, ()), wordlists[lang], max_sentences)
        counts[lang] = len(pairs)
        if not pairs:
            continue
        emb = sentence_embeddings(model, tokenizer, [s for p in pairs for s in p]).view(len(pairs), 2, -1)
        centred.append((emb - emb.mean(dim=1, keepdim=True)).reshape(-1, emb.shape[-1]))
    n = sum(counts.values())
    hidden = int(model.arch.hidden)
    if n < k or k > hidden:
        raise ProjectionError(f"{KEY}.components = {k}: {n} defining sentence pair(s) found (per language: "
                              f"{counts}) and hidden size {hidden}; k must be at most both (more text with a "
                              f"listed word, or a smaller k)")
    V, ratio = principal_components(torch.cat(centred), k)
    return Subspace(V, ratio, counts)


def estimate_subspace(model, tokenizer, sentences_by_lang, wordlists, k: int, max_sentences: int = 1000) -> torch.Tensor:
    """V [k, hidden] (orthonormal rows): ``fit_subspace(...).basis``."""
    return fit_subspace(model, tokenizer, sentences_by_lang, wordlists, k, max_sentences).basis


# ---- applying it -----------------------------------------------------------------------------------------------
BUFFER = "debias_basis"


def _project_output(module, _inputs, output):
    """Forward hook of the final norm: its output projected on the complement of the module's basis buffer.
    A module-level function reading the buffer from the module it is called on, so a deep copy of the model (the
    transfer task model) projects with its own copy of the basis."""
    return project(output, getattr(module, BUFFER))


def apply_projection(model, basis: "torch.Tensor"):
    """``model`` (an ``MLMEncoder``) with the projection applied to the output of its final norm (in place;
    returned): a non-persistent buffer (follows .to(device) and deepcopy, never in a state_dict) and a forward
    hook, so parameter names and the state dict stay exactly the model's."""
    norm = model.final_norm
    if hasattr(norm, BUFFER):
        raise ProjectionError("the model is already projected")
    if basis.shape[1] != model.arch.hidden:
        raise ProjectionError(f"the subspace is {basis.shape[1]} wide; the model's hidden size is {model.arch.hidden}")
    dev = next(model.parameters()).device
    norm.register_buffer(BUFFER, basis.detach().float().to(dev).clone(), persistent=False)
    norm.register_forward_hook(_project_output)
    return model


def save_subspace(path: Path, sub: Subspace) -> None:
    """The basis and its record as metadata, byte-reproducible (``tensorfile.save_tensors`` sorts the header)."""
    import json

    from mlm_core.tensorfile import save_tensors
    meta = {k: json.dumps(v, sort_keys=True) for k, v in sub.record().items()}
    save_tensors({"basis": sub.basis.contiguous()}, Path(path), metadata=meta)


def load_subspace(path: Path) -> torch.Tensor:
    from safetensors.torch import load_file
    return load_file(str(path))["basis"]


# ---- the stages' side ------------------------------------------------------------------------------------------
def _config(lc):
    debias = getattr(lc.config, "debias", None)
    return getattr(debias, "projection", None) if debias is not None else None


def _check_objective(lc) -> None:
    if lc.config.pretrain.objective == "electra":
        raise ProjectionError(f"{KEY}: not available with pretrain.objective electra: transfer fine-tunes the "
                              "discriminator, whose representations would need a subspace of their own")


def projection_inputs(lc) -> dict | None:
    """What the evaluate and audit fingerprints add for ``debias.projection``: each list file's content hash.
    None when unset (the fingerprints stay what they were). Checked here, at planning: every language must be
    in ``sources`` and every list must load, so a bad path fails before any stage runs."""
    cfg = _config(lc)
    if cfg is None:
        return None
    import hashlib

    from mlm_core.bias.wordlists import list_paths, load_wordlists
    _check_objective(lc)
    langs = lc.config.languages
    for lang in cfg.lists:
        if lang not in langs:
            raise ProjectionError(f"{KEY}.lists.{lang}: language '{lang}' is not in sources ({', '.join(langs)})")
    load_wordlists(dict(cfg.lists), lc.base_dir, key=f"{KEY}.lists")
    return {lang: hashlib.sha256(p.read_bytes()).hexdigest() for lang, p in sorted(list_paths(cfg.lists, lc.base_dir).items())}


def corpus_texts(normalize_dir: Path, langs: Iterable[str]) -> dict[str, Iterable[str]]:
    """Language -> its normalized documents in file order, read lazily in record batches (stops when enough)."""
    import pyarrow.parquet as pq

    def docs(f: Path):
        for b in pq.ParquetFile(f).iter_batches(columns=["text"], batch_size=256):
            yield from (t for t in b.column(0).to_pylist() if t)

    out = {}
    for lang in langs:
        f = Path(normalize_dir) / "docs" / f"{lang}.parquet"
        out[lang] = docs(f) if f.is_file() else iter(())
    return out


def prepare(lc, model_dir: Path, normalize_dir: Path, out_dir: Path | None):
    """(hook, record) for a stage scoring the model in ``model_dir``: hook(model) applies the subspace estimated
    from the normalized corpus; record (k, sentences per language, explained variance, file) goes in the stage's
    manifest; the subspace is written to ``out_dir/projection.safetensors``. (None, None) when unset."""
    cfg = _config(lc)
    if cfg is None:
        return None, None
    _check_objective(lc)
    from mlm_core.bias.wordlists import load_wordlists
    from mlm_core.fillmask import load_model_dir
    lists = load_wordlists(dict(cfg.lists), lc.base_dir, key=f"{KEY}.lists")
    model, tok, _ = load_model_dir(Path(model_dir))
    sub = fit_subspace(model, tok, corpus_texts(normalize_dir, sorted(lists)), lists, cfg.components,
                       cfg.max_sentences)
    record = {"method": "SentenceDebias (Liang et al. 2020), token-level before the MLM head",
              **sub.record(), "max_sentences": cfg.max_sentences}
    if out_dir is not None:
        save_subspace(Path(out_dir) / SUBSPACE_FILE, sub)
        record["file"] = SUBSPACE_FILE
    basis = sub.basis
    return (lambda m: apply_projection(m, basis)), record


__all__ = ["ProjectionError", "Subspace", "apply_projection", "corpus_texts", "defining_pairs",
           "estimate_subspace", "fit_subspace", "load_subspace", "prepare", "principal_components", "project",
           "projection_inputs", "save_subspace", "sentence_embeddings", "split_sentences"]
