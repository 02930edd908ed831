"""Sweep definitions: a YAML next to a base pipeline config -> the list of runs (variant x seed), each a config.

In: a sweep file such as::

    name: mask-rate
    base: ../demo.yaml                      # the pipeline config every run starts from (relative to this file)
    variants:                               # named variants, each a set of `--set` overrides ...
      - {name: p15, set: {pretrain.masking.rate: 0.15}}
      - {name: p40, set: {pretrain.masking.rate: 0.40}}
    grid: {pretrain.lr: [1.0e-3, 2.0e-3]}   # ... and/or a grid (the cross product of its values)
    seeds: [0, 1, 2]
    metrics: [top1, upos]
    baseline: p15
    match: none                             # none | flops | tokens (pretrain.steps matched to the baseline's)
    concurrency: 1
    primary:                                # the one metric and the contrasts the report gives a verdict on
      metric: mean.top1                     # held-out [MASK]-only top-1, mean over languages (or any metric name)
      contrasts:
        - {variant: p40, expect: higher, claim: "40% matches or beats 15% (Wettig et al. 2023)"}

Out: ``Sweep`` (the validated definition, its base config, and one ``SweepRun`` per variant and seed, whose
``overrides`` are exactly the ``--set`` words ``mlm run BASE`` takes). With a grid and variants, every variant
is crossed with every grid point (name ``variant,key=value``); a grid alone names its points ``key=value,...``.

Validation is the main config's: pydantic, frozen, unknown keys are errors naming their path (with the closest
key); every variant's overrides are applied to the base config and validated before any work, and an error names
the sweep file, the variant and the key. A variant may not override ``workdir``, ``tracking``, ``seed`` or
``pretrain.seed``: the runs of one sweep share one store and one MLflow experiment, and ``seeds`` owns the seed.
Seeds: each run's seed is ``pretrain.seed`` (training and transfer fine-tuning only), so runs at different seeds
share normalize, tokenizer and shards; the global ``seed`` stays the base config's.
Base overrides (``mlm sweep SWEEP.yaml --set KEY=VALUE``): applied to the base config of every run, before the
variant's own (how a sweep is scaled up on a GPU).
Registry: every run registers under ``<registry.model_name>-sweep-<sweep name>`` (an override of each run, unless
the variant sets ``registry.model_name``), so a sweep's register stages never move the base model's aliases.
Budget matching (``match``): ``mlm_core.budget.steps_for_budget`` against the baseline variant (else the first),
added as a ``pretrain.steps`` override. Planning (fingerprints, the dry-run table, plan.json) is ``sweep_plan``.
"""
from __future__ import annotations

import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mlm_core.config.io import (ConfigError, LoadedConfig, format_validation_error, load_config, model_json_schema,
                                schema_json_text)
from mlm_core.errors import MlmError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$"
# Keys a variant may not set (module docstring): the sweep shares them across its runs.
SHARED_KEYS = ("workdir", "tracking", "seed", "pretrain.seed")
SEED_KEY = "pretrain.seed"          # what a sweep seed sets: training only, so the data stages are shared


def _is_shared(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in SHARED_KEYS)


log = logging.getLogger(__name__)

