"""The encoder model: named sizes (``sizes``), the network and its MLM head (``encoder``),
safetensors weights (``weights``) + the Hugging Face export (``export``; the transformers names of each family in
``hf_layout``), and existing checkpoints read into it (``pretrained``).

Importing this package imports torch (the CLI imports it only inside the commands that train).
"""
from mlm_core.model.encoder import MLMEncoder
from mlm_core.model.export import export_hf
from mlm_core.model.pretrained import (SUPPORTED_ARCHITECTURES, Pretrained, PretrainedError, build_electra,
                                       build_encoder, check_model_config, load_export, read_pretrained)
from mlm_core.model.sizes import SIZES, Arch, ArchError, resolve_arch
from mlm_core.model.weights import ExportError, load_weights, read_arch, save_weights

__all__ = ["SIZES", "Arch", "ArchError", "ExportError", "MLMEncoder", "export_hf", "load_export", "load_weights",
           "read_arch", "resolve_arch", "save_weights", "SUPPORTED_ARCHITECTURES", "Pretrained", "PretrainedError",
           "build_electra", "build_encoder", "check_model_config", "read_pretrained"]
