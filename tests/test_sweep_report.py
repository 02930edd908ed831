"""Sweep report (issue 12 item 3): statistics checked against numbers computed by hand here, the report files
built from a hand-made store (no training), missing runs listed, not dropped."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from mlm_core.report import stats
from mlm_core.report.build import build_report, expand_metrics

# ------------------------------------------------------------------------------------------- statistics


def test_mean_and_sample_std_by_hand():
    s = stats.summarize([0.5, 0.7, 0.9])
    assert s.n == 3 and s.mean == pytest.approx(0.7, abs=1e-15)
    # sample std: sqrt(((-0.2)^2 + 0 + 0.2^2) / (3 - 1)) = 0.2  (population std would be 0.163)
    assert s.std == pytest.approx(0.2, abs=1e-15)
    assert stats.summarize([1.0, None, float("nan"), 3.0]) == stats.Summary(2, 2.0, math.sqrt(2.0))
    assert stats.summarize([0.4]) == stats.Summary(1, 0.4, None)
    assert stats.summarize([]) == stats.Summary(0, None, None)


def test_bootstrap_with_three_seeds_is_min_max():
    # 27 equally likely ordered resamples of 3 values; {min,min,min} alone has probability 1/27 = 3.7% > 2.5%, so
    # the 2.5th percentile of the resampled means is the smallest value (likewise the largest at 97.5%)
    d = stats.paired_difference({0: 0.6, 1: 0.9, 2: 1.4}, {0: 0.5, 1: 0.7, 2: 0.8})
    assert d.n == 3 and d.seeds == (0, 1, 2)
    assert d.mean == pytest.approx((0.1 + 0.2 + 0.6) / 3)
    assert d.ci_low == pytest.approx(0.1) and d.ci_high == pytest.approx(0.6)


def test_bootstrap_pairs_by_seed_and_skips_missing():
    # seed 2 missing on the variant, seed 3 only in the variant: pairs = seeds 0, 1; diffs 0.1, 0.05
    d = stats.paired_difference({0: 0.6, 1: 0.75, 2: None, 3: 0.9}, {0: 0.5, 1: 0.7, 2: 0.8})
    assert d.seeds == (0, 1) and d.mean == pytest.approx(0.075)
    # 2 values: resample means 0.05 (p 1/4), 0.075 (1/2), 0.1 (1/4) -> percentiles 2.5 / 97.5 = the extremes
    assert (d.ci_low, d.ci_high) == (pytest.approx(0.05), pytest.approx(0.1))
    assert stats.paired_difference({0: None}, {0: 1.0}).n == 0


def test_bootstrap_against_numpy_and_t_interval():
    x = np.random.default_rng(123).normal(0.3, 1.0, size=40)
    lo, hi = stats.bootstrap_ci(x)
    # the documented procedure, written out independently: 10000 resamples, default_rng(0), percentiles
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 40, size=(10_000, 40))
    ref = np.percentile(x[idx].mean(axis=1), [2.5, 97.5])
    assert (lo, hi) == (pytest.approx(ref[0], abs=1e-12), pytest.approx(ref[1], abs=1e-12))
    # and it brackets the analytic t-interval loosely: same centre, width within 20% (t_{0.975, 39} = 2.0227)
    half_t = 2.0227 * x.std(ddof=1) / math.sqrt(40)
    assert (lo + hi) / 2 == pytest.approx(x.mean(), abs=0.1 * half_t)
    assert (hi - lo) / 2 == pytest.approx(half_t, rel=0.2)
    assert stats.bootstrap_ci(x) == (lo, hi)          # fixed seed: the same interval every time


# ------------------------------------------------------------------------------------------- the report
ARCH = {"layers": 2, "hidden": 32, "heads": 2, "ffn": 64, "dropout": 0.1, "max_positions": 32,
        "position": "learned", "norm": "post", "tie_embeddings": True, "vocab_size": 100, "pad_id": 0}
LANGS = {"en": 5000, "ru": 900, "hi": 800, "ar": 500, "fr": 400, "de": 300, "zh": 100}
TOP1 = {"mlm": [0.5, 0.7, 0.9], "electra": [0.6, 0.75, 0.95]}


def _write(workdir, stage, fp, manifest, files=None):
    d = workdir / stage / fp
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    for name, text in (files or {}).items():
        (d / name).write_text(text, encoding="utf-8")


def _store(tmp_path, skip=()):
    """A workdir holding the outputs a 2-variant x 3-seed sweep would leave; ``skip``: (variant, seed, stage)."""
    wd = tmp_path / "wd"
    _write(wd, "shards", "sh", {"languages": {lg: {"tokens_train": n} for lg, n in LANGS.items()}, "seq_len": 32,
                                "vocab_size": 100, "special_tokens": {}, "sampling": {}, "shards": []})
    variants = []
    for v, tops in TOP1.items():
        for seed, top in enumerate(tops):
            fp = f"{v}{seed}"
            fps = {"shards": "sh", "pretrain": "p" + fp, "evaluate": "e" + fp, "audit": "a" + fp}
            variants.append({"name": v, "seed": seed, "overrides": [f"seed={seed}"], "config_fingerprints": fps,
                             "status": "done"})
            if (v, seed, "pretrain") not in skip:
                curve = "".join(json.dumps({"type": "eval", "step": s, "en.val_loss": 6 - s / 100 - top,
                                            "fr.val_loss": 6.5 - s / 100}) + "\n" for s in (100, 200))
                curve += json.dumps({"type": "train", "step": 200, "masking_rate": 0.15, "loss": 5.0}) + "\n"
                _write(wd, "pretrain", "p" + fp, {"objective": v, "arch": ARCH, "steps": 200, "tokens": 200 * 8 * 32,
                                                  "config": {"pretrain": {"batch_size": 8}},
                                                  "metrics": {"final_loss": 5.0 - top}}, {"metrics.jsonl": curve})
            if (v, seed, "evaluate") not in skip:
                m = {f"{lg}.top1": top - i / 100 for i, lg in enumerate(LANGS)}
                m |= {f"{lg}.baseline_top1": 0.1 for lg in LANGS}
                m |= {f"upos.{lg}.score": top / 2 for lg in ("fr", "de")}
                transfer = [{"task": "upos", "lang": lg, "score": top / 2, "source_score": 0.9} for lg in ("fr", "de")]
                transfer.append({"task": "upos", "lang": "en", "score": 0.9, "source_score": 0.9})   # the source
                _write(wd, "evaluate", "e" + fp, {"metrics": m, "transfer": transfer, "languages": {},
                                                  "config": {"evaluate": {"upos": {"source_lang": "en"}}}})
            if (v, seed, "audit") not in skip:
                _write(wd, "audit", "a" + fp, {"metrics": {"en.crows_score": 50 + 10 * top}, "crows": []})
    sweep = wd / "sweeps" / "demo-sweep"
    sweep.mkdir(parents=True)
    plan = {"name": "demo-sweep", "baseline": "mlm", "metrics": ["en.top1", "upos.*.score", "small3.top1",
                                                                 "en.crows_score", "no.such_metric"],
            "match": "flops", "variants": variants}
    (sweep / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    return sweep


def test_report_tables_files_and_plots(tmp_path):
    res = build_report(_store(tmp_path))
    md = res["md"].read_text(encoding="utf-8")
    t = res["tables"]["en.top1"]
    base, el, ctrl = t
    # the metric's control, in the same table: the unigram baseline (0.1 in every run)
    assert ctrl["variant"] == "unigram baseline (control)" and ctrl["mean"] == pytest.approx(0.1) and ctrl["n"] == 6
    assert el["vs_control"]["mean"] == pytest.approx(0.7667 - 0.1, abs=1e-4)
    assert base["variant"] == "mlm" and base["mean"] == pytest.approx(0.7) and base["std"] == pytest.approx(0.2)
    assert el["diff"]["mean"] == pytest.approx((0.1 + 0.05 + 0.05) / 3)
    assert (el["diff"]["ci_low"], el["diff"]["ci_high"]) == (pytest.approx(0.05), pytest.approx(0.1))
    assert "### `en.top1`" in md and "| mlm | 3/3 | 0.7000 ± 0.2000 | (baseline)" in md
    # electra: sample std of 0.6, 0.75, 0.95 = sqrt((0.1667^2 + 0.0167^2 + 0.1833^2) / 2) = 0.1756
    # p: exact sign-flip over 3 seeds whose differences all share a sign: 2 of 8 patterns as extreme
    assert "| electra | 3/3 | 0.7667 ± 0.1756 | +0.06667 (n=3) | [+0.05, +0.1] | 0.25 |" in md
    assert "no verdict is given" in md and "(exploratory)" in md
    # the 3 smallest languages by training tokens are zh, de, fr: offsets 6, 5, 4 hundredths
    assert res["tables"]["small3.top1"][0]["mean"] == pytest.approx(0.7 - 0.05)
    assert [r["mean"] for r in res["tables"]["upos.fr.score"]] == [pytest.approx(0.35), pytest.approx(0.7667 / 2, rel=1e-3)]
    assert "upos.de.score" in res["tables"] and res["tables"]["no.such_metric"][0]["n"] == 0
    # the mean transfer score is over the targets, without the source language scored as a target
    assert res["tables"]["upos.mean.score"][0]["mean"] == pytest.approx(0.35)
    for f in ("report.md", "report.html", "report.json", "val_loss_vs_flops.png", "top1_vs_unigram.png",
              "transfer.png", "crows_pairs.png"):
        assert (res["dir"] / f).is_file(), f
    page = res["html"].read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 4 and "<td>0.7000 ± 0.2000</td>" in page
    assert json.loads(res["json"].read_text())["bootstrap"] == {"n_resamples": 10000, "seed": 0, "level": 0.95}
    assert not res["missing"] and "## Missing runs" not in md


def test_missing_runs_are_reported_not_dropped(tmp_path):
    res = build_report(_store(tmp_path, skip={("electra", 2, "evaluate"), ("mlm", 1, "audit")}))
    md = res["md"].read_text(encoding="utf-8")
    assert {"variant": "electra", "seed": 2, "stages": ["evaluate"]} in res["missing"]
    assert {"variant": "mlm", "seed": 1, "stages": ["audit"]} in res["missing"]
    assert "## Missing runs" in md and "| electra | 2 | evaluate | done |" in md
    el = res["tables"]["en.top1"][1]
    assert el["n"] == 2 and el["of"] == 3 and el["missing_seeds"] == [2]
    assert el["diff"]["seeds"] == [0, 1] and el["diff"]["mean"] == pytest.approx(0.075)
    assert "| electra | 2/3 |" in md and "seed 2 |" in md
    # a missing audit removes only the audit metric of that run
    crows = res["tables"]["en.crows_score"][0]
    assert crows["n"] == 2 and crows["missing_seeds"] == [1]
    assert res["tables"]["en.top1"][0]["n"] == 3


def test_a_variant_with_its_own_seeds_is_counted_against_them(tmp_path):
    """A variant that declares its own `seeds` (bias_mitigation: 7 for the primary arms, 3 for the others) is
    "n/3", with its own seeds missing, not "0/7" listing seeds it never had (as the 2026-12-05 report did)."""
    sweep = _store(tmp_path, skip={("electra", 1, "evaluate")})
    plan = json.loads((sweep / "plan.json").read_text())
    plan["variants"] = [v for v in plan["variants"] if not (v["name"] == "electra" and v["seed"] == 2)]
    (sweep / "plan.json").write_text(json.dumps(plan))
    rows = {r["variant"]: r for r in build_report(sweep)["tables"]["en.top1"]}
    assert (rows["electra"]["n"], rows["electra"]["of"], rows["electra"]["missing_seeds"]) == (1, 2, [1])
    assert (rows["mlm"]["n"], rows["mlm"]["of"], rows["mlm"]["missing_seeds"]) == (3, 3, [])


def test_crows_distance_is_the_distance_from_the_neutral_50_on_either_side(tmp_path):
    """``<lang>.crows_distance`` = |crows_score - 50|: 46.3 and 53.7 are equally far from neutral (3.7), so a
    mitigation that moves 52 to 48 is not "less biased" by it; values worked by hand."""
    from mlm_core.report.collect import collect
    sweep = _store(tmp_path)
    audit = sweep.parent.parent / "audit"
    for fp, score in (("amlm0", 46.3), ("amlm1", 53.7), ("amlm2", 50.0)):
        (audit / fp / "manifest.json").write_text(json.dumps({"metrics": {"en.crows_score": score}, "crows": []}))
    _, runs = collect(sweep)
    got = {(r.variant, r.seed): r.metrics.get("en.crows_distance") for r in runs}
    assert got[("mlm", 0)] == pytest.approx(3.7) and got[("mlm", 1)] == pytest.approx(3.7)
    assert got[("mlm", 2)] == 0.0
    assert got[("electra", 0)] == pytest.approx(10 * 0.6)       # 50 + 10 x top1 in _store
    assert not any(k.endswith(".crows_distance") and not k.startswith("en.") for r in runs for k in r.metrics)


def test_expand_metrics_one_component_per_star():
    class R:
        metrics = {"en.top1": 1, "pretrain.en.top1": 1, "upos.fr.score": 1, "upos.mean.score": 1}
    assert expand_metrics(["*.top1", "upos.*.score", "x.y"], [R()]) == [
        "en.top1", "upos.fr.score", "upos.mean.score", "x.y"]
    # short names as a sweep file may give them
    assert expand_metrics(["top1", "upos", "nothing"], [R()]) == [
        "en.top1", "upos.fr.score", "upos.mean.score", "nothing"]


def test_no_plan_is_a_clear_error(tmp_path):
    from mlm_core.report.collect import ReportError
    with pytest.raises(ReportError, match="plan.json"):
        build_report(tmp_path)


def test_publish_logs_to_the_sweep_run(tmp_path):
    """The report's files land under the sweep's MLflow run (artifact folder report/), with per-variant metrics."""
    from mlm_core.config import TrackingConfig
    from tasks.sweep_report import publish_report
    from tasks.tracking import Tracker
    sweep = _store(tmp_path)
    tcfg = TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="sweeps")
    tr = Tracker(tcfg, tmp_path)
    run_id = tr.start_pipeline("sweep demo-sweep", params={}, tags={"mlm.kind": "sweep"})
    tr.end_pipeline("FINISHED")
    res = publish_report(sweep, run_id=run_id, tracking=tcfg, workdir=tmp_path)
    assert res["logged"] and res["run_id"] == run_id and not res["published"]   # no Prefect flow run here
    arts = {a.path for a in tr.client.list_artifacts(run_id, "report")}
    assert {"report/report.md", "report/report.html", "report/val_loss_vs_flops.png"} <= arts
    m = tr.client.get_run(run_id).data.metrics
    assert m["report.mlm.en.top1.mean"] == pytest.approx(0.7)
    assert m["report.electra.en.top1.diff"] == pytest.approx(0.2 / 3)


def test_mlm_report_cli_lists_missing_runs(tmp_path, monkeypatch, capsys):
    """`mlm report SWEEP.yaml` on a sweep nothing of which ran: every run reported missing, files written."""
    from pathlib import Path

    from flows.cli import main
    repo = Path(__file__).resolve().parent.parent
    sw = tmp_path / "s.yaml"
    sw.write_text(f"name: cli-sweep\nbase: {repo / 'configs' / 'demo.yaml'}\nseeds: [0, 1]\nbaseline: a\n"
                  "variants:\n  - {name: a, set: {pretrain.masking.rate: 0.15}}\n"
                  "  - {name: b, set: {pretrain.masking.rate: 0.4}}\nmetrics: [top1]\n"
                  "primary: {metric: mean.top1, contrasts: [{variant: b, expect: higher}]}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)            # the demo's workdir (.mlm) is relative to the current directory
    assert main(["report", str(sw), "--no-log"]) == 0
    out = capsys.readouterr().out
    assert "report from 0 of 4 run(s)" in out and out.count("missing: ") == 4
    # the verdict is printed; with nothing stored it can only be inconclusive
    assert "INCONCLUSIVE: mean.top1 b - a = — — (n=0, Holm p=—, expected higher)" in out
    md = (tmp_path / ".mlm" / "sweeps" / "cli-sweep" / "report" / "report.md").read_text(encoding="utf-8")
    assert "## Missing runs" in md and "| b | 1 | pretrain, evaluate, audit |" in md
