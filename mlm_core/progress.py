"""Live progress of a long stage: pretrain steps, shard encoding, normalize partitions, evaluate/audit items.

One ``Progress`` per loop: ``update(done, loss=..., tokens=..., note=...)`` after each unit of work (cheap: a
clock read, drawing only when due), ``validation(text)`` when a validation pass ends, ``close()`` at the end
(or use it as a context manager). It shows done/total, the loss, tokens/s, items/s, elapsed time and ETA:

- on a terminal it redraws one status line in place (``\\r``, at most every ``TTY_REDRAW_S``);
- elsewhere (a log file, CI, a Prefect worker's captured output) it prints a line every ``interval``
  seconds (``$MLM_PROGRESS_INTERVAL``, default 30; the first line after ``min(5, interval)`` s), and
  a last line at the end; ``MLM_PROGRESS=off`` turns the display off. A loop that ends before its first
  line was due (a small stage) leaves nothing behind, on a terminal or off one.

Rates and ETA are averages since the reporter started (an eval pass slows the average, as it slows the run):
``rate = (done - done at start) / elapsed``, ``ETA = (total - done) / rate``.

Each periodic, validation and final line is also logged at INFO on the ``mlm_core.progress`` logger, which
does not propagate (the console already shows the line): ``tasks/progress_log.py`` attaches Prefect's API
handler to it while a stage task runs, so the lines reach the Prefect run log. Nothing here writes to any
stage output. The engine stays free of Prefect/MLflow: this module uses the standard library only.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import sys
import time
from typing import Callable, TextIO

from mlm_core.errors import StageError

LOGGER_NAME = "mlm_core.progress"
INTERVAL_ENV = "MLM_PROGRESS_INTERVAL"     # seconds between lines when the stream is not a terminal
SWITCH_ENV = "MLM_PROGRESS"                # "off" (or 0/false/no): no display, no progress log records
DEFAULT_INTERVAL_S = 30.0
FIRST_LINE_S = 5.0                         # the first line comes early: after min(FIRST_LINE_S, interval) s
TTY_REDRAW_S = 0.2

log = logging.getLogger(LOGGER_NAME)
log.setLevel(logging.INFO)
log.propagate = False      # the reporter writes the console line itself; handlers attached here get records


def interval_from_env() -> float:
    raw = os.environ.get(INTERVAL_ENV, "").strip()
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        val = float(raw)
    except ValueError:
        val = -1.0
    if not math.isfinite(val) or val < 0:
        raise StageError(f"${INTERVAL_ENV}={raw!r}: expected a number of seconds >= 0 (0: a line at every update)")
    return val


def enabled_from_env() -> bool:
    return os.environ.get(SWITCH_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def fmt_duration(seconds: float | None) -> str:
    """45s, 3m05s, 2h07m, 1d03h; '?' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_rate(x: float) -> str:
    """3 significant digits with a k/M/G suffix: 950, 12.3k, 1.20M."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """A progress reporter for one loop; see the module docstring.

    label: what runs ("pretrain", "shards"); total: units to do (None: unknown, no ETA); unit: their name;
    done/tokens: counts already done before this run (a resumed pretrain), not counted in the rates.
    stream (default stderr), tty (default stream.isatty()), interval (default $MLM_PROGRESS_INTERVAL) and
    clock (default time.monotonic) are there for tests."""

    def __init__(self, label: str, total: int | None = None, *, unit: str = "steps", done: int = 0,
                 tokens: int | None = None, stream: TextIO | None = None, tty: bool | None = None,
                 interval: float | None = None, clock: Callable[[], float] = time.monotonic,
                 enabled: bool | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.interval = interval_from_env() if interval is None else float(interval)
        self.on = enabled_from_env() if enabled is None else enabled
        self.clock = clock
        self.t0 = clock()
        self.done0, self.done = int(done), int(done)
        self.tokens0 = self.tokens = tokens
        self.loss: float | None = None
        self.note = ""
        self.val_short = ""
        self._next_line = self.t0 + min(FIRST_LINE_S, self.interval)
        self._next_draw = self.t0
        self._drawn = 0            # width of the status line on screen (TTY)
        self.lines = 0             # lines printed on a non-terminal stream / logged (for tests)
        self.closed = False

    # ------------------------------------------------------------------ figures
    def elapsed(self) -> float:
        return max(self.clock() - self.t0, 0.0)

    def rate(self) -> float | None:
        """Units per second since the start (None before the first unit)."""
        dt = self.elapsed()
        return (self.done - self.done0) / dt if dt > 0 and self.done > self.done0 else None

    def tokens_per_s(self) -> float | None:
        dt = self.elapsed()
        if self.tokens is None or self.tokens0 is None or dt <= 0:
            return None
        return (self.tokens - self.tokens0) / dt

    def eta(self) -> float | None:
        r = self.rate()
        if self.total is None or not r:
            return None
        return max(self.total - self.done, 0) / r

    def line(self, final: bool = False) -> str:
        if self.total:
            head = f"{self.label} {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.1f}%)"
        else:
            head = f"{self.label} {self.done} {self.unit}"
        parts = [head + (f" {self.note}" if self.note else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        speed = []
        tps = self.tokens_per_s()
        if tps is not None and self.tokens != self.tokens0:
            speed.append(f"{fmt_rate(tps)} tok/s")
        r = self.rate()
        if r is not None:
            one = self.unit[:-1] if self.unit.endswith("s") else self.unit
            speed.append(f"{fmt_rate(r)} {self.unit}/s" if r >= 1 else f"{fmt_duration(1 / r)}/{one}")
        if speed:
            parts.append(" ".join(speed))
        timing = f"elapsed {fmt_duration(self.elapsed())}"
        if not final and self.total is not None:
            timing += f" ETA {fmt_duration(self.eta())}"
        parts.append(timing)
        if self.val_short:
            parts.append(self.val_short)
        return " | ".join(parts)

    # ------------------------------------------------------------------ events
    def update(self, done: int | None = None, *, advance: int = 0, loss: float | None = None,
               tokens: int | None = None, note: str | None = None) -> None:
        if done is not None:
            self.done = int(done)
        self.done += advance
        if loss is not None:
            self.loss = float(loss)
        if tokens is not None:
            self.tokens = int(tokens)
        if note is not None:
            self.note = note
        if not self.on or self.closed:
            return
        now = self.clock()
        if self.tty and now >= self._next_draw:
            self._next_draw = now + TTY_REDRAW_S
            self._draw(self.line())
        if now >= self._next_line:
            self._next_line = now + self.interval
            self._emit(self.line(), console=not self.tty)

    def validation(self, text: str, short: str | None = None) -> None:
        """A validation pass ended: print ``text`` as its own line; ``short`` stays on the status line."""
        self.val_short = short or ""
        if self.on and not self.closed:
            self._emit(f"{self.label} validation: {text}", console=True)
            if self.tty:
                self._draw(self.line())

    def say(self, text: str) -> None:
        """A one-off line of its own (e.g. "resumed from step N"), printed at once whatever the interval."""
        if self.on and not self.closed:
            self._emit(text, console=True)
            if self.tty and self.lines:
                self._draw(self.line())

    def close(self, failed: bool = False) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.on:
            return
        text = self.line(final=True) + (" (stopped)" if failed else " (done)")
        if not failed and self.lines == 0 and self.elapsed() < min(FIRST_LINE_S, self.interval):
            if self._drawn:                 # a quick loop leaves no trace (no line was due yet)
                self._write("\r" + " " * self._drawn + "\r")
                self._drawn = 0
            return
        if self.tty:
            self._draw(text)
            self._write("\n")
            self._drawn = 0
            self._emit(text, console=False)
        else:
            self._emit(text, console=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # ------------------------------------------------------------------ output
    def _write(self, s: str) -> None:
        try:
            self.stream.write(s)
            self.stream.flush()
        except (OSError, ValueError):      # a closed or broken console never stops the stage
            self.on = False

    def _draw(self, text: str) -> None:
        width = shutil.get_terminal_size((120, 24)).columns - 1
        text = text[:width]
        self._write("\r" + text + " " * max(self._drawn - len(text), 0))
        self._drawn = len(text)

    def _emit(self, text: str, console: bool) -> None:
        """A whole line: on the console (clearing a status line first) and to the progress logger."""
        if console:
            if self.tty and self._drawn:
                self._write("\r" + " " * self._drawn + "\r")
                self._drawn = 0
            self._write(text + "\n")
        self.lines += 1
        log.info("%s", text)


def validation_summary(evals: dict, step: int) -> tuple[str, str]:
    """(line, short) for per-language validation results {lang: {"loss", "acc", "baseline_acc", ...}}.

    With [MASK]-only figures (``mask_acc``, ``mask_baseline_acc``: ``train.evaluator``) the line leads with them,
    the measure of learning: ``acc`` counts the ~10% of targets left unchanged, which a model copies."""
    langs = sorted(lg for lg, r in evals.items() if r.get("acc") is not None and r.get("n", 1))
    if not langs:
        return f"step {step}: no validation data", ""
    acc = sum(evals[lg]["acc"] for lg in langs) / len(langs)
    loss = sum(evals[lg]["loss"] for lg in langs) / len(langs)
    masked = [lg for lg in langs if evals[lg].get("mask_acc") is not None
              and evals[lg].get("mask_baseline_acc") is not None]
    if masked:
        m = sum(evals[lg]["mask_acc"] for lg in masked) / len(masked)
        mb = sum(evals[lg]["mask_baseline_acc"] for lg in masked) / len(masked)
        per = "; ".join(f"{lg} {evals[lg]['mask_acc']:.3f} vs {evals[lg]['mask_baseline_acc']:.3f}"
                        + (f" ({evals[lg]['distinct_predictions']} distinct)"
                           if evals[lg].get("distinct_predictions") is not None else "") for lg in masked)
        line = (f"step {step}: [MASK] top-1 {m:.3f} vs unigram baseline {mb:.3f} (mean over {len(masked)} "
                f"languages); by language: {per}; all 80/10/10 targets: loss {loss:.4g} acc {acc:.3f}")
        return line, f"val [MASK] acc {m:.3f} (baseline {mb:.3f}) loss {loss:.4g} @ {step}"
    base = [evals[lg]["baseline_acc"] for lg in langs if evals[lg].get("baseline_acc") is not None]
    mean_base = f" (unigram baseline {sum(base) / len(base):.3f})" if base else ""
    per = " ".join(f"{lg} {evals[lg]['acc']:.3f}" for lg in langs)
    line = (f"step {step}: mean over {len(langs)} languages loss {loss:.4g} acc {acc:.3f}{mean_base}; "
            f"acc by language: {per}")
    return line, f"val acc {acc:.3f} loss {loss:.4g} @ {step}"


class RecordFeed:
    """A ``Progress`` driven by pretrain metrics records (what the torchrun launcher receives from rank 0).

    It starts at the first train record (a resumed run then counts only its own steps in the rates)."""

    def __init__(self, label: str, total: int | None, **kwargs):
        self.label, self.total, self.kwargs = label, total, kwargs
        self.progress: Progress | None = None

    def record(self, rec: dict) -> None:
        step = int(rec.get("step", 0))
        if rec.get("type") == "train":
            if self.progress is None:
                self.progress = Progress(self.label, self.total, done=step, tokens=rec.get("tokens"), **self.kwargs)
            self.progress.update(step, loss=rec.get("loss"), tokens=rec.get("tokens"))
        elif rec.get("type") == "eval" and self.progress is not None:
            evals: dict = {}
            for key, v in rec.items():
                lang, _, name = key.partition(".val_")
                if name in ("loss", "acc", "baseline_acc", "mask_acc", "mask_baseline_acc", "distinct_predictions"):
                    evals.setdefault(lang, {})[name] = v
            line, short = validation_summary(evals, step)
            if rec.get("plateau"):          # the worker's plateau detector fired (train.plateau)
                langs = rec.get("plateau_languages", "")
                line, short = f"{line} | PLATEAU in {langs}", f"{short} | PLATEAU {langs}"
            self.progress.validation(line, short)

    def step(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(int(step))

    def close(self, failed: bool = False) -> None:
        if self.progress is not None:
            self.progress.close(failed=failed)


__all__ = ["Progress", "RecordFeed", "LOGGER_NAME", "INTERVAL_ENV", "SWITCH_ENV", "DEFAULT_INTERVAL_S", "fmt_duration",
           "fmt_rate", "interval_from_env", "validation_summary"]
