"""``flatpack zoo``: list and build the benchmark models (built locally with torch, never downloaded)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from serving.console import console

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["zoo"]

_BYTES_PER_MB = 1_000_000


def _load_zoo() -> ModuleType:
    # Imported per command: torch takes seconds to import and is an optional dependency.
    import zoo as zoo_module

    try:
        zoo_module.build  # noqa: B018 - the first use imports torch
    except ImportError as exc:
        raise click.ClickException(
            f"the model zoo needs torch, onnxscript and scikit-learn ({exc}); "
            "install them with: pip install 'flatpack[zoo]'"
        ) from exc
    return zoo_module


@click.group()
def zoo() -> None:
    """Benchmark models: VGG, ResNet, wide ResNet, MobileNet(V2, V3), EfficientNet, LSTM, BERT, ViT, GCN, digits CNN."""


@zoo.command("list")
def list_cmd() -> None:
    """List the models `flatpack zoo build` can make, with their size options and default inputs."""
    zoo_module = _load_zoo()
    table = Table(title="flatpack model zoo", title_justify="left")
    table.add_column("name", style="bold", no_wrap=True)
    table.add_column("family", no_wrap=True)
    table.add_column("description")
    table.add_column("default input")
    table.add_column("size options (defaults)")
    for entry in zoo_module.list_models():
        defaults = ", ".join(f"{k}={v}" for k, v in entry.defaults)
        table.add_row(entry.name, entry.family, entry.description, entry.default_input, defaults)
    console.print(table)
    console.print("Any wrn-34-K / wrn-50-K (K >= 1) and lstm-N (N layers) can be built, not only those listed.")


def _size_mb(path: Path) -> float:
    data = path.with_name(path.name + ".data")
    total = path.stat().st_size + (data.stat().st_size if data.exists() else 0)
    return total / _BYTES_PER_MB


@zoo.command("build")
@click.argument("name")
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    help="Where to write the .onnx file (parent directories are created).",
)
@click.option(
    "--width-div",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Divide every channel/feature width by this (small test variants).",
)
@click.option("--input-size", type=click.IntRange(min=1),
              help="Image side (vgg: a multiple of 32); dlrm: the candidates one request scores (its batch).")
@click.option("--layers", type=click.IntRange(min=1), help="bert/vit/gcn layers (lstm: put it in the name).")
@click.option("--hidden", type=click.IntRange(min=1), help="bert/vit/lstm hidden size, gcn hidden width.")
@click.option("--heads", type=click.IntRange(min=1), help="bert/vit attention heads.")
@click.option("--seq-len", type=click.IntRange(min=1), help="bert/lstm sequence length.")
@click.option("--vocab", type=click.IntRange(min=1), help="bert vocabulary size.")
@click.option("--nodes", type=click.IntRange(min=1), help="gcn node count.")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Fixes the weights (and the gcn graph, the digits split).",
)
@click.option(
    "--exporter",
    type=click.Choice(["legacy", "dynamo"]),
    default="legacy",
    show_default=True,
    help="torch.onnx.export with dynamo=False (legacy) or dynamo=True.",
)
@click.option("--opset", type=int, default=17, show_default=True, help="ONNX opset.")
@click.option(
    "--attention",
    type=click.Choice(["eager", "sdpa"]),
    default="eager",
    show_default=True,
    help="bert/vit attention: written out (MatMul, Softmax, MatMul) or torch's scaled_dot_product_attention.",
)
@click.option(
    "--dynamic-axes",
    is_flag=True,
    help="bert/vit: export with symbolic batch (and bert's seq) axes, as transformers are usually exported.",
)
def build_cmd(
    name: str,
    output: Path,
    width_div: int,
    input_size: int | None,
    layers: int | None,
    hidden: int | None,
    heads: int | None,
    seq_len: int | None,
    vocab: int | None,
    nodes: int | None,
    seed: int,
    exporter: str,
    opset: int,
    attention: str,
    dynamic_axes: bool,
) -> None:
    """Build zoo model NAME and write it to an ONNX file."""
    zoo_module = _load_zoo()
    # Bound to the real stdout now: the exporters run with stdout redirected, and the spinner must not
    # follow it there.
    stdout = Console(file=sys.stdout)
    try:
        with stdout.status(f"building {name} ({exporter} exporter)...", spinner="dots"):
            model = zoo_module.build(
                name, width_div=width_div, input_size=input_size, layers=layers, hidden=hidden,
                heads=heads, seq_len=seq_len, vocab=vocab, nodes=nodes, seed=seed, exporter=exporter,
                opset=opset, attention=attention, dynamic_axes=dynamic_axes,
            )  # fmt: skip
            metadata = zoo_module.zoo_metadata(model)
            parameters = zoo_module.count_parameters(model)
            path = zoo_module.save_model(model, output)
    except (zoo_module.ZooError, zoo_module.ZooExportError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from exc
    line = f"wrote {path} ({_size_mb(path):.1f} MB, {parameters:,} parameters"
    accuracy = metadata.get(zoo_module.ACCURACY_KEY)
    if accuracy is not None:
        line += f", test accuracy {float(accuracy):.4f}"
    stdout.print(line + ")", markup=False, highlight=False, soft_wrap=True)
