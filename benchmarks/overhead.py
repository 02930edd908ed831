"""Benchmark: what orchestration (Prefect + Great Expectations + MLflow) costs on top of the stage functions.

Not a test; prints tables. Uses the demo pipeline (``configs/demo.yaml``), a fresh workdir per job:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/overhead.py
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/overhead.py --validation-sizes 10,1000 --corpus-dir bench-out/normalize

Measured in the same run, each job in a fresh subprocess:
  direct      ``mlm_core.stages.plan`` + ``execute(force=True)`` for every stage of ``STAGES``, in order,
              twice in one process (cold: first call, with imports; warm: second call).
  in-process  ``flows.pipeline.pipeline(config, overrides=[workdir=...], force=True)`` twice in one process
              (cold: starts Prefect's ephemeral server, imports GE and MLflow; warm: second call), timed
              piece by piece by wrapping the functions it calls: Prefect flow start-up (call -> flow body),
              stage work, validation (first GE import apart), MLflow logging, Prefect artifacts, the rest.
  cli         ``mlm run configs/demo.yaml --force --set workdir=<fresh>`` (whole process, cold).
Overhead = orchestrated - direct (same temperature); target: <= 20 % of the orchestrated wall time.

Validation: ``tasks.validation.validate_stage("normalize", ...)`` on the normalize outputs of benchmark 1
(``benchmarks/normalize.py``, ``<corpus-dir>/ours-<size>MB``; generated and normalized here when absent),
after a warm-up validation so the first GE import is excluded; median ``duration_s`` of ``--repeat`` runs.
Target: each <= 2 s, at 1 GB as at 10 MB.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import REPO, check, job_result, mib, run_measured, table, write_corpus  # noqa: E402

CONFIG = "configs/demo.yaml"
# the orchestrated jobs get a fresh ephemeral Prefect server in their workdir, whatever the caller's env says
CLEAN_ENV = {"PREFECT_API_URL": "", "PREFECT_HOME": ""}


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN_ENV}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return env


def _run(cmd: list[str]) -> dict:
    # run_measured merges os.environ; drop Prefect's server settings from it for the child
    saved = {k: os.environ.pop(k) for k in list(CLEAN_ENV) if k in os.environ}
    try:
        return run_measured(cmd)
    finally:
        os.environ.update(saved)


# ----------------------------------------------------------------------------------------- jobs
class Timers:
    """Accumulated seconds per label, from wrapped functions (thread-safe; nested calls are not excluded)."""

    def __init__(self):
        self.t: dict[str, float] = {}
        self.n: dict[str, int] = {}
        self.lock = threading.Lock()

    def add(self, label: str, dt: float) -> None:
        with self.lock:
            self.t[label] = self.t.get(label, 0.0) + dt
            self.n[label] = self.n.get(label, 0) + 1

    def wrap(self, obj, attr: str, label: str, first_label: str | None = None):
        import functools
        fn = getattr(obj, attr)

        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                self.add(first_label if first_label and first_label not in self.t else label, dt)
        setattr(obj, attr, wrapper)

    def reset(self) -> dict:
        with self.lock:
            out, self.t, self.n = dict(self.t), {}, {}
        return out


def job_direct(scratch: Path) -> dict:
    t0 = time.perf_counter()
    from mlm_core import stages
    from mlm_core.config.io import load_config
    out = {"import_s": time.perf_counter() - t0, "runs": []}
    for i in range(2):
        work = scratch / f"direct-{i}"
        shutil.rmtree(work, ignore_errors=True)
        t1 = time.perf_counter()
        lc = load_config(REPO / CONFIG, [f"workdir={work}"])
        plans = stages.plan(lc)
        per = {}
        for name in stages.STAGES:
            t2 = time.perf_counter()
            stages.execute(lc, name, plans, force=True)
            per[name] = time.perf_counter() - t2
        out["runs"].append({"seconds": time.perf_counter() - t1, "stages": per})
    return out


def job_flow(scratch: Path) -> dict:
    """Two ``pipeline()`` calls in one process, each timed piece by piece."""
    t0 = time.perf_counter()
    state = scratch / "flow-state"
    shutil.rmtree(state, ignore_errors=True)
    from flows.cli.util import prepare_env
    prepare_env(state)                   # PREFECT_HOME = <state>/prefect: a fresh (cold) ephemeral server
    import prefect  # noqa: F401
    t_prefect = time.perf_counter() - t0
    import flows.pipeline as fp
    import mlm_core.stages as ms
    import tasks.stage as ts
    import tasks.tracking as tt
    import tasks.validation as tv
    t_imports = time.perf_counter() - t0

    T = Timers()
    T.wrap(tv, "_gx", "ge_context", first_label="ge_import")            # first call imports GE
    T.wrap(ms, "execute", "execute")                                     # includes validation (check callback)
    for m in ("__init__", "start_pipeline", "end_pipeline", "log_stage", "log_text"):
        T.wrap(tt.Tracker, m, "mlflow", first_label="mlflow_first")      # first: import mlflow + DB migrations
    T.wrap(ts, "create_markdown_artifact", "prefect_artifacts")
    T.wrap(ts, "create_table_artifact", "prefect_artifacts")
    entered: dict[str, float] = {}
    inner = fp.run_pipeline

    def run_pipeline(*a, **kw):
        entered["in"] = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            entered["out"] = time.perf_counter()
    fp.run_pipeline = run_pipeline

    validations: list[float] = []
    orig_validate = ts.validate_stage

    def validate_stage(*a, **kw):
        t = time.perf_counter()
        try:
            rep = orig_validate(*a, **kw)
            validations.append(rep.duration_s)
            return rep
        finally:
            T.add("validation", time.perf_counter() - t)
    ts.validate_stage = validate_stage

    runs = []
    for i in range(2):
        work = scratch / f"flow-{i}"
        shutil.rmtree(work, ignore_errors=True)
        validations.clear()
        t1 = time.perf_counter()
        results = fp.pipeline(config_path=str(REPO / CONFIG), overrides=[f"workdir={work}"], force=True)
        total = time.perf_counter() - t1
        t = T.reset()
        ge_import = t.get("ge_import", 0.0)
        mlflow = t.get("mlflow", 0.0) + t.get("mlflow_first", 0.0)
        validation = t.get("validation", 0.0)
        work_s = t.get("execute", 0.0) - validation
        startup = entered["in"] - t1
        finalize = t1 + total - entered["out"]
        runs.append({
            "seconds": total, "flow_startup": startup, "flow_finalize": finalize,
            "stage_work": work_s, "validation": validation, "ge_import": ge_import,
            "validation_durations": list(validations), "mlflow": mlflow, "mlflow_first": t.get("mlflow_first", 0.0),
            "prefect_artifacts": t.get("prefect_artifacts", 0.0),
            "rest": total - startup - finalize - work_s - validation - mlflow - t.get("prefect_artifacts", 0.0),
            "stages": [r["stage"] for r in results]})
    return {"import_prefect_s": t_prefect, "import_s": t_imports, "runs": runs}


def job_validate(dirs: dict, repeat: int) -> dict:
    """GE import, one warm-up validation, then ``repeat`` timed validations of each normalize output."""
    import tasks.validation as tv
    t0 = time.perf_counter()
    tv.import_gx()
    ge_import = time.perf_counter() - t0
    out = {"ge_import_s": ge_import, "sizes": {}}
    first = None
    for size, d in dirs.items():
        d = Path(d)
        manifest = json.loads((d / "manifest.json").read_text())
        if first is None:
            first = tv.validate_stage("normalize", d, manifest, seed=0).duration_s
        durs, walls = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            rep = tv.validate_stage("normalize", d, manifest, seed=0)
            walls.append(time.perf_counter() - t)
            durs.append(rep.duration_s)
        docs_bytes = sum(f.stat().st_size for f in (d / "docs").glob("*.parquet"))
        out["sizes"][size] = {"durations": durs, "walls": walls, "success": rep.success,
                              "n_rows_sampled": rep.n_rows_sampled, "docs": manifest["counts"]["docs"],
                              "docs_bytes": docs_bytes}
    out["warmup_s"] = first
    return out


# ----------------------------------------------------------------------------------------- helpers
def _normalize_output(corpus_dir: Path, size: int) -> Path | None:
    """The complete normalize output of benchmark 1 for ``size`` MB, if any (newest)."""
    base = corpus_dir / f"ours-{size}MB" / "normalize"
    if not base.is_dir():
        return None
    outs = [p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / "manifest.json").is_file()]
    return max(outs, key=lambda p: p.stat().st_mtime) if outs else None


def _ensure_normalized(corpus_dir: Path, size: int) -> Path:
    d = _normalize_output(corpus_dir, size)
    if d is not None:
        return d
    print(f"  no normalize output for {size} MB under {corpus_dir}: generating and normalizing it", flush=True)
    write_corpus(corpus_dir, size)
    run_measured([sys.executable, str(HERE / "normalize.py"), "--out", str(corpus_dir), "--size", str(size),
                  "--job", "ours"])
    d = _normalize_output(corpus_dir, size)
    if d is None:
        raise SystemExit(f"normalize of {size} MB left no output under {corpus_dir}")
    return d


# ----------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/overhead", help="scratch folder (deleted and rewritten)")
    ap.add_argument("--corpus-dir", default="bench-out/normalize",
                    help="benchmark 1's scratch folder: its normalize outputs are reused for the validation timings")
    ap.add_argument("--validation-sizes", default="10,1000", help="corpus sizes (MB) whose normalize output is validated")
    ap.add_argument("--repeat", type=int, default=3, help="timed validations per size (median reported)")
    ap.add_argument("--skip-pipeline", action="store_true", help="only the validation timings")
    ap.add_argument("--skip-validation", action="store_true", help="only the pipeline overhead")
    ap.add_argument("--job", choices=["direct", "flow", "validate"], help=argparse.SUPPRESS)
    ap.add_argument("--dirs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    scratch = Path(args.out).resolve()

    if args.job:
        os.chdir(REPO)
        if args.job == "direct":
            job_result(job_direct(scratch))
        elif args.job == "flow":
            job_result(job_flow(scratch))
        else:
            job_result(job_validate(json.loads(args.dirs), args.repeat))
        return

    print(f"{os.cpu_count()} cores; demo config {CONFIG}; scratch {scratch}", flush=True)
    if not args.skip_pipeline:
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        me = [sys.executable, __file__, "--out", str(scratch), "--job"]
        d = _run(me + ["direct"])
        print(f"  direct: cold {d['runs'][0]['seconds']:.1f} s, warm {d['runs'][1]['seconds']:.1f} s "
              f"(process {d['wall_s']:.1f} s)", flush=True)
        f = _run(me + ["flow"])
        print(f"  in-process flow: cold {f['runs'][0]['seconds']:.1f} s, warm {f['runs'][1]['seconds']:.1f} s "
              f"(process {f['wall_s']:.1f} s)", flush=True)
        cli_work = scratch / "cli"
        c = _run([str(Path(sys.executable).with_name("mlm")), "run", str(REPO / CONFIG), "--force",
                  "--set", f"workdir={cli_work}"])
        print(f"  cli: {c['wall_s']:.1f} s", flush=True)
        # a cold direct process, for the CLI comparison: interpreter + imports + the work
        dc = d["wall_s"] - d["runs"][1]["seconds"]
        print("\noverhead of orchestration on the demo pipeline (stages: "
              + ", ".join(d["runs"][0]["stages"]) + ")\n")
        rows = []
        for label, direct_s, orch_s in (
                ("cold CLI process (`mlm run`) vs cold direct process", dc, c["wall_s"]),
                ("in-process flow, 1st call (cold) vs direct 1st call", d["runs"][0]["seconds"], f["runs"][0]["seconds"]),
                ("in-process flow, 2nd call (warm) vs direct 2nd call", d["runs"][1]["seconds"], f["runs"][1]["seconds"])):
            ov = orch_s - direct_s
            rows.append([label, f"{direct_s:.2f}", f"{orch_s:.2f}", f"{ov:.2f}", f"{100 * ov / orch_s:.0f} %",
                         check(ov / orch_s <= 0.20)])
        print(table(["comparison", "direct s", "orchestrated s", "overhead s", "overhead %", "target <= 20 %"], rows,
                    "lrrrrr"))
        print("\nwhere the in-process flow's time goes (seconds)\n")
        keys = [("flow_startup", "Prefect flow start-up (ephemeral server, flow run), call -> flow body"),
                ("stage_work", "stage work (mlm_core execute, minus validation)"),
                ("ge_import", "  of validation: first GE import + context"),
                ("validation", "GE validation (incl. the GE import above)"),
                ("mlflow_first", "  of MLflow: first Tracker() (import mlflow, create the SQLite DB)"),
                ("mlflow", "MLflow logging (incl. the first Tracker above)"),
                ("prefect_artifacts", "Prefect artifacts"),
                ("rest", "rest (Prefect task runs, config/plan, logging)"),
                ("flow_finalize", "Prefect flow finalization (flow body -> return)"),
                ("seconds", "total")]
        rows = [[lab, *(f"{r[k]:.2f}" for r in f["runs"])] for k, lab in keys]
        rows.insert(-1, ["direct, for comparison: " + ", ".join(
            f"{n} {d['runs'][0]['stages'][n]:.2f}/{d['runs'][1]['stages'][n]:.2f}" for n in d["runs"][0]["stages"]),
            *(f"{r['seconds']:.2f}" for r in d["runs"])])
        print(table(["piece", "1st call (cold)", "2nd call (warm)"], rows, "lrr"))
        print(f"\nimports: prefect {f['import_prefect_s']:.2f} s, + flows/tasks {f['import_s'] - f['import_prefect_s']:.2f} s"
              f" (in-process job); mlm_core {d['import_s']:.2f} s (direct job); validation duration_s per stage "
              f"(cold/warm): {f['runs'][0]['validation_durations']} / {f['runs'][1]['validation_durations']}")
        print(f"peak RSS: direct {mib(d['peak_rss'])}, in-process flow {mib(f['peak_rss'])}, cli {mib(c['peak_rss'])}")

    if not args.skip_validation:
        sizes = [int(s) for s in args.validation_sizes.split(",") if s.strip()]
        cdir = Path(args.corpus_dir).resolve()
        dirs = {str(s): str(_ensure_normalized(cdir, s)) for s in sizes}
        v = _run([sys.executable, __file__, "--out", str(scratch), "--repeat", str(args.repeat), "--job", "validate",
                  "--dirs", json.dumps(dirs)])
        print(f"\nnormalize validation (validate_stage, GE; first GE import {v['ge_import_s']:.2f} s and a warm-up "
              f"validation {v['warmup_s']:.2f} s excluded; median of {args.repeat})\n")
        rows = []
        for s in sizes:
            r = v["sizes"][str(s)]
            med = statistics.median(r["durations"])
            rows.append([f"{s} MB", f"{r['docs']:,}", f"{r['docs_bytes'] / 1e6:,.0f} MB",
                         ", ".join(f"{k} {n:,}" for k, n in r["n_rows_sampled"].items()),
                         f"{med:.2f}", f"{min(r['durations']):.2f}-{max(r['durations']):.2f}",
                         "passed" if r["success"] else "FAILED", check(med <= 2.0)])
        print(table(["corpus", "docs", "docs parquet", "rows validated", "duration_s", "range", "result",
                     "target <= 2 s"], rows, "lrrlrrll"))


if __name__ == "__main__":
    main()
