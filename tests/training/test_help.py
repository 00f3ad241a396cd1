"""`--help` a person can read: the config file first, the recipe's flags by stage before Trainer's, the defaults a
run really uses, and the Trainer flags the recipe sets itself marked as such."""

import re
import subprocess
import sys
from dataclasses import fields

import pytest
from support import ROOT

from bert_repro.training.finetuning.recipe import FineTuningArguments, FineTuningRecipe
from bert_repro.training.pretraining.recipe import PARSED, PreTrainingRecipe

TRAINER = "transformers' TrainingArguments"


def help_text(parse, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 0
    return capsys.readouterr().out


def sections(text: str) -> dict[str, list[str]]:
    """Group title -> the flags it lists, in order."""
    out: dict[str, list[str]] = {}
    title = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            out[title] = []
        elif title and (flag := re.match(r"  (--?[\w-]+)", line)):
            out[title].append(flag.group(1))
    return out


def defaults(text: str) -> dict[str, str]:
    """Flag -> the default its help shows."""
    found = {}
    for block in re.split(r"\n  (?=--)", text):
        name = re.match(r"--(\w+)", block)
        default = re.search(r"\(default:\s+(.*?)\)\s*$", " ".join(block.split()))
        if name and default:
            found[name.group(1)] = default.group(1)
    return found


def check_layout(text: str, recipe_fields: set[str]) -> dict[str, list[str]]:
    assert text.startswith("usage: python recipes/")
    found = sections(text)
    titles = list(found)
    assert found["options"] == ["-h", "--config"]  # the config file first
    stages = [t.split(":")[0].split(" ")[0] for t in titles[1:-1]]
    in_order = [s for i, s in enumerate(stages) if s not in stages[:i]]
    assert in_order == ["data", "model", "training", "evaluation", "output"]
    assert titles[-1].startswith(TRAINER)
    ours = {flag[2:] for title in titles[1:-1] for flag in found[title]}
    assert recipe_fields <= ours, recipe_fields - ours  # not one of the recipe's flags among Trainer's
    assert not ours & {flag[2:] for flag in found[titles[-1]]}  # each flag shown once
    return found


def test_pretraining_help_is_grouped_by_stage(capsys):
    text = help_text(PreTrainingRecipe.from_args, ["--help"], capsys)
    recipe = {f.name for cls in PARSED for f in fields(cls)}
    check_layout(text, recipe)
    assert "--max-steps" not in text and "--no_lowercase" not in text  # one name a flag
    optim = text[text.index("  --optim ") :].split("\n  --")[0]
    assert "[set by the recipe: --optimizer" in optim
    resume = text[text.index("  --resume_from_checkpoint ") :].split("\n  --")[0]
    assert "true|PATH" in resume and "a finished run is left as it is" in " ".join(resume.split())
    # the defaults a run will use: the paper's, and under --config the file's
    plain = defaults(text)
    assert plain["max_steps"] == "1000000" and plain["warmup_steps"] == "10000" and plain["learning_rate"] == "0.0001"
    quickstart = ["--config", str(ROOT / "recipes/configs/quickstart.yaml"), "--help"]
    shown = defaults(help_text(PreTrainingRecipe.from_args, quickstart, capsys))
    assert shown["max_steps"] == "2000" and shown["learning_rate"] == "0.001" and shown["vocab_size"] == "8192"
    assert shown["adam_epsilon"] == "1e-06"  # the paper's, under the config


def test_finetuning_help_shows_the_grid_as_the_default(capsys):
    text = help_text(FineTuningRecipe.from_args, ["--task", "rte", "--help"], capsys)
    check_layout(text, {f.name for f in fields(FineTuningArguments)})
    flat = " ".join(text.split())
    assert "(default: rte's grid: 5e-05 4e-05 3e-05 2e-05)" in flat
    assert "--learning_rate X One learning rate: the grid {X} (--learning_rates X). (default: none" in flat
    # The Trainer flags a fine-tuning run sets most are among its stages, with the recipe's defaults.
    found = sections(text)
    assert "--eval_strategy" in found["evaluation"] and "--save_strategy" in found["output and Hub"]
    assert "--eval_strategy {no,steps,epoch} When each run of the grid is evaluated" in flat
    assert defaults(text)["eval_strategy"] == "epoch"
    shown = defaults(help_text(FineTuningRecipe.from_args, ["--task", "mrpc", "--help"], capsys))
    assert shown["weight_decay"] == "0.01" and shown["warmup_steps"] == "0.1"
    assert shown["adam_epsilon"] == "1e-06"  # the reference code's, though not among the recipe's own flags
    # each task's own: SQuAD v2.0 trains 2 epochs of 48 at 384 tokens over its grid, MRPC 3 of 32 at 128
    squad = defaults(help_text(FineTuningRecipe.from_args, ["--task", "squad_v2", "--help"], capsys))
    of_task = ("num_train_epochs", "per_device_train_batch_size", "max_seq_length", "learning_rates")
    assert [shown[name] for name in of_task] == ["3", "32", "128", "mrpc's grid: 5e-05 4e-05 3e-05 2e-05"]
    assert [squad[name] for name in of_task] == ["2", "48", "384", "squad_v2's grid: 5e-05 3e-05 2e-05"]


@pytest.mark.parametrize("recipe", ["study", "reproduce"])
def test_study_and_benchmark_help_list_each_flag_once_by_section(recipe):
    from bert_repro.training.studies import ReproduceArguments, StudyArguments
    from bert_repro.training.studies.arguments import STUDY_HELP

    run = subprocess.run([sys.executable, ROOT / f"recipes/{recipe}.py", "--help"], capture_output=True, text=True)
    text, found, shown = run.stdout, sections(run.stdout), defaults(run.stdout)
    assert found["options"] == ["-h", "--config"], run.stderr[-3000:]
    flags = [flag[2:] for title in list(found)[1:] for flag in found[title]]
    assert sorted(flags) == sorted(f.name for f in fields(StudyArguments if recipe == "study" else ReproduceArguments))
    if recipe == "study":
        assert text.startswith("usage: python recipes/study.py --study NAME")
        assert list(found)[1:] == list(STUDY_HELP.titles.values())
        assert (shown["output_dir"], shown["tasks"]) == ("runs/<study>", "all of them")
    else:  # what goes after --, and the paper's tasks as the default
        assert text.startswith("usage: python recipes/reproduce.py --model M") and "[-- FINE-TUNING FLAGS ...]" in text
        assert "Arguments after -- go to every task's fine-tuning" in " ".join(text.split())
        assert shown["tasks"] == "mnli qqp qnli sst2 cola stsb mrpc rte squad squad_v2 swag"


@pytest.mark.parametrize("recipe", ["pretrain", "finetune"])
def test_help_names_trainers_other_flags_without_their_pages_of_text(recipe, capsys):
    parse = PreTrainingRecipe.from_args if recipe == "pretrain" else FineTuningRecipe.from_args
    text = help_text(parse, ["--help"], capsys)
    assert len(text.splitlines()) < 350  # 608 and 570 lines when every Trainer flag had its paragraph
    trainer = text[text.index(TRAINER) :]
    assert "--dataloader_num_workers," in trainer and "Number of subprocesses" not in text
    assert "huggingface.co/docs/transformers/main_classes/trainer" in " ".join(trainer.split())
