"""The real-text recipe search of issue 20: which knobs take a model off the unigram plateau within the
`make real` budget (<= 30 min end to end on an idle 2-core machine).

Each variant is a list of ``--set`` words applied to a pipeline config (default ``configs/real.yaml``); the
data stages (normalize, tokenizer, shards) and each pretrain output are the pipeline's own, executed through
``mlm_core.stages`` (no Prefect, no MLflow) into the config's workdir, so a variant already trained is reused.
Every variant is scored by the evaluate stage's intrinsic metric: held-out ``[MASK]``-only top-1 per language
against the unigram baseline at the same positions, with the document-bootstrap interval of the difference
(``mlm_core.evaluate.intrinsic``). Pretraining time is the stage's own wall time (noisy on a shared machine:
the table also gives tokens/s and the machine's load average during the run).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/recipe_search.py \
        --variant "rotary-800" pretrain.model.position=rotary \
        --variant "learned-800" pretrain.model.position=learned

Results are appended to ``bench-out/recipe/results.jsonl`` (one record per variant) and printed as a table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def run_variant(config: Path, name: str, overrides: list[str], threads: int | None) -> dict:
    import torch

    from mlm_core import stages
    from mlm_core.config.io import load_config
    from mlm_core.evaluate.intrinsic import run_intrinsic
    if threads:
        torch.set_num_threads(threads)
    lc = load_config(config, overrides)
    plans = stages.plan(lc)
    arts, seconds = {}, {}
    for st in ("normalize", "tokenizer", "shards", "pretrain"):
        t0 = time.time()
        load0 = os.getloadavg()[0]
        arts[st], hit = stages.execute(lc, st, plans)
        seconds[st] = (None if hit else round(time.time() - t0, 1), round((load0 + os.getloadavg()[0]) / 2, 1))
    pre = arts["pretrain"]
    res = run_intrinsic(Path(pre.path), Path(arts["shards"].path), None,
                        lc.config.evaluate.model_copy(update={"pll_sentences": 0}), seed=lc.config.seed)
    langs = {}
    for lg, r in sorted(res["intrinsic"].items()):
        if r.get("missing"):
            continue
        langs[lg] = {k: r.get(k) for k in ("top1", "baseline_top1", "top1_over_baseline", "top1_over_baseline_ci_low",
                                           "top1_over_baseline_ci_high", "n_positions")}
    m = pre.manifest
    return {"name": name, "overrides": overrides, "fingerprint": pre.fingerprint, "steps": m.get("steps"),
            "tokens": m.get("tokens"), "pretrain_s": seconds["pretrain"][0], "load": seconds["pretrain"][1],
            "langs": langs, "at": time.strftime("%Y-%m-%d %H:%M:%S")}


def table(rows: list[dict]) -> str:
    langs = sorted({lg for r in rows for lg in r["langs"]})
    head = "| variant | pretrain s | " + " | ".join(f"{lg} top-1 (base)" for lg in langs) + " | min ×base |"
    out = [head, "|" + "---|" * (len(langs) + 3)]
    for r in rows:
        cells, ratios = [], []
        for lg in langs:
            x = r["langs"].get(lg)
            if not x:
                cells.append("-")
                continue
            ok = "" if (x["top1_over_baseline_ci_low"] or 0) > 0 else "·"
            cells.append(f"{x['top1']:.3f} ({x['baseline_top1']:.3f}){ok}")
            ratios.append(x["top1"] / max(x["baseline_top1"], 1e-9))
        out.append(f"| {r['name']} | {r['pretrain_s'] or 'stored'} | " + " | ".join(cells)
                   + f" | {min(ratios) if ratios else 0:.2f} |")
    return "\n".join(out) + "\n(· = the interval of top-1 − baseline reaches 0)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=REPO / "configs" / "real.yaml")
    ap.add_argument("--variant", nargs="+", action="append", metavar=("NAME", "KEY=VALUE"), required=True,
                    help="a name, then --set words (repeatable)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=REPO / "bench-out" / "recipe" / "results.jsonl")
    a = ap.parse_args(argv)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, *sets in a.variant:
        r = run_variant(a.config, name, sets, a.threads)
        rows.append(r)
        with open(a.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(r) + "\n")
        print(table([r]).splitlines()[-2], flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
