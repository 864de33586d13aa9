"""The trained pair as two small ONNX models: the encoder (``T -> T_e``) and the decoder (``T_e -> T``).

The models are written node by node from the trained weights rather than through torch's exporter: each
is one Conv (or ConvTranspose) and at most one Relu, and writing them directly pins the op set and IR
version to the host model's, which :func:`onnx.compose.merge_models` requires.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper, numpy_helper

from autoencoder.design import AEDesign
from autoencoder.train import TrainedWeights

__all__ = ["CODE_SUFFIX", "code_name", "decoder_model", "encoder_model"]

#: The encoded tensor is named ``<split tensor>`` + this suffix.
CODE_SUFFIX = "__ae"
_PREFIX = "flatpack_ae"


def code_name(tensor: str) -> str:
    """Name of the encoded tensor that crosses the split instead of ``tensor``."""
    return tensor + CODE_SUFFIX


def _opset(host: onnx.ModelProto | None) -> tuple[int, list[onnx.OperatorSetIdProto]]:
    if host is None:
        return 8, [helper.make_opsetid("", 17)]
    default = [o for o in host.opset_import if o.domain in ("", "ai.onnx")]
    return host.ir_version, default or [helper.make_opsetid("", 17)]


def _model(graph: onnx.GraphProto, host: onnx.ModelProto | None) -> onnx.ModelProto:
    ir, opsets = _opset(host)
    model = helper.make_model(graph, opset_imports=opsets, producer_name="flatpack.autoencoder")
    model.ir_version = ir
    onnx.checker.check_model(model)
    return model


def _vi(name: str, shape: tuple[int, ...]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def encoder_model(design: AEDesign, weights: TrainedWeights, tensor: str, *,
                  host: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """``tensor`` (``[1, C, H, W]``) -> :func:`code_name` ``(tensor)`` (``[1, C_e, H', W']``).

    ``host``: the model the encoder will be merged into; its IR version and default op set are used.
    """
    d = design
    w, b = f"{_PREFIX}.{tensor}.encoder.weight", f"{_PREFIX}.{tensor}.encoder.bias"
    pad = d.kernel // 2
    node = helper.make_node("Conv", [tensor, w, b], [code_name(tensor)], name=f"{_PREFIX}.{tensor}.encoder",
                            kernel_shape=[d.kernel, d.kernel], strides=[d.stride, d.stride], pads=[pad] * 4)
    graph = helper.make_graph(
        [node], f"{_PREFIX}_encoder",
        [_vi(tensor, (1, d.channels, d.height, d.width))],
        [_vi(code_name(tensor), (1, d.code_channels, d.code_height, d.code_width))],
        initializer=[numpy_helper.from_array(weights.encoder_weight, w),
                     numpy_helper.from_array(weights.encoder_bias, b)],
    )
    return _model(graph, host)


def decoder_model(design: AEDesign, weights: TrainedWeights, tensor: str, *,
                  host: onnx.ModelProto | None = None) -> onnx.ModelProto:
    """:func:`code_name` ``(tensor)`` -> ``tensor``: the decoder's output takes the split tensor's name, so
    the consuming part reads it unchanged."""
    d = design
    w, b = f"{_PREFIX}.{tensor}.decoder.weight", f"{_PREFIX}.{tensor}.decoder.bias"
    pad = d.kernel // 2
    conv_out = f"{_PREFIX}.{tensor}.decoder.conv" if d.relu_out else tensor
    if d.stride == 1:
        conv = helper.make_node("Conv", [code_name(tensor), w, b], [conv_out], name=f"{_PREFIX}.{tensor}.decoder",
                                kernel_shape=[d.kernel, d.kernel], pads=[pad] * 4)
    else:
        conv = helper.make_node("ConvTranspose", [code_name(tensor), w, b], [conv_out],
                                name=f"{_PREFIX}.{tensor}.decoder", kernel_shape=[d.kernel, d.kernel],
                                strides=[d.stride, d.stride], pads=[pad] * 4, output_padding=list(d.output_padding))
    nodes = [conv]
    if d.relu_out:
        nodes.append(helper.make_node("Relu", [conv_out], [tensor], name=f"{_PREFIX}.{tensor}.decoder.relu"))
    graph = helper.make_graph(
        nodes, f"{_PREFIX}_decoder",
        [_vi(code_name(tensor), (1, d.code_channels, d.code_height, d.code_width))],
        [_vi(tensor, (1, d.channels, d.height, d.width))],
        initializer=[numpy_helper.from_array(weights.decoder_weight, w),
                     numpy_helper.from_array(weights.decoder_bias, b)],
    )
    return _model(graph, host)
