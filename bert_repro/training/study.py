"""The paper's section-5 experiments as studies: pre-train each variant, fine-tune it, one table beside the paper's.

A study is data (`STUDIES`): its variants (what changes in pre-training or fine-tuning), its columns (a task and
metric, or a pre-training measure) and the paper's numbers for that table. `run_study` pre-trains every variant at
the size and budget given (the pre-training recipe's own arguments), fine-tunes each on the columns' tasks with the
fine-tuning recipe's protocol (its learning-rate grid, best on dev), and after every finished cell writes into the
output directory:
- `study.md`: our numbers beside the paper's, the budget of each variant (steps, sequences, time) and the ordering
  of the variants, ours against the paper's;
- `study.json`: the same as data; `study.png`: ours against the paper's, one panel per column.

Layout: `<output_dir>/pretrain/<variant>/` (a pre-training run), `<output_dir>/finetune/<variant>/<task>/` (a
fine-tuning run; a column that fine-tunes differently, e.g. feature-based, has its own). Each finished run is
kept and not run again, and the recipes resume an interrupted one from its last checkpoint: run the same command
again to continue a study. Studies:

- `table5`: the pre-training tasks (MLM + NSP, No NSP, LTR & No NSP, + BiLSTM on the LTR model).
- `table6`: model size (L / H / A); also the held-out MLM perplexity of each pre-trained model.
- `table7`: the feature-based approach on CoNLL-2003 (frozen encoder, a BiLSTM on six feature sets) against
  fine-tuning the whole model.
- `table8`: the masking mixes ([MASK] / same / random) on MNLI and NER, fine-tuned and feature-based.
- `pretraining`: not in the paper: the same architecture pre-trained by the recipe against randomly initialised,
  both fine-tuned alike; the evidence that the pre-training helps at the budget given.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shlex
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..atomic import atomic_path, write_json, write_text
from ..model.bilstm_heads import FEATURE_SETS
from ..model.conversion import TOKENIZER_FILES, CheckpointError, check_model_dir
from ..tasks.registry import get_task
from .cli import ConfigurationError
from .finetune import FineTuningRecipe, run_finetuning
from .finetune import check_inputs as check_finetuning_inputs
from .pretraining import PreTrainingRecipe, run_pretraining
from .pretraining.plan import check as check_pretraining
from .reproduce import check_task_data

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# What a study is
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of a table: a task's dev metric after fine-tuning, or (task None) a measure of pre-training."""

    key: str  # directory name of its fine-tuning runs
    label: str  # as the paper's table heads it
    task: str | None
    metric: str  # a task metric, or "mlm_perplexity" (held-out, from the pre-training run)
    split: str = "validation"
    finetuning: Mapping[str, Any] = field(default_factory=dict)  # FineTuningRecipe.replace's changes (Table 8)

    @property
    def run(self) -> str:
        """The directory of the fine-tuning run this column reads: columns of one task read one run (MRPC's accuracy
        and F1), unless the column fine-tunes differently."""
        return self.key if self.finetuning else str(self.task)


@dataclass(frozen=True)
class Variant:
    """One row: what its pre-training (or fine-tuning) changes, relative to the arguments the user gives."""

    key: str  # directory name
    label: str  # as the paper's table names it
    pretraining: Mapping[str, Any] = field(default_factory=dict)  # PreTrainingRecipe.replace's changes
    finetuning: Mapping[str, Any] = field(default_factory=dict)  # FineTuningRecipe.replace's changes
    weights_of: str | None = None  # fine-tune this variant's pre-trained model instead of pre-training its own
    random_init: bool = False  # no pre-training: the architecture of `weights_of`, its weights drawn at random


@dataclass(frozen=True)
class Study:
    name: str
    title: str
    source: str  # where the paper prints it
    variants: tuple[Variant, ...]
    columns: tuple[Column, ...]
    paper: Mapping[str, Mapping[str, float]]  # variant key -> column key -> the paper's number (percent)
    higher_is_better: Mapping[str, bool] = field(default_factory=dict)  # column key -> False where lower wins
    note: str = ""

    def variant(self, key: str) -> Variant:
        return next(v for v in self.variants if v.key == key)


def _frozen(table: dict[str, dict[str, float]]) -> Mapping[str, Mapping[str, float]]:
    return MappingProxyType({k: MappingProxyType(v) for k, v in table.items()})


def _size(layers: int, hidden: int, heads: int) -> Variant:
    overrides = {
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "intermediate_size": 4 * hidden,
    }
    return Variant(
        f"L{layers}_H{hidden}_A{heads}",
        f"L={layers}, H={hidden}, A={heads}",
        pretraining=MappingProxyType({"model_overrides": json.dumps(overrides)}),
    )


def _masking(mask: int, same: int, random: int) -> Variant:
    return Variant(
        f"mask{mask}_same{same}_rnd{random}",
        f"{mask}% / {same}% / {random}%",
        pretraining=MappingProxyType({"mask_replace_prob": mask / 100, "random_replace_prob": random / 100}),
    )


