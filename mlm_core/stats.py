"""Corpus statistics across stages, with DuckDB SQL over the stages' Parquet tables.

In: a loaded config (its stored normalize and shards outputs). Out: one row per language with
documents, tokens, the natural share, the sampled share p(l) = n_l^α / Σ n_k^α and the upsampling
factor (p / natural) — what ``mlm stats`` prints and the shards stage publishes.
"""
from __future__ import annotations

import duckdb

from mlm_core import stages
from mlm_core.errors import PlanError
from mlm_core.sampling import language_weights
from mlm_core.store import StageStore

ALPHAS = (1.0, 0.7, 0.5, 0.3)


def language_table(lc) -> list[dict]:
    store = StageStore(lc.workdir)
    plans = stages.plan(lc, store)
    for need in ("normalize", "shards"):
        if plans[need].status != "done":
            raise PlanError(f"`mlm stats` reads the {need} output, which is {plans[need].status}: "
                            f"run `mlm run CONFIG` (or `--only {need}`) first")
    norm, shards = plans["normalize"].path, plans["shards"].path
    rows = duckdb.sql(f"""
        SELECT n.lang, n.docs, n.quarantined, n.duplicates,
               s.tokens_train AS tokens, s.rows_train AS sequences,
               sa.natural, sa.p, sa.upsampling,
               -- from the current budget (not stored: the budget invalidates no output)
               {int(lc.config.shards.token_budget)} * sa.p / NULLIF(sa.n, 0) AS expected_epochs
        FROM read_parquet('{norm}/stats.parquet') n
        JOIN read_parquet('{shards}/stats.parquet') s USING (lang)
        JOIN read_parquet('{shards}/sampling.parquet') sa USING (lang)
        ORDER BY n.docs DESC""").to_arrow_table().to_pylist()
    return rows


def shares_by_alpha(counts: dict[str, int], alphas=ALPHAS) -> dict[float, dict[str, float]]:
    """Sampled shares of each language for several α (1.0 = natural shares)."""
    return {a: language_weights(counts, a) for a in alphas}
