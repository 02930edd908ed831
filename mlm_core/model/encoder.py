"""A BERT-layout transformer encoder with a masked-language-model head.

In: token ids [B, T] (optionally segment ids marking the documents packed into each row) and MLM
labels (-100 where no prediction is asked). Out: hidden states, logits at the selected positions and
the cross-entropy loss.

Layout = BERT (Devlin et al., 2019), so the default configuration exports to ``BertForMaskedLM``
exactly: word + position + one token-type embedding -> LayerNorm -> dropout; post-LN blocks
(self-attention, residual, LayerNorm; FFN with exact erf GELU, residual, LayerNorm); MLM head
(dense, GELU, LayerNorm, decoder tied to the word embeddings, output bias). Rotary positions (RoFormer,
Su et al., 2021) in a post-LN model are RoFormer's network (``RoFormerForMaskedLM``; the export permutes q / k:
``positions``). Variants that do not export: pre-LN (Xiong et al., 2020: LayerNorm before each sublayer plus
a final one) and local/global attention (sliding windows in all but every k-th layer;
``mlm_core.model.attention``) with BERT's layers. Sinusoidal positions follow Vaswani et al. (2017).
A checkpoint read by ``pretrained`` sets the rest of its family's arithmetic through the Arch: LayerNorm
epsilon, FFN activation (transformers' hidden_act), the MLM head's activation (exact GELU for RoBERTa /
XLM-R / ELECTRA's generator), RoBERTa's position offset and a token-type table with several rows.

``arch.modern`` (family modernbert) builds ModernBERT's layer (Warner et al., 2024; transformers'
``ModernBertForMaskedLM``): no token-type table; LayerNorms and linear layers without bias (the decoder keeps its
output bias); pre-LN with no LayerNorm before layer 0's attention; GeGLU FFN (``ffn_in`` projects to 2 x ffn,
act(first half) * second half, dropout before ``ffn_out`` and none after it); rotary with one base in global
and another in local layers, layer 0 global; a final LayerNorm; head = dense + GELU + LayerNorm; and its init
(``_init_modern``).

The head gathers the selected positions first: a full-vocabulary projection at every position costs
more than the rest of the step when only ~15% of positions are predicted.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from mlm_core.model.attention import LocalMask, global_layers, local_attention, segment_mask
from mlm_core.model.positions import apply_rotary, rotary_cos_sin, sinusoidal_table
from mlm_core.model.sizes import Arch

LN_EPS = 1e-12  # BERT's LayerNorm epsilon (Arch.ln_eps's default); the export writes arch.ln_eps

_SQRT_2_PI = math.sqrt(2.0 / math.pi)
# transformers' ACT2FN formulas (transformers/activations.py, 5.24), written out so the encoder does not
# import transformers; tests/test_model.py checks each against ACT2FN
_ACTIVATIONS = {
    "gelu": F.gelu,                                                    # exact, erf
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_new": lambda x: 0.5 * x * (1.0 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_python_tanh": lambda x: 0.5 * x * (1.0 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * torch.pow(x, 3.0)))),
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "gelu_accurate": lambda x: 0.5 * x * (1 + torch.tanh(_SQRT_2_PI * (x + 0.044715 * torch.pow(x, 3)))),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu_10": lambda x: torch.clip(F.gelu(x), -10, 10),
    "relu": F.relu, "relu6": F.relu6, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh,
    "mish": F.mish, "sigmoid": torch.sigmoid,
}


def activation_fn(name: str):
    """The elementwise function of transformers' ``hidden_act`` ``name`` (Arch.activation)."""
    return _ACTIVATIONS[name]


class SelfAttention(nn.Module):
    def __init__(self, arch: Arch, local: bool = False):
        super().__init__()
        self.heads, self.dropout = arch.heads, arch.dropout
        self.local = local      # sliding window (mlm_core.model.attention); ``mask`` is then a LocalMask
        bias = not arch.modern
        self.qkv = nn.Linear(arch.hidden, 3 * arch.hidden, bias=bias)  # q, k, v fused in one matmul (ModernBERT's Wqkv)
        self.out = nn.Linear(arch.hidden, arch.hidden, bias=bias)

    def forward(self, x, mask, rotary):
        B, T, H = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, H // self.heads).permute(2, 0, 3, 1, 4)  # 3 x [B, nh, T, d]
        if rotary is not None:
            cos, sin = rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        p = self.dropout if self.training else 0.0
        if self.local:
            y = local_attention(q, k, v, mask, dropout_p=p)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(B, T, H))


