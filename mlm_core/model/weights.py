"""Our own weights: a model's tensors as one safetensors file, its ``Arch`` in the file's metadata.

In: an ``MLMEncoder`` (or a ``Discriminator``) and a path. Out: the file (``save_weights``), the weights loaded
strictly into a model of the right shape (``load_weights``), the stored ``Arch`` (``read_arch``). Never pickle.
``ExportError``: a model or folder that cannot be written or read back faithfully (here, and by the Hugging Face
export and import: ``export``, ``pretrained``).
"""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_model

from mlm_core.errors import MlmError
from mlm_core.model.encoder import MLMEncoder
from mlm_core.model.sizes import Arch
from mlm_core.tensorfile import save_module


class ExportError(MlmError, ValueError):
    """A model or folder that cannot be exported / loaded back faithfully."""


def save_weights(model: MLMEncoder, path: Path) -> None:
    """Write the weights as safetensors (a tied tensor stored once); the Arch goes into the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # through mlm_core.tensorfile: safetensors orders a multi-key metadata header differently in every process
    save_module(model, path, metadata={"format": "pt", "arch": json.dumps(model.arch.to_dict(), sort_keys=True)})


def load_weights(model: MLMEncoder, path: Path) -> None:
    """Load safetensors weights into ``model`` (strict: every tensor present, none left over)."""
    try:
        load_model(model, str(path), strict=True)
    except RuntimeError as e:
        raise ExportError(f"{path}: weights do not match the model: {e}") from e


def read_arch(path: Path) -> Arch:
    """The Arch stored in the metadata of a file written by ``save_weights``."""
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
    if "arch" not in meta:
        raise ExportError(f"{path}: no architecture in the safetensors metadata (not written by save_weights)")
    return Arch.from_dict(json.loads(meta["arch"]))


__all__ = ["ExportError", "save_weights", "load_weights", "read_arch"]
