"""Loading the pipeline config: YAML file + ``--set a.b=value`` overrides -> ``PipelineConfig``.

Errors are turned into one readable message per problem, naming the full key path and, for an
unknown key, the closest valid key: ``tokenizer.vocab_sise: unknown key (did you mean vocab_size?)``.
"""
from __future__ import annotations

import difflib
import json
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from mlm_core.config import PipelineConfig
from mlm_core.errors import MlmError


class ConfigError(MlmError, ValueError):
    """A config that cannot be used; the message names the file and every bad key path."""


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus where it came from (paths in it are relative to ``base_dir``)."""

    config: PipelineConfig
    path: Path | None
    base_dir: Path
    overrides: tuple[str, ...] = ()

    def resolve(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else (self.base_dir / q)

    @property
    def workdir(self) -> Path:
        return Path(self.config.workdir).expanduser().resolve()


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one ``a.b.c=value`` override in place; the value is parsed as YAML (``3``, ``true``, ``[en, fr]``)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY.PATH=VALUE")
    key, _, value = assignment.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key path")
    node = raw
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {assignment!r}: {'.'.join(parts[:i + 1])} is not a mapping")
        node = nxt
    node[parts[-1]] = yaml.safe_load(value)


def _inner_model(ann: Any) -> Any:
    origin = typing.get_origin(ann)
    if origin is None:
        return ann
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    if origin in (dict, list) and models:
        return _Container(models[0])
    return models[0] if models else ann


class _Container(str):
    """Marker: the next path element is a dict key or list index; then continue in ``model``."""

    def __new__(cls, model: Any) -> "_Container":
        obj = super().__new__(cls, "container")
        obj.model = model
        return obj


def _walk_fields(loc: tuple, root: Any = PipelineConfig) -> list[str]:
    model: Any = root
    pending_container = False
    for part in loc:
        if pending_container:
            pending_container = False
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or not isinstance(part, str):
            return []
        field = model.model_fields.get(part) or next(
            (f for f in model.model_fields.values() if f.alias == part), None)
        if field is None:
            return []
        inner = _inner_model(field.annotation)
        if isinstance(inner, _Container):
            model, pending_container = inner.model, True
        else:
            model = inner
    return [f.alias or n for n, f in model.model_fields.items()] if isinstance(model, type) and issubclass(
        model, BaseModel) else []


_YAML_BOOL = "tag:yaml.org,2002:bool"


def yaml_bool_keys(text: str) -> dict[tuple, str]:
    """Mapping keys that YAML 1.1 reads as booleans (``no``, ``yes``, ``on``, ``off``...), as they were written:
    ``{(parent key path..., False): "no"}``. A language code ``no`` (Norwegian) is one of them."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    found: dict[tuple, str] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if not isinstance(k, yaml.ScalarNode):
                    continue
                key: Any = k.value
                if k.tag == _YAML_BOOL:
                    key = k.value.lower() in ("yes", "true", "on")
                    found[path + (key,)] = k.value
                walk(v, path + (key,))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                walk(v, path + (i,))

    walk(root, ())
    return found


def _bool_key_line(path: str, loc: tuple, got: bool, words: dict[tuple, str]) -> str:
    word = words.get(loc[:-1]) or ("no" if got is False else "yes")
    where = ".".join(str(p) for p in loc[:-2])
    return (f"{where}: YAML read the key `{word}` as {str(got).lower()} (a YAML 1.1 boolean): quote it, "
            f'`"{word}":` (e.g. the language code "no")')


