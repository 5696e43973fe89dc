"""The `copc` command line."""

from __future__ import annotations

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="COPC platform: train, sweep, report.")

_NOT_BUILT = """\
The embedded sweep is not built yet. What exists today:
  - copc_core math: advantages (GAE, COPC traces, V-trace), policy corrections, losses,
    diagnostics and the method registry (python -m bench.advantages benchmarks them)
Still to come (see the open issues): the training engine (copc train), the Ray runtime,
MLflow/Optuna/Prefect sweeps (copc sweep), HTML reports (copc report)."""


@app.command()
def methods() -> None:
    """List the registered methods."""
    from copc_core.methods import METHODS

    for name, row in METHODS.items():
        typer.echo(f"{name:<22s} {row.description}  [{row.source}]")


@app.command()
def sweep() -> None:
    """Run the embedded-default joint sweep and its report (placeholder until the sweep lands)."""
    typer.echo(_NOT_BUILT)


if __name__ == "__main__":
    app()
