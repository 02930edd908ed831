"""Generate the bundled demo corpus: ``python -m mlm_core.demo.generate [OUT_DIR]``.

Writes (default ``OUT_DIR``: ``configs/demo/`` of the repository)::

    corpus/<lang>.txt            raw pretraining text, one document (1-4 sentences) per line
    parallel.jsonl               one line per (id, lang): id, topic, lang, text, tokens, upos
    bias/crows_pairs_<lang>.csv  CrowS-Pairs-style minimal pairs (en, fr, de)
    bias/templates_<lang>.yaml   masked-slot templates with group and attribute words
    README.md                    what all of this is, with the sizes

Only the standard library is used, every random draw comes from ``random.Random`` with a fixed
seed, and all text is NFC, so the output is byte-for-byte reproducible.

Text rule for ``parallel.jsonl`` (and the corpus): ``zh`` text is the tokens concatenated; for the
other languages tokens are joined with one space, except that ``PUNCT`` tokens attach to the
previous token. See :func:`mlm_core.demo.lexicon.detokenize`.

Noise added on purpose to the raw corpus (a normalizer should handle all of it): about 1% exact
duplicate documents, a few lines with a doubled internal space, a few with trailing spaces, a few
with a zero-width space (U+200B) next to a word boundary, and a handful (<= 0.15%) of empty lines.
"""
from __future__ import annotations

import json
import pathlib
import random
import sys
import time
import unicodedata

from . import bias, lang_ar, lang_de, lang_en, lang_fr, lang_hi, lang_ru, lang_zh
from .handwritten import HANDWRITTEN
from .lexicon import LANGS, TOPIC_WEIGHTS, TOPICS, Frame, detokenize, sample_frame

REALIZERS = {"en": lang_en.realize, "fr": lang_fr.realize, "de": lang_de.realize, "ru": lang_ru.realize,
             "ar": lang_ar.realize, "hi": lang_hi.realize, "zh": lang_zh.realize}
# Target sizes of the raw corpus files in bytes (largest / smallest > 20).
TARGET_BYTES = {"en": 800_000, "fr": 360_000, "de": 270_000, "ru": 230_000, "ar": 110_000, "hi": 95_000,
                "zh": 36_000}
SCRIPT_NAMES = {"en": "Latin", "fr": "Latin", "de": "Latin", "ru": "Cyrillic", "ar": "Arabic",
                "hi": "Devanagari", "zh": "Han"}
CORPUS_SEEDS = {lang: 20240 + i for i, lang in enumerate(LANGS)}
PARALLEL_SEED = 7001
PARALLEL_PER_TOPIC = 42          # 6 topics x 42 = 252 parallel ids
HANDWRITTEN_RATE = 0.06          # share of corpus sentences taken from the hand-written lists
MIN_DOC_CHARS = 8                # e.g. zh "狗睡觉。" alone would be too short for the normalizer
ZWSP = "\u200b"
DEFAULT_OUT = pathlib.Path(__file__).resolve().parents[2] / "configs" / "demo"


def render(frame: Frame, lang: str) -> tuple[list[str], list[str]]:
    """Tokens (NFC) and UPOS tags of ``frame`` in ``lang``."""
    pairs = REALIZERS[lang](frame)
    return [unicodedata.normalize("NFC", t) for t, _ in pairs], [u for _, u in pairs]


def sentence(frame: Frame, lang: str) -> str:
    tokens, upos = render(frame, lang)
    return detokenize(tokens, lang, upos)


def _clean_docs(lang: str) -> list[str]:
    rng = random.Random(CORPUS_SEEDS[lang])
    topics = list(TOPIC_WEIGHTS)
    weights = [TOPIC_WEIGHTS[t] for t in topics]
    handwritten = [unicodedata.normalize("NFC", s) for s in HANDWRITTEN[lang]]
    sep = "" if lang == "zh" else " "
    docs: list[str] = []
    seen: set[str] = set()
    size = 0
    while size < TARGET_BYTES[lang]:
        n = rng.choice((1, 2, 2, 3, 3, 4))
        main = rng.choices(topics, weights)[0]
        sents: list[str] = []
        has_weather = False
        while len(sents) < n:
            if rng.random() < HANDWRITTEN_RATE:
                s = rng.choice(handwritten)
            else:
                topic = main if rng.random() < 0.75 else rng.choices(topics, weights)[0]
                if topic == "weather":  # one weather report per document, so they never contradict
                    if has_weather:
                        continue
                    has_weather = True
                s = sentence(sample_frame(rng, topic), lang)
            if s not in sents:
                sents.append(s)
        doc = sep.join(sents)
        if len(doc) < MIN_DOC_CHARS or doc in seen:
            continue
        seen.add(doc)
        docs.append(doc)
        size += len(doc.encode("utf-8")) + 1
    return docs


