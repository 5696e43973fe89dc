"""Built-in tasks behind one interface (`copc_core.tasks.base.Task`), chosen by the task config's name."""

from __future__ import annotations

import functools

from copc_core.tasks.base import Task


@functools.lru_cache(maxsize=16)
def make_task(config) -> Task:
    """The task a (frozen, hashable) task config describes; built once per config in a process."""
    from copc_core.tasks.search import SearchTask
    from copc_core.tasks.tool_math import ToolMathTask

    registry = {"tool_math": ToolMathTask, "search": SearchTask}
    return registry[config.name](config)
