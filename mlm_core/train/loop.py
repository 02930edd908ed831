"""The pretraining loop: sample -> mask -> forward/backward (x grad_accum) -> clip -> AdamW step, with
metrics, per-language validation, atomic checkpoints and exact resume.

In: a ``PretrainConfig``, a ``ShardDataset`` (train + validation rows, sampling table, special ids), a model
from ``build_model`` and a working folder. Out: ``<out_dir>/metrics.jsonl`` (one JSON object per log /
eval), ``<out_dir>/checkpoints/step-*`` and a result dict (final loss, per-language eval, unigram baseline).

Loss normalisation: every micro-batch's mean loss is re-weighted by its share of the *global* batch's
predictions (counted before the forward passes, all-reduced across ranks), so the update equals one big
batch's mean loss: W ranks x accumulation k is the same optimizer step as 1 rank x accumulation W*k.
The objective (``objectives``: MLM, or ELECTRA with the model of ``mlm_core.model.electra``) builds the
model, corrupts the input and turns a forward pass into the loss; validation lives in ``evaluator``.
The logged "loss" (and its parts) is the mean over the steps since the previous log record.
Every rank's random streams (dropout, masking, ELECTRA sampling) derive from (seed, rank); a rank that
resumes from a checkpoint holding no state for it (the world size grew) derives them from
(seed, rank, step), so new ranks neither repeat one another nor replay step 0.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from mlm_core.config import PretrainConfig, field_effect, trajectory_view
from mlm_core.model.electra import ElectraModel  # noqa: F401 - re-exported (mlm_core.train.loop.ElectraModel)
from mlm_core.progress import Progress, validation_summary
from mlm_core.train import checkpoint as ckpt
from mlm_core.train import plateau
from mlm_core.train.evaluator import Evaluator, derive
from mlm_core.train.objectives import objective_for, objective_of
from mlm_core.train.optim import build_optimizer

log = logging.getLogger(__name__)
PEAK_FLOPS = {"cpu": 175e9, "cuda": 989e12}      # defaults when cfg.peak_flops is unset (per process)
# PretrainConfig fields that do not change the trained weights (declared effect other than "output" in
# mlm_core.config); nested sections (model, masking, distributed...) are filtered field by field in train_fingerprint.
_NO_EVAL = tuple(n for n in PretrainConfig.model_fields if field_effect(PretrainConfig, n) not in ("output", "section"))


# ------------------------------------------------------------------------------------------------ models
def build_model(cfg: PretrainConfig, vocab_size: int, pad_id: int,
                special_ids: list[int] | None = None, init=None) -> tuple[nn.Module, dict]:
    """(model, arch dict) for cfg.objective; seed torch before calling for a reproducible init.
    ``special_ids``: ids an ELECTRA generator's sample may never produce (pad always excluded).
    ``init``: an ``init_from.InitSpec`` (pretrain.init_from): the model holds the checkpoint's weights (its
    shape and vocabulary come from it, not from ``vocab_size`` / ``pad_id``)."""
    if init is not None:
        from mlm_core.train.init_from import build
        core = build(cfg, init, special_ids)
    else:
        core = objective_for(cfg).build(vocab_size, pad_id, special_ids)
        if cfg.model.position_init == "sinusoidal":
            from mlm_core.model.positions import sinusoidal_position_init
            sinusoidal_position_init(core)
    return core, objective_for(cfg).arch(core)


def train_fingerprint(cfg: PretrainConfig, seed: int) -> str:
    """What determines the trajectory: the fields declared "output" (mlm_core.config markers) and the seed;
    logging/eval/checkpoint cadence and placement are left out, so changing them resumes from a checkpoint."""
    return ckpt.config_fingerprint({"pretrain": trajectory_view(cfg), "seed": seed})


# ------------------------------------------------------------------------------------------------ helpers
_derive = derive


def seed_streams(gens: dict[str, torch.Generator], seed: int, rank: int, step: int | None = None) -> None:
    """Seed this rank's dropout (global torch RNG) and the loop's own generators from (seed, rank[, step]).

    step None: a fresh start. A step: a rank resuming without a stored state (world size grew), which
    must neither share streams with another new rank nor replay its own stream from step 0."""
    extra = () if step is None else (int(step), 7)
    torch.manual_seed(_derive(seed, rank, 2, *extra))
    for name, word in (("mask", 1), ("sample", 3)):
        if name in gens:
            gens[name].manual_seed(_derive(seed, rank, word, *extra))


def resolve_device(cfg: PretrainConfig, local_rank: int = 0) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def autocast(device: torch.device, precision: str):
    if device.type == "cuda" and precision in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()                 # fp32 on CPU (bf16 matmul is far slower there)


class Rows:
    """Batches of (language index, row) draws gathered from the memory-mapped shards (one fancy-index per language)."""

    def __init__(self, ds, split: str, langs: list[str]):
        self.cols = [ds.columns(split, lang) for lang in langs]
        self.seq_len = ds.seq_len
        sizes = [len(c["input_ids"]) for c in self.cols]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)   # global sequence ids

    def gather(self, li: np.ndarray, rows: np.ndarray) -> dict[str, torch.Tensor]:
        from mlm_core.shards.reader import gather_rows
        ids, seg, ws = gather_rows(self.cols, li, rows)     # stored rows gathered, then decoded once for the batch
        seg = seg.astype(np.int32)
        return {"input_ids": torch.from_numpy(ids), "segment_ids": torch.from_numpy(seg),
                "word_start": torch.from_numpy(ws), "seq_ids": torch.from_numpy(self.offsets[li] + rows)}


def _append_jsonl(path: Path, rec: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def _read_jsonl(path: Path) -> list[dict]:
    """Records of a metrics file; a line cut short by a killed process is dropped."""
    out = []
    for ln in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            out.append(json.loads(ln))
        except ValueError:
            continue
    return out


def _truncate_metrics(path: Path, upto: int | None) -> None:
    """Keep only records of steps <= upto (they are re-logged after a resume); all gone for a fresh start."""
    if path.exists():
        keep = [] if upto is None else [r for r in _read_jsonl(path) if r.get("step", 0) <= upto]
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep), encoding="utf-8")


def _last_train_loss(path: Path) -> float | None:
    losses = [r["loss"] for r in _read_jsonl(path) if r.get("type") == "train"]
    return losses[-1] if losses else None


class Feed:
    """Draws this rank's micro-batches: sampler -> rows from the shards -> masking; times both parts.
    ``groups``: a ``bias.regularizer.GroupFinder`` (pretrain.bias_regularizer) run on the original rows."""

    def __init__(self, sampler, rows: Rows, masker, generator: torch.Generator, batch_size: int, device,
                 groups=None):
        self.sampler, self.rows, self.masker, self.gen, self.groups = sampler, rows, masker, generator, groups
        self.B, self.device, self.nb = batch_size, device, device.type == "cuda"
        self.t_data = self.t_mask = self.rate = 0.0

    def draw(self, step: int, n: int) -> list[tuple]:
        """n x (input_ids, segment_ids, labels, predictions, non-pad tokens, bias-group masks or None) on the
        device."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            li, rows, passes = self.sampler.next_indices(self.B, passes=True)
            b = self.rows.gather(li, rows)
            t1 = time.perf_counter()
            m = self.masker(b["input_ids"], b["word_start"], step, seq_ids=b["seq_ids"], generator=self.gen,
                            passes=torch.from_numpy(passes))   # static masking: copy = pass mod static_copies
            self.t_data, self.t_mask, self.rate = self.t_data + t1 - t0, self.t_mask + time.perf_counter() - t1, m.rate
            seg = b["segment_ids"]
            gm = None if self.groups is None else self.groups(b["input_ids"], b["word_start"], li).to(self.device)
            out.append((m.input_ids.to(self.device, non_blocking=self.nb), seg.to(self.device, non_blocking=self.nb),
                        m.labels.to(self.device, non_blocking=self.nb), int(m.selected.sum()), int((seg != 0).sum()),
                        gm))
        return out


