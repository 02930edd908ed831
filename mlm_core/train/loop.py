"""The pretraining loop: sample -> mask -> ``step.step`` (forward/backward x grad_accum -> clip -> AdamW step),
with metrics, per-language validation, atomic checkpoints and exact resume. ``train()`` reads as its named
steps: ``set_up``, ``restore``, ``start``, then per step ``step`` / ``advance`` / ``log_train`` / ``validate`` /
``checkpoint`` / ``stop_if_signalled``, and ``finish``.

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

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from mlm_core.config import PretrainConfig, field_effect, trajectory_view
from mlm_core.progress import Progress, validation_summary
from mlm_core.train import checkpoint as ckpt
from mlm_core.train import metrics_file
from mlm_core.train import plateau
from mlm_core.train.evaluator import Evaluator, derive
from mlm_core.train.feed import Feed, Rows
from mlm_core.train.objectives import Objective, objective_for, objective_of
from mlm_core.train.optim import build_optimizer
from mlm_core.train.step import StepOut, autocast, step

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


# ------------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class TrainContext:
    """The options of one ``train()`` call (see its docstring), fixed for the run."""
    cfg: PretrainConfig
    out_dir: Path                   # metrics.jsonl and checkpoints/
    seed: int = 0
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    resume: bool = True             # from the newest complete checkpoint in out_dir/checkpoints
    metrics_cb: Callable[[dict], None] | None = None
    stop_after: int | None = None   # stop (with a checkpoint) after this step, before cfg.steps
    heartbeat: Callable[[int], None] | None = None
    show_progress: bool = True

    @property
    def ckpt_root(self) -> Path:
        return self.out_dir / "checkpoints"

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / "metrics.jsonl"

    @property
    def end(self) -> int:
        return min(self.cfg.steps, self.stop_after) if self.stop_after is not None else self.cfg.steps


@dataclass(frozen=True)
class Run:
    """What ``set_up`` built, fixed from the first step to the last."""
    ctx: TrainContext
    device: torch.device
    core: nn.Module                 # the model (what checkpoints and validation see)
    model: nn.Module                # core, or its DDP / FSDP wrapper (what trains)
    objective: Objective
    arch: dict
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    sampler: object                 # shards.LanguageSampler
    gens: dict[str, torch.Generator]
    feed: Feed
    evaluator: Evaluator
    fp: str                         # train_fingerprint: written into every checkpoint
    seq_len: int
    step_tokens: int                # tokens of one optimizer step, all ranks

    @property
    def sample_gen(self) -> torch.Generator:
        return self.gens.get("sample", self.gens["mask"])

    def emit(self, rec: dict) -> None:
        """Rank 0 appends a metrics record to metrics.jsonl and hands it to the caller's callback."""
        if self.ctx.rank == 0:
            metrics_file.append_record(self.ctx.metrics_path, rec)
            if self.ctx.metrics_cb is not None:
                self.ctx.metrics_cb(rec)


@dataclass
class State:
    """What changes from step to step: the counters a checkpoint saves, the log window, the last judgements."""
    win_sum: torch.Tensor           # the loss parts (objective.parts) summed since the last log record
    win_n: int = 0                  # steps in win_sum (a checkpoint saves both: the logged mean resumes exactly)
    step: int = 0
    tokens: int = 0
    found: tuple | None = None      # (path, meta) of the checkpoint resumed from
    resumed: int | None = None      # its step
    win_t0: float = 0.0             # throughput window (not saved)
    win_steps: int = 0
    final_loss: float | None = None
    last_eval: dict = field(default_factory=dict)
    plateau_rec: dict | None = None  # the plateau detector's last judgement (train.plateau)
    last_ckpt: Path | None = None


