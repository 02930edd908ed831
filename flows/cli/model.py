"""``mlm evaluate``, ``mlm audit`` and ``mlm fill-mask``: commands on one model, a local folder or a registry URI
(``models:/name@alias``) located with the config's tracking settings. Stdlib at import (``mlm --help`` stays
instant); torch, MLflow and the stages are imported inside the commands.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from flows.cli.util import load_args, prepare_env, print_rows, run_cmd


def model_folder(args, lc=None):
    """A context manager giving a local folder for MODEL: a folder as is, or a registry URI resolved with the
    config's tracking settings, else $MLM_TRACKING_URI, else the demo's existing ./.mlm/mlflow.db (never
    created: without any of them, a clear error); a downloaded model's temporary folder is removed on exit."""
    prepare_env()
    uri = os.environ.get("MLM_TRACKING_URI")
    if lc is not None:
        from tasks.tracking import resolve_tracking_uri
        uri = resolve_tracking_uri(lc.config.tracking, lc.workdir)
    if uri is None and Path(".mlm", "mlflow.db").is_file():     # the demo config's workdir, as the README uses it
        uri = f"sqlite:///{Path('.mlm').resolve()}/mlflow.db"
    from tasks.registry import resolve_model
    return resolve_model(args.model, uri)


def cmd_evaluate(args) -> int:
    from mlm_core import stages
    from mlm_core.evaluate.stage import evaluate_model, intrinsic_rows, transfer_rows
    lc = load_args(args)
    plans = stages.plan(lc)
    for need in ("normalize", "shards"):
        if plans[need].status != "done":
            raise stages.PlanError(f"`mlm evaluate` needs the {need} output (held-out data), which is "
                                   f"{plans[need].status}: run `{run_cmd(lc, '--only', need)}` first")
    with model_folder(args, lc) as folder:
        result = evaluate_model(folder, plans["shards"].path, plans["normalize"].path, lc, None)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"model: {args.model}\nper-language masked-token metrics (held-out split), next to the unigram baseline:")
    # a language without held-out data shows as "-" in every column (the `missing` flag itself is not printed)
    print_rows([{k: v for k, v in r.items() if k != "missing"} for r in intrinsic_rows(result)])
    print("zero-shot transfer (fine-tuned on the source language only; gap = source - target, positive = lost):")
    print_rows(transfer_rows(result))
    ret = (result.get("transfer") or {}).get("retrieval") or {}
    if ret:
        print(f"parallel-sentence retrieval ({ret.get('metric', 'accuracy@1')}, layer {ret.get('layer')}, "
              f"pivot {ret.get('pivot')}; chance = 1/n):")
        print_rows([{"pair": f"{ret.get('pivot')}-{lang}", **r} for lang, r in sorted((ret.get("pairs") or {}).items())])
    eff = result.get("efficiency") or {}
    if eff:         # evaluate.efficiency (mlm_core.evaluate.efficiency)
        print(f"efficiency on {eff.get('device')} ({eff.get('device_kind')}):")
        print_rows([{"parameters": eff.get("parameters"), "latency_p50_ms": eff["latency_ms"]["p50"],
                      "latency_p95_ms": eff["latency_ms"]["p95"],
                      "throughput_seq_s": eff["throughput"]["sequences_per_s"],
                      **{f"peak_mb_seq{k}": v for k, v in (eff.get("peak_memory_mb") or {}).items()}}])
    return 0


def cmd_audit(args) -> int:
    from mlm_core.audit import run_audit
    lc = load_args(args)
    with model_folder(args, lc) as folder:
        result = run_audit(folder, lc.config.audit, lc.base_dir)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"model: {args.model}\nCrowS-Pairs (% preferring the more stereotypical sentence; 50 = no preference):")
    print_rows([{"lang": lang, "n": r.get("n"), "score": r.get("metric_score"), "stereo": r.get("stereo_score"),
                  "antistereo": r.get("antistereo_score"), "neutral_%": r.get("neutral_pct"),
                  "empty_sentence": r.get("n_empty_sentence"), "skipped": len(r.get("skipped") or [])}
                 for lang, r in sorted(result.get("crows", {}).items())])
    print("templates (Δ_bias = E_w[log p(w|group1) - log p(w|group2)]; KL to neutral):")
    print_rows([{"lang": lang, **{f"delta {k}": v for k, v in (t.get("delta_bias") or {}).items()},
                  "kl_to_neutral": t.get("kl_to_neutral_mean")} for lang, t in sorted(result.get("templates", {}).items())])
    print(result.get("limits", ""))
    return 0


def cmd_fill_mask(args) -> int:
    from mlm_core.fillmask import fill_mask
    with model_folder(args, load_args(args) if args.config else None) as folder:
        results = fill_mask(folder, args.text, args.top_k)
    if args.json:
        print(json.dumps(results, indent=2, ensure_ascii=False))
        return 0
    for i, preds in enumerate(results):
        print(f"mask #{i + 1}:")
        for p in preds:
            print(f"  {p['score']:.4f}  {p['token']:<16} {p['sequence']}")
    return 0
