"""Benchmark: the shards stage against raw ``encode_batch`` and the Hugging Face ``run_mlm.py`` recipe.

Not a test; prints a table. Everything runs on generated text (deterministic, several scripts),
so it needs no download:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/shards.py            # 80 MB
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/shards.py --mb 20 --out bench-out/shards

Measured, each in a fresh subprocess (peak RSS = that process and its children):
  (a) ours      ``run_shards`` on a normalize-like ``docs/<lang>.parquet`` folder -> packed Arrow shards
  (b) limit     ``Tokenizer.encode_batch`` over the same texts (no packing, no writing)
  (c) hf        ``load_dataset("parquet")`` + ``.map(tokenize, batched, num_proc=2)`` + ``group_texts`` +
                ``save_to_disk`` (run_mlm.py; group_texts keeps the last partial block so counts compare)
Targets: (a) >= 0.9 x (b) throughput; (a) >= 1.1 x (c); output (c)/(a) >= 8; equal token counts.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
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
