"""Built-in tasks behind one interface (`copc_core.tasks.base.Task`), each module holding its task and its config.

A new task: a module here with its config (an `EpisodeTaskConfig` whose `name` is a Literal) and its task, and one
line in `TASKS`; the run config (copc_core.config.TaskConfig), `copc`'s help and `make_task` read this registry.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from copc_core.tasks.base import EpisodeTaskConfig, Task
from copc_core.tasks.search import SearchTask, SearchTaskConfig
from copc_core.tasks.tool_math import ToolMathTask, ToolMathTaskConfig


class BuiltinTask(NamedTuple):
    config: type[EpisodeTaskConfig]  # its `name` field's default is the task's name
    task: type  # built from its config: task(config) is a Task


def _registry(*entries: BuiltinTask) -> dict[str, BuiltinTask]:
    return {entry.config.model_fields["name"].default: entry for entry in entries}


TASKS = _registry(BuiltinTask(ToolMathTaskConfig, ToolMathTask), BuiltinTask(SearchTaskConfig, SearchTask))


@functools.lru_cache(maxsize=16)
def make_task(config) -> Task:
    """The task a (frozen, hashable) task config describes; built once per config in a process."""
    return TASKS[config.name].task(config)
