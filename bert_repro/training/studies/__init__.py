"""The paper's experiments as studies, one module per step: the tables as data (`tables`), the command lines and
what they select (`arguments`), running a section-5 study (`run`) and its report (`report`); `reproduce` is the
study of Tables 1-2, the whole benchmark for one checkpoint.
"""

from .arguments import StudyArguments
from .reproduce import ReproduceArguments, run_reproduce
from .run import StudyError, run_study

__all__ = ["ReproduceArguments", "StudyArguments", "StudyError", "run_reproduce", "run_study"]
