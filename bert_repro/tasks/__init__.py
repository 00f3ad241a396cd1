"""Stage 3, the tasks: the paper's benchmarks described as data (`registry`), each pointing at its kind (`kinds`).

Beside them: metrics (`metrics`), SQuAD post-processing (`squad`), reading the files (`files`) and checking their
values into canonical columns (`columns`)."""

from ..exports import lazy_exports
from .kinds import TaskKind
from .registry import GLUE_TASKS, KINDS, METRICS, TASKS, Metric, Task, get_task

# Read on first use (PEP 562): the files' reader imports datasets, which the registry's users do not need.
_PUBLIC = {"load_task_data": "files", "accuracy": "metrics", "f1": "metrics"}
__all__ = ["GLUE_TASKS", "KINDS", "METRICS", "TASKS", "Metric", "Task", "TaskKind", "get_task", *sorted(_PUBLIC)]
__getattr__ = lazy_exports(__name__, _PUBLIC)
