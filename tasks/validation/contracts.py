"""Each stage's data-contract inputs: the tables its suite runs on and the suite parameters.

Tables are pandas DataFrames built from a stage's statistics files in full, plus bounded random
samples of its rows (so validation cost stays flat as the corpus grows). Parameters fill the
suite's ``{"$PARAMETER": name}`` placeholders from the run's config (recorded in the manifest).
The suites themselves are ``schemas/<suite>.suite.json``. Which functions serve a stage is declared in its
``StageSpec`` (``contract_tables``, ``contract_parameters``). No great_expectations import here.
"""
from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

# C0 and C1 control characters (incl. DEL). Cleaning drops them or folds them into spaces, so none may remain.
CONTROL_RE = r"[\x00-\x1f\x7f-\x9f]"


def normalize_parameters(manifest: dict) -> dict:
    cfg = manifest["config"]["normalize"]
    return {"languages": list(manifest["languages"]), "min_chars": cfg["min_chars"],
            "max_chars": cfg["max_chars"], "max_quarantine_rate": cfg["max_quarantine_rate"],
            "min_docs": cfg.get("min_docs_per_language", 1)}


def normalize_tables(out_dir: Path, options: dict) -> dict:
    import duckdb
    import pyarrow.parquet as pq

    stats = pq.read_table(out_dir / "stats.parquet").to_pandas()
    if {"quarantined", "records"} <= set(stats.columns):
        stats["quarantine_rate"] = (stats["quarantined"] / stats["records"].clip(lower=1)).astype("float64")
    tables = {"stats": stats, "quarantine_stats": pq.read_table(out_dir / "quarantine_stats.parquet").to_pandas()}
    # The stage writes docs_sample.parquet (a uniform sample drawn while streaming the docs), so the
    # row-level checks read at most ~10k rows whatever the corpus size; older outputs fall back to a
    # DuckDB reservoir over every docs file.
    n, seed = int(options["sample_rows"]), int(options["seed"])
    small = out_dir / "docs_sample.parquet"
    src = str(small if small.exists() else out_dir / "docs" / "*.parquet").replace("'", "''")
    with duckdb.connect() as con:
        if not small.exists() and not any((out_dir / "docs").glob("*.parquet")):
            sample = con.sql("SELECT NULL::BIGINT doc_id, NULL::VARCHAR lang, NULL::VARCHAR text, "
                             "NULL::INTEGER n_chars, NULL::VARCHAR hash, NULL::BOOLEAN has_control LIMIT 0").df()
        else:
            sample = con.execute(
                f"SELECT *, regexp_matches(text, $re) AS has_control FROM "
                f"(SELECT * FROM read_parquet('{src}') USING SAMPLE reservoir({n} ROWS) REPEATABLE ({seed}))",
                {"re": CONTROL_RE}).df()
    tables["docs_sample"] = sample
    return tables


# ---------------------------------------------------------------------------------------------------------------
# tokenizer
def tokenizer_parameters(manifest: dict) -> dict:
    cfg = manifest["config"]["tokenizer"]
    size, least = cfg["vocab_size"], int(cfg["min_vocab_fraction"] * cfg["vocab_size"])
    if manifest.get("source"):   # an existing tokenizer (tokenizer.from): its own size, + up to tokenizer.extend
        size = int(manifest["vocab_size_requested"])
        least = int((manifest.get("extension") or {}).get("base_vocab_size", size))
    return {"languages": sorted(manifest["languages"]), "vocab_size": size, "min_vocab_size": least,
            "special_tokens": [f"{r}={t['token']}:{t['id']}" for r, t in manifest["special_tokens"].items()]}


