"""The tasks stage, after the data: the benchmarks as data (`registry`), kinds, files, metrics (docs/layout.md)."""

from ..exports import lazy_exports
from .kinds import TaskKind
from .registry import GLUE_TASKS, KINDS, METRICS, TASKS, Metric, Task, get_task

# Read on first use (PEP 562): the files' reader imports datasets, which the registry's users do not need.
_PUBLIC = {"load_task_data": "files", "accuracy": "metrics", "f1": "metrics"}
__all__ = ["GLUE_TASKS", "KINDS", "METRICS", "TASKS", "Metric", "Task", "TaskKind", "get_task", *sorted(_PUBLIC)]
__getattr__ = lazy_exports(__name__, _PUBLIC)