class SweepError(MlmError, ValueError):
    """A sweep file that cannot be used; the message names the file, the variant and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Variant(_Model):
    """One named variant: config overrides applied to the base config (the same as ``--set KEY.PATH=VALUE``)."""

    name: str = Field(pattern=NAME_PATTERN, description="Variant name (letters, digits, _ . + -), unique in the sweep.")
    set: dict[str, Any] = Field(default_factory=dict, description="Overrides {key.path: value}, e.g. "
                                "{pretrain.masking.rate: 0.4}; validated against the base config.")
    seeds: list[int] | None = Field(default=None, min_length=1, description="This variant's seeds (default: the "
                                    "sweep's `seeds`): e.g. 6 seeds for the variants of a primary contrast, 3 for "
                                    "the exploratory ones. Paired differences use the seeds both variants ran.")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None and len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct (got {seeds})")
        return seeds


class Contrast(_Model):
    """One primary contrast: the variant against a baseline variant, with the direction the paper expects."""

    variant: str = Field(description="The variant whose effect is tested.")
    baseline: str | None = Field(default=None, description="The variant it is compared with (default: the "
                                 "sweep's `baseline`).")
    expect: Literal["higher", "lower"] = Field(description="The paper's expected direction of the primary metric: "
                                               "the variant's value higher or lower than the baseline's.")
    claim: str = Field(default="", description="The paper's claim, in words (shown next to the verdict).")


class Primary(_Model):
    """The sweep's confirmatory question: one metric, its contrasts. Everything else in the report is exploratory."""

    metric: str = Field(description="One metric name as the report names it, e.g. mean.top1 (held-out "
                        "[MASK]-only top-1, mean over languages), en.top1, upos.mean.score; no wildcards.")
    contrasts: list[Contrast] = Field(min_length=1, description="The primary contrasts; their p-values are "
                                      "Holm-corrected together.")

    @model_validator(mode="after")
    def _check(self) -> "Primary":
        if any(c in self.metric for c in "*?[") or not self.metric.strip():
            raise ValueError(f"metric: {self.metric!r}: give one metric name (no wildcards)")
        return self


class SweepConfig(_Model):
    """A sweep: variants (named and/or a grid) x seeds, each run through the pipeline from a base config."""

    name: str = Field(pattern=NAME_PATTERN, description="Sweep name: its state lives in <workdir>/sweeps/<name>/.")
    base: str = Field(description="The base pipeline config (relative to the sweep file).")
    variants: list[Variant] = Field(default_factory=list, description="Named variants (each a set of overrides).")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="{key.path: [values]}: every combination "
                                       "is a variant (crossed with each named variant when both are given).")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1,
                             description="Seeds: every variant runs once per seed (the config's `pretrain.seed`: "
                             "training only; the data stages are shared across seeds).")
    metrics: list[str] = Field(default_factory=list, description="Metrics the report compares across variants.")
    baseline: str | None = Field(default=None, description="The variant the report's paired differences are "
                                 "taken against (and, with match, whose budget every variant gets).")
    match: Literal["none", "flops", "tokens"] = Field(
        default="none", description="none: steps as configured; flops / tokens: pretrain.steps set so every "
        "variant spends the baseline's training FLOPs (ELECTRA's generator counted) / input tokens.")
    concurrency: int = Field(default=1, ge=1, description="Runs at once (1: one after another, in this process; "
                             "more: each run in its own `mlm run` process).")
    description: str = Field(default="", description="Free text: what the sweep measures (shown in the report).")
    primary: Primary | None = Field(default=None, description="The primary metric and contrasts the report "
                                    "gives verdicts on (supported / contradicted / inconclusive); without it "
                                    "every table is exploratory and no verdict is written.")

    @model_validator(mode="after")
    def _check(self) -> "SweepConfig":
        if not self.variants and not self.grid:
            raise ValueError("give `variants` and/or `grid` (nothing to compare)")
        names = [v.name for v in self.variants]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"variant names must be unique: {', '.join(dup)} repeated")
        for key, values in self.grid.items():
            if not values:
                raise ValueError(f"grid.{key}: give at least one value")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct (got {self.seeds})")
        return self


@dataclass(frozen=True)
class SweepRun:
    """One run of the sweep: a variant at a seed, as ``mlm run BASE --set ...`` overrides."""

    variant: str
    seed: int
    overrides: tuple[str, ...]          # KEY.PATH=VALUE words: base --set words, registry name, the variant's,
                                        # matched steps, pretrain.seed
    settings: dict = field(default_factory=dict, compare=False)   # the variant's {key.path: value}

    @property
    def key(self) -> str:
        return f"{self.variant}@seed{self.seed}"


