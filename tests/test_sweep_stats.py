"""Whether a sweep's declared primary question can be answered at all (issue 21): the exact sign-flip test over n
paired seeds, Holm-corrected over the sweep's m primary contrasts, cannot go below m x 2/2^n."""
from __future__ import annotations

import pytest
# ------------------------------------------------------------------ can a primary contrast reach p < 0.05 at all?
def _all_agree_p(n: int) -> float:
    """The exact two-sided sign-flip p of n paired differences that all agree in sign (each +1), by enumerating
    all 2^n sign flips: the share whose |mean| is at least the observed one."""
    import itertools
    obs = n
    hits = sum(1 for signs in itertools.product((1, -1), repeat=n) if abs(sum(signs)) >= obs)
    return hits / 2 ** n


def _sweep_file(tmp_path, seeds, contrasts):
    from conftest import REPO
    body = {"name": "floor", "base": str(REPO / "configs" / "demo.yaml"), "baseline": "a", "seeds": seeds,
            "variants": [{"name": v, "set": {"pretrain.masking.rate": r}} for v, r in
                         (("a", 0.15), ("b", 0.2), ("c", 0.3))],
            "primary": {"metric": "mean.top1", "contrasts": [{"variant": v, "expect": "higher"} for v in contrasts]}}
    import yaml
    p = tmp_path / "floor.yaml"
    p.write_text(yaml.safe_dump(body), encoding="utf-8")
    return p


@pytest.mark.parametrize("n,contrasts,warned", [(6, ["b"], False), (6, ["b", "c"], True), (7, ["b", "c"], False),
                                                (3, ["b"], True)])
def test_a_primary_contrast_that_can_never_reach_significance_is_warned(tmp_path, caplog, n, contrasts, warned):
    """``significance_floors``: the smallest Holm-corrected p is m x the all-agree sign-flip p (checked against an
    enumeration of every sign flip); ``load_sweep`` warns, naming the contrast and the seeds it needs, when that
    floor is >= 0.05 (two contrasts at 6 seeds: 0.0625; masking_strategy and bias_mitigation shipped so)."""
    import logging

    from mlm_core.sweep import load_sweep, read_sweep_config, significance_floors
    path = _sweep_file(tmp_path, list(range(n)), contrasts)
    floors = significance_floors(read_sweep_config(path))
    assert [f[3] for f in floors] == [n] * len(contrasts)
    for *_, floor in floors:
        assert floor == pytest.approx(min(1.0, len(contrasts) * _all_agree_p(n)))
    with caplog.at_level(logging.WARNING, logger="mlm_core.sweep"):
        load_sweep(path)
    lines = [r.getMessage() for r in caplog.records if "Holm-corrected" in r.getMessage()]
    assert bool(lines) is warned, lines
    caplog.clear()             # `mlm sweep` loads the file twice (the CLI's check, then its flow): warned once
    with caplog.at_level(logging.WARNING, logger="mlm_core.sweep"):
        load_sweep(path)
    assert not [r for r in caplog.records if "Holm-corrected" in r.getMessage()]
    if warned:
        need = next(k for k in range(1, 20) if len(contrasts) * _all_agree_p(k) < 0.05)
        assert f"primary.contrasts.0 (b vs a): {n} paired seed(s)" in lines[0]
        assert f"at least {need} common seeds" in lines[0]


def test_every_shipped_primary_contrast_can_reach_significance():
    """The shipped experiment sweeps that declare a primary question can answer it, except the smoke sweep
    masking_rate_reduced.yaml (3 seeds, "far too small to test the claim", as its header says), which is warned."""
    from conftest import REPO
    from mlm_core.sweep import read_sweep_config, underpowered
    found = {}
    for p in sorted((REPO / "configs" / "experiments").glob("*.yaml")):
        raw = p.read_text(encoding="utf-8")
        if "\nvariants:" not in raw:
            continue          # a base config, not a sweep
        found[p.name] = underpowered(read_sweep_config(p), p.name)
    assert {"masking_strategy.yaml", "bias_mitigation.yaml", "masking_rate.yaml"} <= set(found)
    assert {k for k, v in found.items() if v} == {"masking_rate_reduced.yaml"}, found
