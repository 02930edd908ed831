"""The pretrain stage: shard set + tokenizer -> a trained masked language model.

In: ``upstream["shards"]`` (a ShardSet) and ``upstream["tokenizer"]`` (a TokenizerArtifact: its tokenizer.json and
special tokens), ``lc.config.pretrain`` and ``lc.config.train_seed`` (pretrain.seed, else the global seed).
Out (in ``out_dir``):

  model.safetensors   the masked language model (for ELECTRA: the generator, the model that fills masks;
                      evaluate, PLL, fill-mask and the audit score it); its Arch is in the safetensors metadata
  model_config.json   the Arch as JSON (+ objective; ELECTRA: "mlm_model": "generator" + the discriminator's Arch)
  discriminator.safetensors  ELECTRA only: the discriminator (encoder + replaced-token head), the encoder to
                      fine-tune; scored by evaluate's replaced-token detection metrics
  tokenizer.json      copied from the tokenizer stage
  metrics.jsonl       one record per log step / eval pass (see ``loop``)
  eval.json           per-language validation loss and masked accuracy (all 80/10/10 targets, and [MASK]-only
                      with its interval over the baseline), the unigram baseline accuracy, and the plateau
                      detector's last judgement ("plateau": ``train.plateau``; null before its share / when off)
  hf/                 a transformers folder of the model's family when the architecture exports (else a note):
                      ``BertForMaskedLM`` for this pipeline's own models; with ``pretrain.init_from`` the
                      checkpoint's family (RoBERTa in, ``RobertaForMaskedLM`` out; ...). ELECTRA:
                      ``ElectraForMaskedLM`` (generator) + hf-discriminator/ ``ElectraForPreTraining``

Continued pretraining (``pretrain.init_from``): the model starts from the checkpoint, with its shape, special
tokens and max positions, the vocabulary grown by the tokenizer stage's extension; which objective continues
which checkpoint, and every check, are in ``init_from``.

Resume across killed runs and config changes: the store gives each attempt a fresh temporary folder, so
checkpoints live in a stable folder keyed by the training *trajectory*, not by the stage fingerprint:
``<workdir>/pretrain-checkpoints/<trajectory key>/`` (``checkpoints/`` + metrics.jsonl). The key hashes the
pretrain fields declared ``output`` (``loop.train_fingerprint``: what the weights depend on), the seed, the
upstream shards/tokenizer output keys, pretrain's code_version and init_from's content hash (not its path).
Changing a knob that does not change the weights (checkpoint_every, eval_every, log_every, device, ...)
therefore resumes from the newest complete checkpoint instead of restarting at step 0. Pass ``checkpoint_dir``
to override. Training runs in-process for one process, else under torchrun (``distributed``).
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from mlm_core.errors import StageError

log = logging.getLogger(__name__)


# the stage's code version (``mlm_core.stages`` reads it): in its fingerprint and its trajectory key
CODE_VERSION = "2"


def pretrain_inputs(lc) -> dict | None:
    """The stage's ``inputs`` (``mlm_core.stages``), in its fingerprint and its trajectory key: the initial
    checkpoint's content hash (pretrain.init_from); None: a fresh model. An ELECTRA export given by its generator folder ``<run>/hf`` also reads the sibling ``<run>/hf-discriminator``: hashed too.
    pretrain.bias_regularizer: its word-pair lists' content hashes (``bias_regularizer_lists``)."""
    from mlm_core.external import discriminator_sibling, folder_hash, resolve_ref
    bias = None
    if lc.config.pretrain.bias_regularizer is not None:
        from mlm_core.bias.regularizer import lists_input
        bias = {"bias_regularizer_lists": lists_input(lc.config.pretrain.bias_regularizer, lc.base_dir)}
    ref, field = lc.config.pretrain.init_from, "pretrain.init_from"
    if ref is None:
        return bias
    folder = resolve_ref(ref, lc, field)
    got = {"content_hash": folder_hash(folder, lc, field)}
    if (sibling := discriminator_sibling(folder)) is not None:
        got["discriminator_content_hash"] = folder_hash(sibling, lc, field)
    return {"init_from": got} | (bias or {})


def trajectory_key(lc, upstream: dict) -> str:
    """The training-trajectory key: equal for two configs exactly when their training runs are the same."""
    from mlm_core.train.checkpoint import config_fingerprint
    from mlm_core.train.loop import train_fingerprint

    # upstream output keys (hash of their "output" fields), so a report-only change upstream (e.g.
    # shards.token_budget) keeps the trajectory; outputs written before output keys fall back to the fingerprint
    ups = {u: upstream[u].manifest.get("output_key") or upstream[u].fingerprint for u in ("shards", "tokenizer")}
    cfg = lc.config.pretrain
    inputs = pretrain_inputs(lc) or {}
    init = inputs.get("init_from")
    if init is not None:     # the checkpoint's content hash, not its path: moved files keep the trajectory
        cfg = cfg.model_copy(update={"init_from": None})
    key = {"train": train_fingerprint(cfg, lc.config.train_seed), "upstream": ups, "code_version": CODE_VERSION}
    lists = inputs.get("bias_regularizer_lists")    # their content, not their path
    return config_fingerprint(key | ({"init_from": init} if init is not None else {})
                              | ({"bias_regularizer_lists": lists} if lists else {}))


