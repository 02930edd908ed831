"""The shards stage as plan -> process -> merge (issue 10): the output does not depend on the partitioning.

A small real corpus (the first lines of ../shared/data/text in five scripts) goes through normalize and the
tokenizer once; the shards stage then runs with partitions from one per language down to about one document
each. Expected values come from the tokenizers library and md5 directly (each document encoded on its own, the
split recomputed from the hashes), never from the stage's own helpers.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.store import StageStore

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "text"
LANGS = ("en", "ru", "hi", "zh", "ar")
LINES = 60


def write_config(root: Path, **execution) -> Path:
    srcs = {}
    for lang in LANGS:
        with open(DATA / f"{lang}.txt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(LINES)]
        p = root / "raw" / f"{lang}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(lines), encoding="utf-8")
        srcs[lang] = {"paths": [str(p)]}
    raw = {"name": "parts", "workdir": str(root / "work"), "sources": srcs,
           "normalize": {"workers": 1, "min_chars": 5, "max_quarantine_rate": 0.5},
           "tokenizer": {"algorithm": "bpe", "vocab_size": 600, "heldout_docs": 5},
           # rows_per_shard 3: several numbered shard files per language and split; top-up: a planned split
           "shards": {"seq_len": 48, "rows_per_shard": 3, "validation_fraction": 0.1, "min_validation_tokens": 300},
           "execution": execution}
    f = root / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return f


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """normalize + tokenizer, once."""
    root = tmp_path_factory.mktemp("parts")
    cfg = write_config(root)
    lc = load_config(cfg)
    plans = stages.plan(lc)
    for name in ("normalize", "tokenizer"):
        stages.execute(lc, name, plans)
    return cfg


def run_shards_with(cfg: Path, mapper=None, **overrides) -> tuple[dict, Path, int]:
    """Execute the shards stage (forced) with ``execution.*`` overrides; (manifest, folder, partitions)."""
    from mlm_core.shards.build import plan_shards
    lc = load_config(cfg, [f"execution.{k}={v}" for k, v in overrides.items()])
    plans = stages.plan(lc)
    store = StageStore(lc.workdir)
    up = {u: store.load(u, fp) for u, fp in plans["shards"].upstream.items()}
    n_parts = len(plan_shards(lc, up))
    art, hit = stages.execute(lc, "shards", plans, force=True, hooks={"mapper": mapper} if mapper else None)
    assert not hit
    return art.manifest, art.path, n_parts


def output_of(manifest: dict, folder: Path) -> dict:
    """What must not change: every shard (name, rows, sha256), the tables' bytes and the manifest's figures."""
    keep = ("shards", "sampling", "languages", "counts", "validation_docs", "dropped_languages", "files")
    tables = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in ("sampling.parquet", "stats.parquet")}
    return {**{k: manifest[k] for k in keep}, "tables": tables}


def test_partitioning_changes_nothing(upstream):
    big, path_big, n_big = run_shards_with(upstream, partition_mb=64)
    ref = output_of(big, path_big)
    assert n_big == len(LANGS)                           # one partition per language
    for mb in (0.002, 0.0001):                           # ~2 KB of text each; ~one document each
        m, path, n = run_shards_with(upstream, partition_mb=mb)
        assert n > 3 * len(LANGS), (mb, n)
        assert output_of(m, path) == ref, mb
    assert len(big["shards"]) > 2 * len(LANGS)           # numbering across several files per language
    assert not any(Path(path_big).parent.parent.glob("partitions/shards/*")), "partition folders left behind"


def _stream_docs(rows: np.ndarray, sep: int, pad: int) -> list[list[int]]:
    """Rows ([CLS] + seq_len-1 of the document stream) -> the documents (token id lists) between [SEP]s."""
    flat = rows[:, 1:].reshape(-1)
    flat = flat[flat != pad]
    out, cur = [], []
    for t in flat.tolist():
        if t == sep:
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    assert cur == [], "the stream ends inside a document"
    return out


def test_every_document_exactly_once_in_its_split(upstream):
    """Tiny partitions: each split's stream is its documents in file order, each encoded as the tokenizers
    library encodes it alone; validation = the k smallest (md5 prefix, row) documents (split.py's rule)."""
    from tokenizers import Tokenizer

    from mlm_core.shards.reader import read_shard_file
    m, path, n_parts = run_shards_with(upstream, partition_mb=0.0003)
    assert n_parts > 3 * len(LANGS)
    lc = load_config(upstream)
    plans = stages.plan(lc)
    norm = StageStore(lc.workdir).load("normalize", plans["normalize"].fingerprint)
    tart = StageStore(lc.workdir).load("tokenizer", plans["tokenizer"].fingerprint)
    tok = Tokenizer.from_file(str(tart.path / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True
    sp = {r: v["id"] for r, v in m["special_tokens"].items()}
    for lang in LANGS:
        t = pq.read_table(norm.path / "docs" / f"{lang}.parquet", columns=["text", "hash"])
        texts, hashes = t.column("text").to_pylist(), t.column("hash").to_pylist()
        k = m["validation_docs"][lang]
        order = sorted(range(len(texts)), key=lambda i: (int(hashes[i][:8], 16), i))
        val = set(order[:k])
        for split in ("train", "validation"):
            want = [tok.encode(texts[i], add_special_tokens=False).ids for i in range(len(texts))
                    if (i in val) == (split == "validation")]
            want = [w for w in want if w]                # an empty document adds nothing
            files = sorted(s["file"] for s in m["shards"] if s["lang"] == lang and s["split"] == split)
            assert files == [f"{split}/{lang}-{i:05d}.arrow" for i in range(len(files))]
            rows = np.concatenate([read_shard_file(path, f, m)["input_ids"] for f in files]).astype(np.int64)
            assert (rows[:, 0] == sp["cls"]).all()
            assert _stream_docs(rows, sp["sep"], sp["pad"]) == want, (lang, split)


def test_row_ranges_cover_every_document_once(tmp_path):
    import pyarrow as pa

    from mlm_core.shards.parts import read_range, row_ranges
    rng = np.random.default_rng(0)
    texts = [f"{i}:" + "é" * int(n) for i, n in enumerate(rng.integers(1, 200, 500))]    # ~2 bytes a character
    tbl = pa.table({"text": texts, "n_chars": pa.array([len(t) for t in texts], pa.int32()), "hash": ["0" * 32] * 500})
    pq.write_table(tbl, tmp_path / "x.parquet", row_group_size=64)
    nbytes = [len(t.encode()) for t in texts]
    for budget in (1, 500, 4096, 10**9):
        ranges = row_ranges(tmp_path / "x.parquet", budget)
        assert ranges[0][0] == 0 and ranges[-1][1] == 500
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(ranges, ranges[1:]))
        for a, b in ranges[:-1]:   # cut once its text reaches about the budget (sizes estimated from metadata)
            assert sum(nbytes[a:b - 1]) < 1.1 * budget or b - a == 1
        got = [s for a, b in ranges for batch in read_range(tmp_path / "x.parquet", a, b, 37)
               for s in batch.column(0).to_pylist()]
        assert got == texts, budget
    assert len(row_ranges(tmp_path / "x.parquet", 10**9)) == 1
    assert len(row_ranges(tmp_path / "x.parquet", 1)) == 500


def test_the_cut_is_the_hash_order_prefix():
    """validation_of(prefix, rows, split_cut(prefix, k)) == "rank < k" in (prefix, row) order, ties included."""
    from mlm_core.shards.parts import split_cut, validation_of
    rng = np.random.default_rng(1)
    for n in (1, 2, 7, 300):
        prefix = rng.integers(0, 8, n).astype(np.uint32) * np.uint32(2**29)     # many ties
        order = sorted(range(n), key=lambda i: (int(prefix[i]), i))
        for k in range(n + 1):
            want = np.zeros(n, bool)
            want[order[:k]] = True
            got = validation_of(prefix, np.arange(n), split_cut(prefix, k))
            assert (got == want).all(), (n, k)


def test_a_partition_result_that_is_not_its_own_is_refused(upstream):
    """The merge checks every document was encoded once: a result from another partition (a stale or
    mixed-up folder) fails the stage, naming the partition."""
    from mlm_core.errors import StageError

    def swapped(fn, jobs):
        out = [fn(j) for j in jobs]
        out[1], out[2] = out[2], out[1]
        return out
    with pytest.raises(StageError, match=r"shards: partition 1 \(ar rows \d+\.\.\d+\): result .* does not belong to it"):
        run_shards_with(upstream, mapper=swapped, partition_mb=0.002)
