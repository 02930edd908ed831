"""Packed, pre-tokenized Arrow shards: the stage (``run_shards``), the reader (``ShardDataset``,
``as_hf_dataset``) and the language sampler (``LanguageSampler``). Imports no torch/datasets at import time."""
from mlm_core.shards.build import run_shards, segment_dtype, shard_schema, token_dtype
from mlm_core.shards.reader import ShardDataset, ShardIntegrityError, as_hf_dataset, check_shard_set, verify_shards
from mlm_core.shards.sampler import LanguageSampler

__all__ = ["run_shards", "token_dtype", "segment_dtype", "shard_schema", "ShardDataset", "ShardIntegrityError",
           "as_hf_dataset", "check_shard_set", "verify_shards", "LanguageSampler"]