def default_checkpoint_dir(lc, upstream: dict) -> Path:
    """``<workdir>/pretrain-checkpoints/<trajectory key>``."""
    return Path(lc.workdir) / "pretrain-checkpoints" / trajectory_key(lc, upstream)


def _check_inputs(cfg, shards, tok) -> None:
    got = shards.tokenizer_fingerprint
    if got != tok.fingerprint:
        raise StageError(f"pretrain: the shard set {shards.path} was encoded with tokenizer {got}, but the tokenizer "
                         f"upstream is {tok.fingerprint}: rebuild the shards with this tokenizer")
    seq_len = int(shards.seq_len)
    if seq_len > cfg.model.max_positions and cfg.init_from is None:    # init_from: the checkpoint's (init_from.py)
        raise StageError(f"pretrain: shards.seq_len ({seq_len}) exceeds pretrain.model.max_positions "
                         f"({cfg.model.max_positions})")
    if not (Path(tok.path) / "tokenizer.json").is_file():
        raise StageError(f"pretrain: {tok.path} has no tokenizer.json")


def beats_baseline(r: dict) -> bool:
    """A validation record beats the unigram baseline: the lower end of the 95% interval of [MASK]-only top-1 minus
    the baseline's is above 0. The 80/10/10 accuracy is not the test: 10% of its targets are visible and copied.
    (An output written before [MASK]-only scoring: its all-target accuracy, as then.)"""
    if r.get("mask_over_baseline_ci_low") is not None:
        return r["mask_over_baseline_ci_low"] > 0
    return r["acc"] > r["baseline_acc"]


def run_pretrain(lc, upstream: dict, out_dir: Path, *, checkpoint_dir: Path | None = None,
                 metrics_cb: Callable[[dict], None] | None = None) -> dict:
    """Train (resuming when a checkpoint exists) and write the model folder; returns the manifest fields."""
    from mlm_core.locks import file_lock
    work = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(lc, upstream)
    # Two runs whose stage fingerprints differ only in report/none fields (the stage lock does not order
    # them) share this trajectory's checkpoints: one trains, the other waits, then resumes from its end.
    with file_lock(work.parent / f".{work.name}.lock", f"pretrain trajectory {work.name}"):
        return _train_and_export(lc, upstream, out_dir, work, metrics_cb)


