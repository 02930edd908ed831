"""Per-word UPOS predictions of zero-shot transfer, for inspection: ``predictions.parquet`` of the evaluate stage.

In: per scored split (a target, or the held-out source split), its sentences (``conll.Sentence``), their
encoded windows (``transfer_data.Window``) and the predictions of the fine-tuned tagger and of the untrained
control. Out: one row per syntactic word, the rows of every split in one file (``write``), sorted by task,
language, sentence and word, so the file's bytes are a function of the predictions alone.

Columns (``SCHEMA``):
  task                 "upos"
  lang                 the target language (the source language for its held-out split)
  split                "test" (the target file) or "held-out" (``source_score_on: held-out``: the source split
                       seen neither in fine-tuning nor in early stopping, which the report scores as the source)
  sentence_index       0-based position of the sentence in its file (or split)
  sentence_id          the CoNLL-U ``# sent_id`` (else ``<file stem>:<line>``), or the JSONL ``id``
  word_index           0-based position among the sentence's syntactic words (CoNLL-U multiword-token lines
                       ``1-2`` and empty nodes ``1.1`` are not words; their syntactic words are)
  form, gold           the word and its gold UPOS tag
  predicted            the tagger's tag; null when the word has no subword (scored wrong)
  untrained_predicted  the untrained-encoder control's tag (null throughout when ``evaluate.untrained_control``
                       is off)
  windowed             the sentence was longer than the model's input and was scored in overlapping windows
  window               the window that scored the word (0 when not windowed; null when no window did)

Accuracy per (lang, split) = mean(predicted == gold) with null wrong: the reported ``score``.
"""
from __future__ import annotations

from pathlib import Path

FILE = "predictions.parquet"
COLUMNS = ("task", "lang", "split", "sentence_index", "sentence_id", "word_index", "form", "gold", "predicted",
           "untrained_predicted", "windowed", "window")


def schema():
    import pyarrow as pa
    return pa.schema([("task", pa.string()), ("lang", pa.string()), ("split", pa.string()),
                      ("sentence_index", pa.int32()), ("sentence_id", pa.string()), ("word_index", pa.int32()),
                      ("form", pa.string()), ("gold", pa.string()), ("predicted", pa.string()),
                      ("untrained_predicted", pa.string()), ("windowed", pa.bool_()), ("window", pa.int32())])


def split_rows(task: str, lang: str, split: str, sentences, encoded, pred: list, untrained: list | None) -> dict:
    """Columns (dict of lists) for one split; ``pred`` / ``untrained`` are flat over its words, in order."""
    cols: dict[str, list] = {c: [] for c in COLUMNS}
    n_words = sum(len(s.tokens) for s in sentences)
    if len(pred) != n_words or (untrained is not None and len(untrained) != n_words):
        raise ValueError(f"{task}/{lang} ({split}): {len(pred)} predictions for {n_words} words")
    k = 0
    for i, (sent, windows) in enumerate(zip(sentences, encoded)):
        for w, (form, gold) in enumerate(zip(sent.tokens, sent.upos)):
            owner = next((j for j, win in enumerate(windows) if win.first[w] >= 0), None)
            cols["task"].append(task)
            cols["lang"].append(lang)
            cols["split"].append(split)
            cols["sentence_index"].append(i)
            cols["sentence_id"].append(sent.id)
            cols["word_index"].append(w)
            cols["form"].append(form)
            cols["gold"].append(gold)
            cols["predicted"].append(pred[k])
            cols["untrained_predicted"].append(None if untrained is None else untrained[k])
            cols["windowed"].append(len(windows) > 1)
            cols["window"].append(owner)
            k += 1
    return cols


def write(parts: list[dict], path: Path) -> Path:
    """All splits' rows into one Parquet file, sorted by (task, lang, split, sentence_index, word_index)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables = [pa.Table.from_pydict(p, schema=schema()) for p in parts]
    table = pa.concat_tables(tables) if tables else schema().empty_table()
    order = [(c, "ascending") for c in ("task", "lang", "split", "sentence_index", "word_index")]
    table = table.sort_by(order) if table.num_rows else table
    pq.write_table(table, path)
    return Path(path)


__all__ = ["COLUMNS", "FILE", "schema", "split_rows", "write"]
