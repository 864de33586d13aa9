"""``flatpack bench intake``: every model of the intake corpus loaded, split, verified and served
(:mod:`bench.suite.intake`)."""

from __future__ import annotations

from pathlib import Path

import click

from bench.commands.output import echo_json, save_json

__all__ = ["intake_cmd"]


@click.command("intake")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and totals as JSON.")
@click.option("--models", default=None, help="Comma-separated zoo names (default: vgg11,bert,vit,unet, small).")
@click.option("--variants", default=None,
              help="Comma-separated variants (default: fp32,fp16,int8-dynamic,int8-qdq,int8-qop).")
@click.option("--exporters", default="legacy,dynamo", show_default=True,
              help="Comma-separated torch exporters for the zoo models (legacy, dynamo).")
@click.option("--serve", type=click.Choice(["endpoint", "in-process"]), default="endpoint", show_default=True,
              help="Serve each bundle on the local platform behind the HTTP endpoint, or in this process.")
@click.option("--no-helpers", is_flag=True, help="Leave out the hand-built graphs and the scikit-learn model.")
@click.option("--no-verify", is_flag=True, help="Skip verify --all-options (verify_failed stays 0, checked 0).")
@click.option("--out", type=click.Path(file_okay=False), default="bench/results", show_default=True)
def intake_cmd(as_json: bool, models: str | None, variants: str | None, exporters: str, serve: str,
               no_helpers: bool, no_verify: bool, out: str) -> None:
    """Load, split, verify and serve each corpus model; one row per model and variant.

    A row ``loads`` when flatpack reads the file as shipped, lists the ``split_families`` its units admit,
    counts the split options that fail verification (``verify_failed``), and ``serves_exact`` when a bundle
    split where a family exists, deployed on the local platform and asked through its HTTP endpoint (or run in
    this process, ``--serve in-process``), answers as onnxruntime does on the original file."""
    from bench.suite.intake import ZOO_MODELS, corpus, run_intake
    from serving.console import err_console

    entries = corpus(models.split(",") if models else tuple(ZOO_MODELS),
                     variants.split(",") if variants else None, exporters.split(","), helpers=not no_helpers)
    result = run_intake(entries, verify=not no_verify, serve=serve, say=lambda m: err_console.print(f"[dim]{m}[/]"))
    doc = result.to_json()
    save_json(Path(out) / "intake.json", doc, default=None)
    if as_json:
        echo_json(doc, default=None)
        return
    from rich.table import Table

    from serving.console import console

    table = Table(title="intake")
    for col in ("model", "variant", "loads", "families", "unsplit ops", "verify failed", "serves exact", "error"):
        table.add_column(col)
    for r in result.rows:
        table.add_row(r.model, r.variant, str(r.loads), ", ".join(r.split_families) or "-",
                      ", ".join(r.unsplit_ops) or "-", str(r.verify_failed), str(r.serves_exact), (r.error or "")[:80])
    console.print(table)
    console.print(doc["totals"])
