"""ELECTRA's replaced-token detection in `mlm report` (issue 21 item 3): rtd_acc / rtd_auc tables and the Controls
table, each against the all-original baseline (predict "original" everywhere: accuracy = share of original
tokens, AUC 0.5). Expected values are computed here by hand (sklearn for the AUC, an enumeration of sign flips)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from mlm_core.report.build import build_report

SEEDS = list(range(6))
LANGS = ("en", "fr")


def _p_enum(d):
    d = np.asarray(d, dtype=np.float64)
    obs = abs(d.mean())
    flips = [abs((d * np.array(s)).mean()) >= obs - 1e-12 for s in itertools.product((1, -1), repeat=len(d))]
    return float(np.mean(flips))


def test_all_original_baseline_by_definition():
    """The stored control is the all-original predictor: its accuracy is the share of original tokens and a
    constant score has AUC 0.5 (sklearn), the constant the report uses."""
    from sklearn.metrics import roc_auc_score

    from mlm_core.model.electra import rtd_summary
    from mlm_core.report.collect import RTD_BASELINE_AUC
    rng = np.random.default_rng(0)
    y = rng.random(5000) < 0.13
    logits = rng.normal(size=5000) + 2.0 * y
    s = rtd_summary(logits, y)
    all_original = np.zeros(5000, dtype=bool)                 # "replaced?" -> no, everywhere
    assert s["rtd_baseline_acc"] == pytest.approx(float((all_original == y).mean()))
    assert RTD_BASELINE_AUC == roc_auc_score(y, np.zeros(5000)) == 0.5
    assert s["rtd_auc"] == pytest.approx(roc_auc_score(y, logits))


def _write(wd, stage, fp, manifest):
    d = wd / stage / fp
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")


def _rtd(seed: int, i: int) -> dict:
    return {"acc": 0.80 + 0.01 * seed + 0.02 * i, "base": 0.85 - 0.002 * seed, "auc": 0.60 + 0.015 * seed + 0.01 * i}


def _sweep(tmp_path, variants=("mlm", "electra")):
    wd = tmp_path / "wd"
    entries = []
    for v in variants:
        for s in SEEDS:
            fp = f"{v}{s}"
            entries.append({"name": v, "seed": s, "config_fingerprints": {"pretrain": "p" + fp, "evaluate": "e" + fp},
                            "status": "done"})
            _write(wd, "pretrain", "p" + fp, {"objective": v, "arch": {}, "steps": 0, "tokens": 0, "metrics": {}})
            m = {f"{lg}.top1": 0.3 + 0.01 * s for lg in LANGS} | {f"{lg}.baseline_top1": 0.05 for lg in LANGS}
            if v == "electra":
                for i, lg in enumerate(LANGS):
                    r = _rtd(s, i)
                    m |= {f"{lg}.rtd_acc": r["acc"], f"{lg}.rtd_baseline_acc": r["base"], f"{lg}.rtd_auc": r["auc"]}
            _write(wd, "evaluate", "e" + fp, {"metrics": m, "languages": {}})
    sweep = wd / "sweeps" / "e"
    sweep.mkdir(parents=True)
    plan = {"name": "e", "baseline": "mlm", "metrics": ["top1", "rtd_acc", "rtd_auc"], "variants": entries}
    (sweep / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    return sweep


def test_electra_report_shows_rtd_against_the_all_original_baseline(tmp_path):
    res = build_report(_sweep(tmp_path))
    md, tables = res["markdown"], res["tables"]
    assert {"en.rtd_acc", "fr.rtd_acc", "mean.rtd_acc", "en.rtd_auc", "mean.rtd_auc"} <= set(tables)
    acc = {s: np.mean([_rtd(s, i)["acc"] for i in range(2)]) for s in SEEDS}
    base = {s: np.mean([_rtd(s, i)["base"] for i in range(2)]) for s in SEEDS}
    auc = {s: np.mean([_rtd(s, i)["auc"] for i in range(2)]) for s in SEEDS}
    for metric, value, ctrl in (("mean.rtd_acc", acc, base), ("mean.rtd_auc", auc, {s: 0.5 for s in SEEDS})):
        rows = {r["variant"]: r for r in tables[metric]}
        e = rows["electra"]
        assert e["n"] == 6 and e["mean"] == pytest.approx(np.mean(list(value.values())))
        d = [value[s] - ctrl[s] for s in SEEDS]
        assert e["vs_control"]["mean"] == pytest.approx(np.mean(d))
        assert e["vs_control"]["p"] == pytest.approx(_p_enum(d))
        assert e["vs_control"]["n"] == 6
        assert rows["mlm"]["n"] == 0 and rows["mlm"]["not_reported"]      # MLM has no discriminator
        assert rows["mlm"]["missing_seeds"] == [] and not rows["electra"]["not_reported"]
        ctl = rows["all-original baseline (control)"]
        assert ctl["mean"] == pytest.approx(np.mean(list(ctrl.values()))) and ctl["n"] == 6
    assert "| all-original baseline (control) | 6 runs | 0.5000 ± 0.0000 |" in md
    assert "| mlm | 0/6 | not reported by this variant |" in md
    # the Controls table: ELECTRA's mean RTD accuracy and AUC next to the all-original baseline
    ctrl_row = {r["variant"]: r for r in res["controls"]}
    c = ctrl_row["electra"]["mean.rtd_acc"]
    assert c["control_label"] == "all-original baseline"
    assert c["mean"] == pytest.approx(np.mean(list(acc.values())))
    assert c["control_mean"] == pytest.approx(np.mean(list(base.values())))
    assert ctrl_row["electra"]["mean.rtd_auc"]["diff"]["mean"] == pytest.approx(np.mean(list(auc.values())) - 0.5)
    assert ctrl_row["mlm"]["mean.rtd_acc"]["diff"] is None
    controls_md = md.split("## Controls")[1].split("## Exploratory")[0]
    assert "`mean.rtd_acc`" in controls_md and "all-original baseline" in controls_md


def test_mlm_only_sweep_has_no_rtd_rows(tmp_path):
    sweep = _sweep(tmp_path, variants=("mlm",))
    plan = json.loads((sweep / "plan.json").read_text())
    del plan["metrics"]                                        # the default metrics: RTD only where a run has it
    (sweep / "plan.json").write_text(json.dumps(plan))
    res = build_report(sweep)
    assert not any("rtd" in m for m in res["tables"]) and "rtd" not in res["markdown"]
    assert set(res["controls"][0]) == {"variant", "mean.top1"}
