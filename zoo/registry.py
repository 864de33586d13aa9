"""The zoo's catalogue: which names exist, which family builds each, and what each accepts.

Names are fixed (``vgg16``, ``bert``, ...) or patterns (``wrn-50-K``, ``lstm-N``); :func:`list_models`
lists the fixed names and the commonly used pattern instances, :func:`lookup` resolves any valid name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from zoo.bert import BERT_DEFAULTS, make_bert
from zoo.digits import DIGITS_DEFAULTS, make_digits_cnn
from zoo.dlrm import DLRM_DEFAULTS, make_dlrm
from zoo.efficientnet import EFFICIENTNET_DEFAULTS, make_efficientnet
from zoo.errors import ZooError
from zoo.gcn import GCN_DEFAULTS, make_gcn
from zoo.lstm import LSTM_DEFAULTS, LSTM_PATTERN, lstm_layers, make_lstm
from zoo.mobilenet import MOBILENET_DEFAULTS, make_mobilenet
from zoo.mobilenetv3 import MOBILENETV3_DEFAULTS, make_mobilenetv3
from zoo.options import BuildOptions
from zoo.resnet import RESNET_DEFAULTS, WRN_PATTERN, make_resnet, resnet_layout
from zoo.torch_model import TorchModel
from zoo.unet import UNET_DEFAULTS, make_unet
from zoo.vgg import VGG_CONFIGS, VGG_DEFAULTS, make_vgg
from zoo.vit import VIT_DEFAULTS, make_vit

__all__ = ["TRANSFORMER_FAMILIES", "ZooEntry", "list_models", "lookup", "resolve"]

#: Families that take ``attention`` and ``dynamic_axes``.
TRANSFORMER_FAMILIES: frozenset[str] = frozenset({"bert", "vit"})

_Maker = Callable[[str, BuildOptions], TorchModel]


@dataclass(frozen=True)
class ZooEntry:
    """One buildable zoo model.

    Attributes:
        name: what :func:`zoo.build` takes, e.g. ``"wrn-50-2"``.
        family: ``vgg``, ``resnet``, ``wide-resnet``, ``mobilenet``, ``mobilenetv3``, ``efficientnet``,
            ``lstm``, ``bert``, ``vit``, ``gcn``, ``digits``, ``unet`` or ``dlrm``.
        description: one line for people.
        options: the size options this model accepts besides ``width_div``, ``seed``, ``exporter`` and
            ``opset`` (which every model accepts).
        defaults: ``(option, default)`` pairs for :attr:`options`.
        default_input: the graph input(s) at the defaults, e.g. ``"input f32[1,3,224,224]"``.
    """

    name: str
    family: str
    description: str
    options: tuple[str, ...]
    defaults: tuple[tuple[str, int], ...]
    default_input: str

    def default(self, option: str) -> int:
        """The default of one size option; raises ``KeyError`` if this model does not take it."""
        return dict(self.defaults)[option]


@dataclass(frozen=True)
class _Resolved:
    entry: ZooEntry
    make: _Maker


def _entry(name: str, family: str, description: str, defaults: Mapping[str, int], default_input: str) -> ZooEntry:
    return ZooEntry(
        name=name,
        family=family,
        description=description,
        options=tuple(defaults),
        defaults=tuple(defaults.items()),
        default_input=default_input,
    )


def _image_input(size: int, channels: int = 3) -> str:
    return f"input f32[1,{channels},{size},{size}]"


def _fixed_entries() -> dict[str, _Resolved]:
    image = _image_input(224)
    out: dict[str, _Resolved] = {}
    for name, config in VGG_CONFIGS.items():
        convs = sum(1 for c in config if c != "M")
        out[name] = _Resolved(
            _entry(
                name,
                "vgg",
                f"VGG-{convs + 3}, no BN; FC size grows with the input",
                VGG_DEFAULTS,
                image,
            ),
            make_vgg,
        )
    for name, text in (
        ("resnet18", "ResNet-18, basic blocks [2,2,2,2]"),
        ("resnet34", "ResNet-34, basic blocks [3,4,6,3]"),
        ("resnet50", "ResNet-50, bottlenecks [3,4,6,3]"),
    ):
        out[name] = _Resolved(_entry(name, "resnet", text, RESNET_DEFAULTS, image), make_resnet)
    out["mobilenet"] = _Resolved(
        _entry(
            "mobilenet",
            "mobilenet",
            "MobileNetV2; depthwise, grouped and dilated convs",
            MOBILENET_DEFAULTS,
            image,
        ),
        make_mobilenet,
    )
    out["mobilenetv3-large"] = _Resolved(
        _entry(
            "mobilenetv3-large",
            "mobilenetv3",
            "MobileNetV3-Large; squeeze-excitation, hard-swish, depthwise convs",
            MOBILENETV3_DEFAULTS,
            image,
        ),
        make_mobilenetv3,
    )
    out["efficientnet-b0"] = _Resolved(
        _entry(
            "efficientnet-b0",
            "efficientnet",
            "EfficientNet-B0; MBConv with squeeze-excitation, SiLU, depthwise convs",
            EFFICIENTNET_DEFAULTS,
            image,
        ),
        make_efficientnet,
    )
    out["vit"] = _Resolved(
        _entry("vit", "vit", "ViT-B/16; eager or sdpa attention, static or dynamic batch", VIT_DEFAULTS, image),
        make_vit,
    )
    out["bert"] = _Resolved(
        _entry(
            "bert",
            "bert",
            "BERT-base encoder; eager or sdpa attention, static or dynamic axes",
            BERT_DEFAULTS,
            "input_ids, attention_mask, token_type_ids i64[1,128]",
        ),
        make_bert,
    )
    out["gcn"] = _Resolved(
        _entry(
            "gcn",
            "gcn",
            "2-layer GCN over a fixed random graph",
            GCN_DEFAULTS,
            "input f32[2048,512]",
        ),
        make_gcn,
    )
    out["digits-cnn"] = _Resolved(
        _entry(
            "digits-cnn",
            "digits",
            "small CNN trained on sklearn digits",
            DIGITS_DEFAULTS,
            _image_input(32, channels=1),
        ),
        make_digits_cnn,
    )
    out["unet"] = _Resolved(
        _entry(
            "unet",
            "unet",
            "U-Net, 3 levels; decoder upsamples by ConvTranspose, bilinear and nearest Resize, skip concats",
            UNET_DEFAULTS,
            _image_input(UNET_DEFAULTS["input_size"]),
        ),
        make_unet,
    )
    t, bag = DLRM_DEFAULTS["layers"], DLRM_DEFAULTS["seq_len"]
    out["dlrm"] = _Resolved(
        _entry(
            "dlrm",
            "dlrm",
            "DLRM recommender: embedding tables (2 GB, external data) looked up in bags, bottom/top MLPs, "
            "pairwise interaction",
            DLRM_DEFAULTS,
            f"dense f32[B,13], sparse_0..sparse_{t - 1} i64[B,{bag}] (B: input_size, the candidates a request "
            "scores; 1 by default)",
        ),
        make_dlrm,
    )
    return out


_FIXED = _fixed_entries()
_LISTED_WRN_K = (1, 2, 3, 4, 5)
_LISTED_LSTM_N = (1, 2, 4)


def _wide(name: str) -> _Resolved:
    resnet_layout(name)  # validates K
    match = WRN_PATTERN.fullmatch(name)
    assert match is not None
    depth, k = match.groups()
    inner = "block widths" if depth == "34" else "bottleneck widths"
    text = f"wide ResNet-{depth}, {inner} x{k}"
    return _Resolved(_entry(name, "wide-resnet", text, RESNET_DEFAULTS, _image_input(224)), make_resnet)


def _lstm(name: str) -> _Resolved:
    layers = lstm_layers(name)
    text = f"{layers} stacked LSTM layer{'s' if layers > 1 else ''} + FC"
    return _Resolved(
        _entry(name, "lstm", text, LSTM_DEFAULTS, f"input f32[1,{LSTM_DEFAULTS['seq_len']},2048]"), make_lstm
    )


def _all_listed_names() -> list[str]:
    names = [n for n in _FIXED if n.startswith(("vgg", "resnet"))]
    names += [f"wrn-{d}-{k}" for d in (34, 50) for k in _LISTED_WRN_K]
    names += ["mobilenet", "mobilenetv3-large", "efficientnet-b0"]
    names += [f"lstm-{n}" for n in _LISTED_LSTM_N]
    names += ["bert", "vit", "gcn", "digits-cnn", "unet", "dlrm"]
    return names


def lookup(name: str) -> ZooEntry:
    """The catalogue entry for ``name`` (case-insensitive; any ``wrn-34-K``/``wrn-50-K``/``lstm-N``).

    Raises:
        ZooError: an unknown name; the message lists the valid names and patterns.
    """
    return resolve(name)[0]


def resolve(name: str) -> tuple[ZooEntry, _Maker]:
    """The entry for ``name`` and the function that builds its torch module (for :mod:`zoo.builder`).

    Raises:
        ZooError: an unknown name; the message lists the valid names and patterns.
    """
    if not isinstance(name, str):
        raise ZooError(f"a zoo model name must be a string, got {name!r}")
    key = name.strip().lower()
    if key in _FIXED:
        found = _FIXED[key]
    elif WRN_PATTERN.fullmatch(key):
        found = _wide(key)
    elif LSTM_PATTERN.fullmatch(key):
        found = _lstm(key)
    else:
        raise ZooError(
            f"unknown zoo model {name!r}; valid names: {', '.join(_FIXED)}, "
            "wrn-34-K and wrn-50-K (width factor K >= 1, e.g. wrn-50-2), lstm-N (N layers, e.g. lstm-2)"
        )
    return found.entry, found.make


def list_models() -> list[ZooEntry]:
    """Every fixed zoo model plus ``wrn-34-K``/``wrn-50-K`` for K = 1..5 and ``lstm-1``/``-2``/``-4``.

    Other ``wrn-*-K`` and ``lstm-N`` are valid too; they are just not listed.
    """
    return [lookup(name) for name in _all_listed_names()]