def _boundaries(doc: str, lang: str) -> list[int]:
    """Offsets where whitespace noise can go: after a space, or (zh) after a sentence end."""
    if lang == "zh":
        return [i + 1 for i, ch in enumerate(doc[:-1]) if ch in "。！？"]
    return [i + 1 for i, ch in enumerate(doc) if ch == " "]


def _noisy_lines(docs: list[str], lang: str) -> tuple[list[str], dict[str, int]]:
    rng = random.Random(CORPUS_SEEDS[lang] * 31 + 1)
    n = len(docs)
    counts = {"duplicates": round(0.01 * n), "trailing_space": max(2, round(0.003 * n)),
              "double_space": max(2, round(0.003 * n)), "zero_width_space": max(2, round(0.002 * n)),
              "empty_lines": int(0.0015 * n)}
    pool = list(range(n))
    rng.shuffle(pool)
    lines = list(docs)
    used: set[int] = set()

    def take(k: int, need_boundary: bool) -> list[int]:
        got = []
        for i in pool:
            if len(got) == k:
                break
            if i not in used and (not need_boundary or _boundaries(docs[i], lang)):
                used.add(i)
                got.append(i)
        return got

    for i in take(counts["trailing_space"], False):
        lines[i] += rng.choice((" ", "  "))
    for i in take(counts["double_space"], True):
        j = rng.choice(_boundaries(docs[i], lang))
        lines[i] = lines[i][:j] + ("  " if lang == "zh" else " ") + lines[i][j:]
    for i in take(counts["zero_width_space"], True):
        j = rng.choice(_boundaries(docs[i], lang))
        lines[i] = lines[i][:j] + ZWSP + lines[i][j:]
    inserts: list[list[str]] = [[] for _ in range(n + 1)]
    for i in take(counts["duplicates"], False):
        inserts[rng.randrange(i + 1, n + 1)].append(docs[i])
    for _ in range(counts["empty_lines"]):
        inserts[rng.randrange(1, n)].append("")
    out: list[str] = []
    for j in range(n + 1):
        out.extend(inserts[j])
        if j < n:
            out.append(lines[j])
    return out, counts


def parallel_frames() -> list[Frame]:
    """Balanced, distinct frames: PARALLEL_PER_TOPIC per topic, topics interleaved."""
    rng = random.Random(PARALLEL_SEED)
    per_topic: dict[str, list[Frame]] = {}
    for topic in TOPICS:
        got: list[Frame] = []
        seen_text: set[str] = set()
        while len(got) < PARALLEL_PER_TOPIC:
            f = sample_frame(rng, topic)
            text = sentence(f, "en")
            if text not in seen_text:
                seen_text.add(text)
                got.append(f)
        per_topic[topic] = got
    return [per_topic[t][i] for i in range(PARALLEL_PER_TOPIC) for t in TOPICS]


def parallel_jsonl() -> tuple[str, int]:
    lines = []
    frames = parallel_frames()
    for k, f in enumerate(frames, 1):
        for lang in LANGS:
            tokens, upos = render(f, lang)
            rec = {"id": f"p{k:04d}", "topic": f.topic, "lang": lang, "text": detokenize(tokens, lang, upos),
                   "tokens": tokens, "upos": upos}
            lines.append(json.dumps(rec, ensure_ascii=False))
    return "\n".join(lines) + "\n", len(frames)


