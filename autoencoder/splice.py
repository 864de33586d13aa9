"""Putting the encoder and decoder into models: the producing part, the consuming part, the whole model.

All functions are pure: they check their arguments, work on copies and return new models. The parts
are merged with :func:`onnx.compose.merge_models` (the encoder after the producer's output, the decoder
before the consumer's input). The whole compressed model, the reference a compressed bundle is verified
against, is built independently by inserting both convolutions into the original graph at the split
tensor, so that verification compares two constructions rather than one with itself.
"""

from __future__ import annotations

import onnx
from onnx import helper
from onnx.compose import merge_models

from autoencoder.errors import CompressionError
from autoencoder.export import code_name

__all__ = ["DECODED_SUFFIX", "attach_decoder", "attach_encoder", "insert_autoencoder"]

#: Inside a whole compressed model, the decoder's output (the reconstructed split tensor) is named
#: ``<split tensor>`` + this suffix; the original name still holds the producer's exact tensor.
DECODED_SUFFIX = "__ae_decoded"


def _check(model: object, what: str) -> onnx.ModelProto:
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"{what} must be an onnx.ModelProto, got {type(model).__name__}")
    return model


def _dedupe_opsets(model: onnx.ModelProto) -> onnx.ModelProto:
    # merge_models concatenates both models' opset imports; keep one entry per domain.
    seen: dict[str, int] = {}
    for o in model.opset_import:
        seen.setdefault(o.domain, o.version)
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in seen.items())
    return model


def _like(model: onnx.ModelProto, host: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (an encoder or decoder: Conv, ConvTranspose, Relu, unchanged since opset 11) with the host's
    IR version and default-domain op set, which merge_models requires to match."""
    host_default = [o for o in host.opset_import if o.domain in ("", "ai.onnx")]
    if model.ir_version == host.ir_version and list(model.opset_import) == host_default:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.ir_version = host.ir_version
    if host_default:
        del out.opset_import[:]
        out.opset_import.extend(host_default)
    return out


def attach_encoder(producer: onnx.ModelProto, tensor: str, encoder: onnx.ModelProto) -> onnx.ModelProto:
    """``producer`` with output ``tensor`` replaced by the encoder's output ``code_name(tensor)``.

    Raises:
        CompressionError: ``tensor`` is not an output of ``producer``.
    """
    _check(producer, "producer")
    _check(encoder, "encoder")
    outs = [o.name for o in producer.graph.output]
    if tensor not in outs:
        raise CompressionError(f"the producing part has outputs {outs}, not the split tensor {tensor!r}")
    merged = merge_models(producer, _like(encoder, producer), io_map=[(tensor, tensor)],
                          outputs=[code_name(tensor) if o == tensor else o for o in outs])
    return _dedupe_opsets(merged)


def attach_decoder(decoder: onnx.ModelProto, tensor: str, consumer: onnx.ModelProto) -> onnx.ModelProto:
    """``consumer`` reading ``code_name(tensor)`` (and decoding it to ``tensor``) instead of ``tensor``.

    Raises:
        CompressionError: ``tensor`` is not an input of ``consumer``.
    """
    _check(decoder, "decoder")
    _check(consumer, "consumer")
    ins = [i.name for i in consumer.graph.input]
    if tensor not in ins:
        raise CompressionError(f"the consuming part has inputs {ins}, not the split tensor {tensor!r}")
    merged = merge_models(_like(decoder, consumer), consumer, io_map=[(tensor, tensor)])
    # keep the consumer's input order, with the code where the split tensor was
    order = {name: k for k, name in enumerate(code_name(tensor) if n == tensor else n for n in ins)}
    inputs = sorted(merged.graph.input, key=lambda vi: order.get(vi.name, len(order)))
    del merged.graph.input[:]
    merged.graph.input.extend(inputs)
    return _dedupe_opsets(merged)


def insert_autoencoder(model: onnx.ModelProto, tensor: str, encoder: onnx.ModelProto,
                       decoder: onnx.ModelProto) -> onnx.ModelProto:
    """The whole model with the encoder and decoder between ``tensor``'s producer and its consumers.

    Every node that read ``tensor`` reads the decoder's output instead; the model's inputs, outputs and
    metadata are unchanged. ``model`` must be topologically sorted (normalised models are).

    Raises:
        CompressionError: ``tensor`` is not computed by a node of ``model``, or is a model output.
    """
    _check(model, "model")
    _check(encoder, "encoder")
    _check(decoder, "decoder")
    g = model.graph
    producer = next((i for i, n in enumerate(g.node) if tensor in n.output), None)
    if producer is None:
        raise CompressionError(f"no node of the model computes the split tensor {tensor!r}")
    if tensor in {o.name for o in g.output}:
        raise CompressionError(f"the split tensor {tensor!r} is a model output; split before the last unit")
    decoded = tensor + DECODED_SUFFIX
    clash = {decoded, code_name(tensor)} & ({o for n in g.node for o in n.output} | {t.name for t in g.initializer})
    if clash:
        raise CompressionError(f"the model already has tensors named {sorted(clash)}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    og = out.graph
    dec_nodes = []
    for n in decoder.graph.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        for k, name in enumerate(m.output):
            if name == tensor:
                m.output[k] = decoded
        dec_nodes.append(m)
    for n in og.node:
        for k, name in enumerate(n.input):
            if name == tensor:
                n.input[k] = decoded
    nodes = list(og.node)
    new = [*nodes[: producer + 1], *encoder.graph.node, *dec_nodes, *nodes[producer + 1:]]
    del og.node[:]
    og.node.extend(new)
    og.initializer.extend([*encoder.graph.initializer, *decoder.graph.initializer])
    code_vi = onnx.ValueInfoProto()
    code_vi.CopyFrom(encoder.graph.output[0])
    dec_vi = onnx.ValueInfoProto()
    dec_vi.CopyFrom(decoder.graph.output[0])
    dec_vi.name = decoded
    og.value_info.extend([code_vi, dec_vi])
    for extra in decoder.graph.value_info:
        og.value_info.append(extra)
    onnx.checker.check_model(out)
    return out
