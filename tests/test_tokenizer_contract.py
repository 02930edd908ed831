"""The tokenizer data contract names the language whose held-out text is missing (issue 9).

A language with a single document keeps it for training (at most half of a language is held out), so its
fertility and UNK rate cannot be measured. The contract used to fail with ``offending: [0.02, null]``.
"""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from mlm_core.config.io import load_config  # noqa: E402
from mlm_core.tokenizer.stage import run_tokenizer  # noqa: E402
from tasks import validation as v  # noqa: E402
from test_tokenizer import SENTENCES, make_docs, write_normalize  # noqa: E402


def test_single_document_language_is_named(tmp_path):
    norm = write_normalize(tmp_path / "normalize", {"en": make_docs(SENTENCES["en"], 60),
                                                    "fr": make_docs(SENTENCES["fr"], 1)})
    lc = load_config(raw={"seed": 7, "sources": {lang: {"paths": [__file__]} for lang in ("en", "fr")},
                          "tokenizer": {"vocab_size": 300, "heldout_docs": 20, "sample_mb": 1.0}})
    out = tmp_path / "tok"
    out.mkdir()
    fields = run_tokenizer(lc, {"normalize": norm}, out)
    assert fields["languages"]["fr"]["heldout_docs"] == 0 and fields["languages"]["en"]["heldout_docs"] > 0
    with pytest.raises(v.ValidationFailed) as exc:
        v.validate_stage("tokenizer", out, {**fields, "config": lc.config.model_dump(mode="json")})
    msg = str(exc.value)
    failed = [ln for ln in msg.splitlines() if ln.startswith("  - ")]
    # exactly one failure, on the held-out text, naming the language; no bare [limit, null] pair
    assert len(failed) == 1, msg
    assert "heldout_tokens" in failed[0] and "lang='fr'" in failed[0].split("offending: ")[1], msg
    assert "null" not in msg, msg


def test_a_vocabulary_capped_by_the_corpus_does_not_warn(tmp_path, caplog):
    """Issue 24 item 12: every fresh demo warned that its vocabulary (3,896) is below the 4,000 asked. A trainer
    returns fewer tokens only when the corpus has no more pieces: recorded (info), not a WARNING; the critical
    min_vocab_fraction check still guards a vocabulary far too small."""
    import logging
    norm = write_normalize(tmp_path / "normalize", {"en": make_docs(SENTENCES["en"], 60),
                                                    "fr": make_docs(SENTENCES["fr"], 60)})
    lc = load_config(raw={"seed": 7, "sources": {lang: {"paths": [__file__]} for lang in ("en", "fr")},
                          "tokenizer": {"vocab_size": 5000, "heldout_docs": 20, "sample_mb": 1.0,
                                        "min_vocab_fraction": 0.01}})
    out = tmp_path / "tok"
    out.mkdir()
    fields = run_tokenizer(lc, {"normalize": norm}, out)
    assert fields["vocab_size"] < 5000                         # the corpus cannot give 5,000 pieces
    with caplog.at_level(logging.INFO):
        report = v.validate_stage("tokenizer", out, {**fields, "config": lc.config.model_dump(mode="json")})
    assert report.success and report.failed_warnings == []
    assert "validation warning" not in caplog.text
    row = next(r for r in report.results if r["kwargs"].get("column") == "vocab_size" and r["severity"] == "info")
    assert not row["success"]                                  # still recorded in the report and Data Docs