@dataclass(frozen=True)
class Sweep:
    config: SweepConfig
    path: Path
    base_path: Path
    base: LoadedConfig
    runs: tuple[SweepRun, ...]
    steps: dict = field(default_factory=dict)   # variant -> matched pretrain.steps (match != none)
    base_overrides: tuple[str, ...] = ()        # `mlm sweep --set` words, applied to every run's base config

    @property
    def variant_names(self) -> list[str]:
        return list(dict.fromkeys(r.variant for r in self.runs))

    @property
    def state_dir(self) -> Path:
        return self.base.workdir / "sweeps" / self.config.name

    def load_run(self, run: SweepRun) -> LoadedConfig:
        return load_config(self.base_path, list(run.overrides))

    def select(self, variants: list[str] | None = None, seeds: list[int] | None = None) -> set[str]:
        """The keys of the runs ``mlm sweep --variants A,B --seeds 0,1`` runs (None/empty: all of that axis); an
        unknown variant or seed is a ``SweepError`` naming what the sweep has. Planning, plan.json and the report
        still cover every run: the others are left as they are (stored, or pending for another invocation)."""
        names, have = self.variant_names, sorted({r.seed for r in self.runs})
        bad = [v for v in variants or () if v not in names]
        if bad:
            raise SweepError(f"{self.path}: --variants {','.join(bad)}: not a variant of this sweep "
                             f"(variants: {', '.join(names)})")
        bad_seeds = [s for s in seeds or () if s not in have]
        if bad_seeds:
            raise SweepError(f"{self.path}: --seeds {','.join(map(str, bad_seeds))}: no run of this sweep has that "
                             f"seed (seeds: {', '.join(map(str, have))})")
        keys = {r.key for r in self.runs if (not variants or r.variant in variants) and (not seeds or r.seed in seeds)}
        if not keys:
            raise SweepError(f"{self.path}: --variants/--seeds select no run (no variant in "
                             f"{', '.join(variants or names)} runs at seed(s) {', '.join(map(str, seeds or have))})")
        return keys


def override_word(key: str, value: Any) -> str:
    """``key=value`` as ``--set`` takes it: the value in JSON (valid YAML, so it reads back as the same value)."""
    return f"{key}={json.dumps(value, ensure_ascii=False)}"


def _label(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def expand(cfg: SweepConfig) -> list[tuple[str, dict]]:
    """``[(variant name, {key.path: value})]`` in declaration order: named variants x grid points."""
    keys = list(cfg.grid)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*(cfg.grid[k] for k in keys))] if keys else []
    named = [(v.name, dict(v.set)) for v in cfg.variants]     # a variant's own seeds: variant_seeds()
    if not points:
        return named
    grid = [(",".join(f"{k}={_label(v)}" for k, v in p.items()), p) for p in points]
    if not named:
        return grid
    return [(f"{n},{g}", {**s, **p}) for n, s in named for g, p in grid]


def variant_seeds(cfg: SweepConfig, name: str) -> list[int]:
    """The seeds variant ``name`` runs at (an expanded name: a named variant crossed with a grid point)."""
    for v in cfg.variants:
        if v.seeds is not None and (name == v.name or name.startswith(v.name + ",")):
            return list(v.seeds)
    return list(cfg.seeds)