def _bias_setup(cfg: PretrainConfig, objective, core, bias, rank: int) -> int | None:
    """pretrain.bias_regularizer: the block index its term reads (None: off)."""
    if cfg.bias_regularizer is None:
        return None
    if bias is None:
        from mlm_core.errors import MlmError
        raise MlmError("pretrain.bias_regularizer is set but train() got no group table (bias=): build it with "
                       "mlm_core.bias.regularizer.load_group_table")
    layer = objective.enable_bias(core)
    if rank == 0:
        log.info("pretrain: bias regularizer on (weight %g, block %d, groups %s, %s token sequences)",
                 cfg.bias_regularizer.weight, layer, list(bias.groups),
                 {lg: len(es) for lg, es in bias.entries.items()})
    return layer


def _latest(root: Path, rank: int):
    if rank == 0:
        ckpt.cleanup_temporaries(root)
    return ckpt.find_latest(root)


def _restore(found, arch: dict, fp: str, rank: int, *, core, opt, sched, gens, sampler, seed: int = 0) -> dict:
    """Load the checkpoint into model/optimizer/scheduler/RNGs/sampler; returns its counters."""
    path, meta = found
    ckpt.check_arch(path, meta, arch)
    if meta.get("config_fingerprint") != fp and rank == 0:
        log.warning("resuming %s written with a different training config (fingerprint %s, now %s)",
                    path, meta.get("config_fingerprint"), fp)
    st = ckpt.load_checkpoint(path, meta, model=core, optimizer=opt, scheduler=sched, generators=gens, rank=rank)
    sampler.load_state_dict(st["sampler"])
    if not st.get("rng_restored", True):
        seed_streams(gens, seed, rank, int(st["state"]["step"]))
    if rank == 0:
        log.info("resumed from step %d (%s)", st["state"]["step"], path)
    return st["state"]