# ------------------------------------------------------------------------------------------------ the loop
def train(cfg: PretrainConfig, data, model: nn.Module, out_dir: Path, *, seed: int = 0, rank: int = 0,
          world_size: int = 1, local_rank: int = 0, resume: bool = True,
          metrics_cb: Callable[[dict], None] | None = None, stop_after: int | None = None,
          heartbeat: Callable[[int], None] | None = None, show_progress: bool = True, bias=None) -> dict:
    """Train ``model`` on ``data`` (a ShardDataset) to ``cfg.steps`` (or ``stop_after``); see the module docstring.

    bias: the ``bias.regularizer.GroupTable`` of pretrain.bias_regularizer's lists (required when it is set).

    show_progress: rank 0 shows live progress (``mlm_core.progress``); a torchrun worker passes False (the
    launcher shows it from the forwarded records)."""
    ctx = TrainContext(cfg, Path(out_dir), seed, rank, world_size, local_rank, resume, metrics_cb, stop_after,
                       heartbeat, show_progress)
    run = set_up(ctx, data, model, bias)    # device, objective, wrapped model, optimizer, feed, evaluator
    state = restore(run)                    # the newest checkpoint, or a fresh start
    with start(run, state) as bar:          # the progress line (closed also on an error)
        while state.step < ctx.end:
            micro = run.feed.draw(state.step, cfg.grad_accum)    # the whole step's masked micro-batches
            out = step(run.model, run.objective, run.opt, run.sched, micro, cfg, device=run.device,
                       world_size=world_size, sample_generator=run.sample_gen)
            advance(run, state, out)
            if state.step % cfg.log_every == 0 or state.step == ctx.end:
                log_train(run, state, out)
            if state.step % cfg.eval_every == 0 or state.step == cfg.steps:
                validate(run, state, bar)
            if state.step % cfg.checkpoint_every == 0 or state.step == ctx.end:
                state.last_ckpt = checkpoint(run, state)
            bar.update(state.step, loss=state.final_loss, tokens=state.tokens)
            stop_if_signalled(run, state)
    return finish(run, state)


def set_up(ctx: TrainContext, data, model: nn.Module, bias) -> Run:
    """The model on its device with its objective (special ids, bias term, compiled step), wrapped for DDP /
    FSDP; the optimizer; the feed (sampler -> rows -> masker); the fixed validation batches."""
    from mlm_core.masking import Masker
    from mlm_core.train.distributed import wrap_model

    cfg, rank, world_size = ctx.cfg, ctx.rank, ctx.world_size
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(cfg, ctx.local_rank)
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
    sampler = LanguageSampler(data.rows_per_lang("train"), data.sampling_probs(), ctx.seed, rank, world_size)
    from mlm_core.masking.pmi import collocations_for
    masker = Masker(objective.masking(cfg.masking), vocab, sorted(specials.values()), specials["mask"], ctx.seed,
                    cfg.steps, unk_id=specials.get("unk"), collocations=collocations_for(cfg.masking, data))
    gens = {"mask": torch.Generator()}
    if device.type == "cuda":
        gens["sample"] = torch.Generator(device=device)
    groups = None
    if bias_layer is not None:
        from mlm_core.bias.regularizer import GroupFinder
        groups = GroupFinder(bias, sampler.langs, sorted(specials.values()))
    feed = Feed(sampler, Rows(data, "train", sampler.langs), masker, gens["mask"], cfg.batch_size, device, groups)
    evaluator = Evaluator(cfg, data, Masker, vocab, specials, ctx.seed, objective)
    return Run(ctx, device, core, model, objective, arch, opt, sched, sampler, gens, feed, evaluator,
               train_fingerprint(cfg, ctx.seed), T, cfg.batch_size * T * cfg.grad_accum * world_size)


