"""The model zoo: build the models flatpack is evaluated on, locally, deterministically.

Every model is written by hand in torch, given seeded weights on CPU and exported to ONNX; nothing is
downloaded. Families: VGG-11/13/16/19, ResNet-18/34/50, wide ResNets (``wrn-34-K``, ``wrn-50-K``), a
dilated MobileNetV2, MobileNetV3-Large, EfficientNet-B0, stacked LSTMs (``lstm-N``), a BERT encoder and a
ViT (eager or SDPA attention, static or dynamic axes), a GCN with a baked-in graph, a small CNN trained
on scikit-learn's digits (``digits-cnn``), a U-Net, and a DLRM recommender whose embedding tables are most
of its bytes (``dlrm``).

Example::

    from zoo import build, build_to_file

    model = build("resnet18", width_div=8, input_size=32)  # a small ModelProto, in memory
    build_to_file("wrn-50-2", "build/wrn50_2.onnx")  # full size, 275 MB on disk

torch is an optional extra (``flatpack[zoo]``): importing this package costs nothing, and torch is
imported when a name that needs it is first used (PEP 562), so ``zoo.cache.model_file`` resolves a file
and ``zoo.ZooError`` is caught without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zoo.builder import PARAMETERS_KEY, ZOO_KEY, build, build_to_file, build_torch, count_parameters, zoo_metadata
    from zoo.cache import model_file, zoo_file
    from zoo.digits import ACCURACY_KEY, SPLIT_SEED_KEY, load_digits_split
    from zoo.errors import ZooError, ZooExportError
    from zoo.export import EXTERNAL_DATA_THRESHOLD_BYTES, save_model
    from zoo.options import EXPORTERS, BuildKwargs, BuildOptions
    from zoo.registry import ZooEntry, list_models, lookup
    from zoo.torch_model import TorchModel

_HOME = {
    "zoo.builder": ("PARAMETERS_KEY", "ZOO_KEY", "build", "build_to_file", "build_torch", "count_parameters",
                  "zoo_metadata"),
    "zoo.cache": ("model_file", "zoo_file"),
    "zoo.digits": ("ACCURACY_KEY", "SPLIT_SEED_KEY", "load_digits_split"),
    "zoo.errors": ("ZooError", "ZooExportError"),
    "zoo.export": ("EXTERNAL_DATA_THRESHOLD_BYTES", "save_model"),
    "zoo.options": ("EXPORTERS", "BuildKwargs", "BuildOptions"),
    "zoo.registry": ("ZooEntry", "list_models", "lookup"),
    "zoo.torch_model": ("TorchModel",),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}

__all__ = [
    "ACCURACY_KEY",
    "EXPORTERS",
    "EXTERNAL_DATA_THRESHOLD_BYTES",
    "PARAMETERS_KEY",
    "SPLIT_SEED_KEY",
    "ZOO_KEY",
    "BuildKwargs",
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
    "model_file",
    "save_model",
    "zoo_file",
    "zoo_metadata",
]
assert sorted(__all__) == sorted(_MODULE_OF), "every lazily exported name has a home module"


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
