"""Benchmark: the shards stage against raw ``encode_batch`` and the Hugging Face ``run_mlm.py`` recipe.

Not a test; prints a table. Everything runs on generated text (deterministic, several scripts),
so it needs no download:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/shards.py            # 80 MB
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/shards.py --mb 20 --out bench-out/shards

Measured, each in a fresh subprocess (peak RSS = summed RSS of its process tree, polled with psutil every 50 ms):
  (a) ours      ``run_shards`` on a normalize-like ``docs/<lang>.parquet`` folder -> packed Arrow shards
  (b) limit     ``Tokenizer.encode_batch`` over the same texts (no packing, no writing)
  (c) hf        ``load_dataset("parquet")`` + ``.map(tokenize, batched, num_proc=2)`` + ``group_texts`` +
                ``save_to_disk`` (run_mlm.py; group_texts keeps the last partial block so counts compare)
Targets: (a) >= 0.9 x (b) throughput; (a) >= 1.1 x (c); output (c)/(a) >= 8; equal token counts.

Then the reader (``job_reader``): sequences/s to ready tensors from (a)'s shards (format v3) and from the same
rows re-written in format v2, side by side in one process; and bytes per position on disk. Targets: v3 <= 2.5
bytes per position; v3 reader throughput >= v2's. ``--reader-only --mb 10`` runs just (a) and the reader.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# ----------------------------------------------------------------------------------------- corpus
# Syllable inventories per language; words are 1-4 syllables, drawn from a Zipf-distributed lexicon.
SYLLABLES = {
    "en": "ba be bi bo ka ke ki ko la le li lo ma me mi mo na ne ni no ra re ri ro sa se si so ta te ti to "
          "th sh ch ing er an on en st tr pr gr".split(),
    "fr": "la le les de du ré é è ou oi au eau pa pe po ma mo ni nu ra ri ro sa se si ta te ti vi vo qu "
          "on an en in ch gn".split(),
    "de": "ge be ver der die das sch st ein un ka ke ki ko la le li ma mi na ne ni ra re ri sa se ta te "
          "ü ö ä ung heit ich".split(),
    "ru": "ка ко ку ла ле ли ло ма ме ми мо на не ни но ра ре ри ро са се си со та те ти то ва ве ви во "
          "ст пр ж ш щ ый ая ое".split(),
    "el": "κα κο λα λε λι μα με μι να νε νι ρα ρε ρι σα σε σι τα τε τι πα πο θα θε ος ης ου".split(),
    "ar": "كا كي كو لا لي لو ما مي مو نا ني نو را ري رو سا سي سو تا تي تو با بي بو ال ة ين ون".split(),
    "hi": "क का कि की ल ला लि म मा मि न ना नि र रा रि स सा सि त ता ति प पा पि ह है कों में".split(),
    "zh": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么心多"),
}
PUNCT = {"ar": "،.؟", "hi": "।,?", "zh": "，。？", "el": ",.;"}
NO_SPACE = {"zh"}
LANGS = tuple(SYLLABLES)


def _lexicon(lang: str, rng: random.Random, size: int = 12_000) -> list[str]:
    syl = SYLLABLES[lang]
    words, seen = [], set()
    while len(words) < size:
        n = rng.choice((1, 2, 2, 3, 3, 4)) if lang != "zh" else rng.choice((1, 2, 2, 3))
        w = "".join(rng.choice(syl) for _ in range(n))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def generate_docs(lang: str, n_bytes: int, seed: int = 0) -> list[str]:
    """Deterministic documents of Zipf-distributed words (about ``n_bytes`` of UTF-8)."""
    import numpy as np
    rng = random.Random(f"{seed}-{lang}")
    lex = np.array(_lexicon(lang, rng), dtype=object)
    g = np.random.default_rng(abs(hash_str(lang)) + seed)
    punct = PUNCT.get(lang, ",.?")
    sep = "" if lang in NO_SPACE else " "
    docs, total = [], 0
    while total < n_bytes:
        n_words = int(g.integers(20, 400))
        idx = np.minimum(g.zipf(1.15, n_words) - 1, len(lex) - 1)
        words = lex[idx].tolist()
        # sentence ends every 6-18 words
        pos = np.cumsum(g.integers(6, 18, max(1, n_words // 6 + 1)))
        for p in pos[pos < n_words][::-1]:
            words[p - 1] = words[p - 1] + (punct[0] if p % 3 == 0 else punct[1])
        d = sep.join(words) + punct[1]
        docs.append(d[0].upper() + d[1:] if lang in ("en", "fr", "de", "ru", "el") else d)
        total += len(d.encode())
    return docs


def hash_str(s: str) -> int:
    import zlib
    return zlib.crc32(s.encode())


def write_corpus(root: Path, mb: float, seed: int = 0) -> dict:
    """docs/<lang>.parquet in the normalize stage's format (doc_id, lang, text, n_chars, hash)."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq
    docs_dir = root / "normalize" / "docs"
    docs_dir.mkdir(parents=True, exist_ok=True)
    per_lang = int(mb * 1e6 / len(LANGS))
    out = {}
    for lang in LANGS:
        texts = generate_docs(lang, per_lang, seed)
        tbl = pa.table({"doc_id": pa.array(range(len(texts)), pa.int64()), "lang": pa.array([lang] * len(texts)),
                        "text": pa.array(texts, pa.string()),
                        "n_chars": pa.array([len(t) for t in texts], pa.int32()),
                        "hash": pa.array([hashlib.md5(t.encode()).hexdigest() for t in texts], pa.string())})
        pq.write_table(tbl, docs_dir / f"{lang}.parquet", compression="zstd", row_group_size=20_000)
        out[lang] = {"docs": len(texts), "bytes": sum(len(t.encode()) for t in texts)}
    return out


