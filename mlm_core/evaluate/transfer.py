"""Zero-shot cross-lingual transfer (XTREME protocol, Hu et al., 2020): fine-tune on the source
language only, evaluate on every target language; plus Tatoeba-style parallel-sentence retrieval.

In: a trained model folder (``fillmask.load_model_dir``), an ``EvaluateConfig`` whose paths are
relative to ``base_dir`` (the config file's folder), a seed. Out: ``run_transfer`` returns
{"upos": ..., "classification": ..., "retrieval": ...} (a task not configured is absent).

- UPOS tagging: words -> subwords with ``Tokenizer.encode(words, is_pretokenized=True)``; the label
  sits on each word's first subword (``word_ids``), the others are ignored (-100). Word-level accuracy;
  a word that yields no subword counts as wrong. A sentence longer than the model's input is split into
  overlapping windows (``word_windows``: stride half a window, as the doc-stride windows of the BERT/XTREME
  evaluation code), each word scored in the window where it has the most context on its nearer side; so
  no word is scored wrong for lying past ``max_positions``. Per target, ``long_sentences`` and
  ``words_past_max_len`` say how many needed it (the words a single truncated input would have lost).
- Sentence classification: mean of the non-pad hidden states -> linear head; accuracy.
- Every target (both tasks) also reports macro-F1 and per-class (UPOS: per-tag) precision, recall and F1
  (``protocols.per_class_prf``); early stopping maximizes ``finetune.primary_metric`` (accuracy or macro_f1).
  With ``finetune.cv`` classification adds stratified k-fold cross-validation on the source file ("cv":
  per fold and mean ± std; ``classification_cv``).
- Per target: ``score``, ``source_score``, ``gap`` = source_score − score (``gates.transfer_gap``: positive = lost in transfer),
  ``majority_baseline`` (the most frequent source training label predicted everywhere, scored on
  the target) and ``unseen_labels`` (target gold labels never seen in the source training data: they
  can only be scored wrong; reported, not an error). ``source_score`` comes from held-out data: the
  source language's target file when ``source_lang`` is also a target on a file other than ``train``
  (``source_score_on: test``), else a seeded 20% of ``train`` held out from fine-tuning and early
  stopping (``source_score_on: held-out``; it then also scores a source target that named ``train``).
- Validation split (early stopping): the ``dev`` file, else a seeded 10% of ``train``; every split capped at
  ``finetune.max_train_examples``, like the training set.
- Untrained-encoder control (``evaluate.untrained_control``, module ``control``): each task is fine-tuned a second
  time, the same way, on the encoder as pretraining initialised it (the run's training seed, no pretraining);
  per target ``untrained_score`` and ``gain_over_untrained`` with its paired-bootstrap 95% interval over target
  sentences; the task's ``untrained`` record (source score, validation, epochs) and ``source_gain_over_untrained``.
- ``finetuned_sha256`` (task and control): the fine-tuned weights' digest, equal across processes for the same
  model, seed and config (``finetune.threads`` pins the one state that leaked: ``finetune`` module doc).
- UPOS per-word predictions of every reported split (``predictions``: predictions.parquet, with the control's).
- Retrieval: mean-pooled (non-pad) states of ``retrieval_layer`` (0 = embeddings, k = after block k,
  -1 = last), cosine nearest neighbour between the first language and each other one, accuracy in
  both directions, on the sentences present in both (JSONL: by ``id``; plain text: line by line).

Data files (see ``conll``): CoNLL-U, TSV or JSONL. The demo parallel JSONL serves all three tasks:
a ``.jsonl`` path is filtered to the task's language (source_lang or the target key), or to the
language named by a ``#lang=xx`` fragment (``parallel.jsonl#lang=fr``), which wins; its ``upos``
fields feed tagging and its ``topic`` fields serve as classification labels.

This module runs the model (fine-tuning, prediction, retrieval); the model-free half, text to inputs (tokenizer,
word windows), the source splits and the per-target report, is ``transfer_data`` (re-exported here).
"""
from __future__ import annotations

