"""Where the platform keeps its files, from the environment (defaults inside the project)."""

from __future__ import annotations

import os
import pathlib
from typing import Literal

# where a run trains: in this process, or on Ray (rollout and learner actors)
Runtime = Literal["inprocess", "ray"]


def data_root() -> pathlib.Path:
    """`COPC_DATA_DIR`, else ./data under the current directory (resolved; not created)."""
    return pathlib.Path(os.environ.get("COPC_DATA_DIR", "data")).resolve()


def data_dir() -> pathlib.Path:
    """The data folder (`data_root()`), created on demand."""
    path = data_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


class OutsideDataFolderError(ValueError):
    """A path given by a caller (a flow parameter) points outside the data folder."""


def inside_data_folder(path: str | os.PathLike, what: str) -> pathlib.Path:
    """`path` resolved (a relative one against the data folder), refused unless it lies inside the data folder.

    Flow parameters arrive from the Prefect API: whoever can post to it must not choose where files
    are written. Symbolic links are resolved before the check.
    """
    root = data_root()
    candidate = pathlib.Path(path)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if resolved != root and root not in resolved.parents:
        raise OutsideDataFolderError(f"{what} must lie inside the data folder {root} (COPC_DATA_DIR), got {path}")
    return resolved


def confined_store_uri(uri: str, what: str) -> str:
    """A store URI for a flow parameter: a SQLite or file store must lie inside the data folder; a server
    (http(s), PostgreSQL, MySQL) is the caller's to name."""
    for prefix in ("sqlite:///", "file://"):
        if uri.startswith(prefix):
            inside_data_folder(uri[len(prefix) :], what)
            return uri
    if "://" not in uri:  # a bare path is a file store
        inside_data_folder(uri, what)
        return uri
    if uri.split("://", 1)[0].lower() not in (
        "http",
        "https",
        "postgresql",
        "postgresql+psycopg2",
        "mysql",
        "mysql+pymysql",
        "databricks",
    ):
        raise OutsideDataFolderError(f"{what}: unsupported scheme in {uri!r}")
    return uri


def configure_torch_threads(threads: int) -> None:
    """One torch thread per process is the measured sweet spot for the tiny model."""
    import torch

    torch.set_num_threads(threads)