def restore(run: Run) -> State:
    """Seed this rank's streams, then load the newest complete checkpoint over them (model, optimizer, scheduler,
    RNGs, sampler, counters, the cut log window); metrics.jsonl keeps only the records up to its step."""
    ctx = run.ctx
    found = _latest(ctx.ckpt_root, ctx.rank) if ctx.resume else None
    n_parts = len(run.objective.parts)
    state = State(win_sum=torch.zeros(n_parts, dtype=torch.float64, device=run.device), found=found)
    seed_streams(run.gens, ctx.seed, ctx.rank)      # this rank's streams (overwritten by a checkpoint's own)
    if found:
        st = _restore(found, run.arch, run.fp, ctx.rank, core=run.core, opt=run.opt, sched=run.sched,
                      gens=run.gens, sampler=run.sampler, seed=ctx.seed)
        state.step, state.tokens, state.resumed = int(st["step"]), int(st["tokens"]), int(st["step"])
        w = st.get("log_window") or {}
        if len(w.get("sum", ())) == n_parts:        # a window cut by the checkpoint: resume the mean exactly
            state.win_sum = torch.tensor(w["sum"], dtype=torch.float64, device=run.device)
            state.win_n = int(w["steps"])
    if ctx.rank == 0:
        metrics_file.truncate_records(ctx.metrics_path, state.resumed)
    return state


def start(run: Run, state: State) -> Progress:
    """The live progress line (display only: nothing of it reaches metrics.jsonl); the model in train mode."""
    ctx = run.ctx
    bar = Progress("pretrain", ctx.end, done=state.step, tokens=state.tokens,
                   enabled=None if ctx.show_progress and ctx.rank == 0 else False)
    if state.found:                                 # said on the console, not only at INFO (issue 24 item 4)
        bar.say(f"pretrain: resumed from step {state.resumed} of {ctx.end} ({state.found[0]})")
    state.win_t0, state.win_steps = time.perf_counter(), 0
    run.model.train()
    return bar


def advance(run: Run, state: State, out: StepOut) -> None:
    """Count the finished step: its loss parts into the log window, the step and token counters, the heartbeat."""
    state.win_sum, state.win_n = state.win_sum + out.parts, state.win_n + 1
    state.step, state.tokens, state.win_steps = state.step + 1, state.tokens + run.step_tokens, state.win_steps + 1
    if run.ctx.heartbeat is not None:
        run.ctx.heartbeat(state.step)


def log_train(run: Run, state: State, out: StepOut) -> None:
    """A "train" record: the loss (and its parts) averaged over the steps since the last record, throughput,
    MFU, the gradient norm and where the time went; a non-finite loss stops the run."""
    cfg, feed, world_size = run.ctx.cfg, run.feed, run.ctx.world_size
    mean = (state.win_sum / max(state.win_n, 1)).tolist()     # the mean over the interval, not its last step
    state.final_loss = mean[0]
    dt = time.perf_counter() - state.win_t0
    tps = state.win_steps * run.step_tokens / max(dt, 1e-9)
    peak = cfg.peak_flops or PEAK_FLOPS[run.device.type]
    fpt = run.core.flops_per_token(run.seq_len, feed.rate)
    gn = out.grad_norm.full_tensor() if hasattr(out.grad_norm, "full_tensor") else out.grad_norm
    rec = {"type": "train", "step": state.step, "loss": state.final_loss, "lr": out.lr, "masking_rate": feed.rate,
           "tokens": state.tokens, "tokens_per_s": tps, "mfu": fpt * tps / (peak * world_size),
           "grad_norm": float(gn), "data_pct": 100 * feed.t_data / max(dt, 1e-9),
           "masking_pct": 100 * feed.t_mask / max(dt, 1e-9)}
    if len(run.objective.parts) > 2:
        rec |= dict(zip(run.objective.parts[1:], mean[1:]))
    if not math.isfinite(state.final_loss):
        raise FloatingPointError(f"pretrain: loss is {state.final_loss} at step {state.step}")
    run.emit(rec)
    state.win_t0, state.win_steps = time.perf_counter(), 0
    state.win_sum, state.win_n = torch.zeros_like(state.win_sum), 0
    feed.t_data = feed.t_mask = 0.0