import logging
import random
from collections import Counter
from pathlib import Path

import torch

from mlm_core.config import EvaluateConfig, FinetuneConfig, TransferTask
from mlm_core.evaluate.conll import ConllError, read_aligned, read_labeled, read_tagged
from mlm_core.evaluate.control import attach, untrained_like
from mlm_core.evaluate.finetune import (IGNORE, Example, attention_segments, build_task_model, collate, fit,
                                        intra_op_threads, mean_pool, weights_digest)
from mlm_core.evaluate.predictions import split_rows
from mlm_core.evaluate.protocols import cross_validate, per_class_prf, primary_score
from mlm_core.evaluate.transfer_data import (  # noqa: F401  (re-exported: imported from here)
    VALIDATION_FRACTION, Window, accuracy, best_window, encode_texts, encode_words, finish_report, flat_windows,
    needs_source_test, plain_tokenizer, source_splits, target_report, window_counts, word_windows,
)

log = logging.getLogger(__name__)

MAX_LEN = 256          # subwords per input ([CLS]/[SEP] included), also capped by the model's max_positions
EVAL_BATCH = 64        # inputs per no-grad forward pass
TEST_FRACTION = 0.2    # of the source training data, held out for the source score when no separate file gives it
HELD_OUT = " held-out"  # key of the held-out source split among a task's scored splits (no language code has a space)


# ---- model inputs -------------------------------------------------------------------------------
def max_len_of(model) -> int:
    return min(MAX_LEN, model.arch.max_positions)


# ---- UPOS tagging ----------------------------------------------------------------------------------
@torch.inference_mode()
def predict_tags(model, encoded: list[list[Window]], labels: list[str],
                 pad_id: int) -> list[str | None]:
    """Flat word-level predictions, each word from the window that scores it (None: a word without subwords)."""
    flat = flat_windows(encoded)
    order = sorted(range(len(flat)), key=lambda i: len(flat[i][0]))
    per_window: dict[int, list[str | None]] = {}
    for s in range(0, len(order), EVAL_BATCH):
        idx = order[s: s + EVAL_BATCH]
        ids, seg, _ = collate([Example(flat[i].ids, 0) for i in idx], pad_id)
        best = model(ids, seg).argmax(-1).tolist()
        for row, i in enumerate(idx):
            per_window[i] = [labels[best[row][p]] if p >= 0 else None for p in flat[i].first]
    out: list[str | None] = []
    i = 0
    for windows in encoded:
        merged: list[str | None] = [None] * len(windows[0].first)
        for k in range(len(windows)):
            for w, p in enumerate(per_window[i + k]):
                if p is not None:
                    merged[w] = p
        out += merged
        i += len(windows)
    return out


def tagging_examples(encoded, sentences, label_id: dict[str, int]) -> list[Example]:
    """One example per window, labelled on the first subwords of the words it scores."""
    out = []
    for windows, sent in zip(encoded, sentences):
        for ids, first, _ in windows:
            lab = [IGNORE] * len(ids)
            for pos, tag in zip(first, sent.upos):
                if pos >= 0 and tag in label_id:
                    lab[pos] = label_id[tag]
            out.append(Example(ids, lab))
    return out



def fit_and_predict(encoder, pooling: str, predict, labels, train_ex, val_inputs, val_gold, inputs: dict, ft, seed: int,
                    pad: int):
    """Fine-tune a task head on ``encoder`` (early stopping on the source validation split's primary metric), then
    predict every split of ``inputs``: (fit result, weights digest, {split: predictions}). One protocol for the
    pretrained encoder and its untrained control, for token tagging and sentence classification alike."""
    model = build_task_model(encoder, len(labels), pooling, ft, seed)
    res = fit(model, train_ex, lambda m: primary_score(ft.primary_metric, predict(m, val_inputs, labels, pad),
                                                       val_gold), ft, seed, pad)
    return res, weights_digest(model), {k: predict(model, x, labels, pad) for k, x in inputs.items()}

