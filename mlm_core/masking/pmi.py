"""PMI-masking's collocation vocabulary (Levine et al. 2021, "PMI-Masking: Principled masking of correlated
spans", ICLR 2021): word n-grams (n = 2..5) ranked by the paper's PMI measure, computed over the normalized corpus.

The measure (the paper's Eq. 3, "PMI_n"): for an n-gram w1..wn,

    PMI_n(w1..wn) = min over segmentations s of w1..wn into >= 2 contiguous segments of
                    log [ p(w1..wn) / prod_{seg in s} p(seg) ]

i.e. the n-gram's log-probability minus the best explanation of it by its parts. For n = 2 it is the usual
PMI, log p(w1 w2) / (p(w1) p(w2)). The naive extension (dividing by the product of the single-word
probabilities) ranks "a b c" high when "a b" alone is a collocation; the min over segmentations does not.
p(g) of a k-gram = count(g) / (number of k-gram positions in the language's corpus).

Words: runs of letters, digits, marks and "_" (the tokenizers' pre-tokenizers split punctuation off); an
n-gram never spans punctuation (punctuation tokens break the run). Languages written without spaces (zh, ja,
th...) have no whitespace words, so their runs are whole clauses that rarely reach ``pmi_min_count``: they get
few or no collocations and PMI-masking falls back to whole words there.

Counting is one DuckDB aggregation per language over ``docs/<lang>.parquet`` (tokens numbered per document,
n-grams from lead() over them) with ``SET memory_limit`` (sorts and hash tables spill to a temporary folder
beyond it) and ``HAVING count >= pmi_min_count``. Every segment of a kept n-gram occurs at least as often as
the n-gram, so the minimum count prunes nothing the measure needs. Measured on this repo's 2 busy cores:
2.9 MB of English (shared/data) 3.3 s at a 256 MB limit; 29 MB 31 s at 2 GB and 58 s at 256 MB (spilling),
the same counts.

Out (tokenizer stage folder, written when ``tokenizer.pmi_vocab > 0``):
  pmi_ngrams.parquet  lang, rank, ngram, n (words), units (word units after tokenization), count, pmi, hash
  pmi_stats.parquet   per language: candidates, kept, kept_n2..kept_n5, min_pmi, max_pmi, top (5 best)
and the manifest key "pmi". ``hash`` is the n-gram's hash over its units' token ids (``pmi_select``), what the
``pmi`` masking strategy looks up; an n-gram the tokenizer cuts into more than 5 word units has none.
"""
from __future__ import annotations

import itertools
import logging
import tempfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

MAX_N = 5
NGRAMS_FILE = "pmi_ngrams.parquet"
STATS_FILE = "pmi_stats.parquet"
# a word: letters, digits, marks, "_" (RE2 classes: \w is ASCII-only there); anything else but spaces: punctuation
WORD_CHAR = r"[\p{L}\p{N}\p{M}_]"
WORD_RE = WORD_CHAR + "+"
TOKEN_RE = WORD_RE + r"|[^\p{L}\p{N}\p{M}_\s]+"


def _ngram_sql(path: str, min_count: int) -> str:
    """One aggregation: rows (key, k, count, is_total). Tokens are numbered within their document; lead() over
    the document's positions gives the next 4 tokens, an n-gram needs them all (within the document) and all
    words (a punctuation token is NULL). GROUPING SETS also count every k's positions (is_total), whatever
    min_count."""
    lead = ", ".join(f"lead(w, {j}) OVER o AS w{j + 1}" for j in range(1, MAX_N))
    grams = []
    for k in range(1, MAX_N + 1):
        key = " || ' ' || ".join(f"w{j}" for j in range(1, k + 1))
        cond = " AND ".join(f"w{j} IS NOT NULL" for j in range(1, k + 1))
        grams.append(f"SELECT {key} AS key, {k} AS k FROM l WHERE {cond}")
    return (f"WITH d AS (SELECT row_number() OVER () AS doc, regexp_extract_all(text, '{TOKEN_RE}') AS toks "
            f"FROM read_parquet('{path}')), "
            f"t AS (SELECT doc, generate_subscripts(toks, 1) AS i, unnest(toks) AS tok FROM d), "
            # a token is all word characters or none (TOKEN_RE), so its first character classifies it
            f"v AS (SELECT doc, i, CASE WHEN regexp_matches(tok, '^{WORD_CHAR}') THEN tok END AS w FROM t), "
            # partitioned by document: the window operator then spills partitions (one global ORDER BY did not)
            f"l AS (SELECT w AS w1, {lead} FROM v WINDOW o AS (PARTITION BY doc ORDER BY i)), "
            f"g AS ({' UNION ALL '.join(grams)}) "
            f"SELECT key, k, count(*) AS cnt, GROUPING(key) = 1 AS is_total FROM g "
            f"GROUP BY GROUPING SETS ((key, k), (k)) HAVING count(*) >= {int(min_count)} OR GROUPING(key) = 1")


