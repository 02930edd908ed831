"""Stored outputs are verified, not trusted (issue 9 item 2): sizes always, sha256 per the verify policy,
missing and extra files, every problem in one report; the shard reader; `mlm status` and `mlm verify`.

Expected sizes and hashes are computed here with hashlib/len on the bytes the test wrote or changed,
never read back from the code under test."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_lines
from mlm_core import stages
from mlm_core import store as store_mod
from mlm_core.config.io import load_config
from mlm_core.shards import ShardDataset, ShardIntegrityError
from mlm_core.store import MANIFEST, VERIFIED, CorruptOutputError, StageStore

EN = [f"The quick brown fox number {i} jumps over the lazy dog." for i in range(40)]
FR = [f"Le renard brun numéro {i} saute par-dessus le chien paresseux." for i in range(40)]
DATA_STAGES = ("normalize", "tokenizer", "shards")


def flip_byte(f: Path, at: int | None = None) -> None:
    """Change one byte, keeping the size (only a checksum can see it)."""
    data = bytearray(f.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    f.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------ a real data pipeline
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """normalize -> tokenizer -> shards run once through stages.execute; tests corrupt private copies of it."""
    root = tmp_path_factory.mktemp("verify-pipe")
    raw = {"workdir": str(root / "work"),
           "sources": {"en": {"paths": [str(write_lines(root / "en.txt", EN))]},
                       "fr": {"paths": [str(write_lines(root / "fr.txt", FR))]}},
           "normalize": {"workers": 1}, "tokenizer": {"vocab_size": 300, "heldout_docs": 5, "min_vocab_fraction": 0.1},
           "shards": {"seq_len": 16, "workers": 1, "rows_per_shard": 8}}
    lc = load_config(root / "cfg.yaml", raw=raw)
    plans = stages.plan(lc)
    for name in DATA_STAGES:
        stages.execute(lc, name, plans)
    return raw


@pytest.fixture
def pipe(built, tmp_path):
    """A private copy of the built workdir (same fingerprints) and its config file."""
    shutil.copytree(built["workdir"], tmp_path / "work")
    raw = {**built, "workdir": str(tmp_path / "work")}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    lc = load_config(cfg)
    plans = stages.plan(lc)
    assert [plans[n].status for n in DATA_STAGES] == ["done"] * 3
    return lc, plans, cfg


def test_edited_docs_parquet_is_refused_by_the_next_stage(pipe):
    lc, plans, _ = pipe
    norm = plans["normalize"]
    flip_byte(norm.path / "docs" / "en.parquet")
    before = sorted((lc.workdir / "tokenizer").iterdir())
    with pytest.raises(CorruptOutputError) as exc:
        stages.execute(lc, "tokenizer", plans, force=True)
    msg = str(exc.value)
    for part in ("stage 'normalize'", norm.fingerprint, "docs/en.parquet: sha256 mismatch", "--only normalize --force"):
        assert part in msg, msg
    # the hint is the user's own command (issue 24 item 4), not `mlm run <config> ...`
    hinted = msg.split("rebuild it with `", 1)[1].split("`", 1)[0]
    assert shlex.split(hinted) == ["mlm", "run", str(lc.path), "--only", "normalize", "--force"]
    assert "<config>" not in msg
    assert sorted((lc.workdir / "tokenizer").iterdir()) == before      # nothing was built from it
    # the suggested rebuild replaces the corrupt output, and the next stage then runs
    art, hit = stages.execute(lc, "normalize", plans, force=True)
    assert not hit and StageStore(lc.workdir).verify("normalize", norm.fingerprint).ok
    stages.execute(lc, "tokenizer", plans, force=True)


def test_cache_hit_is_verified_too(pipe):
    lc, plans, _ = pipe
    f = plans["tokenizer"].path / "tokenizer.json"
    size = f.stat().st_size
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(CorruptOutputError, match=rf"tokenizer.json: size mismatch: expected {size} bytes, "
                                                 rf"got {size - 10}"):
        stages.execute(lc, "tokenizer", plans)


def test_shard_reader_reports_every_problem_at_once(pipe):
    lc, plans, _ = pipe
    path = plans["shards"].path
    m = json.loads((path / MANIFEST).read_text())
    shards = [s["file"] for s in m["shards"]]
    assert len(shards) >= 3 and (path / "sampling.parquet").is_file()
    flip_byte(path / shards[0])                                         # altered, same size
    (path / shards[1]).write_bytes((path / shards[1]).read_bytes()[:-5])  # truncated
    (path / shards[2]).unlink()                                         # missing
    flip_byte(path / "sampling.parquet")                               # not a shard: still checked
    (path / "notes.txt").write_text("left here by hand\n")             # extra, not *.arrow
    for policy in ("always", "once"):
        with pytest.raises(ShardIntegrityError) as exc:
            ShardDataset(path, verify=policy)
        msg = str(exc.value)
        for part in (f"{shards[0]}: sha256 mismatch", f"{shards[1]}: size mismatch", f"{shards[2]}: missing",
                     "sampling.parquet: sha256 mismatch", "notes.txt: unexpected extra file"):
            assert part in msg, (policy, msg)


@pytest.mark.parametrize("damage", ["sampling", "extra"])
def test_shard_reader_single_problems(pipe, damage):
    """Each alone: a corrupted sampling.parquet, and an extra non-.arrow file (both unnoticed before)."""
    lc, plans, _ = pipe
    path = plans["shards"].path
    if damage == "sampling":
        flip_byte(path / "sampling.parquet")
        want = "sampling.parquet: sha256 mismatch"
    else:
        (path / "train" / "README").write_text("x")
        want = "train/README: unexpected extra file"
    with pytest.raises(ShardIntegrityError, match=want):
        ShardDataset(path, verify="always")


def _commands(text: str) -> list[list[str]]:
    """Every `...` command in a hint, split as a shell would."""
    return [shlex.split(c) for c in text.split("`")[1::2]]


def test_status_says_corrupt_and_verify_lists_everything(pipe, capsys):
    from flows.cli import main
    lc, plans, cfg = pipe
    flip_byte(plans["normalize"].path / "docs" / "fr.parquet")
    (plans["tokenizer"].path / "stray.bin").write_bytes(b"\0")
    assert main(["status", str(cfg)]) == 1                 # corrupt is an exit status (issue 24 item 4)
    out = capsys.readouterr().out
    norm_line = next(line for line in out.splitlines() if line.startswith("normalize"))
    assert "corrupt" in norm_line and "docs/fr.parquet: sha256 mismatch" in out
    assert "stray.bin: unexpected extra file" in out
    assert next(line for line in out.splitlines() if line.startswith("shards")).split()[1] == "done*"
    hint = next(line for line in out.splitlines() if line.startswith("corrupt outputs"))
    assert _commands(hint) == [["mlm", "verify", str(cfg)],
                               ["mlm", "run", str(cfg), "--only", "normalize", "--force"],
                               ["mlm", "run", str(cfg), "--only", "tokenizer", "--force"]]
    assert main(["verify", str(cfg)]) == 1
    cap = capsys.readouterr()
    assert "docs/fr.parquet: sha256 mismatch" in cap.out and "stray.bin: unexpected extra file" in cap.out
    assert "2 problem(s)" in cap.err and "STAGE" not in cap.err and "<config>" not in cap.err
    assert _commands(cap.err) == [["mlm", "run", str(cfg), "--only", "normalize", "--force"],
                                  ["mlm", "run", str(cfg), "--only", "tokenizer", "--force"]]
    assert main(["verify", str(cfg), "shards", "--json"]) == 0
    assert [r["status"] for r in json.loads(capsys.readouterr().out)] == ["ok"]


# ------------------------------------------------------------------------------------ hand-built outputs
FILES = {"a.txt": b"alpha\n" * 100, "sub/b.bin": bytes(range(256)) * 4, "c.txt": b"gamma"}


def hand_built(tmp_path) -> tuple[StageStore, Path]:
    st = StageStore(tmp_path / "work")

    def produce(out: Path) -> dict:
        for rel, data in FILES.items():
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (out / rel).write_bytes(data)
        return {"stats": {"n": len(FILES)}}
    art = st.write("demo", "fp0", produce, {})
    return st, art.path


def test_one_report_lists_every_problem(tmp_path):
    st, d = hand_built(tmp_path)
    flip_byte(d / "a.txt")
    (d / "sub" / "b.bin").write_bytes(FILES["sub/b.bin"] + b"!")
    (d / "c.txt").unlink()
    (d / "d.txt").write_text("new")
    rep = st.verify("demo", "fp0")
    assert sorted((p.file, p.kind) for p in rep.problems) == [
        ("a.txt", "sha256"), ("c.txt", "missing"), ("d.txt", "extra"), ("sub/b.bin", "size")]
    assert f"expected {len(FILES['sub/b.bin'])} bytes, got {len(FILES['sub/b.bin']) + 1}" in rep.describe()
    with pytest.raises(CorruptOutputError) as exc:
        st.load("demo", "fp0", verify="once")
    assert exc.value.report.problems == rep.problems and "stage 'demo' (fingerprint fp0" in str(exc.value)


def test_once_hashes_each_file_once_and_rehashes_on_mtime_change(tmp_path, monkeypatch):
    st, d = hand_built(tmp_path)
    manifest_before = (d / MANIFEST).read_bytes()
    hashed = []
    real = store_mod.sha256_file
    monkeypatch.setattr(store_mod, "sha256_file", lambda p, *a: hashed.append(Path(p).relative_to(d).as_posix())
                        or real(p, *a))

    st.load("demo", "fp0", verify="once")
    assert hashed == []                   # the store hashed every file when it wrote them, and recorded it
    (d / VERIFIED).unlink()
    st.load("demo", "fp0", verify="once")
    assert sorted(hashed) == sorted(FILES)
    side = json.loads((d / VERIFIED).read_text())
    assert {k: v["sha256"] for k, v in side.items()} == {k: hashlib.sha256(v).hexdigest() for k, v in FILES.items()}
    assert {k: v["bytes"] for k, v in side.items()} == {k: len(v) for k, v in FILES.items()}

    hashed.clear()
    st.load("demo", "fp0", verify="once")                         # recorded: sizes only
    assert hashed == []
    # the sidecar is the store's own: not an extra file, not in the manifest, manifest (and fingerprint) untouched
    assert (d / MANIFEST).read_bytes() == manifest_before and VERIFIED not in json.loads(manifest_before)["files"]
    assert st.verify("demo", "fp0", "size").ok

    st_a = (d / "a.txt").stat()
    os.utime(d / "a.txt", ns=(st_a.st_atime_ns, st_a.st_mtime_ns + 5_000_000_000))
    st.load("demo", "fp0", verify="once")                         # touched: hashed again, only that file
    assert hashed == ["a.txt"]

    hashed.clear()
    st.load("demo", "fp0", verify="always")
    st.load("demo", "fp0", verify="always")
    assert len(hashed) == 2 * len(FILES)

    # a same-size edit is invisible to "size", seen by "once" (mtime changed) and "always"
    hashed.clear()
    flip_byte(d / "c.txt")
    assert st.verify("demo", "fp0", "size").ok and hashed == []
    assert [p.file for p in st.verify("demo", "fp0", "once").problems] == ["c.txt"]
    assert [p.file for p in st.verify("demo", "fp0", "always").problems] == ["c.txt"]
    assert "c.txt" not in json.loads((d / VERIFIED).read_text())     # a failed file is never recorded as good


def test_forced_rebuild_replaces_a_corrupt_output(tmp_path):
    st, d = hand_built(tmp_path)
    flip_byte(d / "a.txt")
    art = st.write("demo", "fp0", lambda out: (out / "a.txt").write_bytes(FILES["a.txt"]) and {}, {})
    assert (art.path / "a.txt").read_bytes() == FILES["a.txt"] and not (art.path / "c.txt").exists()
    assert st.verify("demo", "fp0").ok
    assert [p.name for p in (tmp_path / "work" / "demo").iterdir()] == ["fp0"]     # nothing left aside


def test_unknown_policy_is_an_error(tmp_path):
    st, _ = hand_built(tmp_path)
    with pytest.raises(ValueError, match="verify policy 'sometimes'"):
        st.load("demo", "fp0", verify="sometimes")


# ------------------------------------------------------------------------------------ issue 24 item 4
REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd or REPO, timeout=300)


def test_status_exit_status_in_a_real_process(pipe):
    lc, plans, cfg = pipe
    ok = _cli("status", str(cfg))
    assert ok.returncode == 0, ok.stderr
    # under the default verify: once, `done` carries a footnote saying what it does not see, once
    assert ok.stdout.count("done*") == 3
    foot = [line for line in ok.stdout.splitlines() if line.startswith("* done")]
    assert len(foot) == 1 and "size and mtime is not detected" in foot[0]
    assert _commands(foot[0]) == [["mlm", "verify", str(cfg)]]
    flip_byte(plans["tokenizer"].path / "tokenizer.json")
    bad = _cli("status", str(cfg))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "corrupt" in next(line for line in bad.stdout.splitlines() if line.startswith("tokenizer"))
    assert _cli("status", str(cfg), "--json").returncode == 1
    # verify: always never needs the footnote
    assert "* done" not in _cli("status", str(cfg), "--set", "verify=always").stdout


def test_failed_stage_shows_its_folder_and_a_success_removes_it(pipe, capsys):
    from flows.cli import main
    lc, plans, cfg = pipe
    st = StageStore(lc.workdir)
    fp = plans["pretrain"].fingerprint
    failed = lc.workdir / "pretrain" / f".failed-{fp}"
    failed.mkdir(parents=True)
    (failed / "metrics.jsonl").write_text("{}\n")
    main(["status", str(cfg)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("pretrain")).split()
    assert row[1] == "failed" and row[-1] == str(failed)
    note = next(line for line in out.splitlines() if line.startswith("pretrain: the last attempt failed"))
    assert str(failed) in note and _commands(note) == [["mlm", "run", str(cfg), "--only", "pretrain"]]
    # the store itself: a failed write leaves .failed-<fp>, a successful one of the same fingerprint removes it

    def boom(out: Path) -> dict:
        (out / "part.txt").write_text("half")
        raise RuntimeError("stopped")
    with pytest.raises(RuntimeError):
        st.write("demo", "fpx", boom, {})
    assert (lc.workdir / "demo" / ".failed-fpx" / "part.txt").read_text() == "half"
    st.write("demo", "fpx", lambda out: (out / "a.txt").write_text("ok") and {}, {})
    assert not (lc.workdir / "demo" / ".failed-fpx").exists()
    assert st.is_complete("demo", "fpx")


def test_an_earlier_commands_undelivered_records_are_not_warned_again(pipe, capsys):
    """The closing `mlm sync` warning is about this command: an in-process `main()` after one whose MLflow was
    unreachable (the full suite ran such a test first, and `mlm verify` then printed `mlm sync`) stays quiet."""
    from flows.cli import main
    from tasks.tracking import note_undelivered     # loaded, as after any run: the warning is armed
    _, _, cfg = pipe
    note_undelivered("http://127.0.0.1:9", records=3, run="pretrain")
    assert main(["verify", str(cfg)]) == 0
    assert "mlm sync" not in capsys.readouterr().err