class Block(nn.Module):
    """One transformer layer; ``norm`` decides where the LayerNorms sit (post = BERT, pre = stable deep training)."""

    def __init__(self, arch: Arch, local: bool = False, first: bool = False):
        super().__init__()
        self.pre_norm = arch.norm == "pre"
        self.glu = modern = arch.modern
        bias = not modern
        self.attn = SelfAttention(arch, local)
        # ModernBERT's layer 0 reads the embedding LayerNorm's output directly (an Identity in transformers too)
        self.attn_norm = nn.Identity() if modern and first else nn.LayerNorm(arch.hidden, eps=arch.ln_eps, bias=bias)
        self.ffn_in = nn.Linear(arch.hidden, arch.ffn * (2 if modern else 1), bias=bias)   # GeGLU: input | gate
        self.ffn_out = nn.Linear(arch.ffn, arch.hidden, bias=bias)
        self.ffn_norm = nn.LayerNorm(arch.hidden, eps=arch.ln_eps, bias=bias)
        self.drop = nn.Dropout(arch.dropout)
        self.act = activation_fn(arch.activation)   # default exact (erf) GELU, as BERT's "gelu"

    def ffn(self, x):
        if self.glu:    # ModernBertMLP: Wo(drop(act(input) * gate)); its output is not dropped again
            a, gate = self.ffn_in(x).chunk(2, dim=-1)
            return self.ffn_out(self.drop(self.act(a) * gate))
        return self.ffn_out(self.act(self.ffn_in(x)))

    def forward(self, x, mask, rotary):
        if self.pre_norm:
            x = x + self.drop(self.attn(self.attn_norm(x), mask, rotary))
            f = self.ffn(self.ffn_norm(x))
            return x + (f if self.glu else self.drop(f))
        x = self.attn_norm(x + self.drop(self.attn(x, mask, rotary)))
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class MLMEncoder(nn.Module):
    """``mlm_head=False`` builds the encoder alone (an ELECTRA discriminator has no MLM head: an untrained
    one would only score noise). ``arch.embedding_size`` E != hidden: embeddings (and the head's output)
    are E wide, projected to the model width after the embedding LayerNorm (ELECTRA's generator)."""

    def __init__(self, arch: Arch, mlm_head: bool = True):
        super().__init__()
        self._arch = arch
        H, E = arch.hidden, arch.emb_dim
        bias = not arch.modern
        self.tok_emb = nn.Embedding(arch.vocab_size, E, padding_idx=arch.pad_id)
        # token-type table: one row here; an imported checkpoint keeps all its rows (the export writes them back)
        # but the input is always type 0, as transformers' default token_type_ids. ModernBERT has none.
        if not arch.modern:
            self.type_emb = nn.Embedding(arch.type_vocab_size, E)
        if arch.position == "learned":
            # RoBERTa / XLM-R: position ids start at padding_idx + 1 (position_offset); the rows below stay unused
            self.pos_emb = nn.Embedding(arch.max_positions + arch.position_offset, E)
        elif arch.position == "sinusoidal":  # fixed: a buffer, not saved (rebuilt from the formula)
            self.register_buffer("pos_table", sinusoidal_table(arch.max_positions, E), persistent=False)
        else:  # rotary: no table added to the input; q/k are rotated in every layer (local layers: their base)
            thetas = {"": arch.rope_theta} | ({"_local": arch.local_rope_theta}
                                              if arch.local_rope_theta != arch.rope_theta else {})
            for suffix, theta in thetas.items():
                cos, sin = rotary_cos_sin(arch.max_positions, arch.head_dim, theta, float32=arch.modern)
                self.register_buffer("rope_cos" + suffix, cos, persistent=False)
                self.register_buffer("rope_sin" + suffix, sin, persistent=False)
        self.emb_norm = nn.LayerNorm(E, eps=arch.ln_eps, bias=bias)
        if E != H:
            self.emb_proj = nn.Linear(E, H)   # transformers' embeddings_project
        self.drop = nn.Dropout(arch.dropout)
        # per layer: global or local (ModernBERT counts from layer 0: 0, k, 2k, ... are global)
        self._global = global_layers(arch.layers, arch.attention, arch.global_every, from_first=arch.modern)
        self.blocks = nn.ModuleList([Block(arch, local=not g, first=i == 0) for i, g in enumerate(self._global)])
        self.final_norm = nn.LayerNorm(H, eps=arch.ln_eps, bias=bias) if arch.norm == "pre" else nn.Identity()
        self.has_mlm_head = mlm_head
        if mlm_head:
            # MLM head: transform (dense + GELU + LayerNorm), then the vocabulary projection + bias
            self.head_dense = nn.Linear(H, E, bias=bias)
            self.head_norm = nn.LayerNorm(E, eps=arch.ln_eps, bias=bias)
            self.head_act = activation_fn(arch.head_activation)
            self.decoder = nn.Linear(E, arch.vocab_size, bias=False)
            self.head_bias = nn.Parameter(torch.zeros(arch.vocab_size))
        if arch.modern:
            self._init_modern()
        else:
            self.apply(self._init)
        if mlm_head and arch.tie_embeddings:
            self.decoder.weight = self.tok_emb.weight  # one tensor; safetensors helpers handle the sharing

    @staticmethod
    def _init(m: nn.Module) -> None:
        """BERT init: normal(0, 0.02) weights, zero biases, LayerNorm (1, 0), zero pad embedding."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            with torch.no_grad():
                m.weight[m.padding_idx].zero_()
        if isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    def _init_modern(self) -> None:
        """ModernBERT's init (transformers' ``ModernBertPreTrainedModel._init_weights``): truncated normal at
        +-2 std (initializer_cutoff_factor 2, initializer_range 0.02): std 0.02 for the embeddings, Wqkv and Wi;
        0.02 / sqrt(2 x layers) for the layers' output projections (Wo), the head's dense and an untied decoder;
        LayerNorms 1; the decoder's bias 0. The pad row is drawn like the others (ModernBERT does not zero it; the
        embedding's padding_idx still keeps its gradient at zero). A tied decoder is the embedding (0.02), as in
        transformers, where the embedding's init is the one that stays."""
        std, out = 0.02, 0.02 / math.sqrt(2.0 * self.arch.layers)

        def trunc(w: torch.Tensor, s: float) -> None:
            nn.init.trunc_normal_(w, mean=0.0, std=s, a=-2.0 * s, b=2.0 * s)
        trunc(self.tok_emb.weight, std)
        for b in self.blocks:
            trunc(b.attn.qkv.weight, std)
            trunc(b.attn.out.weight, out)
            trunc(b.ffn_in.weight, std)
            trunc(b.ffn_out.weight, out)
        if self.has_mlm_head:
            trunc(self.head_dense.weight, out)
            if not self.arch.tie_embeddings:
                trunc(self.decoder.weight, out)
        for m in self.modules():
            if isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)

    @property
    def arch(self) -> Arch:
        return self._arch

    # ---- the network -------------------------------------------------------------------------------
    def encode(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
               return_layer: int | None = None):
        """Hidden states [B, T, H]. segment_ids: 0 = padding, 1..k = document in the row; None = full attention.
        ``return_layer`` (0-based block index): (hidden, that block's output) instead; the last block's output is
        the final hidden states (after a pre-LN final LayerNorm), what the head reads (pretrain.bias_regularizer)."""
        B, T = input_ids.shape
        if T > self.arch.max_positions:
            raise ValueError(f"sequence length {T} exceeds max_positions {self.arch.max_positions}")
        x = self.tok_emb(input_ids)
        if not self.arch.modern:
            x = x + self.type_emb.weight[0]
        rotary = rotary_local = None
        if self.arch.position == "learned":
            # positions 0..T-1 in every row, as BERT; RoBERTa's offset..offset+T-1 (transformers counts only
            # non-pad tokens: the same at every non-pad position of a right-padded row, which is all we feed)
            off = self.arch.position_offset
            x = x + self.pos_emb.weight[off:off + T]
        elif self.arch.position == "sinusoidal":
            x = x + self.pos_table[:T]
        else:
            rotary = (self.rope_cos[:T], self.rope_sin[:T])
            rotary_local = (self.rope_cos_local[:T], self.rope_sin_local[:T]) if hasattr(self, "rope_cos_local") \
                else rotary
        x = self.drop(self.emb_norm(x))
        if hasattr(self, "emb_proj"):
            x = self.emb_proj(x)
        # the dense [B, 1, T, T] mask only when a global layer reads it; local layers share one LocalMask
        mask = segment_mask(segment_ids) if segment_ids is not None and any(self._global) else None
        local = LocalMask(T, self.arch.window, segment_ids, x.device) if not all(self._global) else None
        kept = None
        for i, (block, is_global) in enumerate(zip(self.blocks, self._global)):
            x = block(x, mask if is_global else local, rotary if is_global else rotary_local)
            if i == return_layer:
                kept = x
        x = self.final_norm(x)
        if return_layer is None:
            return x
        return x, (x if return_layer == len(self.blocks) - 1 else kept)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """MLM head on hidden vectors [..., H] -> vocabulary logits [..., V]."""
        h = self.head_norm(self.head_act(self.head_dense(h)))
        return self.decoder(h) + self.head_bias

    def mlm_logits(self, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Logits [N, V] at the N positions where ``positions`` [B, T] is True (row-major order)."""
        return self.head(hidden[positions])  # gather first: the head runs on N vectors, not B*T

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, label_smoothing: float = 0.0,
                return_layer: int | None = None) -> dict:
        """Encode, then predict where ``labels`` != -100.

        Returns {"loss": mean cross-entropy over the N selected positions (with label smoothing ε;
        0 with a gradient path when N = 0; None without labels), "logits": [N, V] (None without labels),
        "hidden": [B, T, H], "n_predictions": N (int)}; with ``return_layer`` also "layer_hidden" (``encode``).
        """
        extra = {}
        if return_layer is None:
            hidden = self.encode(input_ids, segment_ids)
        else:
            hidden, extra["layer_hidden"] = self.encode(input_ids, segment_ids, return_layer)
        if labels is None:
            return {"loss": None, "logits": None, "hidden": hidden, "n_predictions": 0, **extra}
        selected = labels != -100
        logits = self.mlm_logits(hidden, selected)
        n = logits.shape[0]
        if n == 0:  # cross_entropy of an empty batch is NaN; keep the graph so backward() still works
            loss = logits.sum() * 0.0
        else:
            loss = F.cross_entropy(logits.float(), labels[selected], label_smoothing=label_smoothing)
        return {"loss": loss, "logits": logits, "hidden": hidden, "n_predictions": n, **extra}

    @torch.no_grad()
    def full_logits(self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] at every position (evaluation, fill-mask, export checks; no gradient)."""
        return self.head(self.encode(input_ids, segment_ids))

    # ---- accounting --------------------------------------------------------------------------------
    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (shared tensors once). non_embedding: without the word, position and
        token-type tables and an untied decoder (Kaplan et al., 2020's N)."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a tied tensor once
        if non_embedding:
            n -= self.tok_emb.weight.numel() + (0 if self.arch.modern else self.type_emb.weight.numel())
            if self.arch.position == "learned":
                n -= self.pos_emb.weight.numel()
            if self.has_mlm_head and not self.arch.tie_embeddings:
                n -= self.decoder.weight.numel()
        return n

    def flops_per_token(self, seq_len: int, mask_rate: float = 0.15) -> float:
        """Training FLOPs (forward + backward) per input token, for MFU.

        6 x (matmul weights every token passes through) + 12 x layers x hidden x seq_len for the
        attention scores and weighted sum (PaLM appendix B / nanoGPT; a local layer's query sees at most
        window + 1 keys, so seq_len becomes min(seq_len, window + 1) there), + the head (dense and vocabulary
        projection) counted only on the ``mask_rate`` share of tokens that are predicted.
        """
        a = self.arch
        per_layer = 4 * a.hidden * a.hidden + (3 if a.modern else 2) * a.hidden * a.ffn  # q, k, v, out + FFN (GeGLU: 3)
        span = sum(seq_len if g else min(seq_len, a.window + 1) for g in self._global)    # keys per query, summed
        body = 6 * a.layers * per_layer + 12 * a.hidden * span + 6 * a.emb_dim * a.hidden * (
            a.emb_dim != a.hidden)
        head = 6 * (a.hidden * a.emb_dim + a.emb_dim * a.vocab_size) if self.has_mlm_head else 0
        return float(body + mask_rate * head)


__all__ = ["MLMEncoder", "segment_mask", "sinusoidal_table", "rotary_cos_sin", "apply_rotary", "LN_EPS",
           "activation_fn"]
