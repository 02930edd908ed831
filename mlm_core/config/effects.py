"""Effect markers: what a change to a config field does, and the views of a config built from them.

Every leaf field of a ``Section`` declares ``json_schema_extra={"effect": E}`` (the values are explained in
the module docstring of ``mlm_core.config``). ``field_effect`` reads one marker; ``effect_view`` and its
three named forms select the fields of a section by effect: ``mlm_core.stages`` derives every stage
fingerprint, and ``mlm_core.train`` the training-trajectory key, from these views alone.

This module is a leaf: it imports nothing from the project. ``mlm_core.config`` builds its tree on
``Section`` and re-exports every name here.
"""
from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base for every config section: frozen, unknown keys forbidden."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# ------------------------------------------------------------------------------------------ effect markers
EFFECTS = ("output", "report", "threshold", "none")
FINGERPRINTED = frozenset({"output", "report"})      # what a stage fingerprint holds
TRAJECTORY = frozenset({"output"})                   # what the training-trajectory key holds


def section_type(annotation: Any) -> type[Section] | None:
    """The Section class a field holds (directly, or as Optional / dict value / list item), else None."""
    if isinstance(annotation, type):
        return annotation if issubclass(annotation, Section) else None
    for arg in typing.get_args(annotation):
        found = section_type(arg)
        if found is not None:
            return found
    return None


def field_effect(model: type[BaseModel], name: str) -> str:
    """A field's declared effect: 'output' / 'report' / 'threshold' / 'none'; 'section' for a field holding sections.

    Raises ValueError for a leaf field without a valid marker (every field must declare one)."""
    f = model.model_fields[name]
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    effect = extra.get("effect")
    if section_type(f.annotation) is not None:
        if effect is not None:
            raise ValueError(f"{model.__name__}.{name} holds a section: its own fields carry the effect markers")
        return "section"
    if effect not in EFFECTS:
        raise ValueError(f"{model.__name__}.{name}: json_schema_extra must declare an effect, one of {EFFECTS} "
                         f"(got {effect!r}); see the module docstring of mlm_core.config")
    return effect


def omitted_at_default(model: type[BaseModel], name: str, value: Any) -> bool:
    """True for a field marked ``json_schema_extra={"omit_default": True}`` that holds its default value: such a
    field is left out of every view (hence of every fingerprint). The mark is for fields added to an existing
    stage whose default keeps the stage's output as it was (an optional feature left off): a config that does
    not use the feature keeps its fingerprints, so a pipeline upgrade does not recompute stored outputs."""
    f = model.model_fields[name]
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    return bool(extra.get("omit_default")) and value == f.get_default(call_default_factory=True)


def _omits_default(model: type[BaseModel], name: str) -> bool:
    extra = model.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get("omit_default"))


def unused_here(section: BaseModel, name: str) -> bool:
    """True for a field marked ``json_schema_extra={"used_when": {sibling: value}}`` whose sibling holds another
    value: the field is then not read at all (``pretrain.model.window`` with ``attention: global``), so it is
    left out of every view and fingerprint rather than rerunning a stage whose output it cannot change."""
    f = type(section).model_fields[name]
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    return any(getattr(section, k) != v for k, v in (extra.get("used_when") or {}).items())


def _view(value: Any, dumped: Any, effects: frozenset[str], sparse: bool) -> Any:
    if isinstance(value, Section):
        out = {}
        for name, f in type(value).model_fields.items():
            key = f.serialization_alias or f.alias or name    # tokenizer.from_ is dumped (and keyed) as "from"
            if omitted_at_default(type(value), name, getattr(value, name)) or unused_here(value, name):
                continue
            effect = field_effect(type(value), name)
            if effect == "section":
                sub = _view(getattr(value, name), dumped[key], effects, sparse)
                # an optional section (omit_default) holding none of these effects is left out even when set, as
                # at its default: pretrain.plateau (report-only) must not move the trajectory key by an empty {}
                if not ((sparse or _omits_default(type(value), name)) and sub in ({}, None)):
                    out[key] = sub
            elif effect in effects:
                out[key] = dumped[key]
        return out
    if isinstance(value, dict):
        out = {k: _view(v, dumped[k], effects, sparse) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, None)} if sparse else out
    if isinstance(value, (list, tuple)):
        return [_view(v, d, effects, sparse) for v, d in zip(value, dumped)]
    return dumped


def effect_view(section: Any, effects: frozenset[str] | set[str], sparse: bool = False) -> Any:
    """JSON-ready values of the fields of ``section`` (a Section, or a dict/list of them) whose effect is in
    ``effects``, recursing into nested sections (pretrain.model, pretrain.distributed, sources.<lang>...).
    ``sparse`` leaves out nested sections with nothing selected (for thresholds, merged into a manifest)."""
    dumped = ({k: v.model_dump(mode="json") for k, v in section.items()} if isinstance(section, dict)
              else [v.model_dump(mode="json") for v in section] if isinstance(section, (list, tuple))
              else section.model_dump(mode="json"))
    return _view(section, dumped, frozenset(effects), sparse)


def fingerprint_view(section: Any) -> Any:
    """What of ``section`` goes into its stage's fingerprint (effect output or report)."""
    return effect_view(section, FINGERPRINTED)


def trajectory_view(section: Any) -> Any:
    """What of ``section`` determines the output proper (effect output): the training-trajectory key for pretrain."""
    return effect_view(section, TRAJECTORY)


def threshold_view(section: Any) -> Any:
    """The data-contract thresholds of ``section`` (effect threshold): checked against the stored output."""
    return effect_view(section, {"threshold"}, sparse=True)
