"""Where the platform keeps its files, from the environment (defaults inside the project)."""

from __future__ import annotations

import os
import pathlib


def data_dir() -> pathlib.Path:
    """`COPC_DATA_DIR`, else ./data under the current directory (created on demand)."""
    path = pathlib.Path(os.environ.get("COPC_DATA_DIR", "data")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def configure_torch_threads(threads: int) -> None:
    """One torch thread per process is the measured sweet spot for the tiny model."""
    import torch

    torch.set_num_threads(threads)
