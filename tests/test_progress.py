"""Live progress (issue 14 item 1): lines at an interval off a terminal, in-place redraws on one, pretrain
progress records, the Prefect run log, and quiet HTTP client logs under MLM_VERBOSE=1."""
from __future__ import annotations

import io
import logging
import re

import pytest

from mlm_core.progress import LOGGER_NAME, Progress


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def progress_records():
    h = Records()
    lg = logging.getLogger(LOGGER_NAME)
    lg.addHandler(h)
    yield h.lines
    lg.removeHandler(h)


def hms(seconds: float) -> str:
    """The expected ETA text, written out independently: 465 s -> 7m45s."""
    s = round(seconds)
    return f"{s}s" if s < 60 else f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def test_non_tty_prints_a_line_every_interval_with_rates_and_eta(progress_records):
    clock, out = Clock(), io.StringIO()
    total, step_s, tok_per_step, interval = 1000, 0.5, 2048, 30.0
    p = Progress("pretrain", total, tokens=0, stream=out, tty=False, interval=interval, clock=clock)
    for step in range(1, 201):                      # 100 s of training at 2 steps/s
        clock.t += step_s
        p.update(step, loss=10.0 / step, tokens=step * tok_per_step)
    p.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    # first line early (after 5 s), then one every 30 s, then the final line
    steps = [int(re.match(r"pretrain (\d+)/1000 steps", ln).group(1)) for ln in lines]
    assert steps == [10, 70, 130, 190, 200]
    for ln, step in zip(lines[:-1], steps[:-1]):
        elapsed = step * step_s
        rate = step / elapsed
        assert f"loss {10.0 / step:.4g}" in ln
        assert f"{step * tok_per_step / elapsed / 1000:.3g}k tok/s" in ln         # 4.1k tok/s
        assert f"ETA {hms((total - step) / rate)}" in ln
        assert f"({100 * step / total:.1f}%)" in ln
    assert lines[-1].endswith("(done)") and "ETA" not in lines[-1]
    assert progress_records == lines                # the same lines reach the progress logger (Prefect run log)


def test_resumed_run_counts_only_its_own_steps_in_the_rates():
    clock, out = Clock(), io.StringIO()
    p = Progress("pretrain", 1000, done=500, tokens=500 * 100, stream=out, tty=False, interval=10, clock=clock)
    clock.t += 10
    p.update(520, tokens=520 * 100)                 # 20 steps in 10 s -> 2 steps/s, 480 left -> 240 s
    assert "ETA 4m00s" in out.getvalue() and "200 tok/s" in out.getvalue()


