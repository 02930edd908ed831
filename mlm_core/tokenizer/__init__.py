"""The tokenizer stage: a language-balanced sample of the normalized corpus -> a trained HF tokenizer.

``build``: tokenizer pipelines per algorithm and fixed special ids; ``sample``: the temperature-weighted,
streamed training sample; ``stats``: held-out fertility / UNK rate and vocabulary scripts; ``stage``:
the stage function and the checksum-verified loader. With ``tokenizer.from`` (else ``pretrain.init_from``):
``existing`` reads an existing tokenizer folder, ``extend`` adds ``tokenizer.extend`` new tokens after its
ids, ``from_stage`` is the stage for that case.
"""
from mlm_core.tokenizer.build import (
    SPECIALS, TokenizerError, TokenizerMismatch, build_tokenizer, special_ids, train, train_seconds_per_mb,
)
from mlm_core.tokenizer.sample import TrainSample, train_sample
from mlm_core.tokenizer.stage import TOKENIZER_FILE, load_tokenizer, run_tokenizer

__all__ = ["SPECIALS", "TOKENIZER_FILE", "TokenizerError", "TokenizerMismatch", "TrainSample", "build_tokenizer",
           "load_tokenizer", "run_tokenizer", "special_ids", "train", "train_seconds_per_mb", "train_sample"]
