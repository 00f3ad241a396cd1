"""Stage 3, the tasks: the paper's benchmarks described as data (`registry`), each pointing at its kind (`kinds`:
head, encoding, decoding, scoring, Hub text), their metrics (`metrics`), the SQuAD post-processing (`squad`), the
reading of the tasks' files (`files`) and the check of their values into canonical columns (`columns`)."""

from .kinds import TaskKind  # noqa: F401
from .registry import GLUE_TASKS, KINDS, METRICS, TASKS, Metric, Task, get_task  # noqa: F401
