"""Issue 24 item 8: a stored normalize output re-checked against a stricter normalize.max_quarantine_rate fails
naming the worst files (as the first run's error does, and as the README says), not only language and rate."""
from __future__ import annotations

import pytest
import yaml

from conftest import write_lines
from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.store import StageStore

EN = [f"The quick brown fox number {i} jumps over the lazy dog." for i in range(40)]
FR = [f"Le renard brun numéro {i} saute par-dessus le chien paresseux." for i in range(40)]


def test_recheck_names_the_worst_files(tmp_path):
    from tasks.stage import revalidate
    from tasks.validation import ValidationFailed
    # en: a.txt 40 good + 6 too short, b.txt 2 too short -> 8/48 quarantined; fr: clean
    a = write_lines(tmp_path / "a.txt", EN + ["ab"] * 6)
    b = write_lines(tmp_path / "b.txt", [f"x{i}" for i in range(2)])
    fr = write_lines(tmp_path / "fr.txt", FR)
    raw = {"workdir": str(tmp_path / "work"), "sources": {"en": {"paths": [str(a), str(b)]}, "fr": {"paths": [str(fr)]}},
           "normalize": {"workers": 1, "max_quarantine_rate": 0.5}}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    lc = load_config(cfg)
    plans = stages.plan(lc)
    art, _ = stages.execute(lc, "normalize", plans)
    assert art.manifest["languages"]["en"]["quarantined"] == 8
    strict = stages.plan(load_config(cfg, ["normalize.max_quarantine_rate=0.05"]))
    assert strict["normalize"].fingerprint == plans["normalize"].fingerprint        # a threshold: reused
    with pytest.raises(ValidationFailed) as e:
        revalidate("normalize", StageStore(lc.workdir).load("normalize", art.fingerprint), strict["normalize"], 0)
    msg = str(e.value)
    assert "quarantine rate exceeds normalize.max_quarantine_rate=5.00% in en 8/48 (16.67%); worst files:" in msg
    lines = msg.splitlines()
    first = next(i for i, line in enumerate(lines) if "worst files:" in line)
    assert lines[first + 1] == f"  {a} (en): 6 quarantined; reasons: {{'too_short': 6}}"
    assert lines[first + 2] == f"  {b} (en): 2 quarantined; reasons: {{'too_short': 2}}"
    assert "fr.txt" not in msg.split("worst files:")[1].split("\n(")[0]
    assert "quarantine_rate" in msg                  # the contract's own line is still there
