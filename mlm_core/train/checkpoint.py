"""Atomic, verifiable training checkpoints with exact resume.

Layout: ``<root>/step-000000000100/`` (``step_dir_name``) holding
  model.safetensors        the model's tensors (shared/tied tensors stored once; aliases in meta.json)
  optimizer.safetensors    optimizer state tensors (moments, step counts) ...
  optimizer.json           ... and the rest of its state_dict (param groups, ids) referring to them by name
  scheduler.json           LR scheduler counters
  state.json               step / token / sample counters
  sampler-rank<r>.json     each rank's language-sampler state
  rng-rank<r>.safetensors  torch CPU (+ CUDA) RNG states and the loop's generators (byte tensors) ...
  rng-rank<r>.json         ... plus numpy and Python ``random`` states as plain lists
  meta.json                written LAST: arch, config fingerprint, counters, sha256 of every file above

Atomicity: everything is written into ``<root>/.tmp-step-000000000100-<pid>``, files and folder fsync'd,
then the folder is renamed into place. A checkpoint is complete iff ``meta.json`` exists and every
checksum it lists matches, so a run killed at any moment leaves either a complete checkpoint or a
temporary folder that is never read (and is removed once its writer is gone). Resume takes the newest
complete checkpoint, skipping (with a warning) any whose files do not match their checksums.

No pickle anywhere, written or read: tensors go to safetensors (byte-reproducible headers, see
``mlm_core.tensorfile``), everything else to JSON (``torch.load``, even with ``weights_only=True``, is
the pickle format). Checkpoints of format 1 (``optimizer.pt`` / ``rng-rank<r>.pt`` pickles, written before
this) are refused with a ``CheckpointFormatError`` naming the folder rather than unpickled: delete the
folder (training restarts) or finish that run with the version that wrote it.
Test hook: ``MLM_CHECKPOINT_DELAY_S`` sleeps before ``meta.json`` is written.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from mlm_core.errors import MlmError
from mlm_core.store import sha256_file
from mlm_core.store import fsync_dir
from mlm_core.store import pid_alive
from mlm_core.tensorfile import load_tree, save_tensors, save_tree

log = logging.getLogger(__name__)
FORMAT = 2          # 2: pickle-free (safetensors + JSON); 1 held torch.save pickles and is refused
META = "meta.json"


class CheckpointError(MlmError):
    """A checkpoint that cannot be written or read."""


class CheckpointFormatError(CheckpointError):
    """A checkpoint written in a format this version does not read (never skipped silently)."""


class CheckpointMismatch(CheckpointError, ValueError):
    """A checkpoint written for a different model architecture than the one being trained."""


def step_dir_name(step: int) -> str:
    """``step-000000000100``: 12 digits, so names sort like their steps up to 10^12 (7 digits broke at 10M)."""
    return f"step-{step:012d}"


def step_of(path: Path) -> int | None:
    """The step a ``step-<digits>`` folder holds (any zero padding: older runs wrote 7 digits), else None."""
    digits = Path(path).name[len("step-"):]
    return int(digits) if Path(path).name.startswith("step-") and digits.isdigit() else None


def step_dirs(root: Path) -> list[Path]:
    """Checkpoint folders under ``root``, oldest first, ordered by step number (never by name)."""
    found = [(step_of(p), p.name, p) for p in Path(root).glob("step-*") if p.is_dir() and step_of(p) is not None]
    return [p for _, _, p in sorted(found)]


def config_fingerprint(cfg_dict: dict) -> str:
    return hashlib.sha256(json.dumps(cfg_dict, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------- plain values
def plain(obj: Any) -> Any:
    """Tensors and JSON-like values only (what ``save_tree`` stores without pickle), or TypeError."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k if isinstance(k, (int, str)) else str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint (tensors and plain values only)")


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, sort_keys=True, indent=1), encoding="utf-8")


