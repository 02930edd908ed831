"""Byte-reproducible safetensors files, and pickle-free storage of nested tensor states.

safetensors serializes the ``__metadata__`` mapping from a Rust ``HashMap``, whose iteration order is seeded
per process: the same tensors and metadata give a different header (and sha256) in another process as soon
as the metadata has two keys. The tensors' order and offsets are deterministic (sorted by dtype alignment,
then name). So every writer here lets safetensors lay out the file, then rewrites the JSON header with the
metadata keys sorted: same tensors + same metadata => same bytes, in any process. The rewrite is in place
(the header keeps its length: only the order of its keys changes).

``save_tree`` / ``load_tree`` store a nested state (an optimizer's ``state_dict``, RNG states) as a
safetensors file holding its tensors plus a JSON skeleton holding everything else: no pickle on either side
(``torch.load(weights_only=True)`` is still the pickle format, only with a restricted unpickler). Tuples and
non-string dict keys (the optimizer's integer parameter ids) are tagged so that they come back as they were.
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

_TENSOR, _TUPLE, _DICT, _FLOAT = "__tensor__", "__tuple__", "__dict__", "__float__"
_TAGS = (_TENSOR, _TUPLE, _DICT, _FLOAT)


class TensorFileError(ValueError):
    """A tensor file or skeleton that cannot be written or read."""


# ------------------------------------------------------------------------------------------- safetensors bytes
def _header_bytes(header: dict) -> bytes:
    # serde_json's compact form, as safetensors writes it (UTF-8, no spaces)
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def canonicalize(path: Path) -> None:
    """Rewrite a safetensors file's header with its ``__metadata__`` keys sorted (in place when, as always in
    practice, the header keeps its padded length; else by rewriting the file through a temporary sibling)."""
    path = Path(path)
    with open(path, "r+b") as f:
        head = f.read(8)
        if len(head) != 8:
            raise TensorFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        raw = f.read(n)
        try:
            header = json.loads(raw.decode("utf-8"))
        except ValueError as e:
            raise TensorFileError(f"{path}: unreadable safetensors header: {e}") from None
        meta = header.pop("__metadata__", None)
        canon = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
        body = _header_bytes(canon)
        padded = body + b" " * (-len(body) % 8)
        if len(padded) == n:
            f.seek(8)
            f.write(padded)
            return
    tmp = path.with_name(f".{path.name}.canon.tmp")     # a different length: copy the data after a new header
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        src.seek(8 + n)
        dst.write(struct.pack("<Q", len(padded)) + padded)
        while chunk := src.read(16 * 2**20):
            dst.write(chunk)
    os.replace(tmp, path)


def save_tensors(tensors: dict, path: Path, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` (contiguous copies where needed) with a deterministic header."""
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    canonicalize(path)


def save_module(module, path: Path, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_model`` (shared tensors stored once, ``load_model`` reads it) with a
    deterministic header: save_model records every dropped alias as a metadata key, so tied weights alone
    already make the header order vary."""
    from safetensors.torch import save_model
    save_model(module, str(path), metadata=dict(metadata) if metadata else None)
    canonicalize(path)


# ------------------------------------------------------------------------------------------- nested states
def _encode(obj: Any, tensors: dict, seen: set) -> Any:
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in seen:          # safetensors refuses shared storage: store a copy
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        key = f"t{len(tensors):06d}"
        tensors[key] = t
        return {_TENSOR: key}
    if isinstance(obj, np.generic):
        obj = obj.item()
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        # JSON has no NaN/inf; repr round-trips every other float exactly
        return obj if math.isfinite(obj) else {_FLOAT: repr(obj)}
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v, tensors, seen) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors, seen) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: _encode(v, tensors, seen) for k, v in obj.items()}
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise TypeError(f"cannot store a dict key of type {type(k).__name__} (str and int only)")
        return {_DICT: [[k, _encode(v, tensors, seen)] for k, v in obj.items()]}
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint (tensors and plain values only)")


def _decode(obj: Any, tensors: dict, where: str) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors, where) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if len(obj) == 1:
        (tag, val), = obj.items()
        if tag == _TENSOR:
            if val not in tensors:
                raise TensorFileError(f"{where}: tensor {val!r} is missing from the tensor file")
            return tensors[val]
        if tag == _TUPLE:
            return tuple(_decode(v, tensors, where) for v in val)
        if tag == _DICT:
            return {k: _decode(v, tensors, where) for k, v in val}
        if tag == _FLOAT:
            return float(val)
    return {k: _decode(v, tensors, where) for k, v in obj.items()}


def save_tree(obj: Any, tensor_path: Path, json_path: Path) -> None:
    """Store a nested state: its tensors in ``tensor_path`` (safetensors), the rest in ``json_path``."""
    tensors: dict = {}
    skeleton = _encode(obj, tensors, set())
    save_tensors(tensors, tensor_path)
    # insertion order kept (not sorted): the structure comes back exactly as it was, and it is deterministic
    Path(json_path).write_text(json.dumps(skeleton, indent=1, allow_nan=False), encoding="utf-8")


def load_tree(tensor_path: Path, json_path: Path) -> Any:
    """The state written by ``save_tree``, tensors on the CPU."""
    from safetensors.torch import load_file
    try:
        skeleton = json.loads(Path(json_path).read_text(encoding="utf-8"))
    except ValueError as e:
        raise TensorFileError(f"{json_path}: unreadable JSON: {e}") from None
    return _decode(skeleton, dict(load_file(str(tensor_path))), str(json_path))


__all__ = ["canonicalize", "save_tensors", "save_module", "save_tree", "load_tree", "TensorFileError"]