def run_upos(model, tok, task: TransferTask, ft: FinetuneConfig, base_dir: Path, seed: int, control=None,
             predictions: list | None = None) -> dict:
    """Fine-tune a tagger on ``task.train`` (source language) and score every target (word accuracy).
    ``control``: the untrained encoder (``control.untrained_like``), fine-tuned and scored the same way (module
    ``control``); ``predictions``: a list that receives the per-word columns of each reported split
    (``predictions.split_rows``)."""
    tok, L, pad = plain_tokenizer(tok), max_len_of(model), model.arch.pad_id
    train = read_tagged(base_dir / task.train, task.source_lang)
    dev = read_tagged(base_dir / task.dev, task.source_lang) if task.dev else None
    held_out = needs_source_test(task, base_dir)
    train, val, test = source_splits(train, dev, ft.max_train_examples, seed, TEST_FRACTION if held_out else 0.0)
    counts = Counter(t for s in train for t in s.upos)
    labels = sorted(counts)
    label_id = {t: i for i, t in enumerate(labels)}
    majority = min(counts, key=lambda t: (-counts[t], t))
    train_ex = tagging_examples(encode_words(tok, [s.tokens for s in train], L), train, label_id)
    val_enc = encode_words(tok, [s.tokens for s in val], L)
    val_gold = [t for s in val for t in s.upos]
    # every scored split: the targets, then the held-out source split (key HELD_OUT)
    splits = {lang: read_tagged(base_dir / path, lang) for lang, path in task.targets.items()}
    if held_out:
        splits[HELD_OUT] = test
    enc = {k: encode_words(tok, [s.tokens for s in sents], L) for k, sents in splits.items()}

    def tagged(encoder):
        return fit_and_predict(encoder, "token", predict_tags, labels, train_ex, val_enc, val_gold, enc, ft, seed, pad)

    res, digest, pred = tagged(model)
    ctrl = tagged(control) if control is not None else None
    targets = {}
    for lang in task.targets:
        gold = [t for s in splits[lang] for t in s.upos]
        targets[lang] = target_report(pred[lang], gold, set(labels), majority)
        targets[lang]["uncovered_words"] = sum(all(x.first[w] < 0 for x in ws) for ws in enc[lang]
                                               for w in range(len(ws[0].first)))
        targets[lang]["sentences"] = len(splits[lang])
        targets[lang].update(window_counts(enc[lang], L))
        if targets[lang]["long_sentences"]:
            log.info("upos %s: %d sentence(s) longer than %d subwords scored in overlapping windows (%d words "
                     "past the limit)", lang, targets[lang]["long_sentences"], L, targets[lang]["words_past_max_len"])
    source_test = None
    if held_out:
        source_test = target_report(pred[HELD_OUT], [t for s in test for t in s.upos], set(labels), majority)
    report = finish_report("upos", task, res, targets, labels, majority, len(train), len(val), source_test)
    report["finetuned_sha256"] = digest
    # what each reported figure was scored on: the held-out split replaces a source target naming the train file
    reported = {lang: HELD_OUT if held_out and lang == task.source_lang else lang for lang in task.targets}
    if ctrl is not None:
        attach(report, reported, HELD_OUT if held_out else task.source_lang, pred, ctrl,
               {k: [t for s in sents for t in s.upos] for k, sents in splits.items()},
               {k: sentence_groups(sents) for k, sents in splits.items()}, seed)
    if predictions is not None:
        shown = dict(reported)
        if held_out and task.source_lang not in shown:
            shown[task.source_lang] = HELD_OUT
        for lang, key in sorted(shown.items()):
            predictions.append(split_rows("upos", lang, "held-out" if key == HELD_OUT else "test", splits[key],
                                          enc[key], pred[key], ctrl[2][key] if ctrl is not None else None))
    return report


def sentence_groups(sentences) -> list[int]:
    """The sentence index of each word (the bootstrap's resampling unit)."""
    return [i for i, s in enumerate(sentences) for _ in s.upos]