def significance_floors(cfg: SweepConfig) -> list[tuple[int, str, str, int, float]]:
    """For each primary contrast: (index, variant, baseline, n, floor), where n is the number of seeds both
    variants run at (the paired seeds the report's sign-flip test uses) and floor the smallest Holm-corrected p it
    can ever report: the exact two-sided sign-flip p when every pair agrees in sign, 2 / 2^n, times the number of
    primary contrasts m (Holm's first step). A floor >= 0.05 means the verdict can only be "inconclusive", whatever
    the data: e.g. 6 seeds suffice for one contrast (0.031) but not for two (0.0625), which need 7 (0.031)."""
    from mlm_core.report.stats import holm_floor      # numpy: not at `mlm` start-up
    contrasts = cfg.primary.contrasts if cfg.primary else []
    m = len(contrasts)
    out = []
    for i, c in enumerate(contrasts):
        base = c.baseline or cfg.baseline or ""
        n = len(set(variant_seeds(cfg, c.variant)) & set(variant_seeds(cfg, base)))
        out.append((i, c.variant, base, n, holm_floor(n, m)))
    return out


_warned: set[str] = set()


def underpowered(cfg: SweepConfig, path: str | Path) -> list[str]:
    """One line per primary contrast whose significance floor is >= 0.05 (``significance_floors``), naming the
    seeds it needs; ``load_sweep`` logs them as warnings (a small exploratory sweep may be meant that way)."""
    from mlm_core.report.stats import ALPHA, seeds_needed
    m = len(cfg.primary.contrasts) if cfg.primary else 0
    lines = []
    for i, variant, base, n, floor in significance_floors(cfg):
        if floor >= ALPHA:
            need = seeds_needed(m)
            lines.append(f"{path}: primary.contrasts.{i} ({variant} vs {base}): {n} paired seed(s) and {m} primary "
                         f"contrast(s): the smallest Holm-corrected p is {floor:.3g} >= {ALPHA}, so its verdict can "
                         f"only be inconclusive; give both variants at least {need} common seeds")
    return lines


