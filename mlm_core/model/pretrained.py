"""Weights from an existing model (``pretrain.init_from``): a transformers checkpoint or a model folder this
pipeline wrote, read into our ``MLMEncoder`` (or ELECTRA pair) so that, before any training, its logits equal
transformers' on the same input.

In: a local folder (``mlm_core.external.resolve_ref`` turns a registry address into one). Out: a ``Pretrained``
value (family, Arch, our state dict, special tokens, usable length); ``build_encoder`` / ``build_electra``
make the network, ``check_model_config`` refuses ``pretrain.model`` fields that contradict it.

Accepted folders
  * transformers, safetensors only (``model.safetensors`` or a sharded ``model.safetensors.index.json``):
    BertForMaskedLM, RobertaForMaskedLM, XLMRobertaForMaskedLM, RoFormerForMaskedLM, ModernBertForMaskedLM
    and ELECTRA (below). A pickle
    (``pytorch_model.bin``) is refused without being opened; so is any other architecture.
  * this pipeline's pretrain output: ``model_config.json`` + ``model.safetensors`` (Arch in its metadata)
    [+ ``discriminator.safetensors`` for ELECTRA], or its ``hf/`` export (what a registered model downloads as).
The tokenizer is the folder's ``tokenizer.json``; the special tokens come from ``tokenizer_config.json`` /
``special_tokens_map.json`` (transformers' files), else from the usual names ([PAD] / <pad>, ...) among
the tokenizer's tokens; max positions from config.json (RoBERTa / XLM-R: ``max_position_embeddings`` minus
the ``padding_idx + 1`` offset, e.g. 514 -> 512).

ELECTRA (a generator + discriminator pair, the two networks sharing their embeddings as ELECTRA trains
them; transformers keeps them as two models, the hub as two repositories):
  * ``<folder>/``  = ``ElectraForPreTraining`` (the discriminator) with the generator (``ElectraForMaskedLM``)
    in ``<folder>/generator/``; or
  * this pipeline's export layout: ``<run>/hf-discriminator/`` with its sibling ``<run>/hf/`` (the
    generator); pointing at ``<run>/hf/`` finds the sibling too.
  The generator's embedding tables must equal the discriminator's (our ElectraModel shares one set);
  otherwise the pair is refused. A discriminator without a generator is refused: it has no MLM head, and a
  fresh generator would make the first steps' "before" logits meaningless. A generator alone
  (``ElectraForMaskedLM``) is an ordinary MLM (family "electra", no discriminator): continue it with
  objective mlm; it exports back as ``ElectraForMaskedLM``.

Equivalence notes (transformers 5.24): every LayerNorm uses ``layer_norm_eps``; the FFN uses ``hidden_act``
(GELU variants, relu, ...); the MLM head uses ``hidden_act`` in BERT but exact GELU in RoBERTa / XLM-R's
``lm_head`` and ELECTRA's generator (``Arch.head_activation``); the token-type table keeps all its rows
(the export writes them back) and the forward adds row 0, as transformers does with default
``token_type_ids``; RoBERTa's position ids start at padding_idx + 1 (transformers numbers non-pad tokens,
which equals ours at every position of a right-padded row). RoFormer: q / k rows are permuted into our rotary
layout (``hf_layout``); its stored ``embed_positions`` table must equal the formula (it is what transformers
computes with) and ``rotary_value`` must be false. ModernBERT: ``hf_modernbert`` (biases, RoPE scaling or a
layer pattern it cannot compute are refused, naming the config key).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from mlm_core.model.hf_layout import (LAYOUTS, ROFORMER_TABLE, arch_from_hf_config, disc_from_hf,
                                      family_of_architecture, mlm_from_hf, roformer_table)
from mlm_core.model.hf_modernbert import (ARCHITECTURE as MODERNBERT, ModernBertConfigError,
                                          arch_from_modernbert_config, modernbert_from_hf)
from mlm_core.model.pretrained_files import (ROLES, PretrainedError, read_hf_tensors, read_special_tokens,
                                             refuse_missing_weights)
from mlm_core.model.sizes import Arch, ArchError
from mlm_core.model.weights import ExportError

FIELD = "pretrain.init_from"
SUPPORTED_ARCHITECTURES: tuple[str, ...] = ("BertForMaskedLM", "RobertaForMaskedLM", "XLMRobertaForMaskedLM",
                                            "RoFormerForMaskedLM", "ModernBertForMaskedLM", "ElectraForPreTraining",
                                            "ElectraForMaskedLM")
# tensors a checkpoint may carry that the MLM does not use (BERT's pooler / NSP head, old position-id buffers)
_IGNORED = (".pooler.", "cls.seq_relationship.", "embeddings.position_ids", "embeddings.token_type_ids")
# pretrain.model fields check_model_config compares, and the Arch attribute each one is
_MODEL_FIELDS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "ffn": "ffn",
                 "max_positions": "max_positions", "position": "position", "norm": "norm",
                 "tie_embeddings": "tie_embeddings",
                 # a checkpoint is global (transformers has no local/global BERT): no silent switch to local layers
                 "attention": "attention"}
# ModernBERT's name for its family (model_type) when a config has no "architectures"
_MODEL_TYPES = {"modernbert": MODERNBERT}


@dataclass
class Pretrained:
    family: str                                # bert | roberta | xlm-roberta | electra | roformer | modernbert
    arch: Arch                                 # the MLM network (ELECTRA: the generator)
    disc_arch: Arch | None                     # ELECTRA: the discriminator
    state: dict[str, torch.Tensor]             # MLMEncoder state_dict names
    disc_state: dict[str, torch.Tensor] | None # Discriminator (ElectraModel.disc) state_dict names
    special_tokens: dict[str, dict]            # role (pad/unk/cls/sep/mask) -> {"token", "id"}
    max_positions: int                         # usable sequence length
    vocab_size: int                            # embedding rows
    folder: Path
    config_file: Path | None = None            # where the shape was read (config.json / model_config.json)
    tokenizer_file: Path | None = None
    tokenizer_vocab_size: int = 0              # ids the tokenizer can produce (<= vocab_size)


# ---- transformers folders --------------------------------------------------------------------------------
class _Tracked(dict):
    """A dict that remembers which keys were read (what is left over was not understood)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.used: set[str] = set()

    def __getitem__(self, k):
        self.used.add(k)
        return super().__getitem__(k)


