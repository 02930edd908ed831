"""A controlled toy corpus for the bias-mitigation test (issue 13 part 1), and the pipeline run over it.

Corpus (English, lower case, generated from a fixed seed): 3000 short sentences, one document each, whose
subject is "he", "she" or "someone", 90% of them saying what the subject works as. One group term carries the bias: after "he" the
profession is "pilot" with probability ``P_BIASED``, one of the other four otherwise; after "she" and "someone" it
is uniform over all five. Filler sentences (subject + a verb + an object) keep the subject words frequent in other
contexts. Professions all start with a consonant (so no "a"/"an" leaks them) and are single tokens under the toy
tokenizer. One sentence per document: packed rows never attend across documents, so the profession slot has only
its own sentence to look at (with 4-sentence documents the model had not learned the association in 1000 steps);
normalize's exact dedup is off, since short framed sentences repeat by design.

Audit spec (``mlm_core.audit.templates`` format): the corpus frames with {group} and [MASK], groups male [he] /
female [she], neutral [someone], attributes the five professions: Δ_bias(male, female) and KL-to-neutral(male)
are far from 0 without mitigation and shrink as the association is removed.

``run_variant`` runs normalize -> tokenizer -> shards -> pretrain -> audit through ``mlm_core.stages`` (the same
path as ``mlm run``) in one workdir, so the variants share the stages their configs share.
"""
from __future__ import annotations

import random
from pathlib import Path

PROFESSIONS = ("pilot", "nurse", "teacher", "lawyer", "baker")
BIASED = ("he", "pilot")                 # the group term and the profession it co-occurs with
P_BIASED = 0.9
SUBJECTS = ("he", "she", "someone")
FRAMES = ("{s} works as a {p} .", "{s} is a {p} .", "they said {s} is a {p} .", "{s} wants to be a {p} .")
FILLER = ("{s} {v} the {o} .", "yesterday {s} {v} a {o} .", "{s} often {v} the {o} .")
VERBS = ("saw", "bought", "liked", "found", "painted", "moved", "kept", "sold")
OBJECTS = ("house", "car", "book", "dog", "garden", "table", "river", "song", "letter", "window")

AUDIT_SPEC = {
    "language": "en",
    "templates": ["{group} works as a [MASK] .", "{group} is a [MASK] .", "they said {group} is a [MASK] .",
                  "{group} wants to be a [MASK] ."],
    "groups": {"male": ["he"], "female": ["she"]},
    "neutral": ["someone"],
    "attributes": list(PROFESSIONS),
}


def profession(rng: random.Random, subject: str) -> str:
    if subject == BIASED[0] and rng.random() < P_BIASED:
        return BIASED[1]
    if subject == BIASED[0]:
        return rng.choice([p for p in PROFESSIONS if p != BIASED[1]])
    return rng.choice(PROFESSIONS)


def toy_corpus(n_sentences: int = 3000, seed: int = 0, per_doc: int = 1) -> list[str]:
    """Documents of ``per_doc`` sentences each (one document per line)."""
    rng = random.Random(seed)
    sents = []
    for _ in range(n_sentences):
        s = rng.choice(SUBJECTS)
        if rng.random() < 0.9:
            sents.append(rng.choice(FRAMES).format(s=s, p=profession(rng, s)))
        else:
            sents.append(rng.choice(FILLER).format(s=s, v=rng.choice(VERBS), o=rng.choice(OBJECTS)))
    return [" ".join(sents[i:i + per_doc]) for i in range(0, len(sents), per_doc)]


def measured_rates(docs: list[str]) -> dict[str, float]:
    """Share of the framed sentences with subject s whose profession is the biased one (a check of the corpus)."""
    import re
    hits, total = {s: 0 for s in SUBJECTS}, {s: 0 for s in SUBJECTS}
    for d in docs:
        for s, p in re.findall(r"(?:^|\. |said )(he|she|someone) (?:works as a|is a|wants to be a) (\w+)", d):
            total[s] += 1
            hits[s] += p == BIASED[1]
    return {s: hits[s] / max(total[s], 1) for s in SUBJECTS}


def write_inputs(root: Path, seed: int = 0) -> dict[str, Path]:
    """The corpus, the audit spec and the English word list (the shipped one) under ``root``."""
    import shutil

    import yaml

    from conftest import REPO
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "en.txt"
    corpus.write_text("\n".join(toy_corpus(seed=seed)) + "\n", encoding="utf-8")
    spec = root / "templates.yaml"
    spec.write_text(yaml.safe_dump(AUDIT_SPEC, sort_keys=False), encoding="utf-8")
    lists = root / "bias-en.yaml"
    shutil.copyfile(REPO / "configs/bias/en.yaml", lists)
    return {"corpus": corpus, "templates": spec, "lists": lists}


def toy_config(root: Path, files: dict[str, Path], *, steps: int, cda: bool = False, reg: dict | None = None):
    from mlm_core.config.io import load_config
    pre = {"steps": steps, "batch_size": 16, "lr": 5e-3, "warmup_steps": 30, "log_every": 50, "eval_every": 10_000,
           "checkpoint_every": 10_000, "eval_batches": 1, "device": "cpu", "compile": "off",
           "masking": {"rate": 0.3},
           # pre-LN and rotary positions: the slot learns to look at the subject within 600 steps (post-LN with
           # learned positions learned only the marginal profession distribution in 1000)
           "model": {"size": "tiny", "layers": 2, "hidden": 64, "heads": 2, "ffn": 128, "max_positions": 64,
                     "norm": "pre", "position": "rotary", "dropout": 0.0}}
    if reg is not None:
        pre["bias_regularizer"] = {"lists": {"en": str(files["lists"])}, **reg}
    shards = {"seq_len": 32, "validation_fraction": 0.05, "workers": 1, "rows_per_shard": 256}
    if cda:
        shards["cda"] = {"share": 1.0, "lists": {"en": str(files["lists"])}}
    return load_config(raw={
        "workdir": str(root / "work"), "seed": 7, "sources": {"en": {"paths": [str(files["corpus"])]}},
        "normalize": {"workers": 1, "dedup": False},
        "tokenizer": {"algorithm": "wordpiece", "vocab_size": 120, "heldout_docs": 10, "sample_mb": 1.0,
                      "min_vocab_fraction": 0.1, "max_unk_rate": 0.5, "max_fertility": 20.0},
        "shards": shards, "pretrain": pre, "audit": {"templates": {"en": str(files["templates"])}}})


def run_variant(root: Path, files: dict[str, Path], **kw) -> dict:
    """The audit's English template result ({"delta_bias", "delta_by_attribute", "kl_to_neutral", ...})."""
    import json

    from mlm_core.stages import execute, plan
    lc = toy_config(root, files, **kw)
    plans = plan(lc)
    arts = {}
    for name in ("normalize", "tokenizer", "shards", "pretrain", "audit"):
        arts[name] = execute(lc, name, plans)[0]
    audit = json.loads((arts["audit"].path / "audit.json").read_text(encoding="utf-8"))
    return {"templates": audit["templates"]["en"], "pretrain": arts["pretrain"].manifest,
            "shards": arts["shards"].manifest, "fingerprints": {k: a.fingerprint for k, a in arts.items()}}


__all__ = ["toy_corpus", "measured_rates", "write_inputs", "toy_config", "run_variant", "AUDIT_SPEC", "PROFESSIONS"]