def count_ngrams(docs: Path, min_count: int, memory_mb: int = 1024, threads: int = 2) -> tuple[dict[str, int], dict[int, int]]:
    """({n-gram (words joined by one space): count >= min_count} for n = 1..5, {k: number of k-gram positions})."""
    import duckdb
    sql = _ngram_sql(str(docs).replace("'", "''"), min_count)
    with tempfile.TemporaryDirectory(prefix="pmi-duckdb-") as tmp:
        con = duckdb.connect()
        try:
            con.execute(f"SET memory_limit='{int(memory_mb)}MB'")
            con.execute(f"SET temp_directory='{tmp}'")
            con.execute(f"SET threads={int(threads)}")
            con.execute("SET preserve_insertion_order=false")
            rows = con.execute(sql).fetchall()
        finally:
            con.close()
    counts = {key: int(n) for key, _, n, total in rows if not total}
    totals = {int(k): int(n) for _, k, n, total in rows if total}
    return counts, totals


def segmentations(n: int) -> list[list[tuple[int, int]]]:
    """Every split of positions 0..n-1 into >= 2 contiguous segments, as (start, length) lists."""
    out = []
    for cuts in itertools.product((False, True), repeat=n - 1):
        if not any(cuts):
            continue
        parts, a = [], 0
        for i, c in enumerate(cuts, start=1):
            if c:
                parts.append((a, i - a))
                a = i
        parts.append((a, n - a))
        out.append(parts)
    return out


def pmi_scores(counts: dict[str, int], totals: dict[int, int]) -> "pd.DataFrame":  # noqa: F821
    """One row per n-gram with n >= 2: ngram, n, count, pmi (the measure above), vectorized per n."""
    import pandas as pd
    df = pd.DataFrame({"ngram": list(counts), "count": np.fromiter(counts.values(), dtype=np.int64, count=len(counts))})
    if df.empty:
        return pd.DataFrame({"ngram": [], "n": [], "count": [], "pmi": []})
    df["n"] = df["ngram"].str.count(" ") + 1
    logp = np.log(df["count"].to_numpy(np.float64)) - np.log(df["n"].map(totals).to_numpy(np.float64))
    lp = pd.Series(logp, index=df["ngram"].to_numpy())
    out = []
    for n in range(2, MAX_N + 1):
        sub = df[df["n"] == n]
        if sub.empty:
            continue
        words = sub["ngram"].str.split(" ", expand=True)
        seg_lp: dict[tuple[int, int], np.ndarray] = {}
        for a in range(n):
            for length in range(1, n - a + 1):
                if length == n:
                    continue
                key = words[a]
                for j in range(a + 1, a + length):
                    key = key + " " + words[j]
                # every segment occurs at least as often as the n-gram, so it passed the minimum count
                seg_lp[(a, length)] = lp.reindex(key.to_numpy()).to_numpy(np.float64)
        best = np.full(len(sub), -np.inf)
        for parts in segmentations(n):
            best = np.maximum(best, np.sum([seg_lp[p] for p in parts], axis=0))
        out.append(sub.assign(pmi=lp.loc[sub["ngram"].to_numpy()].to_numpy() - best))
    res = pd.concat(out, ignore_index=True) if out else df.iloc[:0].assign(pmi=[])
    return res[["ngram", "n", "count", "pmi"]]


def rank(scores, vocab: int):
    """The ``vocab`` highest-PMI n-grams with PMI > 0 (ties: more frequent, then alphabetical), ranked from 1."""
    kept = scores[scores["pmi"] > 0].sort_values(["pmi", "count", "ngram"], ascending=[False, False, True])
    kept = kept.head(int(vocab)).reset_index(drop=True)
    return kept.assign(rank=np.arange(1, len(kept) + 1, dtype=np.int64))


def hash_phrases(tok, phrases: list[str]) -> tuple[list[int | None], list[int]]:
    """Per phrase: its hash over its word units as the shards encode them (token ids and word starts from
    ``shards.encode``, the same code), and its unit count; None for a phrase of more than MAX_N units."""
    import torch

    from mlm_core.masking.pmi_select import ngram_hashes
    from mlm_core.shards.encode import encode_texts, prepare_tokenizer
    if not phrases:
        return [], []
    tok = prepare_tokenizer(tok)
    enc = encode_texts(tok, phrases, np.dtype(np.int64))
    T = int(enc.lens.max())
    ids = torch.zeros(len(phrases), T, dtype=torch.int64)
    ws = torch.zeros(len(phrases), T, dtype=torch.bool)
    cand = torch.zeros(len(phrases), T, dtype=torch.bool)
    offs = np.concatenate([[0], np.cumsum(enc.lens)])
    units = []
    for r, (a, b) in enumerate(zip(offs[:-1], offs[1:])):
        ids[r, : b - a] = torch.from_numpy(enc.ids[a:b].astype(np.int64))
        ws[r, : b - a] = torch.from_numpy(enc.word_start[a:b].astype(bool))
        cand[r, : b - a] = True
        units.append(int(enc.word_start[a:b].sum()) if b > a else 0)
    table = ngram_hashes(ids, cand, ws, MAX_N)
    out: list[int | None] = []
    for r, m in enumerate(units):
        out.append(int(table[m][0][r, 0]) if 2 <= m <= MAX_N and bool(table[m][1][r, 0]) else None)
    return out, units


