"""A BERT encoder (Devlin et al., 2019), with static shapes or exported the usual way (dynamic axes).

Embeddings (word + learned position + token type, then LayerNorm; the position table has ``seq_len``
rows rather than BERT-base's 512, a 0.3% smaller model at the defaults) followed by ``layers`` post-LN
transformer layers: self-attention (q/k/v Linear, scaled dot product, additive mask of -10000 on padding,
softmax, output Linear, residual, LayerNorm) and a GELU feed-forward of width ``4 * hidden`` (residual,
LayerNorm). The output is the last hidden state ``[B, S, hidden]``. Inputs: ``input_ids``,
``attention_mask`` and ``token_type_ids``, all int64 ``[B, S]``.

Two attention implementations, as Hugging Face offers them (see :mod:`zoo.attention`): ``eager`` and
``sdpa``.

With static shapes every ``view`` uses Python ints from the configuration and the position embeddings are
the whole table, so the graph has constant shapes. With ``dynamic_axes`` the model is written the way
people write it: sizes come from ``tensor.shape`` and the positions from ``torch.arange``, so the export
has symbolic ``batch`` and ``seq`` axes and Shape/Gather/Range chains (``seq`` at most ``seq_len``).
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.attention import MultiHeadAttention, Sizing, init_transformer
from zoo.errors import ZooError
from zoo.options import BuildOptions, scaled
from zoo.torch_model import TorchModel
from zoo.weights import seeded

__all__ = ["BERT_DEFAULTS", "make_bert"]

BERT_DEFAULTS: dict[str, int] = {"layers": 12, "hidden": 768, "heads": 12, "seq_len": 128, "vocab": 30522}

_LN_EPS = 1e-12
_MASK_VALUE = -10000.0
_BATCH = 1
# torch.export specialises a size-1 example axis to the constant 1: dynamic exports trace batch 2.
_DYNAMIC_EXAMPLE_BATCH = 2


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int, heads: int, sizing: Sizing, attention: str) -> None:
        super().__init__()
        self.attend = MultiHeadAttention(hidden, heads, sizing, attention)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.attend(x, mask_bias))


class _Layer(nn.Module):
    def __init__(self, hidden: int, heads: int, sizing: Sizing, attention: str) -> None:
        super().__init__()
        self.attention = _SelfAttention(hidden, heads, sizing, attention)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.gelu = nn.GELU()
        self.ffn_out = nn.Linear(4 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)

    def forward(self, x: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask_bias)
        return self.norm(x + self.ffn_out(self.gelu(self.intermediate(x))))


class _Bert(nn.Module):
    def __init__(self, *, vocab: int, hidden: int, heads: int, layers: int, sizing: Sizing, attention: str) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        # One row per position the model takes (BERT-base has 512): a static export adds the whole table.
        self.position = nn.Embedding(sizing.seq, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=_LN_EPS)
        self.layers = nn.ModuleList(_Layer(hidden, heads, sizing, attention) for _ in range(layers))
        self.sizing = sizing

    def _positions(self, input_ids: torch.Tensor) -> torch.Tensor:
        if not self.sizing.dynamic:
            return self.position.weight
        return self.position(torch.arange(input_ids.shape[1], device=input_ids.device))

    def _mask_bias(self, attention_mask: torch.Tensor) -> torch.Tensor:
        # As Hugging Face's mask utilities build it: key positions from an arange, looked up in the mask,
        # compared, broadcast to [B, 1, S, S] and turned into an additive bias. Every op here reads the
        # inputs alone (Range, Gather, Equal, Expand, Where): the partitioner must recompute them per stage.
        batch, seq = self.sizing.batch_seq(attention_mask)
        keys = torch.arange(seq, device=attention_mask.device)
        keep = attention_mask[:, keys] == 1
        keep = keep[:, None, None, :].expand(batch, 1, seq, seq)
        zero = torch.zeros((), dtype=torch.float32)
        return torch.where(keep, zero, torch.full((), _MASK_VALUE, dtype=torch.float32))

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.word(input_ids) + self._positions(input_ids) + self.token_type(token_type_ids)
        x = self.norm(x)
        mask_bias = self._mask_bias(attention_mask)
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x


def make_bert(name: str, options: BuildOptions) -> TorchModel:
    """Build the encoder; inputs ``input_ids``/``attention_mask``/``token_type_ids`` int64 ``[1, S]``,
    output ``[1, S, hidden]`` (``[batch, seq]`` and ``[batch, seq, hidden]`` with ``dynamic_axes``).

    ``width_div`` divides ``hidden`` (and so the FFN width); ``heads`` must divide the result.
    The example mask pads the last quarter of the sequence so the mask path is exercised, and the second
    half of the sequence is token type 1.

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
    batch = _DYNAMIC_EXAMPLE_BATCH if options.dynamic_axes else _BATCH
    sizing = Sizing(_BATCH, seq_len, options.dynamic_axes)
    with seeded(options.seed):
        module = _Bert(vocab=vocab, hidden=hidden, heads=heads, layers=options.size("layers"), sizing=sizing,
                       attention=options.attention)
        init_transformer(module)
        ids = torch.randint(0, vocab, (batch, seq_len), dtype=torch.int64)
    mask = torch.ones(batch, seq_len, dtype=torch.int64)
    mask[:, seq_len - seq_len // 4 :] = 0
    token_types = torch.zeros(batch, seq_len, dtype=torch.int64)
    token_types[:, seq_len // 2 :] = 1
    module.eval()
    names = ("input_ids", "attention_mask", "token_type_ids")
    axes = {n: {0: "batch", 1: "seq"} for n in (*names, "output")} if options.dynamic_axes else {}
    return TorchModel(
        module=module,
        example_inputs=(ids, mask, token_types),
        input_names=names,
        output_names=("output",),
        dynamic_axes=axes,
        dynamic_max={"seq": seq_len},
    )
