"""The paper's experiments as studies, one module each: the tables as data (`tables`), the command lines and what
they select (`arguments`), running a section-5 study (`run`), the reports beside the paper (`report`), and the study
of Tables 1-2, the whole benchmark of one checkpoint (`reproduce`).
"""

from .arguments import ReproduceArguments, StudyArguments
from .reproduce import run_reproduce
from .run import StudyError, run_study

__all__ = ["ReproduceArguments", "StudyArguments", "StudyError", "run_reproduce", "run_study"]