# ---- sentence classification ----------------------------------------------------------------------
@torch.inference_mode()
def predict_classes(model, ids_list: list[list[int]], labels: list[str], pad_id: int) -> list[str]:
    order = sorted(range(len(ids_list)), key=lambda i: len(ids_list[i]))
    pred: dict[int, str] = {}
    for s in range(0, len(order), EVAL_BATCH):
        idx = order[s: s + EVAL_BATCH]
        ids, seg, _ = collate([Example(ids_list[i], 0) for i in idx], pad_id)
        for i, c in zip(idx, model(ids, seg).argmax(-1).tolist()):
            pred[i] = labels[c]
    return [pred[i] for i in range(len(ids_list))]


def run_classification(model, tok, task: TransferTask, ft: FinetuneConfig, base_dir: Path, seed: int,
                       control=None) -> dict:
    """Fine-tune a mean-pooled sentence classifier on the source language; accuracy per target. ``control``: the
    untrained encoder, fine-tuned and scored the same way (``run_upos``; each example is its own sentence)."""
    tok, L, pad = plain_tokenizer(tok), max_len_of(model), model.arch.pad_id
    train = read_labeled(base_dir / task.train, task.source_lang)
    dev = read_labeled(base_dir / task.dev, task.source_lang) if task.dev else None
    held_out = needs_source_test(task, base_dir)
    train, val, test = source_splits(train, dev, ft.max_train_examples, seed, TEST_FRACTION if held_out else 0.0)
    counts = Counter(lab for _, lab in train)
    labels = sorted(counts)
    label_id = {t: i for i, t in enumerate(labels)}
    majority = min(counts, key=lambda t: (-counts[t], t))
    train_ids = encode_texts(tok, [t for t, _ in train], L)
    train_ex = [Example(ids, label_id[lab]) for ids, (_, lab) in zip(train_ids, train)]
    val_ids, val_gold = encode_texts(tok, [t for t, _ in val], L), [lab for _, lab in val]
    splits = {lang: read_labeled(base_dir / path, lang) for lang, path in task.targets.items()}
    if held_out:
        splits[HELD_OUT] = test
    ids = {k: encode_texts(tok, [t for t, _ in data], L) for k, data in splits.items()}

    def classified(encoder):
        return fit_and_predict(encoder, "mean", predict_classes, labels, train_ex, val_ids, val_gold, ids, ft, seed,
                               pad)

    res, digest, pred = classified(model)
    gold = {k: [lab for _, lab in data] for k, data in splits.items()}
    targets = {lang: target_report(pred[lang], gold[lang], set(labels), majority) for lang in task.targets}
    source_test = target_report(pred[HELD_OUT], gold[HELD_OUT], set(labels), majority) if held_out else None
    report = finish_report("classification", task, res, targets, labels, majority, len(train), len(val), source_test)
    report["finetuned_sha256"] = digest
    if control is not None:         # each example is its own resampling unit
        reported = {lang: HELD_OUT if held_out and lang == task.source_lang else lang for lang in task.targets}
        attach(report, reported, HELD_OUT if held_out else task.source_lang, pred, classified(control), gold,
               {k: list(range(len(g))) for k, g in gold.items()}, seed)
    if ft.cv:
        report["cv"] = classification_cv(model, tok, task, ft, base_dir, seed)
    return report


