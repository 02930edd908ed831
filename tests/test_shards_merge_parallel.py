"""The shards merge as a parallel map (issue 23 item 1): every file byte-identical to the one-pass merge.

The reference is the one-pass packer (``build.pack_language``, the merge as it was before the map:
``merge_shards(serial=True)``), run on the same encoded partitions. A small real corpus (the first lines of
../shared/data/text in five scripts, plus English lines with listed words so that CDA copies exist) is
normalized, tokenized and encoded once into ~one-document partitions, so output files straddle partitions and
partitions straddle files; the merge then runs serially and with 1, 2 and 4 workers at several row lengths
and file sizes, and on a Dask LocalCluster through the stage's flow.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import REPO
from mlm_core import stages
from mlm_core.config.io import load_config
from mlm_core.store import StageStore

DATA = REPO.parent / "shared" / "data" / "text"
LANGS = ("en", "ru", "hi", "zh", "ar")
TINY = "execution.partition_mb=0.0003"          # about one document per partition


def write_config(root: Path) -> Path:
    srcs = {}
    for lang in LANGS:
        every = (DATA / f"{lang}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        lines = every[:40]
        if lang == "en":
            lines += [x for x in every[40:] if re.search(r"\b(he|she|his|her|him|man|woman)\b", x, re.I)][:30]
        p = root / "raw" / f"{lang}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("".join(lines), encoding="utf-8")
        srcs[lang] = {"paths": [str(p)]}
    raw = {"name": "merge", "workdir": str(root / "work"), "sources": srcs, "seed": 3,
           "normalize": {"workers": 1, "min_chars": 5, "max_quarantine_rate": 0.5},
           "tokenizer": {"algorithm": "bpe", "vocab_size": 600, "heldout_docs": 5},
           "shards": {"seq_len": 48, "rows_per_shard": 3, "validation_fraction": 0.1, "min_validation_tokens": 300,
                      "cda": {"share": 0.6, "lists": {"en": str(REPO / "configs" / "bias" / "en.yaml")}}},
           "tracking": {"enabled": False}}
    f = root / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return f


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """normalize + tokenizer, then the shards plan and every partition encoded (the map), once."""
    from mlm_core.shards.build import plan_shards, process_shards
    root = tmp_path_factory.mktemp("merge")
    cfg = write_config(root)
    lc = load_config(cfg, [TINY])
    plans = stages.plan(lc)
    for name in ("normalize", "tokenizer"):
        stages.execute(lc, name, plans)
    store = StageStore(lc.workdir)
    up = {u: store.load(u, fp) for u, fp in plans["shards"].upstream.items()}
    parts = plan_shards(lc, up)
    dirs = [root / "parts" / f"{p['index']:06d}" for p in parts]
    results = [process_shards(lc, up, p, d) for p, d in zip(parts, dirs)]
    return {"cfg": cfg, "root": root, "up": up, "parts": parts, "results": results, "dirs": dirs}


def files_of(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json" and not p.name.startswith(".")}


def merged(e: dict, out: Path, *overrides: str, serial: bool = False) -> tuple[dict, dict]:
    from mlm_core.shards.build import merge_shards
    lc = load_config(e["cfg"], [TINY, *overrides])
    out.mkdir(parents=True)
    m = merge_shards(lc, e["up"], e["parts"], e["results"], e["dirs"], out, serial=serial)
    return m, files_of(out)


@pytest.mark.parametrize("shape", [("48", "3"), ("8", "25"), ("48", "1"), ("512", "1000")])
def test_parallel_merge_equals_the_one_pass_merge(encoded, shape):
    """seq_len x rows_per_shard: many small files (documents cut across rows, files and partitions), rows
    shorter than most documents, one row per file, one file per stream. Every file's bytes and the manifest
    equal the one-pass merge's."""
    seq_len, rps = shape
    over = (f"shards.seq_len={seq_len}", f"shards.rows_per_shard={rps}")
    root = encoded["root"] / f"out-{seq_len}-{rps}"
    ref_m, ref_files = merged(encoded, root / "serial", *over, serial=True)
    assert ref_m["cda"]["languages"]["en"]["swapped"] > 0
    assert len(ref_m["shards"]) >= 2 * len(LANGS)
    assert all(ref_files[s["file"]] == s["sha256"] for s in ref_m["shards"])
    for w in (1, 2, 4):
        m, files = merged(encoded, root / f"w{w}", *over, f"shards.merge_workers={w}")
        assert files == ref_files, (shape, w)
        assert m == ref_m, (shape, w)


def test_the_plan_crosses_partition_and_file_boundaries(encoded):
    """The case the map has to get right is present: files made of several partitions' pieces, and
    partitions whose stream is cut across files (the reference test above would pass trivially otherwise)."""
    from collections import Counter

    from mlm_core.shards.merge import plan_streams
    from mlm_core.shards.pack import Layout
    lc = load_config(encoded["cfg"], [TINY])
    langs = list(dict.fromkeys(p["lang"] for p in encoded["parts"]))
    dirs_of = {lang: [str(d) for p, d in zip(encoded["parts"], encoded["dirs"]) if p["lang"] == lang]
               for lang in langs}
    layout = Layout.for_vocab(600, lc.config.shards.seq_len, 1, 0)
    jobs, _ = plan_streams(langs, dirs_of, {"en"}, layout, lc.config.shards.rows_per_shard)
    assert any(len(j.pieces) > 1 for j in jobs)
    spans = Counter((p.src.part_dir, p.src.key) for j in jobs for p in j.pieces)
    assert max(spans.values()) > 1