def test_tty_redraws_one_line_in_place(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")            # the status line is cut to the terminal's width (80 under xdist)
    clock, out = Clock(), io.StringIO()
    p = Progress("shards", 200, unit="docs", stream=out, tty=True, interval=30, clock=clock)
    for i in range(1, 101):                         # 100 updates over 5 s
        clock.t += 0.05
        p.update(i, note="encoding en")
    text = out.getvalue()
    assert "\n" not in text                         # nothing scrolled: one status line
    draws = text.count("\r")
    assert 5 <= draws <= 5 / 0.2 + 1                # throttled to one redraw per 0.2 s
    last = text.rsplit("\r", 1)[1]
    n = int(re.match(r"shards (\d+)/200 docs \(\d+\.\d%\) encoding en \| 20 docs/s", last).group(1))
    assert n >= 100 - 0.2 / 0.05 and f"ETA {hms((200 - n) / 20)}" in last
    p.validation("step 100: acc 0.3", "val acc 0.300")
    p.close()
    text = out.getvalue()
    assert re.search(r"\r +\rshards validation: step 100: acc 0.3\n", text)   # status cleared, line kept
    assert text.endswith("\n") and "(done)" in text.splitlines()[-1]
    assert text.split("\n")[-2].rsplit("\r", 1)[1].startswith("shards 100/200 docs (50.0%)")
    assert logging.getLogger(LOGGER_NAME).propagate is False


def test_interval_from_env(monkeypatch):
    from mlm_core.errors import MlmError
    from mlm_core.progress import interval_from_env
    monkeypatch.setenv("MLM_PROGRESS_INTERVAL", "7.5")
    assert interval_from_env() == 7.5
    monkeypatch.setenv("MLM_PROGRESS_INTERVAL", "soon")
    with pytest.raises(MlmError, match="MLM_PROGRESS_INTERVAL"):
        interval_from_env()
    monkeypatch.setenv("MLM_PROGRESS", "off")
    out = io.StringIO()
    p = Progress("x", 3, stream=out, tty=False, interval=0)
    p.update(1)
    p.close()
    assert out.getvalue() == ""


def test_pretrain_emits_progress_and_leaves_metrics_unchanged(tmp_path, monkeypatch, progress_records):
    """A few real pretrain steps: progress lines with step/total, loss, tok/s, ETA and the validation line;
    metrics.jsonl is the same with the display off (up to the measured timings)."""
    from test_train import read_metrics, run, tiny_cfg, tiny_shards
    import torch
    torch.set_num_threads(1)
    shards, _ = tiny_shards(tmp_path / "data", n_docs=40)
    cfg = tiny_cfg(steps=4, eval_every=2, checkpoint_every=100)
    monkeypatch.setenv("MLM_PROGRESS_INTERVAL", "0")
    del progress_records[:]                         # the shards stage's own lines
    run(cfg, shards, tmp_path / "on")
    assert [ln.split(" | ")[0] for ln in progress_records if " validation: " not in ln] == [
        f"pretrain {s}/4 steps ({25 * s:.1f}%)" for s in (1, 2, 3, 4, 4)]
    first = progress_records[0]
    assert re.search(r"loss \d", first) and " tok/s " in first and "ETA " in first
    val = [ln for ln in progress_records if ln.startswith("pretrain validation: step 2: ")]
    # led by [MASK]-only top-1 vs the baseline on the same positions (the all-target figures come after)
    assert val and re.match(r"pretrain validation: step 2: \[MASK\] top-1 \d\.\d{3} vs unigram baseline \d\.\d{3} "
                            r"\(mean over 3 languages\); by language: en \d\.\d{3} vs \d\.\d{3} \(\d+ distinct\)", val[0])
    assert val[0].index("[MASK] top-1") < val[0].index("all 80/10/10 targets: loss")
    assert "val [MASK] acc" in progress_records[-1]
    monkeypatch.setenv("MLM_PROGRESS", "off")
    n = len(progress_records)
    run(cfg, shards, tmp_path / "off")
    assert len(progress_records) == n
    timing = {"tokens_per_s", "mfu", "data_pct", "masking_pct"}
    for kind in ("train", "eval"):
        on, off = read_metrics(tmp_path / "on", kind), read_metrics(tmp_path / "off", kind)
        assert [{k: v for k, v in r.items() if k not in timing} for r in on] == \
               [{k: v for k, v in r.items() if k not in timing} for r in off]


def test_verbose_logging_keeps_http_clients_quiet(monkeypatch, capsys):
    """MLM_VERBOSE=1: our INFO messages show, httpx's request lines do not."""
    from flows import cli
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), {n: logging.getLogger(n).level for n in ("httpx", "httpcore")})
    for h in list(root.handlers):
        root.removeHandler(h)
    monkeypatch.setenv("MLM_VERBOSE", "1")
    try:
        cli.main(["config", "schema"])
        capsys.readouterr()
        logging.getLogger("httpx").info('HTTP Request: POST http://127.0.0.1/api/csrf-token "HTTP/1.1 422"')
        logging.getLogger("mlm_core.stages").info("our own message")
        err = capsys.readouterr().err
        assert "our own message" in err
        assert "csrf-token" not in err
        assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING
        assert logging.getLogger("httpcore").getEffectiveLevel() >= logging.WARNING
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved[1]:
            root.addHandler(h)
        root.setLevel(saved[0])
        for n, lvl in saved[2].items():
            logging.getLogger(n).setLevel(lvl)


