"""Training objectives behind one interface (``Objective``), so the loop, the evaluator, the compiled step,
``init_from`` and the pretrain stage never ask which model they hold. ``OBJECTIVES`` (name -> class) is the one
place ``pretrain.objective`` is dispatched on (``objective_for``); ``objective_of`` finds the objective of an
already built model.

An objective builds its model (fresh, or from a ``pretrain.init_from`` checkpoint: ``check_init`` /
``build_init``), writes and exports it (``save`` / ``export``), says how the input is corrupted, runs a forward
pass (eager, or its compiled graph: ``compiled_loss``) and turns it into the step's loss with the parts to log.
``MLM``: masked-language-model cross-entropy. ``Electra``: the generator's MLM loss + disc_weight x the
discriminator's replaced-token BCE (Clark et al., 2020), the generator's input corrupted 85% [MASK] / 15%
unchanged (see ``mlm_core.model.electra``).

Loss normalisation (both): every micro-batch's mean loss is re-weighted by its share of the *global*
batch's predictions (``n_glob`` selected positions for the MLM part, ``m_glob`` non-pad tokens for the
discriminator), so W ranks x k accumulation steps give the update of one W*k batch.

``pretrain.bias_regularizer`` (``enable_bias``): the forward pass also returns a block's output (the MLM
encoder's; ELECTRA: the discriminator's) and ``add_bias`` adds λ x the term of ``mlm_core.bias.regularizer``,
computed per micro-batch and weighted 1/grad_accum (DDP averages over ranks): the mean over the W*k
micro-batches, whatever W and k. It is logged unweighted as ``bias_reg``.
"""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Protocol

import torch
from torch import nn

from mlm_core.config import PretrainConfig


class Objective(Protocol):
    """What the training code asks of an objective (``MLM``, ``Electra``); one instance per run."""

    name: ClassVar[str]                 # the pretrain.objective value (the key in ``OBJECTIVES``)
    parts: tuple[str, ...]              # the loss parts ``step_loss`` returns, total first
    bias_layer: int | None

    @classmethod
    def holds(cls, core: nn.Module) -> bool: ...    # an already built model is this objective's
    # -- models
    def build(self, vocab_size: int, pad_id: int, special_ids: list[int] | None = None) -> nn.Module: ...
    def check_init(self, p, where: str) -> None: ...            # pretrain.init_from: can it continue ``p``?
    def build_init(self, p, spec, special_ids: list[int] | None = None) -> nn.Module: ...
    def prepare(self, core: nn.Module, special_ids: list[int]) -> None: ...
    def arch(self, core: nn.Module) -> dict: ...
    def mlm_model(self, core: nn.Module) -> nn.Module: ...
    def hidden_model(self, core: nn.Module) -> nn.Module: ...
    # -- the step
    def masking(self, mcfg): ...
    def setup_compile(self, device: torch.device, world_size: int, seq_len: int) -> tuple[bool, str]: ...
    def forward(self, model: nn.Module, ids, seg, labels, label_smoothing: float = 0.0,
                sample_generator: torch.Generator | None = None, n_sel: int | None = None,
                layer: int | None = None) -> dict: ...
    def step_loss(self, out: dict, n: int, n_glob: float, m_real: int, m_glob: float,
                  world_size: int) -> tuple[torch.Tensor, list[torch.Tensor]]: ...
    def enable_bias(self, core: nn.Module) -> int: ...
    def add_bias(self, out: dict, masks: torch.Tensor, loss: torch.Tensor,
                 logged: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]: ...
    # -- the compiled step (``compiled.CompiledForward``)
    compiled_outputs: ClassVar[tuple[str, ...]]
    def compiled_loss(self): ...
    def compiled_inputs(self, model: nn.Module, n_sel: int, budget: int, generator, device) -> tuple: ...
    # -- the stage's output folder
    def save(self, core: nn.Module, out_dir: Path) -> tuple[nn.Module, dict]: ...
    def export(self, core: nn.Module, out_dir: Path, tokenizer_json: Path, specials: dict) -> tuple[str, dict]: ...