def classification_cv(model, tok, task: TransferTask, ft: FinetuneConfig, base_dir: Path, seed: int) -> dict:
    """Stratified k-fold cross-validation of the sentence classifier on the source training file (``protocols.cross_validate``;
    ``tok``: a plain tokenizer, ``plain_tokenizer``)."""
    L, pad = max_len_of(model), model.arch.pad_id
    data = read_labeled(base_dir / task.train, task.source_lang)
    if ft.max_train_examples is not None and len(data) > ft.max_train_examples:
        data = random.Random(seed).sample(data, ft.max_train_examples)
    labels = sorted({lab for _, lab in data})
    label_id = {t: i for i, t in enumerate(labels)}
    ids = encode_texts(tok, [t for t, _ in data], L)
    examples = [Example(i, label_id[lab]) for i, (_, lab) in zip(ids, data)]

    def run_fold(train, val, test, fold):
        clf = build_task_model(model, len(labels), "mean", ft, seed + fold)
        gold = lambda xs: [labels[e.labels] for e in xs]   # noqa: E731
        val_ids = [e.ids for e in val]
        res = fit(clf, train, lambda m: primary_score(ft.primary_metric, predict_classes(m, val_ids, labels, pad),
                                                      gold(val)), ft, seed + fold, pad)
        out = per_class_prf(predict_classes(clf, [e.ids for e in test], labels, pad), gold(test))
        return {**out, "best_epoch": res.best_epoch, "validation_score": round(res.best_score, 5)}

    cv = cross_validate(examples, [e.labels for e in examples], ft.cv_folds, seed, run_fold)
    log.info("classification cv (k=%d, %d examples): accuracy %.4f ± %.4f, macro-F1 %.4f ± %.4f", ft.cv_folds,
             len(examples), cv["accuracy"]["mean"], cv["accuracy"]["std"], cv["macro_f1"]["mean"], cv["macro_f1"]["std"])
    return {"n": len(examples), "primary_metric": ft.primary_metric, **cv}


# ---- retrieval -------------------------------------------------------------------------------------
def resolve_layer(layer: int, n_layers: int) -> int:
    """-1 -> L (last); k in 0..L kept; anything else is an error."""
    k = layer if layer >= 0 else n_layers + 1 + layer
    if not 0 <= k <= n_layers:
        raise ValueError(f"retrieval_layer {layer} is outside the model's layers "
                         f"(0..{n_layers}, or -1..-{n_layers + 1})")
    return k


@torch.inference_mode()
def layer_states(model, ids: torch.Tensor, seg: torch.Tensor, layer: int) -> torch.Tensor:
    """Hidden states [B,T,H] after block ``layer`` (0 = embeddings, L or -1 = the encoder's output).

    ``MLMEncoder.encode`` returns only the last layer, so intermediate ones are caught with a forward
    hook on the embedding LayerNorm (layer 0) or on block ``layer`` (dropout is off in eval mode).
    """
    L = len(model.blocks)
    k = resolve_layer(layer, L)
    seg = attention_segments(seg)
    if k == L:
        return model.encode(ids, seg)
    caught = {}
    module = model.emb_norm if k == 0 else model.blocks[k - 1]
    handle = module.register_forward_hook(lambda _m, _i, out: caught.setdefault("h", out))
    try:
        model.encode(ids, seg)
    finally:
        handle.remove()
    return caught["h"]


def sentence_vectors(model, tok, texts: list[str], layer: int) -> torch.Tensor:
    """Unit-norm mean-pooled states of ``layer`` for each text: [N, H]."""
    ids_list = encode_texts(plain_tokenizer(tok), texts, max_len_of(model))
    order = sorted(range(len(texts)), key=lambda i: len(ids_list[i]))
    out = torch.zeros(len(texts), model.arch.hidden)
    was_training = model.training
    model.eval()
    for s in range(0, len(order), EVAL_BATCH):
        idx = order[s: s + EVAL_BATCH]
        ids, seg, _ = collate([Example(ids_list[i], 0) for i in idx], model.arch.pad_id)
        out[idx] = mean_pool(layer_states(model, ids, seg, layer), seg).float()
    model.train(was_training)
    return torch.nn.functional.normalize(out, dim=-1)


