"""A BERT encoder (Devlin et al., 2019) with hand-written attention and static shapes.

Embeddings (word + learned position + the constant token-type-0 row, then LayerNorm; the position table
has ``seq_len`` rows rather than BERT-base's 512, a 0.3% smaller model at the defaults) followed by
``layers`` post-LN transformer layers: self-attention (q/k/v Linear, scaled dot product, additive mask of
-10000 on padding, softmax, output Linear, residual, LayerNorm) and a GELU feed-forward of width
``4 * hidden`` (residual, LayerNorm). The output is the last hidden state ``[1, seq_len, hidden]``.

Every ``view``/``reshape`` uses Python ints from the configuration, never ``tensor.size()``, so the
exported graph has constant shapes and no Shape/Gather chains for the partitioner to trace. Attention is
written out (no ``nn.MultiheadAttention``, no ``scaled_dot_product_attention``) so both exporters emit
plain MatMul/Softmax nodes.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["BERT_DEFAULTS", "make_bert"]

BERT_DEFAULTS: dict[str, int] = {"layers": 12, "hidden": 768, "heads": 12, "seq_len": 128, "vocab": 30522}

_LN_EPS = 1e-12
_MASK_VALUE = -10000.0
_BATCH = 1


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.heads, self.head_dim, self.hidden, self.seq_len = heads, hidden // heads, hidden, seq_len
        self.scale = math.sqrt(self.head_dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(_BATCH, self.seq_len, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / self.scale + mask_bias
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(_BATCH, self.seq_len, self.hidden)
        return self.norm(x + self.output(context))


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.attention = _SelfAttention(hidden, heads, seq_len)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.gelu = nn.GELU()
        self.ffn_out = nn.Linear(4 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask_bias)
        return self.norm(x + self.ffn_out(self.gelu(self.intermediate(x))))


class _Bert(nn.Module):
    def __init__(self, *, vocab: int, hidden: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        # One row per position actually used (BERT-base has 512): no Slice left in the exported graph.
        self.position = nn.Embedding(seq_len, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.layers = nn.ModuleList(_Layer(hidden, heads, seq_len) for _ in range(layers))
        self.seq_len = seq_len

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Adding the tables (not looking up an arange of position ids) leaves constants, not Range/Gather.
        x = self.word(input_ids) + self.position.weight + self.token_type.weight[0]
        x = self.norm(x)
        mask_bias = (1.0 - attention_mask[:, None, None, :].float()) * _MASK_VALUE
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


@torch.no_grad()
def _init_bert(module: nn.Module) -> None:
    # BERT's N(0, 0.02) weights. Biases and LayerNorm affines are perturbed from BERT's zeros/ones so that
    # no two initializers are equal: the legacy exporter would de-duplicate them behind Identity nodes.
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.bias, 0.0, 0.02)
        if isinstance(m, nn.LayerNorm):
            m.weight.normal_(1.0, 0.02)
            m.bias.normal_(0.0, 0.02)


def make_bert(name: str, options: BuildOptions) -> TorchModel:
    """Build the encoder; inputs ``input_ids``/``attention_mask`` int64 ``[1, S]``, output ``[1, S, hidden]``.

    ``width_div`` divides ``hidden`` (and so the FFN width); ``heads`` must divide the result.
    The example mask pads the last quarter of the sequence so the mask path is exercised.

    Raises:
        ZooError: ``heads`` does not divide the hidden size.
    """
    hidden = scaled(options.size("hidden"), options.width_div)
    heads, seq_len, vocab = options.size("heads"), options.size("seq_len"), options.size("vocab")
    if hidden % heads:
        divisors = [h for h in range(1, min(hidden, 64) + 1) if hidden % h == 0]
        raise ZooError(
            f"{name}: heads={heads} does not divide hidden={hidden} (after width_div={options.width_div}); "
            f"use heads in {divisors} or another hidden size"
        )
    with seeded(options.seed):
        module = _Bert(vocab=vocab, hidden=hidden, heads=heads, layers=options.size("layers"), seq_len=seq_len)
        _init_bert(module)
        ids = torch.randint(0, vocab, (1, seq_len), dtype=torch.int64)
    mask = torch.ones(1, seq_len, dtype=torch.int64)
    mask[:, seq_len - seq_len // 4 :] = 0
    module.eval()
    return TorchModel(
        module=module,
        example_inputs=(ids, mask),
        input_names=("input_ids", "attention_mask"),
        output_names=("output",),
    )
