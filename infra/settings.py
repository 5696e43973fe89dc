"""Where the platform keeps its files, from the environment (defaults inside the project)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
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
    """A store URI for a flow parameter, rewritten to the absolute file it names: a SQLite or file store must lie
    inside the data folder (a relative path is read against the data folder, never the server's working directory;
    SQLite's URI mode and query strings are refused: they can name another file); a server (http(s), PostgreSQL,
    MySQL) is the caller's to name."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme == "sqlite":
        from sqlalchemy.engine import make_url

        try:
            url = make_url(uri)
        except Exception as err:
            raise OutsideDataFolderError(f"{what}: not a store URL: {uri!r} ({err})") from None
        if url.host or url.query or not url.database or url.database.startswith("file:") or "?" in url.database:
            raise OutsideDataFolderError(
                f"{what}: a SQLite store is sqlite:///<file> with no URI mode or options (got {uri!r})"
            )
        return f"sqlite:///{inside_data_folder(url.database, what)}"
    if scheme == "file" or not scheme:
        path = uri[len("file://") :] if scheme else uri
        if "?" in path or "#" in path:
            raise OutsideDataFolderError(f"{what}: a file store is a plain path (got {uri!r})")
        return f"file://{inside_data_folder(path, what)}" if scheme else str(inside_data_folder(path, what))
    if scheme not in (
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


class DamagedStoreError(RuntimeError):
    """A SQLite store the command would open is not a sound database."""


def check_sqlite_store(uri: str, what: str) -> None:
    """Refuse a SQLite store (`sqlite:///<file>`) that SQLite cannot read or whose quick check fails, naming the file
    and what to do, before anything opens it for writing; other stores, and a file not made yet, pass."""
    if not uri.startswith("sqlite:///"):
        return
    path = pathlib.Path(uri[len("sqlite:///") :].split("?", 1)[0])
    if not path.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            found = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
    except sqlite3.DatabaseError as err:
        found = [str(err)]
    if found != ["ok"]:
        raise DamagedStoreError(
            f"the {what} {path} is damaged ({found[0]}); nothing was written to it. Restore it from a backup, or "
            f"save what SQLite can still read: sqlite3 {path} .recover | sqlite3 {path.with_suffix('.recovered.db')} "
            f"(then move the recovered file in its place)"
        )


def configure_torch_threads(threads: int) -> None:
    """One torch thread per process is the measured sweet spot for the tiny model."""
    import torch

    torch.set_num_threads(threads)