def read_sweep_config(path: str | Path) -> SweepConfig:
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"{p}: sweep file not found")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise SweepError(f"{p}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise SweepError(f"{p}: the top level must be a mapping, got {type(raw).__name__}")
    if isinstance(raw.get("sweep"), dict) and "base" not in raw:     # a `sweep:` section is accepted too
        raw = raw["sweep"]
    try:
        return SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise SweepError(format_validation_error(exc, str(p), root=SweepConfig, what="sweep")) from None


def _variant_error(path: Path, name: str, keys: list[str], exc: Exception) -> SweepError:
    msg = str(exc).replace("\n", "\n  ")
    return SweepError(f"{path}: variant {name!r} (sets {', '.join(keys) or 'nothing'}): {msg}")


def model_name_for(base_model_name: str, sweep_name: str) -> str:
    """The registered model name of a sweep's runs: the base config's aliases stay the base config's."""
    return f"{base_model_name}-sweep-{sweep_name}"


def load_sweep(path: str | Path, concurrency: int | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Sweep:
    """Read and validate a sweep file; every run's config is validated here, before any work.

    ``overrides``: ``KEY.PATH=VALUE`` words (``mlm sweep --set``) applied to the base config of every run."""
    path = Path(path)
    overrides = tuple(overrides or ())
    seeded = [w for w in overrides if w.split("=", 1)[0].strip() == SEED_KEY]
    if seeded:
        raise SweepError(f"--set {seeded[0]}: the sweep's `seeds` set {SEED_KEY}")
    cfg = read_sweep_config(path)
    if concurrency is not None:
        if concurrency < 1:
            raise SweepError(f"--concurrency {concurrency}: give at least 1")
        cfg = cfg.model_copy(update={"concurrency": concurrency})
    base_path = (path.resolve().parent / cfg.base).resolve()
    if not base_path.is_file():
        raise SweepError(f"{path}: base: {cfg.base}: config file not found ({base_path})")
    try:
        base = load_config(base_path, list(overrides))
    except ConfigError as exc:
        raise SweepError(f"{path}: base: {exc}") from None
    model_name = model_name_for(base.config.registry.model_name, cfg.name)
    variants = expand(cfg)
    names = [n for n, _ in variants]
    if cfg.baseline is not None and cfg.baseline not in names:
        raise SweepError(f"{path}: baseline: {cfg.baseline!r} is not a variant of this sweep "
                         f"(variants: {', '.join(names)})")
    for i, c in enumerate(cfg.primary.contrasts if cfg.primary else ()):
        base_name = c.baseline or cfg.baseline
        for key, value in (("variant", c.variant), ("baseline", base_name)):
            if value is None:
                raise SweepError(f"{path}: primary.contrasts.{i}.baseline: give it, or the sweep's `baseline`")
            if value not in names:
                raise SweepError(f"{path}: primary.contrasts.{i}.{key}: {value!r} is not a variant of this sweep "
                                 f"(variants: {', '.join(names)})")
        if c.variant == base_name:
            raise SweepError(f"{path}: primary.contrasts.{i}: variant and baseline are both {c.variant!r}")
    for line in underpowered(cfg, path):
        if line not in _warned:      # once per process: `mlm sweep` loads the file, then its flow loads it again
            _warned.add(line)
            log.warning("%s", line)
    loaded: dict[str, LoadedConfig] = {}
    for name, settings in variants:
        shared = [k for k in settings if _is_shared(k)]
        if shared:
            raise SweepError(f"{path}: variant {name!r}: {', '.join(shared)}: a variant may not set "
                             f"{'/'.join(SHARED_KEYS)} (the sweep's runs share one workdir and one MLflow "
                             f"experiment; `seeds` sets {SEED_KEY})")
        words = _run_words(overrides, model_name, settings)
        try:
            loaded[name] = load_config(base_path, words + [f"{SEED_KEY}={cfg.seeds[0]}"])
        except ConfigError as exc:
            raise _variant_error(path, name, list(settings), exc) from None
    steps = _matched_steps(cfg, path, variants, loaded)
    runs = []
    for name, settings in variants:
        words = _run_words(overrides, model_name, settings)
        if name in steps:
            words.append(f"pretrain.steps={steps[name]}")
        runs.extend(SweepRun(name, seed, tuple(words + [f"{SEED_KEY}={seed}"]), dict(settings))
                    for seed in variant_seeds(cfg, name))
    return Sweep(cfg, path, base_path, base, tuple(runs), steps, overrides)


def _run_words(overrides: tuple[str, ...], model_name: str, settings: dict) -> list[str]:
    """A run's ``--set`` words before its steps and seed: base overrides, the sweep's model name, the variant."""
    name = [] if "registry.model_name" in settings else [override_word("registry.model_name", model_name)]
    return list(overrides) + name + [override_word(k, v) for k, v in settings.items()]


def _matched_steps(cfg: SweepConfig, path: Path, variants: list, loaded: dict) -> dict[str, int]:
    if cfg.match == "none":
        return {}
    from mlm_core.budget import steps_for_budget
    ref_name = cfg.baseline or variants[0][0]
    out = {}
    for name, settings in variants:
        if "pretrain.steps" in settings and name != ref_name:
            raise SweepError(f"{path}: variant {name!r}: pretrain.steps: match: {cfg.match} sets the steps "
                             f"(from the baseline {ref_name!r}); remove the override or use match: none")
        try:
            out[name] = steps_for_budget(loaded[name], loaded[ref_name], cfg.match)
        except MlmError as exc:
            raise _variant_error(path, name, list(settings), exc) from None
    return out


def sweep_json_schema() -> dict:
    """The JSON Schema of sweep files (what ``schemas/sweep.schema.json`` holds; a test keeps it in sync)."""
    return model_json_schema(SweepConfig, "mlm-pipeline sweep")


def sweep_schema_text() -> str:
    return schema_json_text(sweep_json_schema())


__all__ = ["significance_floors", "underpowered", "SweepConfig", "Variant", "Contrast", "Primary", "Sweep", "SweepRun", "SweepError", "load_sweep",
           "read_sweep_config",
           "expand", "variant_seeds", "override_word", "model_name_for", "sweep_json_schema", "sweep_schema_text"]