def format_validation_error(err: ValidationError, source: str, root: Any = PipelineConfig,
                            what: str = "config", yaml_words: dict[tuple, str] | None = None) -> str:
    """One line per problem, naming the key path; ``root``: the model validated (the sweep file reuses this);
    ``yaml_words``: ``yaml_bool_keys`` of the source text (names the word a boolean key was written as)."""
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = ".".join(str(p) for p in loc) or "<root>"
        if loc and loc[-1] == "[key]" and isinstance(e.get("input"), bool):
            lines.append(_bool_key_line(path, loc, e["input"], yaml_words or {}))
        elif e["type"] == "extra_forbidden":
            valid = _walk_fields(loc[:-1], root)
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(valid)}"
            lines.append(f"{path}: unknown key ({hint})")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            got = e.get("input")
            shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            lines.append(f"{path}: {msg}{shown}")
    return f"{source}: invalid {what}\n  " + "\n  ".join(lines)


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
                raw: dict | None = None) -> LoadedConfig:
    """Read, override and validate a pipeline config. Raises ConfigError with every problem listed."""
    if raw is None:
        if path is None:
            raise ConfigError("no config file given")
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found")
        text = p.read_text(encoding="utf-8")
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: the top level must be a mapping, got {type(raw).__name__}")
        base = p.resolve().parent
        source = str(p)
    else:
        text = None
        raw = json.loads(json.dumps(raw))
        base = Path(path).resolve().parent if path else Path.cwd()
        source = str(path) if path else "<config>"
    for ov in overrides:
        apply_override(raw, ov)
    try:
        cfg = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, yaml_words=yaml_bool_keys(text) if text else None)
                          ) from None
    return LoadedConfig(cfg, Path(path) if path else None, base, tuple(overrides))


def model_json_schema(model, title: str) -> dict:
    """The draft 2020-12 JSON Schema of a pydantic model, titled (the config's and the sweep file's)."""
    schema = model.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = title
    return schema


def schema_json_text(schema: dict) -> str:
    """A schema as its stored file's text (sorted keys, 2-space indent, trailing newline)."""
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def config_json_schema() -> dict:
    """The JSON Schema of the pipeline config (what ``schemas/config.schema.json`` holds)."""
    return model_json_schema(PipelineConfig, "mlm-pipeline config")


def schema_text() -> str:
    return schema_json_text(config_json_schema())


def config_reference_markdown() -> str:
    """A Markdown reference of every config key (type, default, description), generated from the models."""
    from pydantic import BaseModel as _BM

    from mlm_core.config import field_effect

    lines = ["# Configuration reference", "",
             "Generated from `mlm_core/config.py` by `mlm config docs --write` (a test keeps it in sync).",
             "The JSON Schema is `schemas/config.schema.json` (each key's `effect` is in it too). Unknown keys "
             "are errors.", "",
             "The **effect** column says what changing a key does to stored outputs; stage fingerprints and the "
             "training checkpoints' key are derived from it:", "",
             "- `output`: changes the stage's output (for pretrain: the trained weights). The stage and every "
             "stage downstream of it are recomputed.",
             "- `report`: changes only what the stage reports (for pretrain: validation cadence and size). The "
             "stage and its downstream stages are recomputed, but training resumes from its checkpoints.",
             "- `threshold`: a data-contract threshold. Nothing is recomputed: the stored output is re-validated "
             "against the new value, and the stage fails if it no longer passes.",
             "- `none`: speed or operations only (parallelism, logging, checkpoint cadence, device). Nothing is "
             "recomputed; stored outputs and checkpoints are reused.", ""]

    def type_name(ann) -> str:
        s = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
        return re.sub(r"mlm_core\.config\w*\.", "", s)     # the sections' leaf modules too (config_data, ...)

    def walk(model, prefix: str) -> None:
        rows, subs = [], []
        for name, f in model.model_fields.items():
            key = f"{prefix}{f.alias or name}"      # tokenizer.from (field from_)
            inner = _inner_model(f.annotation)
            target = inner.model if isinstance(inner, _Container) else inner
            if isinstance(target, type) and issubclass(target, _BM):
                sub = f"{key}.<lang>" if isinstance(inner, _Container) else key
                subs.append((target, sub + "."))
                rows.append(f"| `{key}` | section | | | {f.description or ''} |")
                continue
            default = "required" if f.is_required() else (
                "[]" if f.default_factory is list else "{}" if f.default_factory is dict else repr(f.default))
            rows.append(f"| `{key}` | `{type_name(f.annotation)}` | `{default}` | {field_effect(model, name)} | "
                        f"{f.description or ''} |")
        title = prefix.rstrip(".") or "top level"
        lines.extend([f"## `{title}`", "", (model.__doc__ or "").strip(), "",
                      "| key | type | default | effect | meaning |", "|---|---|---|---|---|", *rows, ""])
        for m, p in subs:
            walk(m, p)

    walk(PipelineConfig, "")
    return "\n".join(lines).rstrip() + "\n"
