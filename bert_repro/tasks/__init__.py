"""Stage 3, the tasks: the paper's benchmarks described as data (`registry`), each pointing at its kind (`kinds`:
head, encoding, decoding, scoring, Hub text), their metrics (`metrics`), the SQuAD post-processing (`squad`), the
reading of the tasks' files (`files`) and the check of their values into canonical columns (`columns`)."""

from .kinds import TaskKind
from .registry import GLUE_TASKS, KINDS, METRICS, TASKS, Metric, Task, get_task

# Read on first use (PEP 562): the files' reader imports datasets, which the registry's users do not need.
_PUBLIC = {"load_task_data": "files", "accuracy": "metrics", "f1": "metrics"}
__all__ = ["GLUE_TASKS", "KINDS", "METRICS", "TASKS", "Metric", "Task", "TaskKind", "get_task", *sorted(_PUBLIC)]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
