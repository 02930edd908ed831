"""What an ELECTRA pair needs when it starts from a checkpoint (``Electra.check_init`` / ``build_init``): the MLM
head's tensor names (a BERT checkpoint's head is not the discriminator's), the fresh generator's width as a fraction
of the discriminator's, and the check that an explicit ``electra.generator_fraction`` matches a continued pair's own
generator. Its own module so that ``objectives`` (which owns ELECTRA) and ``init_from`` (which reads checkpoints and
asks the objective to build) import it without importing each other."""
from __future__ import annotations

import dataclasses
import logging

from mlm_core.errors import StageError

log = logging.getLogger("mlm_core.train.init_from")
HEAD_KEYS = ("head_dense.weight", "head_dense.bias", "head_norm.weight", "head_norm.bias", "decoder.weight",
             "head_bias")


def _fraction_gives(disc, gen, fraction: float) -> tuple[int, int]:
    """(hidden, ffn) that ``fraction`` of ``disc`` gives, rounded as ``mlm_core.model.sizes.resolve_arch``
    rounds a generator, with the generator's own head count (a transformers pair may have fewer heads in
    the generator, e.g. electra-base: 4 of 12; in this pipeline's pairs they are the same)."""
    from mlm_core.model.sizes import round_to
    multiple = gen.heads * (2 if gen.position == "rotary" else 1)
    return round_to(disc.hidden * fraction, multiple), max(8, int(round(disc.ffn * fraction)))


def check_generator_fraction(cfg, p, where: str) -> None:
    """An ELECTRA pair ``p`` continues with its own generator (``Electra.check_init``): an explicit
    ``electra.generator_fraction`` (the user's statement of the generator's width, as in ``check_model_config``:
    set in the file or an override) must give that width, else the run would silently train another generator
    than the config says. (From BERT the fraction sizes the fresh generator, as without init_from.)"""
    d, g = p.disc_arch, p.arch
    own = g.hidden / d.hidden
    if "generator_fraction" not in cfg.electra.model_fields_set:
        log.info("pretrain: %s: continuing its ELECTRA generator (hidden %d, ffn %d: %.4g of the discriminator's "
                 "width); pretrain.electra.generator_fraction is unset and does not apply", where, g.hidden,
                 g.ffn, own)
        return
    fraction = cfg.electra.generator_fraction
    if _fraction_gives(d, g, fraction) == (g.hidden, g.ffn):
        return
    fix = (f"set it to {own:.4g}, or remove it" if _fraction_gives(d, g, own) == (g.hidden, g.ffn) else
           f"remove it (hidden and ffn are not the same fraction, {own:.4g} and {g.ffn / d.ffn:.4g})")
    hid, ffn = _fraction_gives(d, g, fraction)
    raise StageError(f"pretrain: pretrain.electra.generator_fraction = {fraction:g} gives a generator of hidden "
                     f"{hid}, ffn {ffn}, but the ELECTRA pair {where} continues its own generator of hidden "
                     f"{g.hidden}, ffn {g.ffn}, {own:.4g} of the discriminator's hidden {d.hidden}, ffn {d.ffn}: "
                     f"{fix} (unset, the checkpoint's generator is used)")


def scaled_arch(arch, fraction: float):
    """The fresh generator's Arch: ``fraction`` of the discriminator's width (hidden rounded to a multiple of
    the head count, as ``mlm_core.model.sizes.resolve_arch`` scales it), same depth and head count."""
    heads = arch.heads
    hidden = max(heads, int(round(arch.hidden * fraction / heads)) * heads)
    return dataclasses.replace(arch, hidden=hidden, ffn=max(8, int(round(arch.ffn * fraction))),
                               embedding_size=None)


__all__ = ["HEAD_KEYS", "check_generator_fraction", "scaled_arch"]
