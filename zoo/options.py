"""Build options shared by every zoo family, and their validation.

One frozen :class:`BuildOptions` carries every knob a build can take. A family declares which of the
sized knobs (``input_size``, ``layers``, ...) it accepts and their defaults; :func:`resolve_options` fills
those defaults in and refuses a knob the family does not take, so ``build("vgg16", heads=4)`` fails loudly
instead of silently building something other than what was asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import TypedDict

from zoo.errors import ZooError

__all__ = ["ATTENTIONS", "EXPORTERS", "SIZED_OPTIONS", "BuildKwargs", "BuildOptions", "resolve_options", "scaled"]

#: Exporters a build can use: the TorchScript-based one and the torch.export-based one.
EXPORTERS: tuple[str, ...] = ("legacy", "dynamo")

#: Attention implementations a transformer can be written with: out in ops, or torch's fused SDPA.
ATTENTIONS: tuple[str, ...] = ("eager", "sdpa")

#: Options whose ``None`` means "the family's default"; a family accepts a subset of these.
SIZED_OPTIONS: tuple[str, ...] = ("input_size", "layers", "hidden", "heads", "seq_len", "vocab", "nodes")

_MIN_OPSET = 13
_MAX_OPSET = 23


@dataclass(frozen=True)
class BuildOptions:
    """Every option of a zoo build; see :func:`zoo.build` for what each means.

    ``None`` in a sized option means "the family's default"; after :func:`resolve_options` the options a
    family accepts are filled in and the others stay ``None``.
    """

    width_div: int = 1
    input_size: int | None = None
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    vocab: int | None = None
    nodes: int | None = None
    seed: int = 0
    exporter: str = "legacy"
    opset: int = 17
    attention: str = "eager"
    dynamic_axes: bool = False

    def as_dict(self) -> dict[str, int | str | None]:
        """The options as a plain dict (for metadata), leaving out sized options that stayed ``None``."""
        out: dict[str, int | str | None] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in SIZED_OPTIONS:
                continue
            out[f.name] = value
        return out

    def size(self, name: str) -> int:
        """A resolved sized option; raises ``KeyError`` if the family did not declare it (a zoo bug)."""
        value = getattr(self, name)
        if value is None:
            raise KeyError(f"option {name!r} was not resolved for this family")
        return int(value)


class BuildKwargs(TypedDict, total=False):
    """:func:`zoo.build`'s keyword options, for callers that keep them in a dict (``build(name, **kwargs)``)."""

    width_div: int
    input_size: int | None
    layers: int | None
    hidden: int | None
    heads: int | None
    seq_len: int | None
    vocab: int | None
    nodes: int | None
    seed: int
    exporter: str
    opset: int
    attention: str
    dynamic_axes: bool


def _check_int(model: str, name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ZooError(f"{model}: option {name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ZooError(f"{model}: option {name} must be >= {minimum}, got {value}")


def resolve_options(
    model: str, options: BuildOptions, defaults: Mapping[str, int], *, transformer: bool = False
) -> BuildOptions:
    """Validate ``options`` for one family and fill in its defaults.

    Args:
        model: the zoo name being built (for error messages).
        options: what the caller passed.
        defaults: the sized options this family accepts, with their defaults. Sized options not in it must
            be ``None``.
        transformer: the family takes ``attention`` and ``dynamic_axes``; others must leave them at their
            defaults.

    Returns:
        A copy of ``options`` with every accepted sized option set.

    Raises:
        ZooError: an option the family does not take, a non-integer or non-positive size, an unknown
            exporter or an opset outside the supported range, ``attention``/``dynamic_axes`` for a model
            that is not a transformer.
    """
    given = [n for n in SIZED_OPTIONS if getattr(options, n) is not None and n not in defaults]
    if given:
        accepted = ", ".join(sorted(defaults)) or "none"
        raise ZooError(
            f"{model} does not take option(s) {', '.join(given)}; its size options are: {accepted} "
            "(plus width_div, seed, exporter, opset)"
        )
    _check_int(model, "width_div", options.width_div, minimum=1)
    _check_int(model, "seed", options.seed, minimum=0)
    _check_int(model, "opset", options.opset, minimum=_MIN_OPSET)
    if options.opset > _MAX_OPSET:
        raise ZooError(f"{model}: opset {options.opset} is newer than supported; use {_MIN_OPSET}..{_MAX_OPSET}")
    if options.exporter not in EXPORTERS:
        raise ZooError(f"{model}: unknown exporter {options.exporter!r}; use one of: {', '.join(EXPORTERS)}")
    _check_transformer_options(model, options, transformer)
    filled = {}
    for name, default in defaults.items():
        value = getattr(options, name)
        if value is None:
            value = default
        _check_int(model, name, value, minimum=1)
        filled[name] = value
    return replace(options, **filled)


def _check_transformer_options(model: str, options: BuildOptions, transformer: bool) -> None:
    if options.attention not in ATTENTIONS:
        raise ZooError(f"{model}: unknown attention {options.attention!r}; use one of: {', '.join(ATTENTIONS)}")
    if not isinstance(options.dynamic_axes, bool):
        raise ZooError(f"{model}: option dynamic_axes must be True or False, got {options.dynamic_axes!r}")
    if transformer:
        return
    if options.attention != "eager":
        raise ZooError(f"{model} has no attention; attention={options.attention!r} is for bert and vit")
    if options.dynamic_axes:
        raise ZooError(f"{model} is built with static shapes only; dynamic_axes is for bert and vit")


def scaled(width: int, width_div: int, *, multiple: int = 1) -> int:
    """``width`` divided by ``width_div``, at least one, rounded up to a multiple of ``multiple``."""
    w = max(1, width // width_div)
    return max(multiple, -(-w // multiple) * multiple)