def _normalize(hf: dict[str, torch.Tensor]) -> _Tracked:
    """float32 tensors; old checkpoints' LayerNorm ``gamma`` / ``beta`` renamed as transformers does on load."""
    out = _Tracked()
    for k, v in hf.items():
        if k.endswith(".gamma"):
            k = k[:-6] + ".weight"
        elif k.endswith(".beta"):
            k = k[:-5] + ".bias"
        out[k] = v.float() if v.is_floating_point() else v
    return out


def _read_config(folder: Path, field: str) -> dict:
    path = folder / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PretrainedError(f"{field}: cannot read {path}: {e}") from None


def _architecture(cfg: dict, path: Path, field: str) -> str:
    archs = cfg.get("architectures") or []
    # an old config without "architectures": its model_type names the family (not ELECTRA's: two classes)
    name = archs[0] if archs else ({f: lay.architecture for f, lay in LAYOUTS.items() if f != "electra"}
                                   | _MODEL_TYPES).get(cfg.get("model_type"))
    if name not in SUPPORTED_ARCHITECTURES:
        raise PretrainedError(f"{field}: {path} declares architecture {name or cfg.get('model_type')!r}, which is not "
                              f"supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    if cfg.get("rotary_value"):
        raise PretrainedError(f"{field}: {path}: rotary_value true (values rotated too) is not supported: this "
                              "encoder rotates queries and keys only, as RoFormer's default")
    if cfg.get("position_embedding_type", "absolute") != "absolute" or cfg.get("is_decoder") \
            or cfg.get("add_cross_attention"):
        raise PretrainedError(f"{field}: {path}: only encoders with absolute position embeddings are supported "
                              f"(position_embedding_type {cfg.get('position_embedding_type')!r}, "
                              f"is_decoder {cfg.get('is_decoder')})")
    return name


def _load_hf(folder: Path, field: str, dropout: float | None = None):
    """(architecture name, Arch, our state dict, config path) of one transformers folder."""
    cfg_path = folder / "config.json"
    cfg = _read_config(folder, field)
    name = _architecture(cfg, cfg_path, field)
    modern = name == MODERNBERT
    family = "electra" if name.startswith("Electra") else "modernbert" if modern else family_of_architecture(name)
    try:
        arch = arch_from_modernbert_config(cfg, dropout) if modern else arch_from_hf_config(cfg, family, dropout)
    except KeyError as e:
        raise PretrainedError(f"{field}: {cfg_path} lacks {e}") from None
    except (ArchError, ModernBertConfigError, ValueError, TypeError) as e:
        raise PretrainedError(f"{field}: {cfg_path}: {e}") from None
    hf, where = read_hf_tensors(folder, field)
    hf = _normalize(hf)
    try:
        sd = (disc_from_hf(arch, hf) if name == "ElectraForPreTraining" else
              modernbert_from_hf(arch, hf) if modern else mlm_from_hf(arch, hf))
    except KeyError as e:
        raise PretrainedError(f"{field}: {where} lacks tensor {e} that {name} has (not a {name} checkpoint?)") from None
    if family == "roformer":
        _check_roformer_table(arch, hf, where, field)
    # tied: transformers ignores a stored decoder (it ties it); untied: it ignores the head's own bias
    if modern:
        unused = ("decoder.weight",) if arch.tie_embeddings else ()
    else:
        lay = LAYOUTS[family]
        unused = (lay.decoder + ".weight", lay.decoder + ".bias") if arch.tie_embeddings else (lay.bias,)
    left = sorted(k for k in set(hf) - hf.used if not any(p in k for p in _IGNORED) and k not in unused)
    if left:
        raise PretrainedError(f"{field}: {where} holds tensors a {name} does not have: {left[:6]}"
                              f"{' ...' if len(left) > 6 else ''} (another architecture saved under this config?)")
    _check_shapes(name, arch, sd, where, field)
    return name, arch, sd, cfg_path


def _check_roformer_table(arch: Arch, hf: dict, where, field: str) -> None:
    """RoFormer computes with the sinusoidal table stored in the checkpoint; ours comes from the formula, so the
    two must agree (a table edited or trained would compute something else)."""
    stored = hf["roformer." + ROFORMER_TABLE]
    want = roformer_table(arch)
    if stored.shape != want.shape or not torch.allclose(stored, want, atol=1e-5):
        raise PretrainedError(f"{field}: {where}: roformer.{ROFORMER_TABLE} {tuple(stored.shape)} is not RoFormer's "
                              f"sinusoidal table {tuple(want.shape)} (max_position_embeddings x head size): a "
                              "changed table would give other logits than this encoder's rotary formula")


def _module(name: str, arch: Arch):
    from mlm_core.model.electra import Discriminator
    from mlm_core.model.encoder import MLMEncoder
    return Discriminator(arch) if name == "ElectraForPreTraining" else MLMEncoder(arch)


def _check_shapes(name: str, arch: Arch, sd: dict, where, field: str) -> None:
    want = _module(name, arch).state_dict()
    bad = [f"{k}: {tuple(sd[k].shape)} vs config {tuple(v.shape)}" for k, v in want.items()
           if k in sd and sd[k].shape != v.shape]
    if bad:
        raise PretrainedError(f"{field}: the tensors in {where} do not match {where.parent / 'config.json'} "
                              f"(ours: weights vs the config's shape): {bad[:4]}")


def load_hf_model(folder: Path, field: str = "model folder"):
    """One transformers folder as our module (eval mode): MLMEncoder, or a Discriminator for
    ElectraForPreTraining (``load_export`` uses this)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise PretrainedError(f"{field}: {folder} has no config.json")
    name, arch, sd, _ = _load_hf(folder, field)
    model = _module(name, arch)
    model.load_state_dict(sd, strict=True)
    return model.eval()


def load_export(out_dir: Path):
    """Read a transformers folder of any supported family (``export_hf`` / ``export_electra`` output, or a
    checkpoint saved by transformers: config.json + model.safetensors [sharded]) into an MLMEncoder (eval
    mode); an ``ElectraForPreTraining`` folder loads as a ``Discriminator``. PretrainedError (an ExportError)
    for anything else."""
    return load_hf_model(Path(out_dir)).eval()


# ---- the pipeline's own folders ---------------------------------------------------------------------------
def _load_ours(folder: Path, field: str):
    """(Arch, state, disc Arch | None, disc state | None) of a pretrain output folder."""
    from mlm_core.model.electra import Discriminator
    from mlm_core.model.encoder import MLMEncoder
    from mlm_core.model.weights import load_weights, read_arch
    out = []
    for fname, cls in (("model.safetensors", MLMEncoder), ("discriminator.safetensors", Discriminator)):
        path = folder / fname
        if not path.is_file():
            out += [None, None]
            continue
        try:
            model = cls(read_arch(path))
            load_weights(model, path)
        except (ExportError, ArchError) as e:
            raise PretrainedError(f"{field}: {e}") from None
        out += [model.arch, model.state_dict()]
    return tuple(out)


# ---- the entry points ------------------------------------------------------------------------------------
def _electra_partner(folder: Path, name: str) -> Path | None:
    """The other half of an ELECTRA pair (see the module docstring), or None."""
    if name == "ElectraForPreTraining":
        cands = [folder / "generator"] + ([folder.parent / "hf"] if folder.name == "hf-discriminator" else [])
    else:
        cands = [folder / "discriminator"] + ([folder.parent / "hf-discriminator"] if folder.name == "hf" else [])
    return next((c for c in cands if (c / "config.json").is_file()), None)


def _shared_embeddings_equal(gen: dict, disc: dict) -> list[str]:
    names = [k for k in ("tok_emb.weight", "type_emb.weight", "pos_emb.weight", "emb_norm.weight", "emb_norm.bias")]
    return [k for k in names if k in gen and (gen[k].shape != disc[k].shape or not torch.allclose(gen[k], disc[k],
                                                                                                  atol=1e-6))]


def read_pretrained(folder: Path, field: str = FIELD) -> Pretrained:
    """Read ``folder`` (see the module docstring). PretrainedError naming the file and ``field``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PretrainedError(f"{field}: {folder} is not a folder")
    disc_arch = disc_state = None
    tok_folder = folder
    if (folder / "model_config.json").is_file() and (folder / "model.safetensors").is_file():
        arch, state, disc_arch, disc_state = _load_ours(folder, field)
        cfg_path = folder / "model_config.json"
    elif (folder / "config.json").is_file():
        refuse_missing_weights(folder, field)
        name, arch, state, cfg_path = _load_hf(folder, field)
        if name.startswith("Electra"):
            partner = _electra_partner(folder, name)
            if name == "ElectraForPreTraining":
                if partner is None:
                    raise PretrainedError(
                        f"{field}: {cfg_path} is an ElectraForPreTraining discriminator without its generator: put the "
                        f"generator (ElectraForMaskedLM) in {folder / 'generator'} (a discriminator has no MLM head "
                        "to continue masked-language-model training with)")
                refuse_missing_weights(partner, field)
                gname, garch, gstate, _ = _load_hf(partner, field)
                if gname != "ElectraForMaskedLM":
                    raise PretrainedError(f"{field}: {partner / 'config.json'} is {gname}, not ElectraForMaskedLM")
                disc_arch, disc_state, arch, state = arch, state, garch, gstate
            elif partner is not None:
                refuse_missing_weights(partner, field)
                dname, disc_arch, disc_state, _ = _load_hf(partner, field)
                if dname != "ElectraForPreTraining":
                    raise PretrainedError(f"{field}: {partner / 'config.json'} is {dname}, not ElectraForPreTraining")
                tok_folder = partner if not (folder / "tokenizer.json").is_file() else folder
            if disc_state is not None:
                differ = _shared_embeddings_equal(state, disc_state)
                if differ:
                    raise PretrainedError(
                        f"{field}: the ELECTRA generator and discriminator in {folder} have different embedding "
                        f"tables {differ}; ELECTRA shares them between the two (and so does this pipeline)")
                if not (tok_folder / "tokenizer.json").is_file() and partner is not None:
                    tok_folder = partner
    else:
        refuse_missing_weights(folder, field)
        raise PretrainedError(f"{field}: {folder} has no config.json (a transformers checkpoint) and no "
                              "model_config.json (a model this pipeline trained)")
    specials, tok_file, tok_size = read_special_tokens(tok_folder, arch, cfg_path, field)
    fam = (disc_arch or arch).family
    if disc_arch is not None and fam == "bert":
        fam = "electra"       # a pair this pipeline trained: its Arch predates families
    return Pretrained(family=fam, arch=arch, disc_arch=disc_arch, state=state, disc_state=disc_state,
                      special_tokens=specials, max_positions=arch.max_positions, vocab_size=arch.vocab_size,
                      folder=folder, config_file=cfg_path, tokenizer_file=tok_file, tokenizer_vocab_size=tok_size)


def build_encoder(p: Pretrained, dropout: float | None = None):
    """The MLMEncoder holding ``p``'s weights (ELECTRA: the generator alone); ``dropout`` replaces the
    checkpoint's (the config's pretrain.model.dropout is a training choice, not a shape)."""
    from mlm_core.model.encoder import MLMEncoder
    arch = p.arch if dropout is None else dataclasses.replace(p.arch, dropout=dropout)
    model = MLMEncoder(arch)
    model.load_state_dict(p.state, strict=True)
    return model


def build_electra(p: Pretrained, dropout: float | None = None, special_ids: list[int] | None = None):
    """The ElectraModel (generator + discriminator sharing the embeddings) holding ``p``'s weights."""
    from mlm_core.model.electra import ElectraModel
    if p.disc_arch is None:
        raise PretrainedError(f"{FIELD}: {p.folder} holds no ELECTRA discriminator (objective electra needs the pair; "
                              "see mlm_core.model.pretrained for the layout), or use objective mlm")
    d, g = p.disc_arch, p.arch
    if dropout is not None:
        d, g = dataclasses.replace(d, dropout=dropout), dataclasses.replace(g, dropout=dropout)
    model = ElectraModel(d, g, special_ids)
    model.disc.load_state_dict(p.disc_state, strict=True)
    model.gen.load_state_dict(p.state, strict=True)     # the shared embeddings again: the same values
    return model


def check_model_config(p: Pretrained, model_cfg, field: str = FIELD) -> None:
    """PretrainedError when a ``pretrain.model`` field the user set explicitly contradicts the checkpoint
    (ELECTRA: the discriminator, which ``pretrain.model`` describes); fields left unset take the checkpoint's."""
    arch = p.disc_arch or p.arch
    src = p.config_file or p.folder
    bad = []
    explicit = set(getattr(model_cfg, "model_fields_set", set()))
    for key, attr in _MODEL_FIELDS.items():
        if key in explicit and getattr(model_cfg, key) is not None and getattr(model_cfg, key) != getattr(arch, attr):
            bad.append(f"pretrain.model.{key} = {getattr(model_cfg, key)!r} but the checkpoint has "
                       f"{getattr(arch, attr)!r}")
    family = getattr(model_cfg, "family", "bert")
    # the config's family is bert (any BERT-layout checkpoint) or modernbert: only that distinction can contradict
    if "family" in explicit and (family == "modernbert") != arch.modern:
        bad.append(f"pretrain.model.family = {family!r} but the checkpoint is {arch.family!r}")
    if "size" in explicit:
        from mlm_core.model.sizes import MODERNBERT_SIZES, SIZES
        named = (MODERNBERT_SIZES if family == "modernbert" else SIZES)[model_cfg.size]
        diff = {k: (v, getattr(arch, k)) for k, v in named.items() if k not in explicit and getattr(arch, k) != v}
        if diff:
            bad.append(f"pretrain.model.size = {model_cfg.size!r} means "
                       + ", ".join(f"{k} {a}" for k, (a, _) in diff.items()) + " but the checkpoint has "
                       + ", ".join(f"{k} {b}" for k, (_, b) in diff.items()))
    if bad:
        raise PretrainedError(f"{field} = {p.folder}: {'; '.join(bad)} (read from {src}); remove these "
                              "pretrain.model fields (the checkpoint's shape is used) or point at another model")


__all__ = ["FIELD", "ROLES", "SUPPORTED_ARCHITECTURES", "Pretrained", "PretrainedError", "read_pretrained",
           "build_encoder", "build_electra", "check_model_config", "load_hf_model", "load_export"]