# ------------------------------------------------------------------------------------------- RNG states
def rng_state(generators: dict[str, torch.Generator] | None = None) -> dict:
    """Every RNG state as byte tensors (torch) and plain lists (numpy, Python). ``generators``: the loop's own."""
    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    for name, g in (generators or {}).items():
        state[f"gen_{name}"] = g.get_state()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, pstate, gauss = random.getstate()
    state["numpy"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    state["python"] = [version, list(pstate), gauss]
    return state


def set_rng_state(state: dict, generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])
    for name, g in (generators or {}).items():
        if f"gen_{name}" not in state:
            raise CheckpointError(f"checkpoint has no state for the {name!r} random generator")
        g.set_state(state[f"gen_{name}"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, pstate, gauss = state["python"]
    random.setstate((version, tuple(pstate), gauss))


# ------------------------------------------------------------------------------------------- model/optim
def tied_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Parameter names that are the same Parameter as an earlier name (tied embeddings): alias -> first name."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def _dedupe(sd: dict[str, torch.Tensor], tied: dict[str, str]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Store each shared tensor once (tied embeddings; also under FSDP, whose full state dict unties them);
    aliases maps dropped name -> kept name."""
    kept: dict[tuple, str] = {}
    out, aliases = {}, {a: k for a, k in tied.items() if a in sd and k in sd}
    for name, t in sd.items():
        if name in aliases:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.numel() and key in kept:
            aliases[name] = kept[key]
            continue
        kept[key] = name
        out[name] = t.detach().cpu().contiguous()
    return out, aliases


def _is_fsdp(model: torch.nn.Module) -> bool:
    return any(type(m).__name__.startswith("FSDP") for m in model.modules())


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict; collective under FSDP, so every rank must call it."""
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return model.state_dict()


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def load_model_state(model: torch.nn.Module, sd: dict[str, torch.Tensor]) -> None:
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True))
        return
    model.load_state_dict(sd, strict=True)


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, sd: dict) -> None:
    if _is_fsdp(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
        set_optimizer_state_dict(model, optimizer, sd, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(sd)


# ------------------------------------------------------------------------------------------- save
def _barrier(world_size: int) -> None:
    if world_size > 1:
        import torch.distributed as dist
        dist.barrier()


def _broadcast_name(name: str | None, world_size: int) -> str:
    if world_size == 1:
        return name  # type: ignore[return-value]
    import torch.distributed as dist
    box = [name]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_checkpoint(root: Path, step: int, *, model: torch.nn.Module, optimizer, scheduler, sampler_state: dict,
                    generators: dict[str, torch.Generator] | None, counters: dict, arch: dict, config_fp: str,
                    keep: int, rank: int = 0, world_size: int = 1) -> Path:
    """Write one checkpoint atomically (collective when world_size > 1); returns its final folder."""
    root = Path(root)
    msd = model_state(model)
    osd = optimizer_state(model, optimizer)
    tmp_name = None
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        tmp_name = f".tmp-{step_dir_name(step)}-{os.getpid()}"
        tmp = root / tmp_name
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    tmp = root / _broadcast_name(tmp_name, world_size)
    save_tree(plain(rng_state(generators)), tmp / f"rng-rank{rank}.safetensors", tmp / f"rng-rank{rank}.json")
    _write_json(tmp / f"sampler-rank{rank}.json", sampler_state)
    written = [f"rng-rank{rank}.safetensors", f"rng-rank{rank}.json", f"sampler-rank{rank}.json"]
    aliases: dict[str, str] = {}
    if rank == 0:
        weights, aliases = _dedupe(msd, tied_aliases(model))
        save_tensors(weights, tmp / "model.safetensors")
        save_tree(plain(osd), tmp / "optimizer.safetensors", tmp / "optimizer.json")
        _write_json(tmp / "scheduler.json", plain(scheduler.state_dict()))
        _write_json(tmp / "state.json", {"step": step, **counters})
        written += ["model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json", "state.json"]
    for name in written:
        _fsync_file(tmp / name)
    _barrier(world_size)
    final = root / step_dir_name(step)
    if rank == 0:
        delay = float(os.environ.get("MLM_CHECKPOINT_DELAY_S", "0") or 0)
        if delay:
            time.sleep(delay)                       # test hook: widen the window for kill -9 during a write
        files = {f.name: sha256_file(f) for f in sorted(tmp.iterdir()) if f.is_file()}
        meta = {"format": FORMAT, "step": step, **counters, "arch": arch, "config_fingerprint": config_fp,
                "world_size": world_size, "aliases": aliases, "files": files, "created_at": time.time()}
        _write_json(tmp / META, meta)
        _fsync_file(tmp / META)
        fsync_dir(tmp)
        if final.exists():                          # re-reached after resuming from an older checkpoint
            trash = root / f".old-{final.name}-{os.getpid()}"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.rename(tmp, final)
        fsync_dir(root)
        prune(root, keep)
        log.info("checkpoint %s written", final)
    _barrier(world_size)
    return final


def prune(root: Path, keep: int) -> None:
    done = step_dirs(root)
    for old in done[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)


def cleanup_temporaries(root: Path) -> list[Path]:
    """Remove ``.tmp-step-*`` folders whose writer is gone (left by a killed run); never read them."""
    removed = []
    for p in Path(root).glob(".tmp-step-*"):
        try:
            pid = int(p.name.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            pid = -1
        if pid > 0 and pid != os.getpid() and pid_alive(pid):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    for p in Path(root).glob(".old-step-*"):
        shutil.rmtree(p, ignore_errors=True)
    if removed:
        log.info("removed %d unfinished checkpoint folder(s) under %s", len(removed), root)
    return removed


# ------------------------------------------------------------------------------------------- find/verify
def verify(path: Path) -> dict:
    """The checkpoint's meta.json when it is complete and every checksum matches; else CheckpointError."""
    mf = path / META
    if not mf.is_file():
        raise CheckpointError(f"{path}: no {META} (incomplete checkpoint)")
    try:
        meta = json.loads(mf.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointError(f"{path}: unreadable {META}: {e}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointFormatError(
            f"{path} is a format-{meta.get('format')} checkpoint (optimizer/RNG states as torch pickles); this "
            f"version reads only pickle-free format-{FORMAT} checkpoints and never unpickles: delete {path} "
            f"(training restarts from the previous checkpoint or step 0) or finish the run with the older version")
    for name, digest in meta.get("files", {}).items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path}: {name} is missing")
        if sha256_file(f) != digest:
            raise CheckpointError(f"{path}: {name} does not match its sha256 (corrupt)")
    return meta


def find_latest(root: Path) -> tuple[Path, dict] | None:
    """Newest complete, verified checkpoint under ``root`` (corrupt ones skipped with a warning), or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    for p in reversed(step_dirs(root)):
        try:
            return p, verify(p)
        except CheckpointFormatError:
            raise                   # not damage: resuming from an older checkpoint would silently lose progress
        except CheckpointError as e:
            log.warning("skipping checkpoint: %s; trying the previous one", e)
    return None


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def check_arch(path: Path, meta: dict, arch: dict) -> None:
    """CheckpointMismatch naming every architecture field that differs."""
    def kind(a: dict) -> str:
        return "ELECTRA (generator + discriminator)" if any(isinstance(v, dict) for v in a.values()) else "MLM encoder"
    if kind(meta.get("arch", {})) != kind(arch):
        raise CheckpointMismatch(f"checkpoint {path} holds an {kind(meta.get('arch', {}))} model but the config trains "
                                 f"an {kind(arch)} (pretrain.objective changed); use a fresh checkpoint folder")
    theirs, mine = _flatten(meta.get("arch", {})), _flatten(arch)
    diff = sorted(k for k in set(theirs) | set(mine) if theirs.get(k, "<absent>") != mine.get(k, "<absent>"))
    if diff:
        detail = ", ".join(f"{k}: checkpoint {theirs.get(k, '<absent>')!r} vs config {mine.get(k, '<absent>')!r}"
                           for k in diff)
        raise CheckpointMismatch(f"checkpoint {path} was written for a different model architecture ({detail}); "
                                 f"use a fresh checkpoint folder or the matching model config")


# ------------------------------------------------------------------------------------------- load
def load_checkpoint(path: Path, meta: dict, *, model: torch.nn.Module, optimizer, scheduler,
                    generators: dict[str, torch.Generator] | None = None, rank: int = 0) -> dict:
    """Restore model, optimizer, scheduler and this rank's RNG states; returns {"sampler": ..., "state": ...}."""
    path = Path(path)
    sd: dict[str, torch.Tensor] = dict(load_file(str(path / "model.safetensors")))
    for alias, target in meta.get("aliases", {}).items():
        sd[alias] = sd[target]
    load_model_state(model, sd)
    load_optimizer_state(model, optimizer, load_tree(path / "optimizer.safetensors", path / "optimizer.json"))
    scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text()))
    r = rank if (path / f"rng-rank{rank}.safetensors").is_file() else None
    sampler = None
    if r is None:
        log.warning("%s has no RNG/sampler state for rank %d (world size changed): using rank 0's sampler "
                    "position; the caller derives this rank's RNG streams from (seed, rank, step)", path, rank)
        sampler = json.loads((path / "sampler-rank0.json").read_text())
    else:
        set_rng_state(load_tree(path / f"rng-rank{r}.safetensors", path / f"rng-rank{r}.json"), generators)
        sampler = json.loads((path / f"sampler-rank{r}.json").read_text())
    state = json.loads((path / "state.json").read_text())
    return {"sampler": sampler, "state": state, "rng_restored": r is not None}


__all__ = ["CheckpointError", "CheckpointFormatError", "CheckpointMismatch", "save_checkpoint", "find_latest", "load_checkpoint", "verify",
           "check_arch", "cleanup_temporaries", "prune", "config_fingerprint", "step_dir_name", "step_dirs",
           "step_of", "plain"]