def sample_texts(root: Path, mb: float) -> list[str]:
    """A language-balanced sample of about ``mb`` MB from the corpus."""
    import pyarrow.parquet as pq
    texts, per_lang = [], mb * 1e6 / len(LANGS)
    for lang in LANGS:
        n = 0
        for t in pq.read_table(root / "normalize" / "docs" / f"{lang}.parquet", columns=["text"]).column(0).to_pylist():
            if n >= per_lang:
                break
            texts.append(t)
            n += len(t.encode())
    return texts


def all_texts(root: Path) -> list[str]:
    import pyarrow.parquet as pq
    return [t for lang in LANGS
            for t in pq.read_table(root / "normalize" / "docs" / f"{lang}.parquet", columns=["text"]).column(0).to_pylist()]


def dir_bytes(p: Path) -> int:
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())


# ----------------------------------------------------------------------------------------- jobs (subprocesses)
def _artifacts(root: Path):
    from mlm_core.artifacts import parse
    tok_dir = root / "tokenizer"
    manifest = json.loads((tok_dir / "manifest.json").read_text())
    return (parse("normalize", root / "normalize", {}, "bench-normalize", strict=False),
            parse("tokenizer", tok_dir, manifest, "bench-tokenizer", strict=False))


def job_ours(root: Path, seq_len: int, workers: int) -> dict:
    from mlm_core.config.io import load_config
    from mlm_core.shards import run_shards
    norm, tok = _artifacts(root)
    out = root / f"ours-w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    lc = load_config(raw={"sources": {lang: {"paths": [str(Path(__file__).resolve())]} for lang in LANGS},
                          "shards": {"seq_len": seq_len, "workers": workers}})
    t0 = time.perf_counter()
    m = run_shards(lc, {"normalize": norm, "tokenizer": tok}, out)
    dt = time.perf_counter() - t0
    content = sum(p[f"content_tokens_{s}"] for p in m["languages"].values() for s in ("train", "validation"))
    res = {"seconds": dt, "tokens": content, "rows": m["counts"]["rows"], "out_bytes": dir_bytes(out)}
    (out / "manifest.json").write_text(json.dumps(m))     # for the reader job (ShardDataset, verify="off")
    return res


def job_encode(root: Path) -> dict:
    from tokenizers import Tokenizer

    from mlm_core.shards.build import prepare_tokenizer
    tok = prepare_tokenizer(Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json")))
    texts = all_texts(root)
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 2000):
        n += sum(len(e) for e in tok.encode_batch(texts[i:i + 2000], add_special_tokens=False))
    return {"seconds": time.perf_counter() - t0, "tokens": n, "rows": 0, "out_bytes": 0}


def job_hf(root: Path, seq_len: int, workers: int) -> dict:
    """run_mlm.py (transformers examples, line_by_line=False): tokenize, group_texts, save_to_disk."""
    os.environ["HF_DATASETS_CACHE"] = str(root / "hf-cache")
    shutil.rmtree(root / "hf-cache", ignore_errors=True)
    out = root / "hf-saved"
    shutil.rmtree(out, ignore_errors=True)
    from itertools import chain

    import numpy as np
    from datasets import load_dataset
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    tok_obj = Tokenizer.from_file(str(root / "tokenizer" / "tokenizer.json"))
    sp = {r: e["token"] for r, e in json.loads((root / "tokenizer" / "manifest.json").read_text())["special_tokens"].items()}
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok_obj, pad_token=sp["pad"], unk_token=sp["unk"],
                                     cls_token=sp["cls"], sep_token=sp["sep"], mask_token=sp["mask"],
                                     model_max_length=10**9)
    t0 = time.perf_counter()
    files = [str(root / "normalize" / "docs" / f"{lang}.parquet") for lang in LANGS]
    raw = load_dataset("parquet", data_files=files, split="train")

    def tokenize(examples):
        return hf_tok(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize, batched=True, num_proc=workers, remove_columns=raw.column_names)

    def group_texts(examples):
        # run_mlm.py's group_texts, except that the last partial block is kept (so token counts compare)
        concatenated = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(concatenated[list(examples.keys())[0]])
        return {k: [t[i: i + seq_len] for i in range(0, total, seq_len)] for k, t in concatenated.items()}

    grouped = tokenized.map(group_texts, batched=True, num_proc=workers)
    grouped.save_to_disk(str(out))
    dt = time.perf_counter() - t0
    n = rows = 0
    for batch in grouped.with_format("numpy").iter(batch_size=10_000):
        stm = batch["special_tokens_mask"]
        flat = np.concatenate(list(stm)) if stm.dtype == object else stm.reshape(-1)
        n += int((flat == 0).sum())
        rows += len(stm)
    return {"seconds": dt, "tokens": n, "rows": rows, "out_bytes": dir_bytes(out),
            "cache_bytes": dir_bytes(root / "hf-cache")}


