"""Shared fixtures. Heavy imports (prefect, mlflow, great_expectations, torch) stay inside fixtures/tests."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# a test that records to Prefect outside the session harness starts Prefect's ephemeral server, 20 s to come up by
# default: on a loaded 2-core machine it took longer and the test failed with "Timed out while attempting to
# connect to ephemeral Prefect API server" (the session harness already waits 120 s)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

# Under pytest-xdist (`make test` runs TEST_WORKERS=2 workers, one per core of CI's machine): one torch/OpenMP
# thread per worker, so two workers never fight over the cores with spinning threads (pretrain's automatic thread
# count honours $OMP_NUM_THREADS; tests that need more set it themselves), and a Prefect home per worker, so two
# workers' ephemeral Prefect servers never share one SQLite database. Set before torch or prefect is imported.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix=f"mlm-tests-{os.environ['PYTEST_XDIST_WORKER']}-"))

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"


# ------------------------------------------------------------------------------ test tiers
# `heavy` (pyproject.toml): starts a server (Prefect, MLflow, PostgreSQL, `mlm serve`), a subprocess pipeline
# (`mlm run`/`mlm sweep` in a process, torchrun, a Dask cluster) or runs real stages end to end, or takes > ~10 s.
# `make test-fast` runs `-m "not heavy"`. Marked in the test files, and here: a test that asks (directly or through
# another fixture) for one of these server fixtures, or for one its module names in its own ``HEAVY_FIXTURES``
# (a module fixture that trains a model or runs stages), is heavy, so a new test on them lands in the heavy tier.
HEAVY_FIXTURES = frozenset({"prefect_harness", "postgres"})


@pytest.hookimpl(tryfirst=True)              # before `-m` deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        heavy = HEAVY_FIXTURES | set(getattr(getattr(item, "module", None), "HEAVY_FIXTURES", ()))
        if heavy & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.heavy)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real public data in ../shared/data; always present in CI, so its absence is a failure, not a skip."""
    assert SHARED_DATA.is_dir(), f"{SHARED_DATA} is missing: tests read real data from ../shared/data"
    return SHARED_DATA


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory):
    """One Prefect test server per session (~15 s), only for the tests that ask for it."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    from prefect.testing.utilities import prefect_test_harness
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny torch ops on a shared 2-core machine: a second intra-op thread only spins (10-50x the CPU time).
    Use with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``; restored after the module."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_lines(path: Path, lines: list[str] | bytes, newline: str = "\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(lines, bytes):
        path.write_bytes(lines)
    else:
        path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return path


FOX_EN = "The quick brown fox number {i} jumps over the lazy dog again."
FOX_RU = "Быстрая лиса номер {i} прыгает через ленивую собаку."


def write_en_ru_config(tmp_path: Path, name: str, n_lines: int, **sections) -> Path:
    """``tmp_path/cfg.yaml``: a two-language pipeline (en, ru: ``n_lines`` numbered fox sentences each, in local
    files) with one normalize worker and its workdir under ``tmp_path``; ``sections`` are added or replace."""
    import yaml
    raw = {"name": name, "workdir": str(tmp_path / "work"),
           "sources": {"en": {"paths": [str(write_lines(tmp_path / "en.txt", [FOX_EN.format(i=i) for i in range(n_lines)]))]},
                       "ru": {"paths": [str(write_lines(tmp_path / "ru.txt", [FOX_RU.format(i=i) for i in range(n_lines)]))]}},
           "normalize": {"workers": 1}} | sections
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(raw))
    return f


DEMO_STAGES = ("normalize", "tokenizer", "shards", "pretrain", "evaluate")


def run_demo_pipeline(tmp_path: Path, n_lines: int, **sections) -> dict:
    """{stage: Artifact} of normalize -> tokenizer (WordPiece 700, quality gates loosened for the tiny corpus)
    -> shards -> pretrain -> evaluate, run by ``mlm_core.stages`` over the first ``n_lines`` lines of the
    demo corpus' en and fr (copied under ``tmp_path``, workdir ``tmp_path/work``, seed 3, one worker).
    Each of ``sections`` (tokenizer, shards, pretrain, evaluate) is merged over that section's defaults."""
    from mlm_core.config.io import load_config
    from mlm_core.stages import execute, plan
    sources = {}
    for lang in ("en", "fr"):
        lines = (REPO / "configs/demo/corpus" / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:n_lines]
        (tmp_path / f"{lang}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        sources[lang] = {"paths": [str(tmp_path / f"{lang}.txt")]}
    base = {"tokenizer": {"algorithm": "wordpiece", "vocab_size": 700, "heldout_docs": 10, "sample_mb": 1.0,
                          "min_vocab_fraction": 0.1, "max_unk_rate": 0.5, "max_fertility": 20.0},
            "shards": {"workers": 1, "rows_per_shard": 64}, "pretrain": {"steps": 3},
            "evaluate": {"pll_sentences": 0, "efficiency": True, "efficiency_repeats": 2}}
    unknown = set(sections) - set(base)
    assert not unknown, f"run_demo_pipeline: no defaults for sections {sorted(unknown)}"
    lc = load_config(raw={"workdir": str(tmp_path / "work"), "seed": 3, "sources": sources,
                          "normalize": {"workers": 1}, **{k: v | sections.get(k, {}) for k, v in base.items()}})
    plans = plan(lc)
    return {name: execute(lc, name, plans)[0] for name in DEMO_STAGES}


# ------------------------------------------------------------------------------ a throwaway PostgreSQL
def pg_bin() -> Path | None:
    """The folder holding initdb + pg_ctl: on PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which("initdb")
    dirs = ([Path(found).resolve().parent] if found else []) + \
        [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]
    return next((d for d in dirs if (d / "initdb").is_file() and (d / "pg_ctl").is_file()), None)


class PgServer:
    """A PostgreSQL server in a temporary folder (initdb, trust auth, a free loopback port); ``url`` is the
    ``--db`` URL. ``stop(mode)`` / ``start()`` stop and restart it on the same port (outage tests).
    PostgreSQL refuses to run as root: as root it runs as the ``postgres`` user (``runuser``)."""

    def __init__(self):
        from flows.procs import free_port
        self.bindir = pg_bin()
        if self.bindir is None:
            msg = "no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql"
            print(f"\nSKIP: {msg}")
            pytest.skip(msg)
        self.run_as: list[str] = []
        self.root = Path(tempfile.mkdtemp(prefix="mlm-pg-"))   # not pytest's tmp: the postgres user must reach it
        if os.geteuid() == 0:                                  # postgres refuses root: run it as its own user
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail("running as root and no 'postgres' user to run PostgreSQL as")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self.run_as = ["runuser", "-u", "postgres", "--"]
        self.port = free_port()
        self.data = self.root / "data"
        self.url = f"postgresql://mlm@127.0.0.1:{self.port}/mlm"

    def _pg_ctl(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run([*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args],
                              capture_output=True, text=True, cwd="/", timeout=timeout)

    def init(self) -> None:
        r = subprocess.run([*self.run_as, str(self.bindir / "initdb"), "-D", str(self.data), "-U", "mlm",
                            "--auth=trust", "-E", "UTF8", "--no-locale"], capture_output=True, text=True, cwd="/",
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr

    def start(self) -> None:
        r = self._pg_ctl("-l", str(self.root / "log"), "-w", "-t", "60", "-o",
                         f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start")
        assert r.returncode == 0, r.stdout + r.stderr + (self.root / "log").read_text(errors="replace")

    def stop(self, mode: str = "immediate") -> None:
        r = self._pg_ctl("-m", mode, "-w", "stop", timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr

    def remove(self) -> None:
        self._pg_ctl("-m", "immediate", "-w", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def pg_server():
    """A started ``PgServer``; always stopped and removed."""
    pg = PgServer()
    try:
        pg.init()
        pg.start()
        print(f"\nPostgreSQL {pg.bindir.parent.name} on 127.0.0.1:{pg.port} ({pg.data})")
        yield pg
    finally:
        pg.remove()


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server for the module; yields the ``--db`` URL. Always stopped and removed."""
    with pg_server() as pg:
        yield pg.url


def wait_for_ping(proc, port: int, log: Path, timeout: float = 180) -> None:
    """Wait until ``mlflow models serve`` (process ``proc``, logging to ``log``) answers /ping on ``port``."""
    import time
    import urllib.request
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2).status == 200:
                return
        except OSError:
            pass
        assert time.time() < deadline, f"mlflow models serve did not answer /ping within {timeout:.0f} s"
        time.sleep(1)
