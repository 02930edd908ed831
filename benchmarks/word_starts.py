"""Benchmark: what the shards stage's word starts cost per language, next to the tokenizer's own encode_batch.

Not a test; prints a table. The shards stage's throughput target is >= 0.9x the tokenizer's ``encode_batch`` alone
(README "Performance"). What it adds per document batch, in its one Python thread, is the flattening of the
Encodings into arrays (``encodings_to_arrays``) and, inside that, the word starts of scripts the pre-tokenizer
gets wrong (``refine_word_starts``: ICU word boundaries for no-space runs, combining marks; it reads each selected
document's token offsets from Python lists). This prints, per language of the real text in ../shared/data/text,
each part in seconds per MB and as a share of one thread's ``encode_batch`` (the min of ``--repeat`` timings,
so the machine's other load counts as little as it can):

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/word_starts.py --tokenizer PATH/tokenizer.json

``--tokenizer``: any tokenizer.json (e.g. ``<workdir>/tokenizer/<fp>/tokenizer.json`` of a run); default: a
byte-level BPE of 8000 trained here on the same text (the pre-tokenizer that splits at combining marks).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")      # one encode thread: the per-thread cost is what compares
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import table  # noqa: E402

DATA = REPO.parent / "shared" / "data" / "text"


def best(fn, k: int) -> float:
    ts = []
    for _ in range(k):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json (default: byte-level BPE 8000 trained here)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import numpy as np
    from tokenizers import Tokenizer
    from mlm_core.shards.encode import encodings_to_arrays, prepare_tokenizer
    from mlm_core.shards.words import refine_word_starts

    files = sorted(DATA.glob("??.txt"))
    if not files:
        sys.exit(f"no text in {DATA}")
    texts = {f.stem: [ln for ln in f.read_text(encoding="utf-8").splitlines() if ln.strip()] for f in files}
    if args.tokenizer:
        tok = Tokenizer.from_file(str(args.tokenizer))
        name = str(args.tokenizer)
    else:
        from tokenizers import models, pre_tokenizers, trainers, decoders
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([t for v in texts.values() for t in v],
                                trainers.BpeTrainer(vocab_size=8000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        name = "byte-level BPE 8000 (trained here)"
    tok = prepare_tokenizer(tok)
    rows = []
    for lang, lines in texts.items():
        mb = sum(len(t.encode()) for t in lines) / 1e6
        encs = tok.encode_batch(lines, add_special_tokens=False)
        lens = np.array([len(e) for e in encs], dtype=np.int64)
        ws = np.ones(int(lens.sum()), dtype=np.uint8)
        t_enc = best(lambda: tok.encode_batch(lines, add_special_tokens=False), args.repeat)
        t_arr = best(lambda: encodings_to_arrays(encs, np.dtype(np.uint32), lines), args.repeat)
        t_ref = best(lambda: refine_word_starts(lines, encs, lens, ws), args.repeat)
        rows.append([lang, f"{mb:.2f}", f"{t_enc / mb:.3f}", f"{t_arr / mb:.3f}", f"{t_ref / mb:.3f}",
                     f"{t_arr / t_enc:.2f}", f"{t_ref / t_enc:.2f}"])
    print(f"tokenizer: {name}; min of {args.repeat}; load average {os.getloadavg()[0]:.1f}\n")
    print(table(["lang", "MB", "encode_batch s/MB (1 thread)", "to arrays s/MB (all)", "word starts s/MB (part)",
                 "arrays / encode", "word starts / encode"], rows))


if __name__ == "__main__":
    main()