def run_job(root: Path, job: str, args) -> dict:
    """Run one job in a fresh interpreter; peak RSS = max over time of the summed RSS of its process tree."""
    import psutil
    cmd = [sys.executable, __file__, "--job", job, "--out", str(root), "--seq-len", str(args.seq_len),
           "--workers", str(args.workers)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            procs = [ps] + ps.children(recursive=True)
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    out = proc.stdout.read()
    if proc.returncode:
        raise SystemExit(f"job {job} failed (rc={proc.returncode}):\n{out}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss"] = peak
    return res


def _tokenizer_folder(root: Path, vocab: int):
    """Train the benchmark's byte-level BPE on a 5 MB sample; write it as a tokenizer stage folder."""
    from mlm_core.config import TokenizerConfig
    from mlm_core.tokenizer.build import special_ids, train
    tok = train(TokenizerConfig(algorithm="bpe", vocab_size=vocab), sample_texts(root, 5))
    tdir = root / "tokenizer"
    tdir.mkdir()
    tok.save(str(tdir / "tokenizer.json"))
    (tdir / "manifest.json").write_text(json.dumps({
        "vocab_size": tok.get_vocab_size(with_added_tokens=True), "algorithm": "bpe",
        "special_tokens": {r: {"token": t, "id": i} for r, (t, i) in special_ids("bert").items()}}))
    return tok


def rss_mode(root: Path, sizes: list[float], args) -> None:
    """Peak RSS of our shards stage alone at several corpus sizes (streaming: it should not grow)."""
    rows = []
    for mb in sizes:
        d = root / f"rss-{mb:g}MB"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        nbytes = sum(c["bytes"] for c in write_corpus(d, mb).values())
        _tokenizer_folder(d, args.vocab)
        r = run_job(d, "ours", args)
        rows.append((mb, nbytes, r))
        print(f"  {mb:g} MB: {r['seconds']:.1f} s, peak RSS {r['peak_rss'] / 2**20:.0f} MB", flush=True)
    print(f"\n| corpus | s | MB/s | peak RSS MB |\n|---|---:|---:|---:|")
    for mb, nbytes, r in rows:
        print(f"| {mb:g} MB | {r['seconds']:.1f} | {nbytes / 1e6 / r['seconds']:.2f} | {r['peak_rss'] / 2**20:.0f} |")
    if len(rows) > 1:
        print(f"\npeak RSS at {rows[-1][0]:g} MB / at {rows[0][0]:g} MB = "
              f"{rows[-1][2]['peak_rss'] / rows[0][2]['peak_rss']:.2f}   target: flat (about 1)")


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    from shards_reader import job_reader, print_reader
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=80.0, help="corpus size (MB of UTF-8 text)")
    ap.add_argument("--out", default="bench-out/shards", help="scratch folder (deleted and rewritten)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=16_000)
    ap.add_argument("--workers", type=int, default=2, help="processes for (a) and num_proc for (c)")
    ap.add_argument("--repeat", type=int, default=1, help="run each job this many times (interleaved), keep the best")
    ap.add_argument("--skip-train-speed", action="store_true", help="skip the tokenizer training-speed table")
    ap.add_argument("--rss-sizes", help="flat-memory mode: comma-separated MB sizes (e.g. 100,1000); runs only (a) "
                    "at each size and prints its peak RSS (target: flat)")
    ap.add_argument("--reader-only", action="store_true",
                    help="only (a) and the reader throughput v2 vs v3 (use a small --mb, e.g. 10)")
    ap.add_argument("--job", choices=["ours", "ours3", "encode", "hf", "reader"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = Path(args.out).resolve()
    if args.rss_sizes and not args.job:
        rss_mode(root, [float(x) for x in args.rss_sizes.split(",")], args)
        return
    if args.reader_only and not args.job:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        write_corpus(root, args.mb)
        _tokenizer_folder(root, args.vocab)
        r = run_job(root, "ours", args)
        print(f"(a) ours: {r['seconds']:.1f} s, {r['rows']} rows")
        print_reader(run_job(root, "reader", args))
        return

    if args.job:
        res = {"ours": lambda: job_ours(root, args.seq_len, args.workers),
               "ours3": lambda: job_ours(root, args.seq_len, 3),
               "encode": lambda: job_encode(root),
               "hf": lambda: job_hf(root, args.seq_len, args.workers),
               "reader": lambda: job_reader(root)}[args.job]()
        print(json.dumps(res))
        return

    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    t0 = time.perf_counter()
    corpus = write_corpus(root, args.mb)
    nbytes = sum(c["bytes"] for c in corpus.values())
    print(f"corpus: {nbytes / 1e6:.1f} MB, {sum(c['docs'] for c in corpus.values())} docs, "
          f"{len(LANGS)} languages ({', '.join(LANGS)}), written in {time.perf_counter() - t0:.1f} s")

    from mlm_core.tokenizer.build import train_seconds_per_mb
    t0 = time.perf_counter()
    tok = _tokenizer_folder(root, args.vocab)
    print(f"tokenizer: byte-level BPE, vocab {tok.get_vocab_size()}, trained on 5 MB in {time.perf_counter() - t0:.1f} s")

    jobs = [("(a) ours: run_shards, workers=%d" % args.workers, "ours"),
            ("(a3) ours: run_shards, 3 procs", "ours3"),
            ("(b) encode_batch (limit)", "encode"), ("(c) HF run_mlm.py way", "hf")]
    res: dict[str, dict] = {}
    for rep in range(args.repeat):          # interleaved repeats, best kept: the box may be shared
        for label, job in jobs:
            r = run_job(root, job, args)
            print(f"  ran {label}: {r['seconds']:.1f} s, peak RSS {r['peak_rss'] / 2**20:.0f} MB", flush=True)
            if job not in res or r["seconds"] < res[job]["seconds"]:
                res[job] = {**r, "peak_rss": max(r["peak_rss"], res.get(job, {}).get("peak_rss", 0))}

    print(f"\n{args.mb:.0f} MB, seq_len {args.seq_len}, {os.cpu_count()} cores, workers/num_proc {args.workers}, "
          f"best of {args.repeat}; load average now {os.getloadavg()[0]:.2f}\n")
    print(f"| {'job':40} | {'s':>6} | {'MB/s':>6} | {'Mtok/s':>6} | {'peak RSS MB':>11} | {'output MB':>9} | {'tokens':>11} |")
    print(f"|{'-' * 42}|{'-' * 8}|{'-' * 8}|{'-' * 8}|{'-' * 13}|{'-' * 11}|{'-' * 13}|")
    for label, job in jobs:
        r = res[job]
        extra = f" (+{r['cache_bytes'] / 1e6:.0f} MB cache)" if "cache_bytes" in r else ""
        print(f"| {label:40} | {r['seconds']:6.1f} | {nbytes / 1e6 / r['seconds']:6.2f} | "
              f"{r['tokens'] / 1e6 / r['seconds']:6.2f} | {r['peak_rss'] / 2**20:11.0f} | "
              f"{r['out_bytes'] / 1e6:9.1f} | {r['tokens']:11d} |{extra}")
    a, a3, b, c = res["ours"], res["ours3"], res["encode"], res["hf"]
    tput = lambda r: r["tokens"] / r["seconds"]  # noqa: E731
    print()
    print(f"(a)/(b) throughput  {tput(a) / tput(b):.2f}   target >= 0.9   (a3)/(b) {tput(a3) / tput(b):.2f}")
    print(f"(a)/(c) throughput  {tput(a) / tput(c):.2f}   target >= 1.1   (a3)/(c) {tput(a3) / tput(c):.2f}")
    print(f"(c)/(a) output size {c['out_bytes'] / a['out_bytes']:.1f}    target >= 8")
    print(f"tokens (a) {a['tokens']} vs (c) {c['tokens']} vs (b) {b['tokens']}: "
          f"{'equal' if a['tokens'] == c['tokens'] == b['tokens'] else 'DIFFERENT'}")

    print_reader(run_job(root, "reader", args))

    if not args.skip_train_speed:
        sample = sample_texts(root, 2)
        mb = sum(len(t.encode()) for t in sample) / 1e6
        print(f"\ntokenizer training on a {mb:.1f} MB sample, vocab 8000:")
        for algo in ("bpe", "wordpiece", "unigram"):
            print(f"  {algo:10} {train_seconds_per_mb(algo, sample, 8000):6.2f} s/MB", flush=True)


if __name__ == "__main__":
    main()