def build_vocabulary(norm_dir: Path, langs: list[str], tok, cfg, out_dir: Path) -> dict:
    """Write pmi_ngrams.parquet and pmi_stats.parquet into ``out_dir``; returns the manifest's "pmi" entry."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables, stats = [], []
    for lang in langs:
        docs = Path(norm_dir) / "docs" / f"{lang}.parquet"
        if not docs.is_file():
            raise FileNotFoundError(f"{docs}: no normalized documents for {lang} (tokenizer.pmi_vocab needs them)")
        counts, totals = count_ngrams(docs, cfg.pmi_min_count, cfg.pmi_memory_mb)
        scores = pmi_scores(counts, totals)
        kept = rank(scores, cfg.pmi_vocab)
        hashes, units = hash_phrases(tok, kept["ngram"].tolist())
        kept = kept.assign(lang=lang, units=np.asarray(units, dtype=np.int64),
                           hash=pd.array(hashes, dtype="Int64"))
        tables.append(kept)
        row = {"lang": lang, "candidates": int(len(scores)), "kept": int(len(kept)),
               **{f"kept_n{n}": int((kept["n"] == n).sum()) for n in range(2, MAX_N + 1)},
               "unhashed": int(kept["hash"].isna().sum()),
               "min_pmi": float(kept["pmi"].min()) if len(kept) else None,
               "max_pmi": float(kept["pmi"].max()) if len(kept) else None,
               "top": " | ".join(kept["ngram"].head(5))}
        stats.append(row)
        log.info("pmi %s: %d n-grams >= %d occurrences, kept %d (n=2..5: %s), top: %s", lang, len(scores),
                 cfg.pmi_min_count, len(kept), [row[f"kept_n{n}"] for n in range(2, MAX_N + 1)], row["top"])
    schema = pa.schema([("lang", pa.string()), ("rank", pa.int64()), ("ngram", pa.string()), ("n", pa.int64()),
                        ("units", pa.int64()), ("count", pa.int64()), ("pmi", pa.float64()), ("hash", pa.int64())])
    cols = ["lang", "rank", "ngram", "n", "units", "count", "pmi", "hash"]
    allk = pd.concat(tables, ignore_index=True)[cols] if tables else pd.DataFrame(columns=cols)
    pq.write_table(pa.Table.from_pandas(allk, schema=schema, preserve_index=False), Path(out_dir) / NGRAMS_FILE)
    pq.write_table(pa.Table.from_pylist(stats), Path(out_dir) / STATS_FILE)
    return {"min_count": cfg.pmi_min_count, "vocab": cfg.pmi_vocab, "max_n": MAX_N,
            "languages": {s["lang"]: {k: v for k, v in s.items() if k != "lang"} for s in stats}}


def load_collocations(folder: Path) -> dict[int, "torch.Tensor"]:  # noqa: F821
    """{unit count m: sorted unique int64 hashes} from a tokenizer stage folder's pmi_ngrams.parquet."""
    import pyarrow.parquet as pq
    import torch
    path = Path(folder) / NGRAMS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no PMI n-gram vocabulary; pretrain.masking.strategy 'pmi' needs the "
                                f"tokenizer stage to build one (tokenizer.pmi_vocab > 0)")
    t = pq.read_table(path, columns=["units", "hash"]).to_pandas().dropna()
    return {int(m): torch.unique(torch.tensor(g["hash"].astype("int64").to_numpy(), dtype=torch.int64))
            for m, g in t.groupby("units")}


def collocations_for(mcfg, data) -> dict | None:
    """The collocation table for ``pretrain.masking`` (None unless strategy 'pmi'): from the tokenizer output
    that encoded the shard set ``data`` (a ShardDataset opened with ``tokenizer_dir``, the pretrain stage's
    upstream tokenizer)."""
    from mlm_core.masking.strategies import strategy_class
    if not strategy_class(mcfg.strategy).needs_collocations:
        return None
    if getattr(data, "tokenizer_dir", None) is None:
        raise ValueError(f"{data.path}: pretrain.masking.strategy 'pmi' reads the PMI n-gram vocabulary of the "
                         f"tokenizer output these shards were encoded with, and none was given (open the "
                         f"ShardDataset with tokenizer_dir=<the tokenizer output's folder>)")
    return load_collocations(data.tokenizer_dir)


__all__ = ["MAX_N", "NGRAMS_FILE", "STATS_FILE", "build_vocabulary", "collocations_for", "count_ngrams",
           "hash_phrases", "load_collocations", "pmi_scores", "rank", "segmentations"]