class MLM:
    name = "mlm"
    parts = ("loss", "mlm_loss")            # what ``step_loss`` reports, in this order
    compiled_outputs = ("loss",)            # what ``compiled_loss`` returns (before a bias layer's output)

    def __init__(self, cfg: PretrainConfig):
        self.cfg = cfg
        self.compiled = None                # a compiled.CompiledForward once setup_compile() turned it on
        self.bias_layer = None              # the block whose output feeds the bias term (enable_bias)

    def setup_compile(self, device: torch.device, world_size: int, seq_len: int) -> tuple[bool, str]:
        """Decide pretrain.compile (``compiled.use_compile``) and, when on, route training micro-batches
        through the fixed-shape compiled graph; returns (on, why)."""
        from mlm_core.train.compiled import CompiledForward, use_compile
        on, why = use_compile(self.cfg, device, world_size)
        if on:
            self.compiled = CompiledForward(self, self.masking(self.cfg.masking), self.cfg.batch_size, seq_len,
                                            device)
        return on, why

    def _compiled(self, model, ids) -> bool:
        return self.compiled is not None and self.compiled.applies(model, ids)

    @classmethod
    def holds(cls, core: nn.Module) -> bool:
        """Whether an already built model is this objective's (``objective_of``; MLM: the default)."""
        return True

    def compiled_loss(self):
        """The function the compiled graph is made of (read from ``compiled`` when the graph is built)."""
        from mlm_core.train import compiled
        return compiled.mlm_loss

    def compiled_inputs(self, model, n_sel: int, budget: int, generator, device) -> tuple:
        """What ``compiled_loss`` takes after the budget (MLM: nothing)."""
        return ()

    def build(self, vocab_size: int, pad_id: int, special_ids: list[int] | None = None) -> nn.Module:
        from mlm_core.model import MLMEncoder, resolve_arch
        return MLMEncoder(resolve_arch(self.cfg.model, vocab_size, pad_id))

    def check_init(self, p, where: str) -> None:
        """pretrain.init_from: a ``StageError`` when this objective cannot continue the checkpoint ``p``
        (a ``model.pretrained.Pretrained``; ``where`` names it)."""
        if p.disc_arch is not None:
            from mlm_core.errors import StageError
            raise StageError(f"pretrain: {where} is an ELECTRA pair (discriminator + generator); objective mlm would "
                             "continue only the small generator and drop the discriminator: set pretrain.objective: "
                             "electra to continue the pair, or point pretrain.init_from at the generator folder alone")

    def build_init(self, p, spec, special_ids: list[int] | None = None) -> nn.Module:
        """The model holding the checkpoint ``p``'s weights (``init_from.build``; ``spec``: its ``InitSpec``)."""
        from mlm_core.model.pretrained import build_encoder
        return build_encoder(p, spec.dropout)

    def save(self, core: nn.Module, out_dir: Path) -> tuple[nn.Module, dict]:
        """Write the weight files of the stage's folder: (the MLM network, the manifest's extra fields)."""
        from mlm_core.model import save_weights
        save_weights(core, Path(out_dir) / "model.safetensors")
        return core, {}

    def export(self, core: nn.Module, out_dir: Path, tokenizer_json: Path, specials: dict) -> tuple[str, dict]:
        """The Hugging Face export: (its folder name, the manifest's extra fields); ``ExportError`` when the
        architecture does not export."""
        from mlm_core.model import export_hf
        export_hf(core, Path(out_dir) / "hf", tokenizer_json, specials)
        return "hf", {}

    def masking(self, mcfg):
        return mcfg

    def prepare(self, core: nn.Module, special_ids: list[int]) -> None:
        """Tell the model the tokenizer's special ids (ELECTRA never samples them)."""

    @staticmethod
    def arch(core: nn.Module) -> dict:
        return core.arch.to_dict()

    @staticmethod
    def mlm_model(core: nn.Module) -> nn.Module:
        """The network that predicts masked tokens (what is saved as the MLM and filled masks with)."""
        return core

    def forward(self, model: nn.Module, ids, seg, labels, label_smoothing: float = 0.0,
                sample_generator: torch.Generator | None = None, n_sel: int | None = None,
                layer: int | None = None) -> dict:
        """The model's output dict; ``n_sel``: the selected count when the caller knows it (saves a device sync
        on the compiled path). Training micro-batches go through the compiled graph when it is on (they
        then carry only the losses and n_predictions); evaluation always runs eagerly. ``layer``: also return
        that block's output as "layer_hidden" (the bias regularizer)."""
        if self._compiled(model, ids):
            return self.compiled(model, ids, seg, labels, label_smoothing, n_sel, sample_generator, layer=layer)
        if layer is not None:
            return model(ids, seg, labels, label_smoothing, return_layer=layer)
        return model(ids, seg, labels, label_smoothing)

    @staticmethod
    def hidden_model(core: nn.Module) -> nn.Module:
        """The encoder whose hidden states the bias regularizer pulls (MLM: the model itself)."""
        return core

    def enable_bias(self, core: nn.Module) -> int:
        """Turn pretrain.bias_regularizer on: resolve its layer against the model (an error naming the key when
        out of range) and log ``bias_reg`` as a loss part; returns the 0-based block index."""
        from mlm_core.bias.regularizer import resolve_layer
        self.bias_layer = resolve_layer(self.cfg.bias_regularizer.layer, self.hidden_model(core).arch.layers)
        self.parts = type(self).parts + ("bias_reg",)
        return self.bias_layer

    def add_bias(self, out: dict, masks: torch.Tensor, loss: torch.Tensor,
                 logged: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``step_loss``'s (loss, parts) with λ x the bias term of this micro-batch (masks: ``GroupFinder``)."""
        from mlm_core.bias.regularizer import bias_term
        reg = bias_term(out["layer_hidden"], masks) / self.cfg.grad_accum
        total = loss + self.cfg.bias_regularizer.weight * reg
        return total, [total.detach(), *logged[1:], reg.detach()]

    def step_loss(self, out: dict, n: int, n_glob: float, m_real: int, m_glob: float,
                  world_size: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        mlm = out["loss"] * (n * world_size / max(n_glob, 1.0))
        return mlm, [mlm.detach(), mlm.detach()]


class Electra(MLM):
    name = "electra"
    parts = ("loss", "mlm_loss", "disc_loss")
    compiled_outputs = ("loss", "disc_loss")

    @classmethod
    def holds(cls, core: nn.Module) -> bool:
        from mlm_core.model.electra import ElectraModel
        return isinstance(core, ElectraModel)

    def compiled_loss(self):
        from mlm_core.train import compiled
        return compiled.electra_loss

    def compiled_inputs(self, model, n_sel: int, budget: int, generator, device) -> tuple:
        """The generator's Gumbel noise, drawn eagerly (``compiled.gumbel_noise``)."""
        from mlm_core.train.compiled import gumbel_noise
        return (gumbel_noise(model, n_sel, budget, generator, device),)

    def check_init(self, p, where: str) -> None:
        """An ELECTRA pair continues (its generator's width against an explicit generator_fraction); a BERT
        checkpoint becomes the discriminator; RoBERTa / XLM-R, ModernBERT and a lone generator are refused."""
        from mlm_core.errors import StageError
        if p.disc_arch is not None:
            from mlm_core.train.electra_init import check_generator_fraction
            check_generator_fraction(self.cfg, p, where)
            return
        if p.arch.modern:
            raise StageError(f"pretrain: objective electra from {where} (modernbert): transformers has no ModernBERT "
                             "ELECTRA layout, so the result could not be exported back; use objective mlm")
        if p.family == "electra":
            raise StageError(f"pretrain: {where} is an ELECTRA generator without its discriminator: objective "
                             "electra needs the pair (see mlm_core.model.pretrained), or use objective mlm")
        if p.arch.position_offset:
            raise StageError(f"pretrain: objective electra from {where} ({p.family}): its positions start at "
                             f"padding_idx + 1, which the ELECTRA layout cannot express (the result could not be "
                             f"exported back); use objective mlm, or an ELECTRA or BERT checkpoint")

    def build_init(self, p, spec, special_ids: list[int] | None = None) -> nn.Module:
        """A pair: the pair. BERT: its encoder becomes the discriminator (fresh replaced-token head) and a fresh
        generator, ``electra.generator_fraction`` of its width, shares its embeddings."""
        import dataclasses

        from mlm_core.errors import StageError
        from mlm_core.model.electra import ElectraModel
        from mlm_core.model.pretrained import build_electra
        from mlm_core.train.electra_init import HEAD_KEYS, scaled_arch
        if p.disc_arch is not None:
            return build_electra(p, spec.dropout, special_ids)
        disc = dataclasses.replace(p.arch, family="electra",
                                   **({"dropout": spec.dropout} if spec.dropout is not None else {}))
        model = ElectraModel(disc, scaled_arch(disc, self.cfg.electra.generator_fraction), special_ids)
        enc = {k: v for k, v in p.state.items() if k not in HEAD_KEYS}
        missing, unexpected = model.disc.load_state_dict(enc, strict=False)
        if unexpected or any(not k.startswith("rtd_") for k in missing):
            raise StageError(f"pretrain: {spec.folder}: its encoder does not fit an ELECTRA discriminator "
                             f"(missing {missing[:4]}, unexpected {unexpected[:4]})")
        return model

    def save(self, core: nn.Module, out_dir: Path) -> tuple[nn.Module, dict]:
        """model.safetensors: the generator (the MLM); discriminator.safetensors: the discriminator."""
        from mlm_core.model import save_weights
        save_weights(core.gen, Path(out_dir) / "model.safetensors")
        save_weights(core.disc, Path(out_dir) / "discriminator.safetensors")
        return core.gen, {"mlm_model": "generator", "discriminator": core.disc.arch.to_dict()}

    def export(self, core: nn.Module, out_dir: Path, tokenizer_json: Path, specials: dict) -> tuple[str, dict]:
        """``ElectraForMaskedLM`` (generator) + ``ElectraForPreTraining`` (discriminator) folders."""
        from mlm_core.model.export_electra import DISCRIMINATOR_DIR, GENERATOR_DIR, export_electra
        export_electra(core.gen, core.disc, Path(out_dir), tokenizer_json, specials)
        return GENERATOR_DIR, {"export_discriminator": DISCRIMINATOR_DIR}

    def build(self, vocab_size: int, pad_id: int, special_ids: list[int] | None = None) -> nn.Module:
        from mlm_core.model import resolve_arch
        from mlm_core.model.electra import ElectraModel
        disc = resolve_arch(self.cfg.model, vocab_size, pad_id)
        gen = resolve_arch(self.cfg.model, vocab_size, pad_id, scale=self.cfg.electra.generator_fraction)
        return ElectraModel(disc, gen, special_ids)

    def masking(self, mcfg):
        from mlm_core.model.electra import electra_masking
        return electra_masking(mcfg)

    def prepare(self, core, special_ids):
        core.set_special_ids(special_ids)

    @staticmethod
    def arch(core: nn.Module) -> dict:
        return core.arch_dict

    @staticmethod
    def mlm_model(core: nn.Module) -> nn.Module:
        return core.gen

    def forward(self, model, ids, seg, labels, label_smoothing: float = 0.0, sample_generator=None,
                n_sel: int | None = None, layer: int | None = None) -> dict:
        if self._compiled(model, ids):
            return self.compiled(model, ids, seg, labels, label_smoothing, n_sel, sample_generator, layer=layer)
        if layer is not None:
            return model(ids, seg, labels, label_smoothing, sample_generator=sample_generator, return_layer=layer)
        return model(ids, seg, labels, label_smoothing, sample_generator=sample_generator)

    @staticmethod
    def hidden_model(core: nn.Module) -> nn.Module:
        return core.disc                    # the encoder to fine-tune (the audits score the generator)

    def step_loss(self, out, n, n_glob, m_real, m_glob, world_size):
        mlm, _ = super().step_loss(out, n, n_glob, m_real, m_glob, world_size)
        disc = out["disc_loss"] * (m_real * world_size / max(m_glob, 1.0))
        loss = mlm + self.cfg.electra.disc_weight * disc
        return loss, [loss.detach(), mlm.detach(), disc.detach()]


# the one place a pretrain.objective name is dispatched on
OBJECTIVES: dict[str, type[MLM]] = {"mlm": MLM, "electra": Electra}
DEFAULT = "mlm"                             # the objective of a model no other objective holds


def objective_for(cfg: PretrainConfig) -> Objective:
    """The objective ``cfg.objective`` names (``OBJECTIVES``)."""
    kind = OBJECTIVES.get(cfg.objective)
    if kind is None:
        from mlm_core.errors import MlmError
        raise MlmError(f"pretrain.objective: unknown objective {cfg.objective!r} (known: {sorted(OBJECTIVES)})")
    return kind(cfg)


def objective_of(model: nn.Module, cfg: PretrainConfig) -> Objective:
    """The objective matching an already built model (a caller may build the model itself)."""
    core = getattr(model, "module", model)
    kinds = [k for name, k in OBJECTIVES.items() if name != DEFAULT and k.holds(core)]
    return (kinds[0] if kinds else OBJECTIVES[DEFAULT])(cfg)


__all__ = ["Objective", "OBJECTIVES", "MLM", "Electra", "objective_for", "objective_of"]