def tokenizer_tables(out_dir: Path, options: dict) -> dict:
    """stats: per language, with `fertility` = tokens per word, or per character for languages written
    without spaces (zh, ja, th...), next to its limit; specials: what tokenizer.json really holds."""
    import json

    import pandas as pd
    import pyarrow.parquet as pq

    manifest = options["manifest"]
    stats = pq.read_table(out_dir / "stats.parquet").to_pandas()
    no_spaces = {lang: bool(s.get("no_spaces")) for lang, s in manifest["languages"].items()}
    stats["fertility"] = [row.tokens_per_char if no_spaces.get(row.lang) else row.tokens_per_word
                          for row in stats.itertuples()]
    # named for the failure message: "heldout_tokens ... lang='fr' heldout_docs=0: 0" says which language has
    # no held-out text (a one-document language), where the fertility check alone said "[4.0, null]"
    stats["heldout_tokens"] = stats["tokens"]
    # limits from the thresholds in force (merged into manifest["config"] by mlm_core.stages.with_thresholds),
    # not the columns written with the output: a threshold change re-validates a stored tokenizer
    limits = manifest.get("config", {}).get("tokenizer", {})
    if "max_fertility" in limits:
        per_lang = limits.get("max_fertility_per_lang") or {}
        stats["max_fertility"] = [float(per_lang.get(lang, limits["max_fertility"])) for lang in stats["lang"]]
        stats["fertility_to_limit"] = (stats["fertility"].astype("float64") / stats["max_fertility"]).astype("float64")
        if (stats["fertility_to_limit"] > 1).any():
            # the failure names the offending language; this shows it next to the corpus' other languages
            from mlm_core.tokenizer.stats import fertility_table
            log.warning("tokenizer contract: fertility per language (%s):\n%s", out_dir, fertility_table(
                manifest["languages"], dict(zip(stats["lang"], stats["max_fertility"]))))
    if "max_unk_rate" in limits:
        stats["max_unk_rate"] = float(limits["max_unk_rate"])
    tok = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8"))
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    specials = pd.DataFrame([{"role": role, "declared": f"{role}={t['token']}:{t['id']}",
                              "actual": f"{role}={t['token']}:{added.get(t['token'], -1)}"}
                             for role, t in manifest["special_tokens"].items()])
    vocab = pd.DataFrame([{"vocab_size": int(manifest["vocab_size"]),
                           "requested": int(manifest["vocab_size_requested"])}])
    return {"stats": stats, "specials": specials, "vocab": vocab}


# ---------------------------------------------------------------------------------------------------------------
# shards
def shards_parameters(manifest: dict) -> dict:
    langs = sorted(set(manifest["config"]["languages"]) - set(manifest.get("dropped_languages", [])))
    return {"languages": langs, "seq_len": int(manifest["seq_len"]), "max_id": int(manifest["vocab_size"]) - 1}


