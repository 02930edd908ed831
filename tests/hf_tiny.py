"""Tiny randomly initialized transformers checkpoints + their tokenizers, saved as a Hugging Face folder
(what a user points ``pretrain.init_from`` / ``tokenizer.from`` at). No network: the tokenizer is trained
with the ``tokenizers`` library on the given texts, the model is ``XConfig(...) -> XForMaskedLM(cfg)``.

Families and the tokenizer each ships with (as the real checkpoints do):
  bert         WordPiece, [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, BertForMaskedLM
  roberta      byte-level BPE, <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4, RobertaForMaskedLM (positions offset by
               padding_idx + 1)
  xlm-roberta  Unigram with Metaspace (SentencePiece style), <s> <pad> </s> <unk> first, <mask> last,
               XLMRobertaForMaskedLM
  electra      WordPiece as bert; ElectraForPreTraining (the discriminator) in the folder and its generator
               ElectraForMaskedLM in ``generator/`` (the pair the hub publishes as two repositories)
  roformer     WordPiece as bert, RoFormerForMaskedLM (rotary, its interleaved pair layout)
  modernbert   byte-level BPE with the special tokens LAST, as ModernBERT's tokenizer ([UNK] [CLS] [SEP] [PAD]
               [MASK] after the merges; pad id != 0), ModernBertForMaskedLM with a small local window (8) so
               the sliding layers differ from global ones on these sentences
"""
from __future__ import annotations

from pathlib import Path

FAMILIES = ("bert", "roberta", "xlm-roberta", "electra", "roformer", "modernbert")
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]     # ModernBERT's order, after the vocabulary


def train_tokenizer(family: str, texts: list[str], vocab_size: int = 300):
    """A ``tokenizers.Tokenizer`` of the family's kind trained on ``texts`` (special tokens first)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    if family in ("bert", "electra", "roformer"):
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS,
                                                                 min_frequency=1))
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    elif family == "roberta":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=ROBERTA_SPECIALS,
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           min_frequency=1))
        tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    elif family == "xlm-roberta":
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.NFKC()
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        tok.train_from_iterator(texts, trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                                               special_tokens=ROBERTA_SPECIALS[:4]))
        tok.add_special_tokens(["<mask>"])          # XLM-R: <mask> is the last id
        tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                                           special_tokens=[("<s>", 0), ("</s>", 2)])
    elif family == "modernbert":
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size - len(MODERNBERT_SPECIALS),
                                                           initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           min_frequency=1))
        tok.add_special_tokens(MODERNBERT_SPECIALS)
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    else:
        raise ValueError(f"unknown family {family!r} ({', '.join(FAMILIES)})")
    return tok


def _specials(family: str) -> dict:
    if family == "modernbert":          # ModernBERT's tokenizer passes no token_type_ids (the model has none)
        return dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), BERT_SPECIALS)) | {
            "model_input_names": ["input_ids", "attention_mask"]}
    if family in ("bert", "electra", "roformer"):
        return dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), BERT_SPECIALS))
    return {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
            "cls_token": "<s>", "sep_token": "</s>", "mask_token": "<mask>"}


def save_tiny(dest: Path, family: str, texts: list[str], *, seed: int = 0, vocab_size: int = 300,
              max_positions: int = 64, hidden: int = 32, layers: int = 2, heads: int = 2, ffn: int = 64,
              tie: bool = True, generator_hidden: int = 16, config: dict | None = None) -> Path:
    """Write a tiny random ``family`` checkpoint + tokenizer to ``dest`` (safetensors); returns ``dest``.
    ``config``: more XConfig fields (layer_norm_eps, hidden_act, type_vocab_size...)."""
    import torch
    import transformers as tf
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(family, texts, vocab_size)
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, **_specials(family))
    V = tok.get_vocab_size()
    pad = tok.token_to_id("<pad>" if family in ("roberta", "xlm-roberta") else "[PAD]")
    shape = dict(vocab_size=V, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                 intermediate_size=ffn, pad_token_id=pad, tie_word_embeddings=tie, **(config or {}))
    torch.manual_seed(seed)
    if family == "bert":
        models = {dest: tf.BertForMaskedLM(tf.BertConfig(max_position_embeddings=max_positions, **shape))}
    elif family in ("roberta", "xlm-roberta"):
        Cfg, Model = ((tf.RobertaConfig, tf.RobertaForMaskedLM) if family == "roberta"
                      else (tf.XLMRobertaConfig, tf.XLMRobertaForMaskedLM))
        # RoBERTa's position ids start at padding_idx + 1: the table holds max_positions + 2 rows
        models = {dest: Model(Cfg(**({"max_position_embeddings": max_positions + pad + 1, "type_vocab_size": 1,
                                     "bos_token_id": 0, "eos_token_id": 2} | shape)))}
    elif family == "roformer":
        models = {dest: tf.RoFormerForMaskedLM(tf.RoFormerConfig(max_position_embeddings=max_positions, **shape))}
    elif family == "modernbert":
        ids = {f"{r}_token_id": tok.token_to_id(f"[{t}]") for r, t in (("cls", "CLS"), ("bos", "CLS"), ("sep", "SEP"),
                                                                         ("eos", "SEP"))}
        models = {dest: tf.ModernBertForMaskedLM(tf.ModernBertConfig(**({"max_position_embeddings": max_positions,
                                                                         "local_attention": 8} | ids | shape)))}
    else:
        disc = tf.ElectraConfig(max_position_embeddings=max_positions, embedding_size=hidden, **shape)
        gen = tf.ElectraConfig(max_position_embeddings=max_positions, embedding_size=hidden,
                               **(shape | {"hidden_size": generator_hidden, "intermediate_size": 4 * generator_hidden,
                                           "num_attention_heads": 1}))
        models = {dest: tf.ElectraForPreTraining(disc), dest / "generator": tf.ElectraForMaskedLM(gen)}
    for where, model in models.items():
        model.eval()
        with torch.no_grad():       # random, not zero, biases and norms: a wrong mapping cannot hide
            for name, p in model.named_parameters():
                # ModernBERT's norms are "...norm" (its layers have no biases but the decoder's)
                if name.endswith("bias") or "LayerNorm" in name or (family == "modernbert" and "norm" in name):
                    p.add_(torch.randn_like(p) * 0.05)
    if family == "electra":         # ELECTRA trains the pair with one set of embeddings (generator's = discriminator's)
        with torch.no_grad():
            gen_emb = models[dest / "generator"].electra.embeddings
            for name, p in models[dest].electra.embeddings.named_parameters():
                gen_emb.get_parameter(name).copy_(p)
    for where, model in models.items():
        model.save_pretrained(where, safe_serialization=True)
        fast.save_pretrained(where)
    return dest