def test_merge_workers_is_in_no_fingerprint(encoded):
    plans = {w: stages.plan(load_config(encoded["cfg"], [f"shards.merge_workers={w}"])) for w in (1, 4)}
    assert plans[1]["shards"].fingerprint == plans[4]["shards"].fingerprint


def test_parallel_merge_on_a_dask_local_cluster_equals_the_one_pass_merge(encoded, prefect_harness, monkeypatch):
    """engine dask (a LocalCluster of 2 processes), the stage's Prefect flow, 4 merge workers: the stored
    files and the manifest's shard table equal the one-pass merge of engine local."""
    import tasks.engine as engine
    from flows.pipeline import STAGE_FLOWS
    used, real = [], engine.mapper_for
    monkeypatch.setattr(engine, "mapper_for", lambda lc, stage: used.append(real(lc, stage)) or used[-1])
    ref_m, ref_files = merged(encoded, encoded["root"] / "dask-ref", serial=True)
    [res] = STAGE_FLOWS["shards"](config_path=str(encoded["cfg"]), force=True, overrides=[
        "execution.engine=dask", "execution.workers=2", "execution.partition_mb=0.002", "shards.merge_workers=4"])
    assert [type(m) for m in used] == [engine.DaskMapper]         # the partitions ran on the cluster
    got = files_of(Path(res["path"]))
    assert got == ref_files
    import json
    m = json.loads((Path(res["path"]) / "manifest.json").read_text())
    assert m["shards"] == ref_m["shards"]
    assert {k: v["sha256"] for k, v in m["files"].items()} == {k: v for k, v in ref_files.items() if k in m["files"]}
    assert len(m["files"]) == len(ref_files)


# ---------------------------------------------------------------- random streams, at the packer level
def _random_parts(root: Path, rng, n_parts: int, vocab: int, ids_dtype, cda: bool) -> list[str]:
    """Partition folders of random documents (empty ones and empty partitions/splits included)."""
    from mlm_core.shards.encode import Encoded
    from mlm_core.shards.parts import PartWriter
    dirs = []
    for i in range(n_parts):
        w = PartWriter(("train", "validation", "cda") if cda else ("train", "validation"))
        for split in w.chunks:
            n_docs = int(rng.choice([0, 1, 3, 40]))
            lens = rng.integers(0, 60, n_docs) * (rng.random(n_docs) > 0.15)      # some empty documents
            n = int(lens.sum())
            w.add(split, Encoded(rng.integers(5, vocab, n).astype(ids_dtype),
                                 (rng.random(n) < 0.4).astype(np.uint8), lens.astype(np.int64)))
        d = root / f"p{i:03d}"
        w.save(d, np.dtype(ids_dtype), {})
        dirs.append(str(d))
    return dirs


@pytest.mark.parametrize("seed", range(6))
def test_random_streams_equal_the_one_pass_packer(tmp_path, seed):
    """Random document lengths (empty documents, partitions and splits), row lengths, file sizes and both
    stored layouts (folded ids; uint16 ids with bit-packed word starts): the map writes the one-pass packer's
    files and counts, with 1, 2 and 4 workers."""
    from mlm_core.shards.build import pack_language
    from mlm_core.shards.layout import Layout
    from mlm_core.shards.merge import plan_streams, write_files
    rng = np.random.default_rng(seed)
    vocab = int(rng.choice([600, 40_000]))
    seq_len, rps = int(rng.choice([8, 17, 64])), int(rng.choice([1, 2, 5, 1000]))
    layout = Layout.for_vocab(vocab, seq_len, sep=3, pad=0)
    cda = bool(seed % 2)
    dirs = _random_parts(tmp_path / "parts", rng, int(rng.integers(1, 8)), vocab, layout.ids, cda)
    ref_files, ref_stats = pack_language("xx", [Path(d) for d in dirs], cda, tmp_path / "ref", layout, 2, rps, 7)
    ref = files_of(tmp_path / "ref")
    for w in (1, 2, 4):
        jobs, per_lang = plan_streams(["xx"], {"xx": dirs}, {"xx"} if cda else set(), layout, rps)
        got = write_files(jobs, tmp_path / f"w{w}", layout, 2, w)
        assert got == ref_files and per_lang["xx"] == ref_stats, (seed, w)
        assert files_of(tmp_path / f"w{w}") == ref, (seed, w)


def test_a_special_id_inside_a_document_fails_naming_the_stream(tmp_path):
    from mlm_core.errors import StageError
    from mlm_core.shards.encode import Encoded
    from mlm_core.shards.layout import Layout
    from mlm_core.shards.merge import plan_streams, write_files
    from mlm_core.shards.parts import PartWriter
    layout = Layout.for_vocab(600, 16, sep=3, pad=0)
    w = PartWriter()
    w.add("train", Encoded(np.array([7, 8, 3, 9], np.uint16), np.zeros(4, np.uint8), np.array([4], np.int64)))
    w.save(tmp_path / "p", np.dtype(np.uint16), {})
    jobs, _ = plan_streams(["xx"], {"xx": [str(tmp_path / "p")]}, set(), layout, 4)
    msg = r"shards: train/xx: a document encodes to the \[SEP\] or \[PAD\] id \(3/0\)"
    with pytest.raises(StageError, match=msg):
        write_files(jobs, tmp_path / "out", layout, 2, 2)