def shards_tables(out_dir: Path, options: dict) -> dict:
    """shards: one row per file (from the manifest); sampling: the table; rows_sample: a bounded random sample
    of sequences read through the memory-mapped files, with their length, max token id and padding count."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    from mlm_core.shards.reader import read_shard_file
    manifest = options["manifest"]
    files = pd.DataFrame(manifest["shards"])
    sampling = pq.read_table(out_dir / "sampling.parquet").to_pandas()
    rng = np.random.default_rng(int(options["seed"]))
    per_file = max(1, int(options["sample_rows"]) // max(len(files), 1))
    rows = []
    for f in manifest["shards"]:
        # decoded: format v3 folds word starts into the stored ids (mlm_core.shards.layout)
        ids = read_shard_file(out_dir, f["file"], manifest)["input_ids"]
        width = ids.shape[1]
        pick = rng.choice(len(ids), size=min(per_file, len(ids)), replace=False) if len(ids) else []
        for i in pick:
            rows.append({"file": f["file"], "lang": f["lang"], "split": f["split"], "row": int(i),
                         "length": int(width), "max_id": int(ids[i].max())})
    sample = pd.DataFrame(rows, columns=["file", "lang", "split", "row", "length", "max_id"])
    return {"shards": files, "sampling": sampling, "rows_sample": sample,
            "train_langs": files[files.split == "train"][["lang"]].drop_duplicates(),
            "validation_langs": files[files.split == "validation"][["lang"]].drop_duplicates()}


# ---------------------------------------------------------------------------------------------------------------
# pretrain, evaluate, audit, register: small result tables, validated in full
def _json(path: Path) -> dict:
    import json
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def pretrain_parameters(manifest: dict) -> dict:
    return {"languages": sorted(manifest.get("eval", {}))}


def pretrain_tables(out_dir: Path, options: dict) -> dict:
    import pandas as pd
    ev = _json(out_dir / "eval.json").get("eval", {})
    # the learning test is on [MASK] positions only (an output written before that scoring: its all-target figures)
    rows = [{"lang": lang, "loss": r["loss"], "acc": r["acc"], "baseline_acc": r["baseline_acc"],
             "mask_over_baseline_ci_low": r.get("mask_over_baseline_ci_low", r["acc"] - r["baseline_acc"])}
            for lang, r in ev.items()]
    files = pd.DataFrame([{"file": f, "present": (out_dir / f).is_file()}
                          for f in ("model.safetensors", "model_config.json", "tokenizer.json", "eval.json")])
    return {"eval": pd.DataFrame(rows, columns=["lang", "loss", "acc", "baseline_acc", "mask_over_baseline_ci_low"]),
            "files": files,
            "run": pd.DataFrame([{"final_loss": options["manifest"].get("final_loss"),
                                  "steps": options["manifest"].get("steps")}])}


def evaluate_parameters(manifest: dict) -> dict:
    return {"languages": sorted(manifest.get("languages", {}))}


def evaluate_tables(out_dir: Path, options: dict) -> dict:
    import pyarrow.parquet as pq
    import pandas as pd
    intr = pq.read_table(out_dir / "intrinsic.parquet").to_pandas()
    # efficiency (mlm_core.evaluate.efficiency): one row, none when evaluate.efficiency is off
    eff = _json(out_dir / "evaluation.json").get("efficiency") or {}
    cols = ["parameters", "latency_p50_ms", "latency_p95_ms", "throughput_seq_s"]
    rows = [{"parameters": eff.get("parameters"), "latency_p50_ms": (eff.get("latency_ms") or {}).get("p50"),
             "latency_p95_ms": (eff.get("latency_ms") or {}).get("p95"),
             "throughput_seq_s": (eff.get("throughput") or {}).get("sequences_per_s")}] if eff else []
    transfer = pq.read_table(out_dir / "transfer.parquet").to_pandas()
    return {"intrinsic": intr[~intr["missing"]].reset_index(drop=True), "languages": intr[["lang"]],
            "transfer": transfer, "prediction_scores": _prediction_scores(out_dir, transfer),
            "efficiency": pd.DataFrame(rows, columns=cols).astype("float64")}


def _prediction_scores(out_dir: Path, transfer):
    """One row per UPOS target of transfer.parquet: its accuracy (and the untrained control's) recomputed from
    predictions.parquet (null predictions wrong), minus the reported one, and the word count minus the reported n.
    A target without predictions has 0 words (fails n_diff); no upos task: no rows."""
    import duckdb
    import pandas as pd
    cols = ["task", "lang", "words", "n_diff", "score_diff", "untrained_diff"]
    upos = transfer[transfer["task"] == "upos"] if "task" in transfer else transfer.iloc[0:0]
    f = out_dir / "predictions.parquet"
    if upos.empty:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in ("task", "lang") else "float64") for c in cols})
    got = pd.DataFrame(columns=["task", "lang", "words", "acc", "untrained_acc"])
    if f.exists():
        with duckdb.connect() as con:
            got = con.execute(
                "SELECT task, lang, count(*)::DOUBLE AS words, "
                "avg(CASE WHEN predicted = gold THEN 1.0 ELSE 0.0 END) AS acc, "
                "CASE WHEN count(untrained_predicted) > 0 THEN "
                "avg(CASE WHEN untrained_predicted = gold THEN 1.0 ELSE 0.0 END) END AS untrained_acc "
                "FROM read_parquet($f) GROUP BY task, lang", {"f": str(f)}).df()
    m = upos.merge(got, on=["task", "lang"], how="left")
    m["words"] = m["words"].fillna(0.0)
    untrained = m["untrained_score"] if "untrained_score" in m else pd.Series(float("nan"), index=m.index)
    return pd.DataFrame({"task": m["task"], "lang": m["lang"], "words": m["words"].astype("float64"),
                         "n_diff": (m["words"] - m["n"]).astype("float64"),
                         "score_diff": (m["acc"] - m["score"]).abs().astype("float64"),
                         "untrained_diff": (m["untrained_acc"].astype("float64") - untrained).abs().astype("float64")})


def audit_tables(out_dir: Path, options: dict) -> dict:
    import pyarrow.parquet as pq
    return {"crows": pq.read_table(out_dir / "crows.parquet").to_pandas()}


def register_tables(out_dir: Path, options: dict) -> dict:
    import pandas as pd
    gates = _json(out_dir / "gates.json")
    return {"gates": pd.DataFrame(gates, columns=["name", "passed", "value", "threshold", "detail"])}
