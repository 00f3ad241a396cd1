"""The command lines of a study (`StudyArguments`, recipes/study.py) and of the benchmark (`ReproduceArguments`,
recipes/reproduce.py), and what they select: a study's variants and tasks, table6's own sizes, the models reused
instead of pre-trained, each task's directory under --data_root.
"""

from __future__ import annotations

import logging
import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from ...model.conversion import CheckpointError, check_model_dir
from ...tasks.registry import Task
from ..cli import ConfigurationError, HelpLayout, flag, hide_credentials
from .tables import STUDIES, Study, _size

logger = logging.getLogger(__name__)

DEFAULT_TASKS = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte", "squad", "squad_v2", "swag")
# The directory names users have for each task (GLUE's download script, SQuAD/SWAG/CoNLL conventions).
DIRECTORY_NAMES = {
    "sst2": ("SST-2",),
    "stsb": ("STS-B",),
    "cola": ("CoLA",),
    "squad": ("SQuAD", "squad_v1.1"),
    "squad_v2": ("SQuAD2", "squad2"),
    "conll2003": ("CoNLL-2003", "conll"),
}
DATA_ROOT_HELP = "A directory with a sub-directory per task (MRPC/, SST-2/, SQuAD/ ...); tasks without one use the Hub."

# `--help`: the study's flags by section (each dataclass field's `group`, else "study").
STUDY_HELP = HelpLayout(
    titles={"study": "the study: which experiment, its variants and tasks", "pre-training": "pre-training each variant"}
    | {"fine-tuning": "fine-tuning each variant on each task", "output": "output"},
    usage="--study NAME [--tasks T ...] [--pretrain_args ARGS] [--finetune_args ARGS] [--output_dir DIR] ...",
    shown_defaults={"output_dir": "runs/<study>", "tasks": "all of them", "variants": "all of them"},
)
REPRODUCE_HELP = HelpLayout(
    usage="--model M [--tasks T ...] [--data_root DIR] [--output_dir DIR] [-- FINE-TUNING FLAGS ...]",
    epilog="Arguments after -- go to every task's fine-tuning (python recipes/finetune.py --task mrpc --help lists "
    "them), e.g. -- --seeds 1 2 3 --max_train_samples 2000; report.md records them and any subsampling. Tasks that "
    "finished are not run again: the same command resumes an interrupted benchmark.",
    shown_defaults={"tasks": " ".join(DEFAULT_TASKS)},
)


@dataclass
class StudyArguments:
    help_group = "study"
    study: str = flag("", f"Which study: {', '.join(STUDIES)}.")
    output_dir: str = flag("", "Where the runs and study.md go.", group="output")
    pretrain_config: str = flag(
        "recipes/configs/quickstart.yaml",
        "The pre-training recipe's YAML config every variant starts from (corpus, size, schedule).",
        group="pre-training",
    )
    pretrain_args: str = flag(
        "",
        'More pre-training arguments for every variant, one string, e.g. "--preset mini --max_steps 2000" (the '
        "recipe's own flags: recipes/pretrain.py --help).",
        group="pre-training",
    )
    finetune_args: str = flag(
        "",
        'More fine-tuning arguments for every run, one string, e.g. "--learning_rates 5e-5 --max_train_samples 20000" '
        "(recipes/finetune.py --help).",
        group="fine-tuning",
    )
    data_root: str | None = flag(None, DATA_ROOT_HELP)
    tasks: list[str] = flag(factory=list, help="Only these of the study's tasks.")
    variants: list[str] = flag(
        factory=list, help="Only these of the study's variants (a variant whose weights another one uses is kept)."
    )
    reuse: list[str] = flag(
        factory=list, help="variant=DIR: use an existing pre-trained model for that variant instead of pre-training it."
    )
    sizes: list[str] = flag(
        factory=list, help="table6 only: the sizes to study as L/H/A (e.g. 2/128/2 4/256/4) instead of the paper's."
    )
    finetune_args_for: list[str] = flag(
        factory=list,
        help='KEY="ARGS": more fine-tuning arguments for one variant or one task, after --finetune_args (a task\'s, '
        'then a variant\'s), e.g. random="--learning_rates 3e-4" sst2="--num_train_epochs 1".',
        group="fine-tuning",
    )
    seeds: list[int] = flag(
        factory=list,
        help="Fine-tune every cell once per seed, each seed its own run (<task>/seed<S>/): the table gives the mean "
        "and standard error over the seeds. Default: one run per cell, the fine-tuning recipe's --seeds (best of "
        "them on dev).",
        group="fine-tuning",
    )
    jobs: int = flag(
        1,
        "Fine-tuning runs at once, each in its own process (small models leave most of a GPU idle; each process uses "
        "its share of the CPU cores).",
        group="fine-tuning",
    )


@dataclass
class ReproduceArguments:
    help_group = "the benchmark"  # --help's section for these flags
    model: str = flag("", "The checkpoint to benchmark (directory or Hub id).")
    output_dir: str = flag("runs/reproduce", "One sub-directory per task, and the report.")
    tasks: list[str] = flag(
        factory=lambda: list(DEFAULT_TASKS), help="Tasks to run: the paper's 11; add conll2003 and wnli if wanted."
    )
    data_root: str | None = flag(None, DATA_ROOT_HELP)
    paper_model: str = flag("base", "Which of the paper's models to compare with.")
    overwrite_output_dir: bool = flag(False, "Start again in a folder holding another benchmark (moved aside first).")