def _plateau_alarm(rec: dict, cfg: PretrainConfig, rank: int, checkpoint: Callable[[], Path | None]) -> None:
    """The detector fired: a WARNING (the ``mlm_core`` logger; tasks/ forwards it to the Prefect run log); with
    pretrain.plateau.stop_on_plateau, keep this step's checkpoint and stop with ``PlateauError``."""
    if rank == 0:
        log.warning("%s", rec["message"])
    if cfg.plateau.stop_on_plateau:
        checkpoint()
        raise plateau.PlateauError(plateau.stop_message(rec), rec)


# ------------------------------------------------------------------------------------------------ the loop
def train(cfg: PretrainConfig, data, model: nn.Module, out_dir: Path, *, seed: int = 0, rank: int = 0,
          world_size: int = 1, local_rank: int = 0, resume: bool = True,
          metrics_cb: Callable[[dict], None] | None = None, stop_after: int | None = None,
          heartbeat: Callable[[int], None] | None = None, show_progress: bool = True, bias=None) -> dict:
    """Train ``model`` on ``data`` (a ShardDataset) to ``cfg.steps`` (or ``stop_after``); see the module docstring.

    bias: the ``bias.regularizer.GroupTable`` of pretrain.bias_regularizer's lists (required when it is set).

    show_progress: rank 0 shows live progress (``mlm_core.progress``); a torchrun worker passes False (the
    launcher shows it from the forwarded records)."""
    from mlm_core.masking import Masker
    from mlm_core.train.distributed import all_reduce_sum, wrap_model
    from mlm_core.train.signals import interrupted, should_stop

    out_dir, ckpt_root = Path(out_dir), Path(out_dir) / "checkpoints"
    out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg, local_rank)
    if cfg.precision == "bf16" and device.type == "cpu" and rank == 0:
        log.warning("precision bf16 requested on CPU: training in fp32 (bf16 autocast is used on CUDA only)")
    specials = {r: int(e["id"]) for r, e in data.manifest["special_tokens"].items()}
    vocab, T = int(data.manifest["vocab_size"]), data.seq_len
    core = model.to(device)
    objective = objective_of(core, cfg)
    objective.prepare(core, sorted(specials.values()))
    bias_layer = _bias_setup(cfg, objective, core, bias, rank)
    arch = objective.arch(core)
    model = wrap_model(core, cfg.distributed, device, world_size)
    compiled, why = objective.setup_compile(device, world_size, T)     # pretrain.compile (train.compiled)
    if rank == 0:
        log.info("pretrain: compiled training step %s (%s)", "on" if compiled else "off", why)
    opt, sched = build_optimizer(model, cfg, fused_cpu=compiled)
    from mlm_core.shards import LanguageSampler
    sampler = LanguageSampler(data.rows_per_lang("train"), data.sampling_probs(), seed, rank, world_size)
    from mlm_core.masking.pmi import collocations_for
    masker = Masker(objective.masking(cfg.masking), vocab, sorted(specials.values()), specials["mask"], seed, cfg.steps,
                    unk_id=specials.get("unk"), collocations=collocations_for(cfg.masking, data))
    gens = {"mask": torch.Generator()}
    if device.type == "cuda":
        gens["sample"] = torch.Generator(device=device)
    sample_gen = gens.get("sample", gens["mask"])
    groups = None
    if bias_layer is not None:
        from mlm_core.bias.regularizer import GroupFinder
        groups = GroupFinder(bias, sampler.langs, sorted(specials.values()))
    feed = Feed(sampler, Rows(data, "train", sampler.langs), masker, gens["mask"], cfg.batch_size, device, groups)
    fp = train_fingerprint(cfg, seed)

    found = _latest(ckpt_root, rank) if resume else None
    step, tokens, resumed = 0, 0, None
    n_parts = len(objective.parts)
    win_sum, win_n = torch.zeros(n_parts, dtype=torch.float64, device=device), 0   # loss parts summed since the last log
    seed_streams(gens, seed, rank)                  # this rank's streams (overwritten by a checkpoint's own)
    if found:
        st = _restore(found, arch, fp, rank, core=core, opt=opt, sched=sched, gens=gens, sampler=sampler, seed=seed)
        step, tokens, resumed = int(st["step"]), int(st["tokens"]), int(st["step"])
        w = st.get("log_window") or {}
        if len(w.get("sum", ())) == n_parts:        # a window cut by the checkpoint: resume the mean exactly
            win_sum, win_n = torch.tensor(w["sum"], dtype=torch.float64, device=device), int(w["steps"])
    metrics_path = out_dir / "metrics.jsonl"
    if rank == 0:
        _truncate_metrics(metrics_path, resumed)

    def emit(rec: dict) -> None:
        if rank == 0:
            _append_jsonl(metrics_path, rec)
            if metrics_cb is not None:
                metrics_cb(rec)

    evaluator = Evaluator(cfg, data, Masker, vocab, specials, seed, objective)
    peak = cfg.peak_flops or PEAK_FLOPS[device.type]
    end = min(cfg.steps, stop_after) if stop_after is not None else cfg.steps
    accum = cfg.grad_accum
    step_tokens = cfg.batch_size * T * accum * world_size
    # display only: nothing of it reaches metrics.jsonl or any other output
    progress = Progress("pretrain", end, done=step, tokens=tokens, 
                        enabled=None if show_progress and rank == 0 else False)
    if found:                                       # said on the console, not only at INFO (issue 24 item 4)
        progress.say(f"pretrain: resumed from step {resumed} of {end} ({found[0]})")
    last_eval: dict = {}
    plateau_rec = None                              # the plateau detector's last judgement (train.plateau)
    final_loss = None
    win_t0, win_steps = time.perf_counter(), 0
    model.train()

    def save(at: int) -> Path:
        counters = {"tokens": tokens, "world_size": world_size,
                    "log_window": {"sum": [float(x) for x in win_sum.tolist()], "steps": win_n}}
        return ckpt.save_checkpoint(ckpt_root, at, model=core, optimizer=opt, scheduler=sched,
                                    sampler_state=sampler.state_dict(), generators=gens, counters=counters,
                                    arch=arch, config_fp=fp, keep=cfg.keep_checkpoints, rank=rank,
                                    world_size=world_size)

    last_ckpt = None
    with progress:                                  # closes the status line, also on an error
        while step < end:
            # 1) draw and mask the whole step's micro-batches first: the global prediction counts
            #    normalise the loss
            micro = feed.draw(step, accum)
            counts = torch.tensor([sum(x[3] for x in micro), sum(x[4] for x in micro)], dtype=torch.float64)
            n_glob, m_glob = all_reduce_sum(counts, world_size, device).tolist()
            # 2) forward/backward
            lr = sched.get_last_lr()[0]
            parts = torch.zeros(n_parts, dtype=torch.float64, device=device)   # objective.parts (this rank's share)
            for i, (ids, seg, labels, n, m_real, gm) in enumerate(micro):
                last = i == accum - 1 or not hasattr(model, "no_sync")
                sync = contextlib.nullcontext() if last else model.no_sync()
                with sync:
                    with autocast(device, cfg.precision):
                        out = objective.forward(model, ids, seg, labels, cfg.label_smoothing,
                                                sample_generator=sample_gen, n_sel=n, layer=bias_layer)
                    loss, logged = objective.step_loss(out, n, n_glob, m_real, m_glob, world_size)
                    if gm is not None:          # pretrain.bias_regularizer
                        loss, logged = objective.add_bias(out, gm, loss, logged)
                    loss.backward()
                parts += torch.stack([x.double() for x in logged]) / world_size
            win_sum, win_n = win_sum + all_reduce_sum(parts, world_size, device), win_n + 1
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                   cfg.clip_norm if cfg.clip_norm else float("inf"))
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step, tokens, win_steps = step + 1, tokens + step_tokens, win_steps + 1
            if heartbeat is not None:
                heartbeat(step)
            # 3) log / eval / checkpoint
            if step % cfg.log_every == 0 or step == end:
                mean = (win_sum / max(win_n, 1)).tolist()     # the mean over the interval, not its last step
                final_loss = mean[0]
                dt = time.perf_counter() - win_t0
                tps = win_steps * step_tokens / max(dt, 1e-9)
                rate, t_data, t_mask = feed.rate, feed.t_data, feed.t_mask
                fpt = core.flops_per_token(T, rate)
                gn = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
                rec = {"type": "train", "step": step, "loss": final_loss, "lr": lr, "masking_rate": rate,
                       "tokens": tokens, "tokens_per_s": tps, "mfu": fpt * tps / (peak * world_size),
                       "grad_norm": float(gn), "data_pct": 100 * t_data / max(dt, 1e-9),
                       "masking_pct": 100 * t_mask / max(dt, 1e-9)}
                if n_parts > 2:
                    rec |= dict(zip(objective.parts[1:], mean[1:]))
                if not math.isfinite(final_loss):
                    raise FloatingPointError(f"pretrain: loss is {final_loss} at step {step}")
                emit(rec)
                win_t0, win_steps = time.perf_counter(), 0
                win_sum, win_n = torch.zeros_like(win_sum), 0
                feed.t_data = feed.t_mask = 0.0
            if step % cfg.eval_every == 0 or step == cfg.steps:
                last_eval = evaluator(core, device, cfg.precision)
                judged = plateau.check(last_eval, step, cfg)     # pretrain.plateau (None before its share)
                plateau_rec = judged or plateau_rec
                emit({"type": "eval", "step": step, **{f"{lg}.val_{k}": v for lg, r in last_eval.items()
                                                       for k, v in r.items() if k != "n"}, **plateau.fields(judged)})
                progress.validation(*plateau.summary(validation_summary(last_eval, step), judged))
                if judged and judged["fired"]:
                    _plateau_alarm(judged, cfg, rank, lambda: save(step))
            if step % cfg.checkpoint_every == 0 or step == end:
                last_ckpt = save(step)
            progress.update(step, loss=final_loss, tokens=tokens)
            if step < end and should_stop(world_size, device):  # SIGTERM/SIGINT: checkpoint at this boundary, stop
                raise interrupted(step, last_ckpt if step % cfg.checkpoint_every == 0 else save(step))
    if last_ckpt is None and found:                 # resumed an already finished run: nothing trained now
        last_ckpt = found[0]
        final_loss = _last_train_loss(metrics_path) if rank == 0 else None
        if step >= cfg.steps:
            last_eval = evaluator(core, device, cfg.precision)
            plateau_rec = plateau.check(last_eval, step, cfg)
            if plateau_rec and plateau_rec["fired"]:
                _plateau_alarm(plateau_rec, cfg, rank, lambda: last_ckpt)
    return {"step": step, "tokens": tokens, "final_loss": final_loss, "eval": last_eval,
            "baseline": {lg: r["baseline_acc"] for lg, r in last_eval.items()}, "unigram_top": evaluator.top,
            "checkpoint": str(last_ckpt) if last_ckpt else None, "completed": step >= cfg.steps,
            "resumed_from": resumed, "arch": arch, "config_fingerprint": fp, "plateau": plateau_rec}


__all__ = ["train", "build_model", "ElectraModel", "Evaluator", "resolve_device", "train_fingerprint", "PEAK_FLOPS"]