MNLI_M = Column("mnli", "MNLI-m", "mnli", "accuracy", split="validation_matched")
QNLI = Column("qnli", "QNLI", "qnli", "accuracy")
MRPC = Column("mrpc", "MRPC", "mrpc", "accuracy")
SST2 = Column("sst2", "SST-2", "sst2", "accuracy")
SQUAD = Column("squad", "SQuAD F1", "squad", "squad_f1")
NER = Column("conll2003", "NER (F1)", "conll2003", "entity_f1")
# The feature set the paper uses for Table 8's feature-based column: the last four layers concatenated.
NER_FEATURES = Column(
    "conll2003_features",
    "NER feature-based (F1)",
    "conll2003",
    "entity_f1",
    finetuning=MappingProxyType({"features": "concat_last_four"}),
)

# Table 7: the feature sets and the paper's dev F1 of each, as the task registry keeps them.
_CONLL = get_task("conll2003")
TABLE7_FEATURES = tuple(
    (name, FEATURE_SETS[name].table7_row, result.value) for name, result in _CONLL.paper_feature_based.items()
)
TABLE7_FINETUNING = next(r.value for r in _CONLL.paper if r.model == "base" and r.split == "validation")

STUDIES: Mapping[str, Study] = MappingProxyType(
    {
        "table5": Study(
            "table5",
            "Ablation over the pre-training tasks",
            "Table 5 (dev, BERT-BASE)",
            variants=(
                Variant("mlm_nsp", "BERT (MLM + NSP)"),
                Variant("mlm", "No NSP", pretraining=MappingProxyType({"objective": "mlm"})),
                Variant("ltr", "LTR & No NSP", pretraining=MappingProxyType({"objective": "ltr"})),
                Variant("ltr_bilstm", "+ BiLSTM", finetuning=MappingProxyType({"head": "bilstm"}), weights_of="ltr"),
            ),
            columns=(MNLI_M, QNLI, MRPC, SST2, SQUAD),
            paper=_frozen(
                {
                    "mlm_nsp": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst2": 92.7, "squad": 88.5},
                    "mlm": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst2": 92.6, "squad": 87.9},
                    "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst2": 92.1, "squad": 77.8},
                    "ltr_bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst2": 91.6, "squad": 84.9},
                }
            ),
            note="The paper's ordering: MLM + NSP >= No NSP > LTR & No NSP; the BiLSTM recovers part of LTR's loss on "
            "SQuAD only.",
        ),
        "table6": Study(
            "table6",
            "Ablation over model size",
            "Table 6 (dev, MLM perplexity of held-out training data)",
            variants=tuple(
                _size(*s)
                for s in ((3, 768, 12), (6, 768, 3), (6, 768, 12), (12, 768, 12), (12, 1024, 16), (24, 1024, 16))
            ),
            columns=(Column("mlm_ppl", "LM (ppl)", None, "mlm_perplexity"), MNLI_M, MRPC, SST2),
            paper=_frozen(
                {
                    "L3_H768_A12": {"mlm_ppl": 5.84, "mnli": 77.9, "mrpc": 79.8, "sst2": 88.4},
                    "L6_H768_A3": {"mlm_ppl": 5.24, "mnli": 80.6, "mrpc": 82.2, "sst2": 90.7},
                    "L6_H768_A12": {"mlm_ppl": 4.68, "mnli": 81.9, "mrpc": 84.8, "sst2": 91.3},
                    "L12_H768_A12": {"mlm_ppl": 3.99, "mnli": 84.4, "mrpc": 86.7, "sst2": 92.9},
                    "L12_H1024_A16": {"mlm_ppl": 3.54, "mnli": 85.7, "mrpc": 86.9, "sst2": 93.3},
                    "L24_H1024_A16": {"mlm_ppl": 3.23, "mnli": 86.6, "mrpc": 87.8, "sst2": 93.7},
                }
            ),
            higher_is_better={"mlm_ppl": False},
            note="The paper: larger models are better on every task, even MRPC's 3,600 training examples. Pass "
            "--sizes to study other sizes at a smaller budget.",
        ),
        "table7": Study(
            "table7",
            "Feature-based approach on CoNLL-2003 NER",
            "Table 7 (dev F1, BERT-BASE)",
            variants=(
                Variant("finetune", "Fine-tuning approach"),
                *(
                    Variant(name, label, finetuning=MappingProxyType({"features": name}), weights_of="finetune")
                    for name, label, _ in TABLE7_FEATURES
                ),
            ),
            columns=(NER,),
            paper=_frozen(
                {
                    "finetune": {"conll2003": TABLE7_FINETUNING},
                    **{name: {"conll2003": value} for name, _, value in TABLE7_FEATURES},
                }
            ),
            note="One pre-trained model; every feature-based row freezes it and trains a two-layer BiLSTM on the "
            "features. The paper: concatenating the last four layers is within 0.3 F1 of fine-tuning.",
        ),
        "table8": Study(
            "table8",
            "Ablation over the masking procedure ([MASK] / same / random)",
            "Table 8 (dev)",
            variants=tuple(
                _masking(*m) for m in ((80, 10, 10), (100, 0, 0), (80, 0, 20), (80, 20, 0), (0, 20, 80), (0, 0, 100))
            ),
            columns=(Column("mnli", "MNLI", "mnli", "accuracy", split="validation_matched"), NER, NER_FEATURES),
            paper=_frozen(
                {
                    "mask80_same10_rnd10": {"mnli": 84.2, "conll2003": 95.4, "conll2003_features": 94.9},
                    "mask100_same0_rnd0": {"mnli": 84.3, "conll2003": 94.9, "conll2003_features": 94.0},
                    "mask80_same0_rnd20": {"mnli": 84.4, "conll2003": 95.2, "conll2003_features": 94.6},
                    "mask80_same20_rnd0": {"mnli": 84.1, "conll2003": 95.2, "conll2003_features": 94.7},
                    "mask0_same20_rnd80": {"mnli": 83.7, "conll2003": 94.8, "conll2003_features": 94.6},
                    "mask0_same0_rnd100": {"mnli": 83.6, "conll2003": 94.9, "conll2003_features": 94.6},
                }
            ),
            note="The paper: fine-tuning is robust to the mix; the feature-based approach suffers most with [MASK] "
            "only (a mismatch between pre-training and use).",
        ),
        "pretraining": Study(
            "pretraining",
            "Does our pre-training help? Pre-trained against randomly initialised",
            "not in the paper",
            variants=(
                Variant("pretrained", "pre-trained (MLM + NSP)"),
                Variant("random", "random initialisation", weights_of="pretrained", random_init=True),
            ),
            columns=(SST2, MRPC, Column("mrpc_f1", "MRPC F1", "mrpc", "f1")),
            paper=_frozen({}),
            note="The same architecture, vocabulary and fine-tuning protocol; only the initial weights differ.",
        ),
    }
)


