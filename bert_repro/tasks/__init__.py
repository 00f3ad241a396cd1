"""Stage 3, the tasks: the paper's benchmarks described as data (`registry`), their metrics (`metrics`) and the
SQuAD post-processing (`squad`)."""

from .registry import GLUE_TASKS, KINDS, METRICS, TASKS, Task, get_task  # noqa: F401
