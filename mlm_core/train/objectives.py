"""Training objectives behind one interface, so the loop and the evaluator never ask which model they hold.

An objective builds its model, says how the input is corrupted, runs a forward pass and turns it into
the step's loss with the parts to log. ``MLM``: masked-language-model cross-entropy. ``Electra``: the
generator's MLM loss + disc_weight x the discriminator's replaced-token BCE (Clark et al., 2020), the
generator's input corrupted 85% [MASK] / 15% unchanged (see ``mlm_core.model.electra``).

Loss normalisation (both): every micro-batch's mean loss is re-weighted by its share of the *global*
batch's predictions (``n_glob`` selected positions for the MLM part, ``m_glob`` non-pad tokens for the
discriminator), so W ranks x k accumulation steps give the update of one W*k batch.

``pretrain.bias_regularizer`` (``enable_bias``): the forward pass also returns a block's output (the MLM
encoder's; ELECTRA: the discriminator's) and ``add_bias`` adds λ x the term of ``mlm_core.bias.regularizer``,
computed per micro-batch and weighted 1/grad_accum (DDP averages over ranks): the mean over the W*k
micro-batches, whatever W and k. It is logged unweighted as ``bias_reg``.
"""
from __future__ import annotations

import torch
from torch import nn

from mlm_core.config import PretrainConfig


class MLM:
    name = "mlm"
    parts = ("loss", "mlm_loss")            # what ``step_loss`` reports, in this order

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
            self.compiled = CompiledForward(self.name, self.masking(self.cfg.masking), self.cfg.batch_size, seq_len,
                                            device)
        return on, why

    def _compiled(self, model, ids) -> bool:
        return self.compiled is not None and self.compiled.applies(model, ids)

    def build(self, vocab_size: int, pad_id: int, special_ids: list[int] | None = None) -> nn.Module:
        from mlm_core.model import MLMEncoder, resolve_arch
        return MLMEncoder(resolve_arch(self.cfg.model, vocab_size, pad_id))

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


def objective_for(cfg: PretrainConfig) -> MLM:
    return {"mlm": MLM, "electra": Electra}[cfg.objective](cfg)


def objective_of(model: nn.Module, cfg: PretrainConfig) -> MLM:
    """The objective matching an already built model (a caller may build the model itself)."""
    core = getattr(model, "module", model)
    from mlm_core.model.electra import ElectraModel
    kind = Electra if isinstance(core, ElectraModel) else MLM
    return kind(cfg)


__all__ = ["MLM", "Electra", "objective_for", "objective_of"]