def get_study(name: str) -> Study:
    if name not in STUDIES:
        raise ConfigurationError(f"Unknown study {name!r}; choose one of: {', '.join(STUDIES)}.")
    return STUDIES[name]


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class StudyArguments:
    study: str = field(default="", metadata={"help": f"Which study: {', '.join(STUDIES)}."})
    output_dir: str = field(default="", metadata={"help": "Where the runs and study.md go (default runs/<study>)."})
    pretrain_config: str = field(
        default="recipes/configs/quickstart.yaml",
        metadata={"help": "The pre-training recipe's YAML config every variant starts from (corpus, size, schedule)."},
    )
    pretrain_args: str = field(
        default="",
        metadata={
            "help": 'More pre-training arguments for every variant, one string, e.g. "--preset mini --max_steps '
            "2000\" (the recipe's own flags: recipes/pretrain.py --help)."
        },
    )
    finetune_args: str = field(
        default="",
        metadata={
            "help": 'More fine-tuning arguments for every run, one string, e.g. "--learning_rates 5e-5 '
            '--max_train_samples 20000" (recipes/finetune.py --help).'
        },
    )
    data_root: str | None = field(
        default=None,
        metadata={
            "help": "A directory with one sub-directory per task (MRPC/, SST-2/, ...); tasks without one use the Hub."
        },
    )
    tasks: list[str] = field(
        default_factory=list, metadata={"help": "Only these of the study's tasks (default: all of them)."}
    )
    variants: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Only these of the study's variants (default: all; a variant whose weights another one uses "
            "is kept)."
        },
    )
    reuse: list[str] = field(
        default_factory=list,
        metadata={
            "help": "variant=DIR: use an existing pre-trained model for that variant instead of pre-training it."
        },
    )
    sizes: list[str] = field(
        default_factory=list,
        metadata={"help": "table6 only: the sizes to study as L/H/A (e.g. 2/128/2 4/256/4) instead of the paper's."},
    )
    finetune_args_for: list[str] = field(
        default_factory=list,
        metadata={
            "help": 'KEY="ARGS": more fine-tuning arguments for one variant or one task, after --finetune_args '
            '(a task\'s, then a variant\'s), e.g. random="--learning_rates 3e-4" sst2="--num_train_epochs 1".'
        },
    )
    seeds: list[int] = field(
        default_factory=list,
        metadata={
            "help": "Fine-tune every cell once per seed, each seed its own run (<task>/seed<S>/): the table gives "
            "the mean and standard error over the seeds. Default: one run per cell, the fine-tuning recipe's "
            "--seeds (best of them on dev)."
        },
    )
    jobs: int = field(
        default=1,
        metadata={
            "help": "Fine-tuning runs at once, each in its own process (small models leave most of a GPU idle; "
            "each process uses its share of the CPU cores)."
        },
    )