def check_task_data(tasks: list[Task], data_root: str | None) -> dict[str, Path | None]:
    """Each task's directory under --data_root, found before any work: offline, a missing one is an error now, not
    after hours of other tasks or of pre-training."""
    root = Path(data_root) if data_root else None
    children = sorted(p for p in root.iterdir() if p.is_dir()) if root and root.is_dir() else []
    dirs = {}
    for task in tasks:
        names = {task.name.lower(), *(n.lower() for n in DIRECTORY_NAMES.get(task.name, ()))}
        dirs[task.name] = next((child for child in children if child.name.lower() in names), None)
    missing = [name for name, directory in dirs.items() if directory is None]
    if missing and os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        where = f"under --data_root {data_root}" if data_root else "(no --data_root given)"
        raise ConfigurationError(
            f"No local data for task(s) {', '.join(missing)} {where}, and the Hub is off (HF_HUB_OFFLINE=1). Put "
            f"each task's files in a sub-directory named after it (e.g. MRPC/, SST-2/) or run only the tasks you "
            f"have with --tasks."
        )
    if missing and data_root:
        logger.warning("No directory for %s under --data_root %s: from the Hub.", ", ".join(missing), data_root)
    return dirs


def split_args(text: str, flag: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ConfigurationError(f"{flag}: cannot split {text!r} into arguments ({err}).") from None


def redacted(args: StudyArguments) -> StudyArguments:
    """`args` as the study's record and reports show them, credentials hidden (--finetune_args "--hub_token X")."""

    def hide(text: str) -> str:
        split = split_args(text, "")
        return text if hide_credentials(split) == split else shlex.join(hide_credentials(split))

    keyed = (item.partition("=") for item in args.finetune_args_for)
    return replace(
        args,
        pretrain_args=hide(args.pretrain_args),
        finetune_args=hide(args.finetune_args),
        finetune_args_for=[key + equals + hide(text) for key, equals, text in keyed],
    )


def finetune_args_for(study: Study, args: StudyArguments) -> dict[str, list[str]]:
    """--finetune_args_for as {variant or task: its arguments}."""
    keys = [v.key for v in study.variants] + list(dict.fromkeys(c.task for c in study.columns if c.task))
    out: dict[str, list[str]] = {}
    for item in args.finetune_args_for:
        key, sep, text = item.partition("=")
        if not sep or key not in keys:
            raise ConfigurationError(
                f'--finetune_args_for {item!r}: expected KEY="ARGS" with KEY a variant or task of the study: '
                f"{', '.join(keys)}."
            )
        out.setdefault(key, []).extend(split_args(text, "--finetune_args_for"))
    return out


def parse_reuse(study: Study, reuse: list[str]) -> dict[str, Path]:
    out = {}
    for item in reuse:
        key, sep, path = item.partition("=")
        if not sep or key not in {v.key for v in study.variants}:
            variants = ", ".join(v.key for v in study.variants)
            raise ConfigurationError(f"--reuse {item!r}: expected VARIANT=DIR with VARIANT one of {variants}.")
        if not Path(path).is_dir():
            raise ConfigurationError(f"--reuse {item!r}: {path} is not a directory (of a pre-trained model).")
        try:
            check_model_dir(path)
        except CheckpointError as err:
            raise ConfigurationError(f"--reuse {item!r}: {err}") from None
        out[key] = Path(path)
    return out


def _refuse_unknown(flag: str, given: list[str], known: list[str], study: Study) -> None:
    if unknown := [name for name in given if name not in known]:
        raise ConfigurationError(
            f"--{flag} {' '.join(unknown)}: not in study {study.name}; its {flag} are {', '.join(known)}."
        )


def select(study: Study, args: StudyArguments) -> Study:
    """The study restricted to the variants and tasks asked for (and the variants their weights come from), with
    table6's --sizes instead of the paper's."""
    if args.sizes and study.name != "table6":
        raise ConfigurationError("--sizes applies to --study table6 only.")
    if args.sizes:
        sized = []
        for text in args.sizes:
            try:
                layers, hidden, heads = (int(x) for x in text.split("/"))
            except ValueError:
                raise ConfigurationError(f"--sizes: {text!r} is not L/H/A (three integers, e.g. 4/256/4).") from None
            sized.append(_size(layers, hidden, heads))
        study = Study(**{**study.__dict__, "variants": tuple(sized)})
    variants, columns = study.variants, study.columns
    if args.tasks:
        _refuse_unknown("tasks", args.tasks, sorted({c.task for c in study.columns if c.task}), study)
        columns = tuple(c for c in study.columns if c.task is None or c.task in args.tasks)
    if args.variants:
        _refuse_unknown("variants", args.variants, [v.key for v in study.variants], study)
        wanted = set(args.variants) | {study.variant(k).weights_of for k in args.variants} - {None}
        variants = tuple(v for v in study.variants if v.key in wanted)
    return Study(**{**study.__dict__, "variants": variants, "columns": columns})