def _train_and_export(lc, upstream: dict, out_dir: Path, work: Path,
                      metrics_cb: Callable[[dict], None] | None) -> dict:
    import torch
    from safetensors.torch import load_file

    from mlm_core.model import ExportError
    from mlm_core.shards import ShardDataset
    from mlm_core.store import write_json_atomic
    from mlm_core.train.distributed import launch
    from mlm_core.train.loop import build_model, train
    from mlm_core.train.objectives import objective_for

    cfg, seed = lc.config.pretrain, lc.config.train_seed      # pretrain.seed, else the global seed
    shards, tok = upstream["shards"], upstream["tokenizer"]
    _check_inputs(cfg, shards, tok)
    init = None
    if cfg.init_from is not None:
        from mlm_core.train.init_from import prepare
        init = prepare(lc, shards, tok)         # resolved, read and checked before any training
    out_dir = Path(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    specials = shards.special_tokens
    vocab, pad = int(shards.vocab_size), int(specials["pad"]["id"])
    verify = lc.config.verify
    log.info("pretrain: %s, %d steps, checkpoints in %s", cfg.objective, cfg.steps, work)
    bias = None
    if cfg.bias_regularizer is not None:    # the group words' token sequences under this run's tokenizer
        from mlm_core.bias.regularizer import load_group_table
        bias = load_group_table(cfg.bias_regularizer, lc.base_dir, Path(tok.path) / "tokenizer.json",
                                [int(e["id"]) for e in specials.values()])

    world = cfg.distributed.nproc_per_node * cfg.distributed.nnodes
    if world == 1:
        ds = ShardDataset(shards, verify=verify, expect_tokenizer_fingerprint=tok.fingerprint,
                          tokenizer_dir=tok.path)
        from mlm_core.train.loop import resolve_device
        if resolve_device(cfg).type == "cpu":
            from mlm_core.train import threads
            threads.apply(cfg.threads)   # spinning threads on shared cores: the measured 6x slowdown
        torch.manual_seed(seed)
        model, arch = build_model(cfg, vocab, pad, init=init)
        from mlm_core.train.signals import graceful
        with graceful():    # SIGTERM/SIGINT: checkpoint at the next step boundary, then Interrupted
            result = train(cfg, ds, model, work, seed=seed, metrics_cb=metrics_cb, bias=bias)
        model = model.cpu()
    else:
        args = {"config": cfg.model_dump(mode="json"), "seed": seed, "shards": str(shards.path),
                "tokenizer_fingerprint": tok.fingerprint, "tokenizer_dir": str(tok.path), "verify": verify,
                "out_dir": str(work),
                "resume": True, "print_metrics": True, "init": init.to_json() if init else None,
                "bias": bias.to_json() if bias else None}
        result = launch(args, cfg.distributed, work / "launch", metrics_cb=metrics_cb)
        torch.manual_seed(seed)
        model, arch = build_model(cfg, vocab, pad, init=init)
        meta = json.loads((Path(result["checkpoint"]) / "meta.json").read_text(encoding="utf-8"))
        sd = dict(load_file(str(Path(result["checkpoint"]) / "model.safetensors")))
        sd |= {alias: sd[target] for alias, target in meta.get("aliases", {}).items()}
        model.load_state_dict(sd, strict=True)

    objective = objective_for(cfg)
    encoder, extra = objective.save(model, out_dir)   # the MLM's weights (+ ELECTRA: the discriminator's)
    write_json_atomic(out_dir / "model_config.json", {**encoder.arch.to_dict(), "objective": cfg.objective, **extra})
    shutil.copyfile(Path(tok.path) / "tokenizer.json", out_dir / "tokenizer.json")
    if (work / "metrics.jsonl").exists():
        shutil.copyfile(work / "metrics.jsonl", out_dir / "metrics.jsonl")
    evals, baseline = result["eval"], result["baseline"]
    write_json_atomic(out_dir / "eval.json", {"step": result["step"], "eval": evals, "baseline": baseline,
                                              "unigram_top": result.get("unigram_top", {}),
                                              "plateau": result.get("plateau")})
    export, note = None, None
    try:
        export, exported = objective.export(model, out_dir, Path(tok.path) / "tokenizer.json", specials)
        extra |= exported
    except ExportError as e:
        note = str(e)
        log.warning("pretrain: no Hugging Face export: %s", e)
    beats = {lg: beats_baseline(r) for lg, r in evals.items()}
    if not all(beats.values()):
        log.warning("pretrain: held-out [MASK] top-1 does not beat the unigram baseline beyond the noise of the "
                    "validation rows for %s", sorted(lg for lg, ok in beats.items() if not ok))
    params = sum(p.numel() for p in model.parameters())     # shared tensors once (ELECTRA: both networks)
    if bias is not None:
        extra["bias_regularizer"] = {"groups": list(bias.groups), "table": bias.digest(),
                                     "sequences": {lg: len(es) for lg, es in bias.entries.items()}}
    metrics = {"final_loss": result["final_loss"]}
    for lg, r in evals.items():
        metrics |= {f"{lg}.val_loss": r["loss"], f"{lg}.val_acc": r["acc"], f"{lg}.baseline_acc": r["baseline_acc"]}
        metrics |= {f"{lg}.val_{k}": r[k] for k in ("disc_acc", "disc_auc", "disc_baseline_acc") if k in r}
        metrics |= {f"{lg}.val_{k}": r[k] for k in ("mask_acc", "mask_baseline_acc", "mask_n", "distinct_predictions",
                                                     "mask_over_baseline_ci_low", "mask_over_baseline_ci_high") if k in r}
    if init is not None:        # where training started (the content hash is in the fingerprint's inputs)
        from mlm_core.external import cache_dir, content_hash
        extra["init_from"] = {"ref": cfg.init_from, "content_hash": content_hash(init.folder, cache_dir(lc)),
                              "family": objective.hidden_model(model).arch.family,
                              "vocab_size": init.vocab_size, "extended": bool(init.extension)}
    return {"arch": encoder.arch.to_dict(), "objective": cfg.objective, "steps": result["step"],
            "tokens": result["tokens"], "final_loss": result["final_loss"], "eval": evals, "baseline": baseline,
            "beats_baseline": beats, "export": export, "export_note": note,
            "counts": {"steps": result["step"], "tokens": result["tokens"], "params": params},
            "metrics": metrics, "checkpoint_dir": str(work), "resumed_from": result.get("resumed_from"),
            "plateau": result.get("plateau"), **extra}


__all__ = ["run_pretrain", "default_checkpoint_dir", "trajectory_key"]
