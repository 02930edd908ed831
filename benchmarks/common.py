"""Shared benchmark helpers: a generated raw corpus, peak-RSS measurement of a subprocess, tables.

Nothing here imports the project; every benchmark runs each measurement in a fresh interpreter
(``run_measured``) so imports, caches and memory of one job never leak into the next.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MB = 1_000_000  # benchmarks count MB as 10^6 bytes of UTF-8

# ----------------------------------------------------------------------------------------- raw corpus
# Syllables per language (Latin, Cyrillic, Devanagari, Han, Arabic scripts); words are 1-4 syllables
# drawn from a Zipf-distributed lexicon, sentences of 4-16 words.
SYLLABLES = {
    "en": "ba be bi bo ka ke ki ko la le li lo ma me mi mo na ne ni no ra re ri ro sa se si so ta te ti to "
          "th sh ch ing er an on en st tr pr gr".split(),
    "fr": "la le les de du ré é è ou oi au eau pa pe po ma mo ni nu ra ri ro sa se si ta te ti vi vo qu "
          "on an en in ch gn ç".split(),
    "ru": "ка ко ку ла ле ли ло ма ме ми мо на не ни но ра ре ри ро са се си со та те ти то ва ве ви во "
          "ст пр ж ш щ ый ая ое".split(),
    "hi": "क का कि की ल ला लि म मा मि न ना नि र रा रि स सा सि त ता ति प पा पि ह है कों में".split(),
    "zh": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么心多"),
    "ar": "كا كي كو لا لي لو ما مي مو نا ني نو را ري رو سا سي سو تا تي تو با بي بو ال ة ين ون".split(),
}
PUNCT = {"ar": "،.؟", "hi": "।,?", "zh": "，。？"}
NO_SPACE = {"zh"}
LANGS = tuple(SYLLABLES)
DUP_RATE = 0.01        # share of lines that repeat an earlier line of the same language
ZW_RATE = 0.02         # lines with a zero-width space inserted
DOUBLE_SPACE_RATE = 0.05
NFKC_RATE = 0.01       # lines with a compatibility character (full-width letter, ligature) NFKC folds
MIN_LINE, MAX_LINE = 50, 400


def _lexicon(lang: str, rng: random.Random, size: int = 8_000) -> list[str]:
    syl = SYLLABLES[lang]
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        n = rng.choice((1, 2, 2, 3)) if lang in NO_SPACE else rng.choice((1, 2, 2, 3, 3, 4))
        w = "".join(rng.choice(syl) for _ in range(n))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def _sentences(lang: str, n: int, seed: int) -> list[str]:
    """A pool of ``n`` sentences; lines are cut from a random stream of them, so lines are ~all distinct."""
    import numpy as np
    rng = random.Random(f"{seed}-{lang}")
    lex = np.array(_lexicon(lang, rng), dtype=object)
    g = np.random.default_rng([seed, sum(map(ord, lang))])
    punct = PUNCT.get(lang, ",.?")
    sep = "" if lang in NO_SPACE else " "
    lens = g.integers(4, 17, n)
    idx = np.minimum(g.zipf(1.2, int(lens.sum())) - 1, len(lex) - 1)
    words = lex[idx].tolist()
    out, pos = [], 0
    for k in lens.tolist():
        s = sep.join(words[pos:pos + k]) + punct[1]
        pos += k
        out.append(s[0].upper() + s[1:] if lang in ("en", "fr", "ru") else s)
    return out


def _lines(lang: str, n_bytes: int, seed: int):
    """Yield (line, utf8_len) until ``n_bytes``: 50-400 characters, ~1% exact duplicates, a little noise."""
    import numpy as np
    pool = _sentences(lang, 100_000, seed)
    g = np.random.default_rng([seed, 7, sum(map(ord, lang))])
    sep = "" if lang in NO_SPACE else " "
    total, recent = 0, []
    block = 50_000
    while total < n_bytes:
        targets = g.integers(MIN_LINE, MAX_LINE - 40, block).tolist()
        picks = g.integers(0, len(pool), block * 12).tolist()
        u = g.random((block, 4)).tolist()
        pi = 0
        for t, (r_dup, r_zw, r_ds, r_nfkc) in zip(targets, u):
            if r_dup < DUP_RATE and recent:
                line = recent[int(r_zw * len(recent))]
            else:
                parts, n = [], 0
                while n < t:
                    s = pool[picks[pi % len(picks)]]
                    pi += 1
                    parts.append(s)
                    n += len(s) + len(sep)
                line = sep.join(parts)[:MAX_LINE - 10].rstrip()
                if r_zw < ZW_RATE:
                    k = len(line) // 2
                    line = line[:k] + "\u200b" + line[k:]
                if r_ds < DOUBLE_SPACE_RATE:
                    line = line.replace(" ", "  ", 2) if " " in line else line + "  "
                if r_nfkc < NFKC_RATE:
                    line = line + " \uff21\ufb01"      # full-width A + "fi" ligature
                if len(recent) < 20_000:
                    recent.append(line)
                elif r_ds < 0.05:
                    recent[int(r_nfkc * len(recent))] = line
            b = len(line.encode()) + 1
            total += b
            yield line
            if total >= n_bytes:
                return


def corpus_dir(root: Path, size_mb: int) -> Path:
    return Path(root) / f"corpus-{size_mb}MB"


def write_corpus(root: Path, size_mb: int, seed: int = 0, file_mb: int = 128, log=print) -> dict:
    """A raw text corpus of about ``size_mb`` MB: ``<lang>-<k>.txt`` files (one document per line), at
    most ``file_mb`` MB each. Reused when ``corpus.json`` already describes the same parameters."""
    d = corpus_dir(root, size_mb)
    meta_path = d / "corpus.json"
    want = {"size_mb": size_mb, "seed": seed, "file_mb": file_mb, "langs": list(LANGS), "version": 2}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("params") == want and all(Path(f).exists() for fs in meta["files"].values() for f in fs):
            return meta
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0 = time.perf_counter()
    per_lang = size_mb * MB // len(LANGS)
    n_files = max(1, -(-per_lang // (file_mb * MB)))
    files: dict[str, list[str]] = {}
    nlines = 0
    for lang in LANGS:
        files[lang] = []
        it = _lines(lang, per_lang, seed)
        lang_bytes = 0
        for k in range(n_files):
            path = d / f"{lang}-{k}.txt"
            files[lang].append(str(path))
            cap = per_lang * (k + 1) // n_files
            with open(path, "w", encoding="utf-8") as f:
                buf, nb = [], 0
                for line in it:
                    buf.append(line)
                    nb += len(line.encode()) + 1
                    if len(buf) >= 20_000:
                        f.write("\n".join(buf) + "\n")
                        nlines += len(buf)
                        buf = []
                    if lang_bytes + nb >= cap:
                        break
                if buf:
                    f.write("\n".join(buf) + "\n")
                    nlines += len(buf)
            lang_bytes += nb
    meta = {"params": want, "files": files, "bytes": sum(Path(f).stat().st_size for fs in files.values() for f in fs),
            "lines": nlines, "seconds": round(time.perf_counter() - t0, 1)}
    meta_path.write_text(json.dumps(meta, indent=1))
    log(f"corpus {size_mb} MB: {meta['bytes'] / MB:.1f} MB, {nlines:,} lines, {len(LANGS)} languages x {n_files} "
        f"file(s), written in {meta['seconds']} s -> {d}")
    return meta


# ----------------------------------------------------------------------------------------- measurement
def run_measured(cmd: list[str], env: dict | None = None, poll_s: float = 0.05, timeout_s: float | None = None) -> dict:
    """Run ``cmd`` in a fresh process; return its last stdout line parsed as JSON, plus
    ``peak_rss`` (bytes: max over time of the summed RSS of the process and all its descendants, polled
    every ``poll_s``), ``ru_maxrss_children`` (bytes: the kernel's max RSS of the largest single process
    among the child and the descendants it waited for, from wait4) and ``wall_s`` (whole process)."""
    import psutil
    full_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    # the pipes are drained by threads so a chatty child never blocks
    import threading
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def drain(stream, key):
        for line in stream:
            chunks[key].append(line)
    ts = [threading.Thread(target=drain, args=(proc.stdout, "out"), daemon=True),
          threading.Thread(target=drain, args=(proc.stderr, "err"), daemon=True)]
    for t in ts:
        t.start()
    ps = psutil.Process(proc.pid)
    peak, rusage, status = 0, None, None
    while True:
        pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status, rusage = st, ru
            break
        try:
            procs = [ps] + ps.children(recursive=True)
            total = 0
            for p in procs:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            peak = max(peak, total)
        except psutil.Error:
            pass
        if timeout_s and time.perf_counter() - t0 > timeout_s:
            proc.kill()
        time.sleep(poll_s)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in ts:
        t.join(timeout=5)
    out, err = "".join(chunks["out"]), "".join(chunks["err"])
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={proc.returncode}):\n{out[-3000:]}\n{err[-6000:]}")
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1]) if lines else {}
    res.update(peak_rss=peak, ru_maxrss_children=rusage.ru_maxrss * 1024, wall_s=wall, stderr_tail=err[-2000:])
    return res


def job_result(res: dict) -> None:
    """What a job prints last: one JSON line the parent parses."""
    sys.stdout.write("\n" + json.dumps(res, default=str) + "\n")
    sys.stdout.flush()


# ----------------------------------------------------------------------------------------- tables
def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; ``align`` is one 'l'/'r' per column (default: first left, others right)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)
    fmt = lambda r: "| " + " | ".join(c.ljust(w) if a == "l" else c.rjust(w)  # noqa: E731
                                      for c, w, a in zip(r, widths, align)) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2)) for w, a in zip(widths, align)) + "|"
    return "\n".join([fmt(headers), sep] + [fmt(r) for r in cells])


def mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.0f} MiB"


def check(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")
