"""The benchmark model zoo: build the models flatpack is evaluated on, locally, deterministically.

Every model is written by hand in torch, given seeded weights on CPU and exported to ONNX; nothing is
downloaded. Families: VGG-11/13/16/19, ResNet-18/34/50, wide ResNets (``wrn-34-K``, ``wrn-50-K``), a
dilated MobileNetV2, stacked LSTMs (``lstm-N``), a BERT encoder, a GCN with a baked-in graph, and a small
CNN trained on scikit-learn's digits (``digits-cnn``).

Example::

    from bench.zoo import build, build_to_file

    model = build("resnet18", width_div=8, input_size=32)  # a small ModelProto, in memory
    build_to_file("wrn-50-2", "build/wrn50_2.onnx")  # full size, 275 MB on disk
"""

from bench.zoo.build import (
    PARAMETERS_KEY,
    ZOO_KEY,
    build,
    build_to_file,
    build_torch,
    count_parameters,
    zoo_metadata,
)
from bench.zoo.digits import ACCURACY_KEY, SPLIT_SEED_KEY, load_digits_split
from bench.zoo.errors import ZooError, ZooExportError
from bench.zoo.export import EXTERNAL_DATA_THRESHOLD_BYTES, save_model
from bench.zoo.options import EXPORTERS, BuildOptions
from bench.zoo.registry import ZooEntry, list_models, lookup
from bench.zoo.torch_model import TorchModel

__all__ = [
    "ACCURACY_KEY",
    "EXPORTERS",
    "EXTERNAL_DATA_THRESHOLD_BYTES",
    "PARAMETERS_KEY",
    "SPLIT_SEED_KEY",
    "ZOO_KEY",
    "BuildOptions",
    "TorchModel",
    "ZooEntry",
    "ZooError",
    "ZooExportError",
    "build",
    "build_to_file",
    "build_torch",
    "count_parameters",
    "list_models",
    "load_digits_split",
    "lookup",
    "save_model",
    "zoo_metadata",
]
