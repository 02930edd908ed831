"""The pretrain stage: shard set + tokenizer -> a trained masked language model.

In: ``upstream["shards"]`` (a shards Artifact) and ``upstream["tokenizer"]`` (its tokenizer.json and special
tokens), ``lc.config.pretrain`` and ``lc.config.seed``. Out (in ``out_dir``):

  model.safetensors   the encoder (the discriminator for ELECTRA); its Arch is in the safetensors metadata
  model_config.json   the Arch as JSON (+ objective)
  generator.safetensors  ELECTRA only: the generator (shares the word embeddings)
  tokenizer.json      copied from the tokenizer stage
  metrics.jsonl       one record per log step / eval pass (see ``loop``)
  eval.json           per-language validation loss and masked accuracy, and the unigram baseline accuracy
  hf/                 a transformers ``BertForMaskedLM`` folder when the architecture exports (else a note)

Resume across killed runs: the store gives each attempt a fresh temporary folder
(``<workdir>/pretrain/.tmp-<fingerprint>-<pid>-<nonce>``), so checkpoints live in a stable folder keyed by
the stage fingerprint: ``<workdir>/pretrain-checkpoints/<fingerprint>/`` (``checkpoints/`` + metrics.jsonl).
Rerunning the same config resumes from its newest complete checkpoint. Pass ``checkpoint_dir`` to override.
Training runs in-process for one process, else under torchrun (``distributed``).
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable

from mlm_core.errors import StageError

log = logging.getLogger(__name__)


def default_checkpoint_dir(lc, out_dir: Path) -> Path:
    """``<workdir>/pretrain-checkpoints/<fingerprint>``; the fingerprint is parsed from the store's temp folder name."""
    name = Path(out_dir).name
    fp = name.split("-")[1] if name.startswith(".tmp-") and name.count("-") >= 2 else name
    return Path(lc.workdir) / "pretrain-checkpoints" / fp


def _check_inputs(cfg, shards, tok) -> None:
    got = shards.manifest.get("tokenizer_fingerprint")
    if got != tok.fingerprint:
        raise StageError(f"pretrain: the shard set {shards.path} was encoded with tokenizer {got}, but the tokenizer "
                         f"upstream is {tok.fingerprint}: rebuild the shards with this tokenizer")
    seq_len = int(shards.manifest["seq_len"])
    if seq_len > cfg.model.max_positions:
        raise StageError(f"pretrain: shards.seq_len ({seq_len}) exceeds pretrain.model.max_positions "
                         f"({cfg.model.max_positions})")
    if not (Path(tok.path) / "tokenizer.json").is_file():
        raise StageError(f"pretrain: {tok.path} has no tokenizer.json")


def run_pretrain(lc, upstream: dict, out_dir: Path, *, checkpoint_dir: Path | None = None,
                 metrics_cb: Callable[[dict], None] | None = None) -> dict:
    """Train (resuming when a checkpoint exists) and write the model folder; returns the manifest fields."""
    import torch
    from safetensors.torch import load_file

    from mlm_core.model import ExportError, export_hf, save_weights
    from mlm_core.shards import ShardDataset
    from mlm_core.store import write_json_atomic
    from mlm_core.train.distributed import launch
    from mlm_core.train.loop import ElectraModel, build_model, train

    cfg, seed = lc.config.pretrain, lc.config.seed
    shards, tok = upstream["shards"], upstream["tokenizer"]
    _check_inputs(cfg, shards, tok)
    out_dir = Path(out_dir)
    work = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir(lc, out_dir)
    work.mkdir(parents=True, exist_ok=True)
    specials = shards.manifest["special_tokens"]
    vocab, pad = int(shards.manifest["vocab_size"]), int(specials["pad"]["id"])
    verify = lc.config.verify
    log.info("pretrain: %s, %d steps, checkpoints in %s", cfg.objective, cfg.steps, work)

    world = cfg.distributed.nproc_per_node * cfg.distributed.nnodes
    if world == 1:
        ds = ShardDataset(shards, verify=verify, expect_tokenizer_fingerprint=tok.fingerprint)
        torch.manual_seed(seed)
        model, arch = build_model(cfg, vocab, pad)
        result = train(cfg, ds, model, work, seed=seed, metrics_cb=metrics_cb)
        model = model.cpu()
    else:
        args = {"config": cfg.model_dump(mode="json"), "seed": seed, "shards": str(shards.path),
                "tokenizer_fingerprint": tok.fingerprint, "verify": verify, "out_dir": str(work),
                "resume": True, "print_metrics": True}
        result = launch(args, cfg.distributed, work / "launch", metrics_cb=metrics_cb)
        torch.manual_seed(seed)
        model, arch = build_model(cfg, vocab, pad)
        meta = json.loads((Path(result["checkpoint"]) / "meta.json").read_text(encoding="utf-8"))
        sd = dict(load_file(str(Path(result["checkpoint"]) / "model.safetensors")))
        sd |= {alias: sd[target] for alias, target in meta.get("aliases", {}).items()}
        model.load_state_dict(sd, strict=True)

    electra = isinstance(model, ElectraModel)
    encoder = model.disc if electra else model
    save_weights(encoder, out_dir / "model.safetensors")
    if electra:
        from safetensors.torch import save_model
        save_model(model.gen, str(out_dir / "generator.safetensors"))
    write_json_atomic(out_dir / "model_config.json", {**encoder.arch.to_dict(), "objective": cfg.objective})
    shutil.copyfile(Path(tok.path) / "tokenizer.json", out_dir / "tokenizer.json")
    if (work / "metrics.jsonl").exists():
        shutil.copyfile(work / "metrics.jsonl", out_dir / "metrics.jsonl")
    evals, baseline = result["eval"], result["baseline"]
    write_json_atomic(out_dir / "eval.json", {"step": result["step"], "eval": evals, "baseline": baseline,
                                              "unigram_top": result.get("unigram_top", {})})
    export, note = None, None
    if electra:
        note = ("ELECTRA: model.safetensors holds the discriminator, whose MLM head is untrained; a "
                "BertForMaskedLM export would predict nonsense, so none was written")
    else:
        try:
            export_hf(encoder, out_dir / "hf", Path(tok.path) / "tokenizer.json", specials)
            export = "hf"
        except ExportError as e:
            note = str(e)
            log.warning("pretrain: no Hugging Face export: %s", e)
    beats = {lg: r["acc"] > r["baseline_acc"] for lg, r in evals.items()}
    if not all(beats.values()):
        log.warning("pretrain: validation masked accuracy does not beat the unigram baseline for %s",
                    sorted(lg for lg, ok in beats.items() if not ok))
    params = encoder.num_params(non_embedding=False)
    metrics = {"final_loss": result["final_loss"]}
    for lg, r in evals.items():
        metrics |= {f"{lg}.val_loss": r["loss"], f"{lg}.val_acc": r["acc"], f"{lg}.baseline_acc": r["baseline_acc"]}
    return {"arch": encoder.arch.to_dict(), "objective": cfg.objective, "steps": result["step"],
            "tokens": result["tokens"], "final_loss": result["final_loss"], "eval": evals, "baseline": baseline,
            "beats_baseline": beats, "export": export, "export_note": note,
            "counts": {"steps": result["step"], "tokens": result["tokens"], "params": params},
            "metrics": metrics, "checkpoint_dir": str(work), "resumed_from": result.get("resumed_from")}


__all__ = ["run_pretrain", "default_checkpoint_dir"]