def _split_args(text: str, flag: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as err:
        raise ConfigurationError(f"{flag}: cannot split {text!r} into arguments ({err}).") from None


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


def select(study: Study, args: StudyArguments) -> Study:
    """The study restricted to the variants and tasks asked for (and the variants their weights come from)."""
    study = _parse_sizes(study, args.sizes)
    columns = study.columns
    if args.tasks:
        known = {c.task for c in study.columns if c.task}
        unknown = [t for t in args.tasks if t not in known]
        if unknown:
            raise ConfigurationError(
                f"--tasks {' '.join(unknown)}: not in study {study.name}; its tasks are {', '.join(sorted(known))}."
            )
        columns = tuple(c for c in study.columns if c.task is None or c.task in args.tasks)
    variants = study.variants
    if args.variants:
        keys = {v.key for v in study.variants}
        unknown = [k for k in args.variants if k not in keys]
        if unknown:
            raise ConfigurationError(
                f"--variants {' '.join(unknown)}: not in study {study.name}; its variants are "
                f"{', '.join(v.key for v in study.variants)}."
            )
        wanted = set(args.variants) | {study.variant(k).weights_of for k in args.variants} - {None}
        variants = tuple(v for v in study.variants if v.key in wanted)
    return Study(**{**study.__dict__, "variants": variants, "columns": columns})


# ---------------------------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------------------------


def _finished(directory: Path) -> bool:
    return (directory / "results.json").is_file() and (directory / "config.json").is_file()


# What a study's runs depend on: a directory holds the runs of one set of them (seeds, jobs, tasks and variants may
# change between invocations: they add or pick runs, and change none).
RECORDED_ARGUMENTS = (
    "study",
    "pretrain_config",
    "pretrain_args",
    "finetune_args",
    "finetune_args_for",
    "reuse",
    "sizes",
)


def check_same_study(output_dir: Path, args: StudyArguments) -> None:
    """Create `output_dir` for this study, or check that the study it holds ran with the same arguments: its finished
    runs are kept and not run again, so runs made with other arguments would pass for this study's."""
    record = {k: getattr(args, k) for k in RECORDED_ARGUMENTS}
    path = output_dir / "study_args.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = [k for k in RECORDED_ARGUMENTS if before.get(k) != record[k]]
        if changed:
            raise ConfigurationError(
                f"{output_dir} holds a study run with other arguments ("
                + "; ".join(f"--{k} {before.get(k)!r} then, {record[k]!r} now" for k in changed)
                + f"), whose finished runs would be kept as this one's. Pass another --output_dir, or remove "
                f"{output_dir} to start again."
            )
        return
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json(path, record)


def study_pretraining(args: StudyArguments) -> PreTrainingRecipe:
    """The recipe every variant starts from: --pretrain_config with --pretrain_args (the recipe's own flags)."""
    return PreTrainingRecipe.from_args(
        ["--config", args.pretrain_config, *_split_args(args.pretrain_args, "--pretrain_args")]
    )


def variant_recipe(variant: Variant, base: PreTrainingRecipe, directory: Path) -> PreTrainingRecipe:
    """`variant`'s pre-training: the study's recipe with the variant's changes, in its own directory."""
    return base.replace(**variant.pretraining, output_dir=str(directory))


def pretrain_variant(variant: Variant, base: PreTrainingRecipe, directory: Path, weights: dict[str, Path]) -> Path:
    """The variant's pre-trained model directory: reused, finished earlier, drawn at random, or pre-trained now."""
    if variant.key in weights:
        return weights[variant.key]
    if variant.random_init:
        return random_init_model(weights[variant.weights_of], directory)
    if _finished(directory):
        logger.info("pre-training of %s finished earlier, not run again", variant.key)
        return directory
    recipe = variant_recipe(variant, base, directory)
    if any(directory.glob("checkpoint-*")):
        recipe = recipe.replace(resume_from_checkpoint="true")
    logger.info("pre-training %s in %s, the study's recipe with %s", variant.key, directory, dict(variant.pretraining))
    summary = run_pretraining(recipe)
    if "stopped_at_step" in summary:
        raise ConfigurationError(
            f"the pre-training of {variant.key} stopped at step {summary['stopped_at_step']} "
            "(--stop_after_steps); run the same study command again to continue it."
        )
    return directory


def random_init_model(pretrained: Path, directory: Path) -> Path:
    """`pretrained`'s architecture and vocabulary with freshly initialised weights (the recipe's initialisation)."""
    if _finished(directory):
        return directory
    import torch

    from ..model.configuration_bert_repro import BertReproConfig
    from ..model.speed_paths import BertReproForPreTraining

    torch.manual_seed(0)
    config = BertReproConfig.from_pretrained(pretrained)
    model = BertReproForPreTraining(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (pretrained / name).is_file():
            shutil.copy(pretrained / name, directory / name)
    write_text(
        directory / "results.json",
        json.dumps(
            {"random_init": True, "architecture_of": str(pretrained), "global_step": 0, "train_runtime_s": 0.0},
            indent=2,
        ),
    )
    return directory


@dataclass(frozen=True)
class FineTuningRun:
    """One fine-tuning run of a study: a variant's model on one column's task (one seed of it, with --seeds)."""

    variant: str
    run: str  # the column's run (Column.run)
    seed: int | None
    directory: Path
    recipe: FineTuningRecipe | None

    @property
    def results(self) -> dict[str, Any] | None:
        path = self.directory / "results.json"
        return json.loads(path.read_text()) if path.is_file() else None


def _finetune_args_for(study: Study, args: StudyArguments) -> dict[str, list[str]]:
    keys = [v.key for v in study.variants] + list(dict.fromkeys(c.task for c in study.columns if c.task))
    out: dict[str, list[str]] = {}
    for item in args.finetune_args_for:
        key, sep, text = item.partition("=")
        if not sep or key not in keys:
            raise ConfigurationError(
                f'--finetune_args_for {item!r}: expected KEY="ARGS" with KEY a variant or task of the study: '
                f"{', '.join(keys)}."
            )
        out.setdefault(key, []).extend(_split_args(text, "--finetune_args_for"))
    return out


def planned_runs(
    study: Study, args: StudyArguments, output_dir: Path, models: Mapping[str, str], data_dirs: dict[str, Path | None]
) -> list[FineTuningRun]:
    """Every fine-tuning run of the study, in the order they start: seed by seed, each seed's runs of every variant
    side by side (a study cut short has the same seeds of every variant)."""
    common = _split_args(args.finetune_args, "--finetune_args")
    per_key = _finetune_args_for(study, args)
    if args.seeds and any(a.split("=")[0] in ("--seed", "--seeds") for a in common + sum(per_key.values(), [])):
        raise ConfigurationError(
            "--seeds of the study gives each run its seed: leave --seed(s) out of the fine-tuning arguments."
        )
    runs: dict[Path, FineTuningRun] = {}
    for seed in args.seeds or [None]:
        for column in (c for c in study.columns if c.task):
            for variant in study.variants:
                directory = output_dir / "finetune" / variant.key / column.run
                directory = directory if seed is None else directory / f"seed{seed}"
                if directory in runs:
                    continue
                # The user's flags (the study's command line): the common ones, the task's, the variant's
                theirs = [*common, *per_key.get(column.task, []), *per_key.get(variant.key, [])]
                recipe = FineTuningRecipe.from_args(["--task", column.task, "--model", models[variant.key], *theirs])
                recipe = recipe.replace(
                    **variant.finetuning,
                    **column.finetuning,
                    output_dir=str(directory),
                    **({} if seed is None else {"seeds": [seed]}),
                    **({} if data_dirs[column.task] is None else {"data": [str(data_dirs[column.task])]}),
                )
                runs[directory] = FineTuningRun(variant.key, column.run, seed, directory, recipe)
    return list(runs.values())


def _finetune_in_process(recipe: FineTuningRecipe, log: str, threads: int) -> None:
    """One fine-tuning run in a process of its own (--jobs), its output in `log`."""
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizers' thread pool, before its first use
    import torch

    torch.set_num_threads(threads)
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        run_finetuning(recipe)


def run_finetuning_jobs(runs: list[FineTuningRun], jobs: int, output_dir: Path, after_each) -> list[str]:
    """Run what is not finished yet, `jobs` at a time; `after_each()` after every run. Returns the failed runs (one
    process each: a failure is reported and the others go on) as messages."""
    todo = []
    for run in runs:
        if run.results is None:
            todo.append(run)
        else:
            logger.info("fine-tuning %s finished earlier, not run again", run.directory)
    if jobs <= 1:
        for run in todo:
            logger.info("fine-tuning %s in %s", run.variant, run.directory)
            run_finetuning(run.recipe)
            after_each()
        return []
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // jobs)
    failed = []
    # spawn: a fresh interpreter each (CUDA cannot be forked); one run per process, so each starts clean
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
        futures = {}
        for run in todo:
            log = output_dir / "logs" / f"{run.directory.relative_to(output_dir / 'finetune')}".replace("/", "-")
            log = log.with_name(log.name + ".log")
            logger.info("fine-tuning %s in %s (log %s)", run.variant, run.directory, log)
            futures[pool.submit(_finetune_in_process, run.recipe, str(log), threads)] = (run, log)
        for future in as_completed(futures):
            run, log = futures[future]
            try:
                future.result()
                logger.info("fine-tuning %s finished", run.directory)
            except Exception as err:  # reported with its log; the other runs go on
                failed.append(f"{run.directory}: {type(err).__name__}: {err} (log: {log})")
                logger.error("fine-tuning %s failed: %s", run.directory, failed[-1])
            after_each()
    return failed


def cell_value(
    column: Column, pretrain_results: dict[str, Any], finetune_results: dict[str, Any] | None
) -> float | None:
    """Our number for one cell, in the paper's unit (percent; perplexity as is)."""
    if column.metric == "mlm_perplexity":
        loss = pretrain_results.get("eval_mlm_loss")
        return None if loss is None else round(math.exp(loss), 2)
    best = finetune_results["best"][column.split][column.metric]
    return round(best if column.metric.startswith("squad") else 100 * best, 2)


def fine_tuned_cell(column: Column, runs: list[FineTuningRun]) -> dict[str, Any]:
    """A fine-tuning cell from its finished runs: the one run's number, or with seeds their mean, standard error
    (sample standard deviation / sqrt(n)) and each seed's number."""
    values = {r.seed: cell_value(column, {}, results) for r in runs if (results := r.results) is not None}
    if not values:
        return {"ours": None}
    if list(values) == [None]:
        return {"ours": values[None]}
    numbers = list(values.values())
    mean = sum(numbers) / len(numbers)
    se = statistics.stdev(numbers) / math.sqrt(len(numbers)) if len(numbers) > 1 else None
    return {"ours": round(mean, 2), "se": None if se is None else round(se, 2), "seeds": values}


def majority_baseline(study: Study, data_dirs: dict[str, Path | None]) -> dict[str, float]:
    """Each column's score of always predicting the most frequent label of the training set, where the task's kind
    has such a baseline (classification): the number a model must beat to have learnt anything."""
    from ..tasks.files import load_task_data
    from .finetune import data_source, score

    out, data = {}, {}
    for column in (c for c in study.columns if c.task):
        task = get_task(column.task)
        if task.name not in data:
            where = data_dirs[task.name]
            data[task.name] = load_task_data(task, data_source([str(where)] if where else []))
        splits = data[task.name]
        predictions = task.kind.majority_predictions(task, splits["train"], splits[column.split])
        if predictions is not None:
            out[column.key] = round(100 * score(task, splits[column.split], predictions)[column.metric], 2)
    return out


def run_study(args: StudyArguments) -> str:
    """Pre-train every variant, then fine-tune them (finished runs are kept), writing study.md / .json / .png after
    every finished run."""
    if not args.study:
        raise ConfigurationError(f"Pass --study: one of {', '.join(STUDIES)}.")
    if args.jobs < 1:
        raise ConfigurationError(f"--jobs {args.jobs}: at least 1.")
    study = select(get_study(args.study), args)
    reused = _parse_reuse(study, args.reuse)
    data_dirs = check_task_data(
        [get_task(t) for t in dict.fromkeys(c.task for c in study.columns if c.task)], args.data_root
    )
    # a wrong flag in the fine-tuning arguments fails now, not after the pre-training
    for run in planned_runs(study, args, Path("(output)"), defaultdict(lambda: "(pre-trained)"), data_dirs):
        check_finetuning_inputs(*run.recipe.resolved(), model_at_hand=False)
    if not Path(args.pretrain_config).is_file() and not all(v.key in reused or v.random_init for v in study.variants):
        raise ConfigurationError(
            f"--pretrain_config {args.pretrain_config}: no such file (a YAML config of "
            "recipes/pretrain.py, e.g. recipes/configs/quickstart.yaml)."
        )
    pretrained = [v for v in study.variants if v.key not in reused and not v.random_init]
    base = study_pretraining(args) if pretrained else None
    for variant in pretrained:  # every pre-training's recipe too, before the first one starts
        check_pretraining(variant_recipe(variant, base, Path("(output)")))
    baseline = majority_baseline(study, data_dirs)
    output_dir = Path(args.output_dir or f"runs/{study.name}")
    check_same_study(output_dir, args)
    weights: dict[str, Path] = dict(reused)
    start = time.time()
    for variant in study.variants:
        if variant.weights_of and not variant.random_init:
            weights[variant.key] = weights[variant.weights_of]
        weights[variant.key] = pretrain_variant(variant, base, output_dir / "pretrain" / variant.key, weights)
    runs = planned_runs(study, args, output_dir, {k: str(v) for k, v in weights.items()}, data_dirs)

    def report() -> str:
        rows = [table_row(study, variant, weights[variant.key], runs) for variant in study.variants]
        return write_study(output_dir, study, rows, args, time.time() - start, baseline, failed)

    failed: list[str] = []
    report()  # the pre-training's numbers, before any fine-tuning
    failed += run_finetuning_jobs(runs, args.jobs, output_dir, report)
    text = report()
    if failed:
        raise StudyError(f"{len(failed)} fine-tuning run(s) failed; the table has the others:\n" + "\n".join(failed))
    return text


class StudyError(RuntimeError):
    """Runs of a study failed (their logs say why); the table of the finished ones is written."""


def table_row(study: Study, variant: Variant, model: Path, runs: list[FineTuningRun]) -> dict[str, Any]:
    """One variant's row: its pre-training's numbers and a cell per column from the runs finished so far."""
    pretrain_results = json.loads((model / "results.json").read_text()) if (model / "results.json").is_file() else {}
    own = [r for r in runs if r.variant == variant.key]
    row = {
        "variant": variant.key,
        "label": variant.label,
        "model": str(model),
        "pretraining": {
            k: pretrain_results.get(k)
            for k in (
                "global_step",
                "train_runtime_s",
                "train_runtime_from_step",
                "tokens_per_second",
                "eval_mlm_loss",
                "eval_mlm_accuracy",
                "eval_nsp_accuracy",
            )
        },
        "cells": {},
        "finetune_seconds": sum(results.get("seconds", 0.0) for r in own if (results := r.results) is not None),
    }
    for column in study.columns:
        if column.task is not None:
            cell = fine_tuned_cell(column, [r for r in own if r.run == column.run])
        elif variant.weights_of and not variant.random_init:
            cell = {"ours": None}  # a fine-tuning variant of another's model: its pre-training is that row's
        else:
            cell = {"ours": cell_value(column, pretrain_results, None)}
        row["cells"][column.key] = {**cell, "paper": study.paper.get(variant.key, {}).get(column.key)}
    return row


# ---------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------


def ordering(study: Study, rows: list[dict[str, Any]], which: str) -> list[str]:
    """Variants from best to worst by the mean of `which` ("ours" or "paper") over the fine-tuning columns that
    every row has a number for."""
    score = mean_scores(study, rows, which)
    return sorted(score, key=lambda k: -score[k])


def ordering_text(study: Study, rows: list[dict[str, Any]], which: str, labels: dict[str, str]) -> str:
    """The ordering as "A > B = C": variants whose means agree to the two decimals printed are tied, not ranked."""
    score = mean_scores(study, rows, which)
    order = sorted(score, key=lambda k: -score[k])
    text = labels[order[0]] if order else ""
    for before, key in zip(order, order[1:]):
        text += f" {'=' if round(score[before], 2) == round(score[key], 2) else '>'} {labels[key]}"
    return text


def mean_scores(study: Study, rows: list[dict[str, Any]], which: str) -> dict[str, float]:
    def value(row: dict[str, Any], column: str) -> float | None:
        if which == "paper":
            return study.paper.get(row["variant"], {}).get(column)
        return row["cells"].get(column, {}).get("ours")

    columns = [c.key for c in study.columns if c.task is not None and all(value(r, c.key) is not None for r in rows)]
    if not columns or not rows:
        return {}
    return {r["variant"]: sum(value(r, c) for c in columns) / len(columns) for r in rows}


def runs_time(rows: list[dict[str, Any]]) -> tuple[float, float, bool]:
    """The recorded training time behind a table, whichever invocation ran it: the pre-training of each distinct
    model once (a fine-tuning variant shares another's), the fine-tuning of every row, and whether a pre-training
    was timed only from a step (resumed from a checkpoint that did not record the time before it)."""
    models: dict[str, dict[str, Any]] = {}
    for r in rows:
        models.setdefault(r["model"], r["pretraining"])
    pretraining = sum(p.get("train_runtime_s") or 0.0 for p in models.values())
    partly = any(p.get("train_runtime_from_step") for p in models.values())
    return pretraining, sum(r["finetune_seconds"] for r in rows), partly


def _number(cell: dict[str, Any]) -> str:
    ours, se = cell.get("ours"), cell.get("se")
    if ours is None:
        return ""
    return (
        f"{ours:.2f}"
        + (f" ± {se:.2f}" if se is not None else "")
        + (f" ({len(cell['seeds'])})" if "seeds" in cell else "")
    )


def write_study(
    output_dir: Path,
    study: Study,
    rows: list[dict[str, Any]],
    args: StudyArguments,
    seconds: float,
    baseline: Mapping[str, float] | None = None,
    failed: list[str] | None = None,
) -> str:
    columns = study.columns
    baseline = baseline or {}
    head = " | ".join(f"{c.label} ours | paper" for c in columns)
    per_key = "".join(f", {item.partition('=')[0]} also `{item.partition('=')[2]}`" for item in args.finetune_args_for)
    lines = [
        f"# {study.title}",
        "",
        f"Paper: {study.source}. Ours: dev set, "
        + (
            f"mean ± standard error over {len(args.seeds)} fine-tuning seeds (seeds finished in brackets)"
            if args.seeds
            else "best of the fine-tuning grid"
        )
        + f"; every variant pre-trained from `{args.pretrain_config}` with "
        f"`{args.pretrain_args or '(no other arguments)'}`"
        + (f", fine-tuned with `{args.finetune_args}`" if args.finetune_args else "")
        + per_key
        + ".",
        "",
        f"| variant | {head} | steps | pre-training (s) | fine-tuning (s) |",
        "|---|" + "---|---|" * len(columns) + "---|---|---|",
    ]
    for r in rows:
        cells = []
        for c in columns:
            cell = r["cells"].get(c.key, {})
            paper = study.paper.get(r["variant"], {}).get(c.key)
            cells.append(f"{_number(cell)} | {'' if paper is None else f'{paper:.1f}'}")
        p = r["pretraining"]
        runtime, since = p.get("train_runtime_s"), p.get("train_runtime_from_step")
        runtime = "" if runtime is None else f"{runtime:.0f}" + (f" (from step {since})" if since else "")
        lines.append(
            f"| {r['label']} | {' | '.join(cells)} | {p.get('global_step') or ''} | {runtime} | "
            f"{r['finetune_seconds']:.0f} |"
        )
    if baseline:
        cells = " | ".join(f"{baseline[c.key]:.2f} | " if c.key in baseline else " | " for c in columns)
        lines.append(f"| majority class (the training set's most frequent label) | {cells} | | | |")
    ours_order, paper_order = ordering(study, rows, "ours"), ordering(study, rows, "paper")
    labels = {r["variant"]: r["label"] for r in rows}
    if ours_order:
        lines += [
            "",
            "Ordering by the mean of the fine-tuning columns (best first; = where the means are equal):",
            f"- ours: {ordering_text(study, rows, 'ours', labels)}",
        ]
        if paper_order:
            lines.append(f"- paper: {ordering_text(study, rows, 'paper', labels)}")
    if study.note:
        lines += ["", study.note]
    pretraining, finetuning, partly_timed = runs_time(rows)
    lines += [
        "",
        f"Time of the runs: {(pretraining + finetuning) / 3600:.2f} h (pre-training "
        f"{pretraining / 3600:.2f} h{', part of it timed only from a step' if partly_timed else ''}, "
        f"fine-tuning {finetuning / 3600:.2f} h; each model counted once, kept runs included"
        + (f"; the fine-tuning ran {args.jobs} at a time" if args.jobs > 1 else "")
        + f"); this invocation {seconds / 3600:.2f} h. Runs: `{output_dir}/pretrain/<variant>/`, "
        f"`{output_dir}/finetune/<variant>/<task>/{'seed<S>/' if args.seeds else ''}`.",
    ]
    if failed:
        lines += ["", f"Failed runs ({len(failed)}; their cells are missing or have fewer seeds):"]
        lines += [f"- {f}" for f in failed]
    text = "\n".join(lines) + "\n"
    write_text(output_dir / "study.md", text)
    write_text(
        output_dir / "study.json",
        json.dumps(
            {
                "study": study.name,
                "title": study.title,
                "paper_source": study.source,
                "columns": [
                    {"key": c.key, "label": c.label, "task": c.task, "metric": c.metric, "split": c.split}
                    for c in columns
                ],
                "rows": rows,
                "ordering": {"ours": ours_order, "paper": paper_order},
                "pretrain_config": args.pretrain_config,
                "pretrain_args": args.pretrain_args,
                "finetune_args": args.finetune_args,
                "finetune_args_for": args.finetune_args_for,
                "seeds": args.seeds,
                "majority_baseline": dict(baseline),
                "failed": failed or [],
                "seconds": round(seconds, 1),
                "run_seconds": {"pretraining": round(pretraining, 1), "finetuning": round(finetuning, 1)},
            },
            indent=2,
        ),
    )
    plot_study(study, rows, output_dir / "study.png", baseline)
    return text


def plot_study(
    study: Study, rows: list[dict[str, Any]], path: Path, baseline: Mapping[str, float] | None = None
) -> None:
    try:
        import matplotlib
    except ImportError:  # an optional extra: the table is written without its chart rather than lost
        logger.warning("matplotlib is not installed (pip install 'bert-repro[train]'): not writing %s", path.name)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = study.columns
    fig, axes = plt.subplots(1, len(columns), figsize=(3.2 * len(columns) + 1, 3.6), squeeze=False)
    xs = range(len(rows))
    for ax, column in zip(axes[0], columns):
        ours = [r["cells"].get(column.key, {}).get("ours") for r in rows]
        errors = [r["cells"].get(column.key, {}).get("se") or 0 for r in rows]
        paper = [study.paper.get(r["variant"], {}).get(column.key) for r in rows]
        ax.bar([x - 0.2 for x in xs], [v or 0 for v in ours], width=0.4, yerr=errors, capsize=3, label="ours")
        if baseline and column.key in baseline:
            ax.axhline(baseline[column.key], color="grey", linestyle="--", linewidth=1, label="majority class")
        ax.bar([x + 0.2 for x in xs], [v or 0 for v in paper], width=0.4, label="paper")
        ax.set_title(column.label, fontsize=10)
        ax.set_xticks(list(xs), [r["label"] for r in rows], rotation=35, ha="right", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{study.title} ({study.source})", fontsize=11)
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=110, format=Path(path).suffix[1:] or None)
    plt.close(fig)


__all__ = ["Column", "STUDIES", "Study", "StudyArguments", "StudyError", "Variant", "get_study", "run_study"]