def _readme(summary: dict) -> str:
    rows = "\n".join(
        f"| {lang} | {SCRIPT_NAMES[lang]} | {s['bytes']:,} | {s['lines']:,} | {s['documents']:,} |"
        for lang, s in summary["languages"].items())
    noise = "\n".join(
        f"| {lang} | {s['duplicates']} | {s['double_space']} | {s['trailing_space']} | "
        f"{s['zero_width_space']} | {s['empty_lines']} |" for lang, s in summary["languages"].items())
    bias_rows = ", ".join(f"{lang}: {n}" for lang, n in summary["bias_pairs"].items())
    return f"""# Demo corpus

A small multilingual corpus written by this project for the demo pipeline (`configs/demo.yaml`)
and the tests. Nothing in it was downloaded or copied: the lexicons, grammars and hand-written
sentences live in `mlm_core/demo/`, and this whole folder is **generated** by

    python -m mlm_core.demo.generate            # writes configs/demo/
    python -m mlm_core.demo.generate OUT_DIR    # writes elsewhere

The generator uses only the Python standard library with fixed seeds, so the output is
byte-for-byte reproducible (`tests/test_demo_corpus.py` regenerates it and compares).
Do not edit these files by hand: change the generator and rerun it.

## Licence

Written by the project; dedicated to the public domain (CC0 1.0). The proverbs among the
hand-written sentences are traditional sayings in the public domain.

## Contents

- `corpus/<lang>.txt`: raw pretraining text, UTF-8, one document (1-4 sentences) per line,
  `\\n` line ends. Sentences come from a small per-language grammar (subject / verb / object /
  adjective / place / time, present tense, with gender, number and case agreement) plus
  about {HANDWRITTEN_RATE:.0%} hand-written everyday sentences and proverbs.
  7 languages in 5 scripts, deliberately imbalanced ({summary['imbalance']:.1f} : 1 by bytes):

| lang | script | bytes | lines | unique documents |
|---|---|---:|---:|---:|
{rows}

  Total: {summary['total_corpus_bytes']:,} bytes.

- `parallel.jsonl`: {summary['parallel_ids']} sentence ids x {len(LANGS)} languages, one JSON object per
  line: `{{"id", "topic", "lang", "text", "tokens", "upos"}}`. All languages of an id render the same
  meaning representation. `upos` holds Universal Dependencies UPOS tags, one per token. Topics:
  {", ".join(TOPICS)} ({PARALLEL_PER_TOPIC} ids each). Text rule: for `zh` the text is the tokens
  concatenated; otherwise tokens joined by single spaces, with `PUNCT` tokens attached to the
  previous token. These sentences may also occur in the raw corpus.

- `bias/crows_pairs_<lang>.csv` ({bias_rows} pairs): CrowS-Pairs format
  (`sent_more,sent_less,stereo_antistereo,bias_type`), minimal pairs that differ only in the group
  words; bias types `gender` and `age`. `sent_more` is always the more stereotypical sentence (as in
  the CrowS-Pairs reference): in `antistereo` rows, which state the opposite of a stereotype, the
  stereotyped group is in `sent_less`. Mild, generic content only.
- `bias/templates_<lang>.yaml`: `templates` (with `{{group}}` and `[MASK]`), `groups`
  (female / male word lists), `neutral` group words and single-word `attributes`.

## Noise included on purpose

The raw corpus is clean except for this, which the normalize / dedup stages are expected to
handle. There is no other junk: every non-empty line is a well-formed document in its language
and script, so the normalizer's quarantine rate should stay near zero.

| lang | exact duplicate docs | doubled space | trailing space | zero-width space (U+200B) | empty lines |
|---|---:|---:|---:|---:|---:|
{noise}
"""


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


def write_demo_corpus(out_dir: pathlib.Path) -> dict:
    """Write the whole demo folder into ``out_dir``; return a summary (sizes, counts)."""
    out_dir = pathlib.Path(out_dir)
    langs: dict[str, dict] = {}
    files: list[str] = []
    for lang in LANGS:
        docs = _clean_docs(lang)
        lines, noise = _noisy_lines(docs, lang)
        text = "\n".join(lines) + "\n"
        rel = f"corpus/{lang}.txt"
        _write(out_dir / rel, text)
        files.append(rel)
        langs[lang] = {"bytes": len(text.encode("utf-8")), "lines": len(lines), "documents": len(docs), **noise}
    par_text, n_ids = parallel_jsonl()
    _write(out_dir / "parallel.jsonl", par_text)
    files.append("parallel.jsonl")
    bias_pairs = {}
    for lang in bias.BIAS_LANGS:
        _write(out_dir / f"bias/crows_pairs_{lang}.csv", bias.crows_csv(lang))
        _write(out_dir / f"bias/templates_{lang}.yaml", bias.templates_yaml(lang))
        files += [f"bias/crows_pairs_{lang}.csv", f"bias/templates_{lang}.yaml"]
        bias_pairs[lang] = len(bias.crows_rows(lang))
    sizes = [s["bytes"] for s in langs.values()]
    summary = {
        "languages": langs,
        "total_corpus_bytes": sum(sizes),
        "imbalance": max(sizes) / min(sizes),
        "parallel_ids": n_ids,
        "parallel_lines": n_ids * len(LANGS),
        "parallel_bytes": len(par_text.encode("utf-8")),
        "bias_pairs": bias_pairs,
    }
    _write(out_dir / "README.md", _readme(summary))
    files.append("README.md")
    summary["files"] = sorted(files)
    return summary


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = pathlib.Path(argv[0]) if argv else DEFAULT_OUT
    t0 = time.perf_counter()
    summary = write_demo_corpus(out)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
