"""Continued pretraining: the model the pretrain stage starts from when ``pretrain.init_from`` is set.

In: the resolved checkpoint folder (``mlm_core.external.resolve_ref``), the tokenizer stage's output (its
special tokens, vocabulary size and, with ``tokenizer.extend``, ``extension.parquet``) and the shard set's
``seq_len``. Out: an ``InitSpec`` (plain values: what a torchrun worker needs to build the same model) and
the model itself (``build``).

The run takes the checkpoint's special tokens, max positions and shape (``mlm_core.model.pretrained``):
  * a ``pretrain.model`` field set explicitly to another value than the checkpoint's is an error
    (``check_model_config``); fields left unset take the checkpoint's; ``pretrain.model.dropout`` applies only
    when set explicitly (a training choice, not a shape), else the checkpoint's own;
  * ``shards.seq_len`` above the checkpoint's max positions, and a tokenizer whose special-token ids differ
    from the checkpoint's (a ``tokenizer.from`` other than the model's own), are errors naming both values;
  * a tokenizer with more ids than the checkpoint has embedding rows is an error, unless the extra ids are
    the tokenizer stage's extension (``tokenizer.extend``): then the embedding (and an untied decoder, and
    the output bias) grows to the new vocabulary and each new row is the mean of the rows of the pieces the
    base tokenizer split that token into (the same for the bias).

Objective x checkpoint:
  * mlm from BERT / RoBERTa / XLM-R / RoFormer / ModernBERT (or an ELECTRA generator alone): the MLM continues.
  * electra from an ELECTRA pair (discriminator + generator): the pair continues, with the checkpoint's
    generator; ``electra.generator_fraction`` set explicitly to a value that would not give that generator's
    width (hidden and ffn) is an error naming both (``electra_init.check_generator_fraction``); left unset, it is ignored.
  * electra from a BERT checkpoint: the checkpoint becomes the discriminator (its encoder; the MLM head is
    dropped, the replaced-token head is fresh) and a fresh generator, ``electra.generator_fraction`` of its
    width, shares its embeddings, as ELECTRA trains; the export is an ELECTRA pair. From RoBERTa / XLM-R it
    is refused: their positions start at padding_idx + 1, which the ELECTRA layout cannot express, so the
    result could not be exported back.
  * mlm from an ELECTRA pair is refused: it would continue only the small generator and drop the
    discriminator, the network people fine-tune (and the one ELECTRA pretraining is for); continue the pair
    with objective electra, or point at the generator folder alone to continue it as an MLM on purpose.

A trajectory checkpoint (``<workdir>/pretrain-checkpoints/<key>``) of the same run wins over the init: the
loop restores it on top of the model built here (it is later), and the key holds the checkpoint's content hash.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from mlm_core.errors import StageError

FIELD = "pretrain.init_from"
VOCAB_KEYS = ("tok_emb.weight", "decoder.weight", "head_bias")     # tensors with one row per token id


@dataclass(frozen=True)
class InitSpec:
    folder: str                   # the resolved checkpoint folder
    vocab_size: int               # the model's vocabulary after any extension
    dropout: float | None         # pretrain.model.dropout when set explicitly, else None (the checkpoint's)
    extension: str | None = None  # the tokenizer stage's extension.parquet, when it extended the vocabulary

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def prepare(lc, shards, tok) -> InitSpec:
    """Resolve ``pretrain.init_from``, read it, check it against the config and the tokenizer / shards."""
    from mlm_core.external import resolve_ref
    from mlm_core.model.pretrained import check_model_config, read_pretrained
    cfg = lc.config.pretrain
    folder = resolve_ref(cfg.init_from, lc, FIELD)
    p = read_pretrained(folder, FIELD)
    check_model_config(p, cfg.model, FIELD)
    where = f"{FIELD} = {cfg.init_from}" + (f" ({folder})" if str(folder) != cfg.init_from else "")
    seq_len = int(shards.seq_len)
    if seq_len > p.max_positions:
        raise StageError(f"pretrain: shards.seq_len ({seq_len}) exceeds the max positions of {where} "
                         f"({p.max_positions}): lower shards.seq_len to at most {p.max_positions}")
    _check_specials(p, shards.special_tokens, tok, where)
    vocab, extension = _vocabulary(p, shards, tok, where)
    _check_objective(cfg, p, where)
    dropout = cfg.model.dropout if "dropout" in cfg.model.model_fields_set else None
    return InitSpec(folder=str(folder), vocab_size=vocab, dropout=dropout, extension=extension)


def _tok_source(tok) -> str:
    src = (tok.source or {}).get("ref")
    return f"the tokenizer stage's (tokenizer.from = {src})" if src else f"the tokenizer stage's ({tok.path})"


def _check_specials(p, specials: dict, tok, where: str) -> None:
    bad = [f"{role}: {e.get('token')!r} = id {int(e['id'])} in {_tok_source(tok)} but "
           f"{p.special_tokens[role].get('token')!r} = id {int(p.special_tokens[role]['id'])} in the checkpoint"
           for role, e in sorted(specials.items())
           if role in p.special_tokens and int(e["id"]) != int(p.special_tokens[role]["id"])]
    if bad:
        raise StageError(f"pretrain: the tokenizer's special tokens differ from those of {where}: {'; '.join(bad)}. "
                         "The model knows its own ids: use the model's tokenizer (leave tokenizer.from unset, or "
                         "point it at the same model)")


def _vocabulary(p, shards, tok, where: str) -> tuple[int, str | None]:
    """(model vocabulary size, extension.parquet or None)."""
    vocab = int(shards.vocab_size)
    ext = tok.extension
    if ext:
        base, path = int(ext["base_vocab_size"]), Path(tok.path) / "extension.parquet"
        if base > p.vocab_size:
            raise StageError(f"pretrain: the extended tokenizer's base vocabulary ({base} ids, {path}) is larger than "
                             f"the {p.vocab_size} embedding rows of {where}")
        return max(vocab, p.vocab_size), str(path)
    if vocab > p.vocab_size:
        raise StageError(f"pretrain: the tokenizer ({_tok_source(tok)}) has {vocab} ids but {where} has "
                         f"{p.vocab_size} embedding rows: use the model's own tokenizer, or extend it with "
                         f"tokenizer.extend (new rows start as the mean of their pieces)")
    return p.vocab_size, None


def _check_objective(cfg, p, where: str) -> None:
    """Whether ``cfg.objective`` can continue the checkpoint ``p`` (the objective's ``check_init``)."""
    from mlm_core.train.objectives import objective_for
    objective_for(cfg).check_init(p, where)


# ------------------------------------------------------------------------------------------------ building
def _read_extension(path: str, old_rows: int) -> list[tuple[int, list[int]]]:
    import pyarrow.parquet as pq
    rows = pq.read_table(path, columns=["id", "pieces"]).to_pylist()
    out = []
    for r in rows:
        pieces = [int(x) for x in (r["pieces"] or [])]
        if not pieces or min(pieces) < 0 or max(pieces) >= old_rows or int(r["id"]) < 0:
            raise StageError(f"pretrain: {path}: new id {r['id']} has pieces {pieces}; each needs at least one piece "
                             f"id below the checkpoint's {old_rows} embedding rows")
        out.append((int(r["id"]), pieces))
    return out


def grow_vocabulary(state: dict, old_rows: int, new_rows: int, extension: list[tuple[int, list[int]]]) -> dict:
    """``state`` with every per-token tensor (``VOCAB_KEYS``) grown to ``new_rows``; each extension id's row
    (and bias) = the mean of its pieces' rows in the checkpoint."""
    import torch
    out = dict(state)
    for key in VOCAB_KEYS:
        old = state.get(key)
        if old is None or old.shape[0] != old_rows:
            continue
        new = torch.zeros((new_rows, *old.shape[1:]), dtype=old.dtype)
        new[:old_rows] = old
        for i, pieces in extension:
            new[i] = old[pieces].mean(0)
        out[key] = new
    return out


def load(spec: InitSpec):
    """The checkpoint as a ``Pretrained`` with the vocabulary grown per ``spec``."""
    from mlm_core.model.pretrained import read_pretrained
    p = read_pretrained(Path(spec.folder), FIELD)
    if spec.vocab_size == p.vocab_size and not spec.extension:
        return p
    ext = _read_extension(spec.extension, p.vocab_size) if spec.extension else []
    bad = [i for i, _ in ext if i >= spec.vocab_size]
    if bad:
        raise StageError(f"pretrain: {spec.extension}: new ids {bad[:5]} are beyond the tokenizer's "
                         f"{spec.vocab_size} ids")
    grow = lambda sd: None if sd is None else grow_vocabulary(sd, p.vocab_size, spec.vocab_size, ext)  # noqa: E731
    resize = lambda a: None if a is None else dataclasses.replace(a, vocab_size=spec.vocab_size)  # noqa: E731
    return dataclasses.replace(p, arch=resize(p.arch), disc_arch=resize(p.disc_arch), state=grow(p.state),
                               disc_state=grow(p.disc_state), vocab_size=spec.vocab_size)


def build(cfg, spec: InitSpec, special_ids: list[int] | None = None):
    """The model for ``cfg.objective`` holding the checkpoint's weights (see the module docstring)."""
    from mlm_core.train.objectives import objective_for
    return objective_for(cfg).build_init(load(spec), spec, special_ids)


__all__ = ["InitSpec", "prepare", "build", "load", "grow_vocabulary", "FIELD"]