def test_progress_lines_reach_the_prefect_run_log(prefect_harness):
    from prefect import flow, task
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.context import get_run_context
    from prefect.logging.handlers import APILogHandler

    from tasks.progress_log import to_run_log

    @task
    def stage_like() -> str:
        with to_run_log():
            p = Progress("normalize", 2, unit="partitions", stream=io.StringIO(), tty=False, interval=0)
            p.update(1, note="en")
            p.close()
            # the engine's warnings too (the pretrain plateau detector logs on mlm_core.train.loop), not its INFO
            logging.getLogger("mlm_core.train.loop").warning("pretrain PLATEAU at step 10 of 20")
            logging.getLogger("mlm_core.train.loop").info("an engine info line")
        return str(get_run_context().task_run.flow_run_id)

    @flow
    def f() -> str:
        return stage_like()

    flow_run_id = f()
    APILogHandler().flush()                         # send what is queued, then read it back

    import asyncio

    async def read():
        async with get_client() as c:
            return await c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    logs = asyncio.run(read())
    msgs = [lg.message for lg in logs if lg.name == LOGGER_NAME]
    assert any(m.startswith("normalize 1/2 partitions (50.0%) en") for m in msgs), msgs
    assert any(m.endswith("(done)") for m in msgs)
    engine = [(lg.level, lg.message) for lg in logs if lg.name == "mlm_core.train.loop"]
    assert engine == [(logging.WARNING, "pretrain PLATEAU at step 10 of 20")], engine
    with to_run_log() as h:                         # outside a run: console only, nothing attached
        assert h is None


def test_torchrun_launcher_shows_progress_from_rank0_records():
    """Under torchrun the workers print records; the launcher's RecordFeed turns them into progress lines,
    starting at the first train record (a resumed run's rates count only its own steps)."""
    from mlm_core.progress import RecordFeed
    clock, out = Clock(), io.StringIO()
    feed = RecordFeed("pretrain", 100, stream=out, tty=False, interval=10, clock=clock)
    feed.step(3)                                    # a heartbeat before any record: nothing to show yet
    feed.record({"type": "train", "step": 40, "loss": 3.0, "tokens": 40 * 512})
    clock.t += 10
    feed.record({"type": "train", "step": 60, "loss": 2.5, "tokens": 60 * 512})   # 2 steps/s, 40 left: 20 s
    clock.t += 1
    feed.record({"type": "eval", "step": 60, "en.val_loss": 2.0, "en.val_acc": 0.25, "en.val_baseline_acc": 0.1,
                 "fr.val_loss": 3.0, "fr.val_acc": 0.35, "fr.val_baseline_acc": 0.1})
    feed.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("pretrain 60/100 steps (60.0%) | loss 2.5 | 1.02k tok/s 2 steps/s")
    assert "ETA 20s" in lines[0]
    assert lines[1] == ("pretrain validation: step 60: mean over 2 languages loss 2.5 acc 0.300 "
                        "(unigram baseline 0.100); acc by language: en 0.250 fr 0.350")
    assert lines[2].endswith("| val acc 0.300 loss 2.5 @ 60 (done)")


def test_torchrun_launcher_leads_with_mask_accuracy_and_shows_the_plateau():
    """Records with [MASK]-only figures: the launcher's validation line leads with them; a worker's plateau
    flag (train.plateau) is on the line and the status line."""
    from mlm_core.progress import RecordFeed
    clock, out = Clock(), io.StringIO()
    feed = RecordFeed("pretrain", 100, stream=out, tty=False, interval=10, clock=clock)
    feed.record({"type": "train", "step": 60, "loss": 2.5, "tokens": 60 * 512})
    feed.record({"type": "eval", "step": 60, "en.val_loss": 2.0, "en.val_acc": 0.12, "en.val_baseline_acc": 0.045,
                 "en.val_mask_acc": 0.041, "en.val_mask_baseline_acc": 0.043, "en.val_distinct_predictions": 3,
                 "plateau": 1, "plateau_languages": "en"})
    feed.close()
    lines = out.getvalue().splitlines()
    assert lines[-2] == ("pretrain validation: step 60: [MASK] top-1 0.041 vs unigram baseline 0.043 "
                         "(mean over 1 languages); by language: en 0.041 vs 0.043 (3 distinct); all 80/10/10 targets: "
                         "loss 2 acc 0.120 | PLATEAU in en")
    assert lines[-1].endswith("| val [MASK] acc 0.041 (baseline 0.043) loss 2 @ 60 | PLATEAU en (done)")


def test_a_loop_done_before_its_first_line_leaves_nothing():
    clock, out = Clock(), io.StringIO()
    p = Progress("normalize", 2, unit="partitions", stream=out, tty=False, interval=30, clock=clock)
    clock.t += 1
    p.update(2)
    p.close()
    assert out.getvalue() == ""
    p = Progress("normalize", 2, unit="partitions", stream=out, tty=True, interval=30, clock=clock)
    clock.t += 1
    p.update(2)
    p.close()
    text = out.getvalue()
    assert "\n" not in text and re.search(r"^\rnormalize 2/2 .*\r +\r$", text)   # drawn, then blanked