def retrieval_accuracy(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(a->b, b->a) nearest-neighbour accuracy of unit vectors where row i of a translates row i of b."""
    sim = a @ b.T
    gold = torch.arange(len(a))
    return (float((sim.argmax(1) == gold).float().mean()), float((sim.argmax(0) == gold).float().mean()))


def run_retrieval(model, tok, files: dict[str, str], layer: int, base_dir: Path) -> dict:
    """Pair the first language of ``files`` with each other one; accuracy in both directions."""
    langs = list(files)
    if len(langs) < 2:
        raise ConllError(f"retrieval needs at least two languages, got {langs}")
    pivot = langs[0]
    texts = {lang: read_aligned(base_dir / files[lang], lang) for lang in langs}
    k = resolve_layer(layer, len(model.blocks))
    pairs = {}
    for lang in langs[1:]:
        ids = [i for i, t in texts[pivot].items() if t.strip() and texts[lang].get(i, "").strip()]
        if len(ids) < 2:
            raise ConllError(f"retrieval {pivot}-{lang}: {len(ids)} aligned sentence(s) "
                             f"({files[pivot]}, {files[lang]})")
        src = sentence_vectors(model, tok, [texts[pivot][i] for i in ids], k)
        tgt = sentence_vectors(model, tok, [texts[lang][i] for i in ids], k)
        fwd, bwd = retrieval_accuracy(src, tgt)
        pairs[lang] = {"n": len(ids), "src_to_tgt": round(fwd, 5), "tgt_to_src": round(bwd, 5),
                       "mean": round((fwd + bwd) / 2, 5), "chance": round(1 / len(ids), 5)}
    return {"pivot": pivot, "layer": k, "metric": "accuracy@1", "pairs": pairs}


# ---- the entry point -------------------------------------------------------------------------------
def run_transfer(model_dir: Path, cfg: EvaluateConfig, base_dir: Path, seed: int, model_hook=None,
                 predictions: list | None = None) -> dict:
    """Every configured transfer task for the model in ``model_dir``; the model on disk is not modified.
    ``model_hook(model) -> model``: applied to the encoder before fine-tuning (debias.projection: the task head
    then sees projected representations; not to the untrained control). ``predictions``: a list receiving the
    UPOS per-word columns (``predictions.write`` makes predictions.parquet of them). Everything runs on
    ``finetune.threads`` torch threads (``finetune.intra_op_threads``): a function of (model, seed, config)."""
    from mlm_core.evaluate.intrinsic import load_discriminator
    from mlm_core.fillmask import load_model_dir
    model, tok, _ = load_model_dir(Path(model_dir))
    model = load_discriminator(Path(model_dir)) or model    # ELECTRA: the discriminator is the encoder to transfer
    control = untrained_like(model, seed) if cfg.untrained_control else None
    if model_hook is not None:
        model = model_hook(model)
    base_dir = Path(base_dir)
    out: dict = {}
    from mlm_core.progress import Progress
    todo = [k for k, on in (("upos", cfg.upos is not None), ("classification", cfg.classification is not None),
                            ("retrieval", bool(cfg.retrieval))) if on]
    with Progress("evaluate transfer", len(todo), unit="tasks") as shown, intra_op_threads(cfg.finetune.threads):
        for i, kind in enumerate(todo):
            shown.update(i, note=kind)
            if kind == "upos":
                out["upos"] = run_upos(model, tok, cfg.upos, cfg.finetune, base_dir, seed, control, predictions)
            elif kind == "classification":
                out["classification"] = run_classification(model, tok, cfg.classification, cfg.finetune, base_dir,
                                                           seed, control)
            else:
                out["retrieval"] = run_retrieval(model, tok, cfg.retrieval, cfg.retrieval_layer, base_dir)
        shown.update(len(todo), note="")
    for kind in ("upos", "classification"):
        for lang, t in out.get(kind, {}).get("targets", {}).items():
            ctrl = (f", untrained {t['untrained_score']:.4f}, gain {t['gain_over_untrained']:+.4f} "
                    f"[{t['gain_over_untrained_ci_low']:+.4f}, {t['gain_over_untrained_ci_high']:+.4f}]"
                    if t.get("gain_over_untrained") is not None else "")
            log.info("%s %s: %.4f (source %.4f, gap %+.4f, majority %.4f%s)", kind, lang, t["score"],
                     t["source_score"], t["gap"], t["majority_baseline"], ctrl)
    return out


__all__ = ["accuracy", "classification_cv", "best_window", "encode_texts", "encode_words", "layer_states", "plain_tokenizer", "predict_classes",
           "predict_tags", "resolve_layer", "retrieval_accuracy", "run_classification", "run_retrieval",
           "run_transfer", "run_upos", "sentence_vectors", "source_splits", "target_report", "Window", "window_counts",
           "word_windows"]
