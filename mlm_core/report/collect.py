"""Reading a sweep's stored outputs: one ``Run`` per (variant, seed) of ``<workdir>/sweeps/<name>/plan.json``.

Each run's outputs are the normal stage outputs: the fingerprints recorded in plan.json
(``config_fingerprints``), or, where plan.json has none, those ``stages.plan(load_config(base, overrides))``
computes. A run whose pretrain or evaluate output is not complete is *missing* (listed in the report, never
silently dropped); one whose audit is missing keeps its other metrics and is listed as partial.

A run's metrics (one flat dict, the names the manifests use):
  * evaluate's ``metrics`` (``<lang>.top1``, ``<lang>.pseudo_perplexity``, ``upos.<lang>.score``, ...), plus
    ``<task>.source_score`` (the fine-tuned source language's own score) and ``<task>.mean.score`` (the mean over
    the target languages other than the source language);
  * audit's ``metrics`` (``<lang>.crows_score``, ...), plus ``<lang>.crows_distance`` = |crows_score - 50|, the
    distance from a neutral model's score (lower is more neutral on either side of 50);
  * pretrain's ``metrics`` prefixed ``pretrain.`` (``pretrain.final_loss``, ``pretrain.<lang>.val_loss``...);
  * language groups by training-data size (the shards stage's train tokens per language): ``small3.<m>`` = the
    mean of ``<lang>.<m>`` over the 3 smallest languages, ``large2.<m>`` over the 2 largest (with >= 5 languages;
    for m in top1, baseline_top1, top1_over_baseline, pseudo_perplexity).
  * ``mean.<m>``: the unweighted mean over the scored languages of ``<lang>.<m>`` for m in top1, baseline_top1,
    top1_over_baseline (held-out [MASK]-only top-1 per language mean, its unigram baseline and the difference),
    and for ELECTRA runs rtd_acc, rtd_auc (the discriminator's replaced-token detection) and their control, the
    all-original baseline (predict "original" everywhere): ``<lang>.rtd_baseline_acc`` (stored by evaluate: the
    share of original tokens) and ``<lang>.rtd_baseline_auc`` = 0.5 (a constant score ranks no replaced token
    above an original one; added here for each ``<lang>.rtd_auc``); with ``evaluate.span_fill``, span_exact and
    span_baseline_exact (whole-span filling and its unigram baseline; per-document data from
    ``span_documents.parquet``).
And the validation curve: (training FLOPs, mean validation loss over languages) at each eval record of the
pretrain stage's metrics.jsonl; FLOPs = tokens so far x the stored model's flops_per_token at the run's mean
measured masking rate (the count the loop's MFU uses).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlm_core.artifacts import Evaluation, PretrainedModel, ShardSet
from mlm_core.errors import MlmError
from mlm_core.train.metrics_file import read_records

RUN_STAGES = ("pretrain", "evaluate", "audit")
REQUIRED = ("pretrain", "evaluate")
GROUP_METRICS = ("top1", "baseline_top1", "top1_over_baseline", "pseudo_perplexity")
MEAN_METRICS = ("top1", "baseline_top1", "top1_over_baseline")
# ELECTRA's replaced-token detection and its all-original control (no per-document data: seeds-only intervals)
RTD_METRICS = ("rtd_acc", "rtd_auc", "rtd_baseline_acc", "rtd_baseline_auc")
RTD_BASELINE_AUC = 0.5
# evaluate.span_fill: whole-span exact match and its unigram baseline (per document: span_documents.parquet)
SPAN_METRICS = ("span_exact", "span_baseline_exact")
LANG = r"[a-z]{2,3}"
CROWS_NEUTRAL = 50.0       # CrowS-Pairs: the score of a model that prefers neither sentence of a pair
DOC_TOLERANCE = 1e-4       # per-document data must give back the stored metric (scores are rounded to 5 decimals)


class ReportError(MlmError, ValueError):
    """A sweep whose report cannot be built (no plan.json, unreadable plan)."""


@dataclass
class Run:
    variant: str
    seed: int
    fingerprints: dict
    missing_stages: list = field(default_factory=list)
    metrics: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)          # [(flops, mean val loss)]
    languages: dict = field(default_factory=dict)      # lang -> train tokens (shards)
    sweep_status: str | None = None                    # what plan.json says
    source_langs: dict = field(default_factory=dict)   # transfer task -> its source language
    groups: dict = field(default_factory=dict)         # small3 / large2 -> their languages
    evaluate_dir: Path | None = None                   # the evaluate output (per-document data: ``doc_data``)
    _docs: dict = field(default_factory=dict, repr=False)   # cache of ``doc_data``

    @property
    def complete(self) -> bool:
        return not any(s in self.missing_stages for s in REQUIRED)


def read_plan(sweep_dir: Path) -> dict:
    p = Path(sweep_dir) / "plan.json"
    if not p.is_file():
        raise ReportError(f"{p}: no sweep plan (run `mlm sweep SWEEP.yaml` first, or its --dry-run)")
    try:
        plan = json.loads(p.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ReportError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(plan.get("variants"), list):
        raise ReportError(f"{p}: no 'variants' list")
    return plan


def _fingerprints(entry: dict, plan: dict, workdir: Path) -> dict:
    fps = dict(entry.get("config_fingerprints") or {})
    if all(s in fps for s in RUN_STAGES + ("shards",)) or not plan.get("base"):
        return fps
    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.store import StageStore
    lc = load_config(plan["base"], list(entry.get("overrides") or []))
    return {k: p.fingerprint for k, p in stages.plan(lc, StageStore(workdir)).items()} | fps


def model_flops_per_token(arch: dict, seq_len: int, rate: float) -> float | None:
    """flops_per_token of the stored architecture (``PretrainedModel.arch``), built on the meta device."""
    import torch

    from mlm_core.model.sizes import Arch
    try:
        with torch.device("meta"):
            if "discriminator" in arch:
                from mlm_core.model.electra import ElectraModel
                model = ElectraModel(Arch.from_dict(arch["discriminator"]), Arch.from_dict(arch["generator"]))
            else:
                from mlm_core.model.encoder import MLMEncoder
                model = MLMEncoder(Arch.from_dict(arch))
        return float(model.flops_per_token(seq_len, rate))
    except Exception:   # noqa: BLE001 - an arch this code cannot rebuild: the curve is plotted against tokens
        return None


def _curve(pre: PretrainedModel) -> list[tuple[float, float]]:
    recs = read_records(Path(pre.path) / "metrics.jsonl")
    steps, tokens = int(pre.steps or 0), int(pre.tokens or 0)
    if not steps or not tokens:
        return []
    per_step = tokens / steps
    rates = [r["masking_rate"] for r in recs if r.get("type") == "train" and r.get("masking_rate") is not None]
    rate = sum(rates) / len(rates) if rates else 0.15
    rows = int(pre.arch.get("max_positions", 0))
    seq_len = pre.seq_len() or _seq_len(pre, rows)
    fpt = model_flops_per_token(pre.arch or {}, seq_len, rate) if seq_len else None
    out = []
    for r in recs:
        if r.get("type") != "eval":
            continue
        losses = [v for k, v in r.items() if k.endswith(".val_loss") and isinstance(v, (int, float))]
        if losses:
            x = r["step"] * per_step * (fpt if fpt else 1.0)
            out.append((float(x), float(sum(losses) / len(losses))))
    return out


def _seq_len(pre: PretrainedModel, fallback: int) -> int:
    p = (pre.config or {}).get("pretrain") or {}
    b, acc = p.get("batch_size"), p.get("grad_accum", 1)
    d = p.get("distributed") or {}
    world = d.get("nproc_per_node", 1) * d.get("nnodes", 1)
    steps, tokens = pre.steps, pre.tokens
    if b and steps and tokens:
        return int(round(tokens / steps / (b * acc * world)))
    return fallback


def _derived(ev: Evaluation) -> dict:
    out = {}
    by_task: dict[str, list] = {}
    tasks_cfg = ev.task_config()
    for t in ev.transfer or []:
        task = t.get("task")
        if task is None:
            continue
        if t.get("source_score") is not None:
            out[f"{task}.source_score"] = float(t["source_score"])
        # the source language scored as a target is the source score, not a transfer: not in the mean
        if t.get("lang") == (tasks_cfg.get(task) or {}).get("source_lang"):
            continue
        for key in ("score", "untrained_score", "gain_over_untrained"):     # the untrained-encoder control too
            if t.get(key) is not None:
                by_task.setdefault((task, key), []).append(float(t[key]))
    for (task, key), values in by_task.items():
        out[f"{task}.mean.{key}"] = sum(values) / len(values)
    return out


def _means(metrics: dict) -> dict:
    """``mean.<m>``: the mean over the languages that have ``<lang>.<m>`` (module docstring)."""
    out = {}
    for m in MEAN_METRICS + RTD_METRICS + SPAN_METRICS:
        vals = [v for k, v in metrics.items() if re.fullmatch(rf"{LANG}\.{m}", k) and isinstance(v, (int, float))]
        if vals:
            out[f"mean.{m}"] = sum(vals) / len(vals)
    return out


def _rtd_controls(metrics: dict) -> dict:
    """``<lang>.rtd_baseline_auc`` (the all-original baseline's AUC, 0.5) for every ``<lang>.rtd_auc``."""
    return {f"{k[:-len('.rtd_auc')]}.rtd_baseline_auc": RTD_BASELINE_AUC for k, v in metrics.items()
            if re.fullmatch(rf"{LANG}\.rtd_auc", k) and isinstance(v, (int, float))}


def _crows_distance(metrics: dict) -> dict:
    """``<lang>.crows_distance`` = |crows_score - 50| for every ``<lang>.crows_score``: how far from neutral. On
    CrowS-Pairs an unbiased model scores 50 (Nangia et al. 2020), so "lower score" means "less biased" only above
    50; a mitigation that takes 52 to 46 is not more neutral (issue 21: the bias sweep's 52.0 -> 48.3)."""
    return {f"{k[:-len('.crows_score')]}.crows_distance": abs(float(v) - CROWS_NEUTRAL) for k, v in metrics.items()
            if re.fullmatch(rf"{LANG}\.crows_score", k) and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _table(path: Path):
    if not path.is_file():
        return None
    import pyarrow.parquet as pq
    return pq.read_table(path).to_pylist()


def _intrinsic_strata(run: "Run", m: str) -> dict | None:
    """{lang: (numerator, denominator)} per document for ``<lang>.<m>`` from intrinsic_documents.parquet."""
    from mlm_core.evaluate.intrinsic import DOCUMENTS_FILE
    if "intrinsic" not in run._docs:
        rows = _table(run.evaluate_dir / DOCUMENTS_FILE) if run.evaluate_dir else None
        by: dict[str, list] = {}
        for r in rows or []:
            by.setdefault(r["lang"], []).append(r)
        run._docs["intrinsic"] = by if rows is not None else None
    by = run._docs["intrinsic"]
    if by is None:
        return None
    out = {}
    for lang, rows in by.items():
        den = np.array([r["positions"] for r in rows], dtype=np.float64)
        cor = np.array([r["correct"] for r in rows], dtype=np.float64)
        base = [r["baseline_correct"] for r in rows]
        if m != "top1" and any(b is None for b in base):
            continue
        b = np.array(base, dtype=np.float64) if m != "top1" else None
        out[lang] = (cor if m == "top1" else b if m == "baseline_top1" else cor - b, den)
    return out


def _span_strata(run: "Run", m: str) -> dict | None:
    """{lang: (numerator, denominator)} per document for ``<lang>.<m>`` (m in SPAN_METRICS) from
    span_documents.parquet: exact hits (model or baseline) over spans."""
    from mlm_core.evaluate.span_fill import DOCUMENTS_FILE
    if "span" not in run._docs:
        rows = _table(run.evaluate_dir / DOCUMENTS_FILE) if run.evaluate_dir else None
        by: dict[str, list] = {}
        for r in rows or []:
            by.setdefault(r["lang"], []).append(r)
        run._docs["span"] = by if rows is not None else None
    by = run._docs["span"]
    if by is None:
        return None
    key = "exact" if m == "span_exact" else "baseline_exact"
    return {lang: (np.array([r[key] for r in rows], dtype=np.float64),
                   np.array([r["spans"] for r in rows], dtype=np.float64))
            for lang, rows in by.items() if all(r[key] is not None for r in rows)}


def _upos_strata(run: "Run", task: str, key: str) -> dict | None:
    """{lang: (numerator, denominator)} per sentence for ``<task>.<lang>.<key>`` from predictions.parquet: the
    test split of each target, the held-out split where the source language was scored on it."""
    from mlm_core.evaluate.predictions import FILE
    if "predictions" not in run._docs:
        run._docs["predictions"] = _table(run.evaluate_dir / FILE) if run.evaluate_dir else None
    rows = run._docs["predictions"]
    if rows is None:
        return None
    acc: dict[tuple, dict] = {}
    for r in rows:
        if r["task"] != task:
            continue
        sent = acc.setdefault((r["lang"], r["split"]), {}).setdefault(r["sentence_index"], [0, 0, 0])
        sent[0] += r["predicted"] is not None and r["predicted"] == r["gold"]
        sent[1] += r["untrained_predicted"] is not None and r["untrained_predicted"] == r["gold"]
        sent[2] += 1
    out = {}
    for (lang, split), sents in sorted(acc.items()):
        a = np.array([sents[i] for i in sorted(sents)], dtype=np.float64)
        num = a[:, 0] if key == "score" else a[:, 1] if key == "untrained_score" else a[:, 0] - a[:, 1]
        want = run.metrics.get(f"{task}.{lang}.{key}")
        if want is not None and abs(num.sum() / a[:, 2].sum() - want) <= DOC_TOLERANCE:
            out[lang] = (num, a[:, 2])
    return out


def doc_data(run: "Run", metric: str):
    """The per-document data behind ``metric`` for this run (``stats.DocData``), or None when the evaluate output
    stores none for it (an output written before issue 21, a metric not built from held-out documents) or when
    it does not give back the stored value within DOC_TOLERANCE."""
    from mlm_core.report.stats import DocData
    if metric in run._docs:
        return run._docs[metric]
    strata = None
    parts = metric.split(".")
    if len(parts) == 2 and parts[1] in MEAN_METRICS and re.fullmatch(LANG, parts[0]):
        st = _intrinsic_strata(run, parts[1])
        strata = {parts[0]: st[parts[0]]} if st and parts[0] in st else None
    elif len(parts) == 2 and parts[0] in ("mean", *run.groups) and parts[1] in MEAN_METRICS:
        st = _intrinsic_strata(run, parts[1])
        langs = run.groups.get(parts[0]) or [k.split(".")[0] for k in run.metrics
                                             if re.fullmatch(rf"{LANG}\.{parts[1]}", k)]
        strata = {lg: st[lg] for lg in langs} if st and langs and all(lg in st for lg in langs) else None
    elif len(parts) == 2 and parts[1] in SPAN_METRICS:
        st = _span_strata(run, parts[1])
        langs = [parts[0]] if parts[0] != "mean" else [k.split(".")[0] for k in run.metrics
                                                        if re.fullmatch(rf"{LANG}\.{parts[1]}", k)]
        strata = {lg: st[lg] for lg in langs} if st and langs and all(lg in st for lg in langs) else None
    elif len(parts) == 3 and parts[2] in ("score", "untrained_score", "gain_over_untrained"):
        st = _upos_strata(run, parts[0], parts[2])
        if st is not None and parts[1] == "mean":
            targets = [k.split(".")[1] for k in run.metrics if re.fullmatch(
                rf"{re.escape(parts[0])}\.{LANG}\.{parts[2]}", k)]
            src = run.source_langs.get(parts[0])
            targets = [t for t in targets if t != src]
            strata = {t: st[t] for t in targets} if targets and all(t in st for t in targets) else None
        elif st is not None:
            strata = {parts[1]: st[parts[1]]} if parts[1] in st else None
    dd = DocData(strata) if strata else None
    if dd is not None and (metric not in run.metrics or abs(dd.value() - run.metrics[metric]) > DOC_TOLERANCE):
        dd = None
    run._docs[metric] = dd
    return dd


def _groups(metrics: dict, sizes: dict) -> dict:
    if len(sizes) < 5:
        return {}
    order = sorted(sizes, key=lambda lg: (sizes[lg], lg))
    out = {}
    for gname, langs in (("small3", order[:3]), ("large2", order[-2:])):
        for m in GROUP_METRICS:
            vals = [metrics.get(f"{lg}.{m}") for lg in langs]
            if vals and all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
                out[f"{gname}.{m}"] = sum(vals) / len(vals)
    return out


def collect(sweep_dir: Path, plan: dict | None = None) -> tuple[dict, list[Run]]:
    """(plan, runs) for the sweep folder ``<workdir>/sweeps/<name>``."""
    from mlm_core.store import StageStore
    sweep_dir = Path(sweep_dir)
    plan = plan if plan is not None else read_plan(sweep_dir)
    workdir = Path(plan.get("workdir") or sweep_dir.parent.parent)
    store = StageStore(workdir)
    runs = []
    for entry in plan["variants"]:
        fps = _fingerprints(entry, plan, workdir)
        run = Run(str(entry["name"]), int(entry.get("seed", 0)), fps, sweep_status=entry.get("status"))
        arts = {}
        for stage in RUN_STAGES:
            fp = fps.get(stage)
            if fp and store.is_complete(stage, fp):
                arts[stage] = store.load(stage, fp)
            elif stage in REQUIRED or fp:
                run.missing_stages.append(stage)
        if "pretrain" in arts:
            pre: PretrainedModel = arts["pretrain"]
            run.metrics |= {f"pretrain.{k}": v for k, v in (pre.metrics or {}).items()}
            run.curve = _curve(pre)
        if "evaluate" in arts:
            ev: Evaluation = arts["evaluate"]
            run.metrics |= dict(ev.metrics or {}) | _derived(ev)
            run.metrics |= _rtd_controls(run.metrics)
            run.metrics |= _means(run.metrics)
            run.evaluate_dir = Path(ev.path)
            tasks_cfg = ev.task_config()
            run.source_langs = {t: c.get("source_lang") for t, c in tasks_cfg.items()
                                if isinstance(c, dict) and c.get("source_lang")}
        if "audit" in arts:
            run.metrics |= dict(arts["audit"].metrics or {})
            run.metrics |= _crows_distance(run.metrics)
        if fps.get("shards") and store.is_complete("shards", fps["shards"]):
            shards: ShardSet = store.load("shards", fps["shards"])
            langs = shards.languages or {}
            run.languages = {lg: int(v.get("tokens_train", 0)) for lg, v in langs.items()}
            run.metrics |= _groups(run.metrics, run.languages)
            if len(run.languages) >= 5:
                order = sorted(run.languages, key=lambda lg: (run.languages[lg], lg))
                run.groups = {"small3": order[:3], "large2": order[-2:]}
        run.metrics = {k: float(v) for k, v in run.metrics.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
        runs.append(run)
    return plan, runs


__all__ = ["Run", "ReportError", "collect", "read_plan", "model_flops_per_token", "doc_data"]
