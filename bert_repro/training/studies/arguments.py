"""A study's command-line arguments (`StudyArguments`, read by recipes/study.py) and what they select: the
variants and tasks asked for, table6's own sizes, the models reused instead of pre-trained.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from ...model.conversion import CheckpointError, check_model_dir
from ..cli import ConfigurationError, HelpLayout, flag, hide_credentials
from .tables import STUDIES, Study, _size

# `--help`: the study's flags by section (each dataclass field's `group`, else "study").
HELP_LAYOUT = HelpLayout(
    titles={"study": "the study: which experiment, its variants and tasks", "pre-training": "pre-training each variant"}
    | {"fine-tuning": "fine-tuning each variant on each task", "output": "output"},
    usage="--study NAME [--tasks T ...] [--pretrain_args ARGS] [--finetune_args ARGS] [--output_dir DIR] ...",
    shown_defaults={"output_dir": "runs/<study>"},
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
        'More pre-training arguments for every variant, one string, e.g. "--preset mini --max_steps '
        "2000\" (the recipe's own flags: recipes/pretrain.py --help).",
        group="pre-training",
    )
    finetune_args: str = flag(
        "",
        'More fine-tuning arguments for every run, one string, e.g. "--learning_rates 5e-5 '
        '--max_train_samples 20000" (recipes/finetune.py --help).',
        group="fine-tuning",
    )
    data_root: str | None = flag(
        None, "A directory with one sub-directory per task (MRPC/, SST-2/, ...); tasks without one use the Hub."
    )
    tasks: list[str] = flag(factory=list, help="Only these of the study's tasks (default: all of them).")
    variants: list[str] = flag(
        factory=list,
        help="Only these of the study's variants (default: all; a variant whose weights another one uses is kept).",
    )
    reuse: list[str] = flag(
        factory=list, help="variant=DIR: use an existing pre-trained model for that variant instead of pre-training it."
    )
    sizes: list[str] = flag(
        factory=list, help="table6 only: the sizes to study as L/H/A (e.g. 2/128/2 4/256/4) instead of the paper's."
    )
    finetune_args_for: list[str] = flag(
        factory=list,
        help='KEY="ARGS": more fine-tuning arguments for one variant or one task, after --finetune_args '
        '(a task\'s, then a variant\'s), e.g. random="--learning_rates 3e-4" sst2="--num_train_epochs 1".',
        group="fine-tuning",
    )
    seeds: list[int] = flag(
        factory=list,
        help="Fine-tune every cell once per seed, each seed its own run (<task>/seed<S>/): the table gives "
        "the mean and standard error over the seeds. Default: one run per cell, the fine-tuning recipe's "
        "--seeds (best of them on dev).",
        group="fine-tuning",
    )
    jobs: int = flag(
        1,
        "Fine-tuning runs at once, each in its own process (small models leave most of a GPU idle; "
        "each process uses its share of the CPU cores).",
        group="fine-tuning",
    )


def _split_args(text: str, flag: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ConfigurationError(f"{flag}: cannot split {text!r} into arguments ({err}).") from None


def without_credentials(args: StudyArguments) -> StudyArguments:
    """`args` as the study's record and reports show them, credentials hidden (--finetune_args "--hub_token X")."""

    def hide(text: str) -> str:
        split = _split_args(text, "")
        return text if hide_credentials(split) == split else shlex.join(hide_credentials(split))

    keyed = (item.partition("=") for item in args.finetune_args_for)
    return replace(
        args,
        pretrain_args=hide(args.pretrain_args),
        finetune_args=hide(args.finetune_args),
        finetune_args_for=[key + equals + hide(text) for key, equals, text in keyed],
    )


def _parse_sizes(study: Study, sizes: list[str]) -> Study:
    if not sizes:
        return study
    if study.name != "table6":
        raise ConfigurationError("--sizes applies to --study table6 only.")
    variants = []
    for text in sizes:
        try:
            layers, hidden, heads = (int(x) for x in text.split("/"))
        except ValueError:
            raise ConfigurationError(f"--sizes: {text!r} is not L/H/A (three integers, e.g. 4/256/4).") from None
        variants.append(_size(layers, hidden, heads))
    return Study(**{**study.__dict__, "variants": tuple(variants)})


def _parse_reuse(study: Study, reuse: list[str]) -> dict[str, Path]:
    out = {}
    for item in reuse:
        key, sep, path = item.partition("=")
        if not sep or key not in {v.key for v in study.variants}:
            raise ConfigurationError(
                f"--reuse {item!r}: expected VARIANT=DIR with VARIANT one of "
                f"{', '.join(v.key for v in study.variants)}."
            )
        if not Path(path).is_dir():
            raise ConfigurationError(
                f"--reuse {item!r}: {path} is not a directory (a pre-trained model directory was expected)."
            )
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
    """The study restricted to the variants and tasks asked for (and the variants their weights come from)."""
    study = _parse_sizes(study, args.sizes)
    columns, variants = study.columns, study.variants
    if args.tasks:
        _refuse_unknown("tasks", args.tasks, sorted({c.task for c in study.columns if c.task}), study)
        columns = tuple(c for c in study.columns if c.task is None or c.task in args.tasks)
    if args.variants:
        _refuse_unknown("variants", args.variants, [v.key for v in study.variants], study)
        wanted = set(args.variants) | {study.variant(k).weights_of for k in args.variants} - {None}
        variants = tuple(v for v in study.variants if v.key in wanted)
    return Study(**{**study.__dict__, "variants": variants, "columns": columns})