def validate(run: Run, state: State, bar: Progress) -> None:
    """Score the fixed validation batches, judge a plateau (``train.plateau``), log an "eval" record; a plateau
    that stops the run (pretrain.plateau.stop_on_plateau) checkpoints this step first."""
    cfg = run.ctx.cfg
    state.last_eval = run.evaluator(run.core, run.device, cfg.precision)
    judged = plateau.check(state.last_eval, state.step, cfg)     # pretrain.plateau (None before its share)
    state.plateau_rec = judged or state.plateau_rec
    run.emit({"type": "eval", "step": state.step, **{f"{lg}.val_{k}": v for lg, r in state.last_eval.items()
                                                     for k, v in r.items() if k != "n"}, **plateau.fields(judged)})
    bar.validation(*plateau.summary(validation_summary(state.last_eval, state.step), judged))
    if judged and judged["fired"]:
        _plateau_alarm(judged, cfg, run.ctx.rank, lambda: checkpoint(run, state))


def checkpoint(run: Run, state: State) -> Path:
    """An atomic checkpoint of this step: model, optimizer, scheduler, sampler, RNG streams and counters."""
    ctx = run.ctx
    counters = {"tokens": state.tokens, "world_size": ctx.world_size,
                "log_window": {"sum": [float(x) for x in state.win_sum.tolist()], "steps": state.win_n}}
    return ckpt.save_checkpoint(ctx.ckpt_root, state.step, model=run.core, optimizer=run.opt, scheduler=run.sched,
                                sampler_state=run.sampler.state_dict(), generators=run.gens, counters=counters,
                                arch=run.arch, config_fp=run.fp, keep=ctx.cfg.keep_checkpoints, rank=ctx.rank,
                                world_size=ctx.world_size)


def stop_if_signalled(run: Run, state: State) -> None:
    """SIGTERM / SIGINT (``signals``, the same answer on every rank): checkpoint at this boundary, then stop."""
    from mlm_core.train.signals import interrupted, should_stop
    ctx = run.ctx
    if state.step < ctx.end and should_stop(ctx.world_size, run.device):
        saved = state.last_ckpt if state.step % ctx.cfg.checkpoint_every == 0 else checkpoint(run, state)
        raise interrupted(state.step, saved)


def finish(run: Run, state: State) -> dict:
    """The result dict; a resumed run that was already finished trained nothing now: its last logged loss,
    a fresh validation and plateau judgement of the restored model."""
    ctx = run.ctx
    if state.last_ckpt is None and state.found:
        state.last_ckpt = state.found[0]
        state.final_loss = metrics_file.last_train_loss(ctx.metrics_path) if ctx.rank == 0 else None
        if state.step >= ctx.cfg.steps:
            state.last_eval = run.evaluator(run.core, run.device, ctx.cfg.precision)
            state.plateau_rec = plateau.check(state.last_eval, state.step, ctx.cfg)
            if state.plateau_rec and state.plateau_rec["fired"]:
                _plateau_alarm(state.plateau_rec, ctx.cfg, ctx.rank, lambda: state.last_ckpt)
    last_eval, last_ckpt = state.last_eval, state.last_ckpt
    return {"step": state.step, "tokens": state.tokens, "final_loss": state.final_loss, "eval": last_eval,
            "baseline": {lg: r["baseline_acc"] for lg, r in last_eval.items()}, "unigram_top": run.evaluator.top,
            "checkpoint": str(last_ckpt) if last_ckpt else None, "completed": state.step >= ctx.cfg.steps,
            "resumed_from": state.resumed, "arch": run.arch, "config_fingerprint": run.fp,
            "plateau": state.plateau_rec}


__all__ = ["train", "step", "build_model", "Evaluator", "resolve_device", "train_fingerprint",
           "PEAK_FLOPS", "TrainContext", "Run", "State", "autocast"]
