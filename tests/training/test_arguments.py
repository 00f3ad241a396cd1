"""What the recipes take from the command line: transformers' example scripts' names for our settings, a
single value for a searched grid, unknown flags answered with the closest names, and one check of a model
directory before anything opens it. In-process and quick; `test_recipe_errors.py` runs the recipes."""

import json

import pytest
import torch
from support import ROOT
from support.damaged import damage_model_dir
from support.models import tiny_config

from bert_repro import BertReproForPreTraining
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning
from bert_repro.training.finetuning.checks import check_inputs, check_model_config

# --- transformers' names


def finetuning(*argv):
    run, training = FineTuningRecipe.from_args(list(argv)).resolved()
    check_inputs(run, training, model_at_hand=False)
    return run, training


def pretraining(*argv):
    from bert_repro.training.pretraining.recipe import PreTrainingRecipe

    return PreTrainingRecipe.from_args(list(argv))


@pytest.mark.parametrize(
    "theirs, ours",
    [
        ("--task_name mrpc --model_name_or_path m", "--task mrpc --model m"),
        (
            "--task mrpc --model m --train_file a.csv --validation_file b.csv --test_file c.csv",
            "--task mrpc --model m --data train=a.csv validation=b.csv test=c.csv",
        ),
        (  # split=path pairs add up
            "--task mrpc --model m --data test=c.csv --train_file a.csv",
            "--task mrpc --model m --data test=c.csv train=a.csv",
        ),
        ("--dataset_name rajpurkar/squad --model m", "--task squad --model m"),  # run_qa.py
        ("--dataset_name squad_v2 --model m", "--task squad_v2 --model m"),
        (
            "--task sst2 --model m --tokenizer_name t --preprocessing_num_workers 3 --max_seq_length 64",
            "--task sst2 --model m --tokenizer t --num_proc 3 --max_seq_length 64",
        ),
    ],
)
def test_finetuning_takes_transformers_names(theirs, ours):
    (run, training), (expected, expected_training) = finetuning(*theirs.split()), finetuning(*ours.split())
    if run.task != expected.task:  # a task named by its Hub dataset
        assert run.task == "rajpurkar/squad" and expected.task == "squad"
        run.task = expected.task
    assert run == expected and training.to_dict() == expected_training.to_dict()


@pytest.mark.parametrize(
    "theirs, ours",
    [
        # run_mlm.py: continue from the model, with its tokenizer unless --tokenizer_name says otherwise.
        ("--model_name_or_path bert-x", "--init_from bert-x --tokenizer bert-x"),
        ("--tokenizer_name t --model_name_or_path bert-x", "--init_from bert-x --tokenizer t"),
        (
            "--train_file a.txt --mlm_probability 0.2 --preprocessing_num_workers 2",
            "--corpus a.txt --masked_lm_prob 0.2 --num_proc 2",
        ),
        (
            "--dataset_name wikitext --dataset_config_name wikitext-2-raw-v1",
            "--corpus wikitext --hub_config wikitext-2-raw-v1",
        ),
    ],
)
def test_pretraining_takes_transformers_names(theirs, ours):
    assert pretraining(*theirs.split(), "--output_dir", "o") == pretraining(*ours.split(), "--output_dir", "o")


def test_run_mlms_tokenizer_from_the_model_yields_to_a_config_files(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("tokenizer: t\n")
    recipe = pretraining("--config", str(config), "--model_name_or_path", "bert-x", "--output_dir", "o")
    assert (recipe.model.init_from, recipe.data.tokenizer) == ("bert-x", "t")


def test_reproduce_takes_model_name_or_path():
    from bert_repro.training.cli import parse_with_config
    from bert_repro.training.studies import ReproduceArguments

    argv = ["--model_name_or_path", "m"]
    (args,) = parse_with_config((ReproduceArguments,), {}, argv, "recipes/reproduce.py")
    assert args.model == "m"


@pytest.mark.parametrize(
    "parse, argv, message",
    [
        (finetuning, "--data d --train_file a", "--data and --train_file both set --data; give one of them."),
        (finetuning, "--model_name_or_path n", "--model and --model_name_or_path both set --model"),
        (pretraining, "--corpus a.txt --dataset_name wikitext", "--corpus and --dataset_name both set --corpus"),
    ],
)
def test_two_names_for_one_setting_are_refused(parse, argv, message):
    common = ["--task", "mrpc", "--model", "m"] if parse is finetuning else []
    with pytest.raises(ConfigurationError, match=message):
        parse(*common, *argv.split())


# --- A single value for a grid


def test_learning_rate_and_seed_are_a_grid_of_one():
    run, training = finetuning("--task", "mrpc", "--model", "m", "--learning_rate", "2e-5", "--seed", "7")
    assert run.learning_rates == [2e-5] and run.seeds == [7]  # not the task's four rates, not seed 42
    run, _ = finetuning("--task", "mrpc", "--model", "m", "--learning-rate=3e-5")  # argparse's other spelling
    assert run.learning_rates == [3e-5]
    run, _ = finetuning("--task", "mrpc", "--model", "m", "--features", "concat_last_four", "--learning_rate", "1e-4")
    assert run.learning_rates == [1e-4]  # the feature-based grid too
    run, _ = finetuning("--task", "mrpc", "--model", "m")
    assert run.learning_rates == [5e-5, 4e-5, 3e-5, 2e-5] and run.seeds == [42]  # none given: the paper's


@pytest.mark.parametrize("single, grid", [("learning_rate", "learning_rates"), ("seed", "seeds")])
def test_a_single_value_and_its_grid_together_are_refused(single, grid, tmp_path):
    with pytest.raises(ConfigurationError, match=f"--{single} and --{grid} both given on the command line"):
        finetuning("--task", "mrpc", "--model", "m", f"--{single}", "1", f"--{grid}", "2", "3")
    config = tmp_path / "run.yaml"
    config.write_text(f"task: mrpc\n{single}: 1\n{grid}: [2, 3]\n")
    with pytest.raises(ConfigurationError, match=f"--{single} and --{grid} both given in {config}"):
        finetuning("--config", str(config), "--model", "m")


def test_the_command_line_overrides_the_config_file_for_grids(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("task: mrpc\nlearning_rates: [1e-5, 2e-5]\nseed: 3\n")
    run, _ = finetuning("--config", str(config), "--model", "m")
    assert run.learning_rates == [1e-5, 2e-5] and run.seeds == [3]
    run, _ = finetuning("--config", str(config), "--model", "m", "--learning_rate", "4e-5", "--seeds", "1", "2")
    assert run.learning_rates == [4e-5] and run.seeds == [1, 2]


# --- Unknown names


@pytest.mark.parametrize(
    "parse, argv, message",
    [
        (finetuning, ["--learning_rat", "1e-5"], "--learning_rat (did you mean --learning_rate or --learning_rates?)"),
        (finetuning, ["--epochs", "2"], "--epochs (did you mean --num_train_epochs?)"),
        (
            finetuning,
            ["--dataset_config_name", "x"],
            "--dataset_config_name (transformers' name, which recipes/finetune.py has no setting for)",
        ),
        (finetuning, ["extra"], "unknown argument(s): extra."),
        (pretraining, ["--seeds", "1"], "--seeds (did you mean --seed?)"),
        # run_mlm.py's flags that no setting means: what to use instead, not the closest name (--split_lines)
        (pretraining, ["--validation_file", "v.txt"], "--validation_file (the held-out documents are drawn from"),
        (pretraining, ["--line_by_line"], "--line_by_line (run_mlm.py's one example per line; here examples are"),
    ],
)
def test_unknown_flags_get_the_closest_names(parse, argv, message):
    common = ["--task", "sst2", "--model", "m"] if parse is finetuning else []
    with pytest.raises(ConfigurationError, match="unknown argument") as error:
        parse(*common, *argv)
    assert message in str(error.value)
    recipe = "finetune" if parse is finetuning else "pretrain"
    assert f"See python recipes/{recipe}.py --help" in str(error.value)


def test_unknown_task_and_config_field_get_the_closest_names(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown task 'sts' \\(did you mean stsb\\?\\)"):
        finetuning("--task", "sts", "--model", "m")
    config = tmp_path / "run.yaml"
    config.write_text("task: mrpc\nlearning_rate_grid: [1e-5]\n")
    with pytest.raises(ConfigurationError, match=r"unknown field\(s\) learning_rate_grid \(did you mean learning_rate"):
        finetuning("--config", str(config), "--model", "m")


@pytest.mark.parametrize(
    "text, message",
    [
        (b"preset: tiny\nmax_steps: [2\n", "run.yaml, line 3, column 1: not valid YAML (expected ',' or ']'"),
        (b"task: mrpc\n\tmodel: m\n", "run.yaml, line 2, column 1: not valid YAML (found character '\\t'"),
        (b"\xff\xfetask: mrpc\n", "run.yaml: not UTF-8 text (invalid start byte at byte 0)"),
        (b"- mrpc\n", "run.yaml: expected a mapping of field: value, got list"),
    ],
)
def test_a_config_file_that_is_not_yaml_is_one_line_naming_file_and_line(text, message, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_bytes(text)
    with pytest.raises(ConfigurationError) as error:
        finetuning("--config", str(config), "--model", "m")
    assert str(error.value).startswith(str(config)) and message in str(error.value)


# --- Model directories: one check for every opener


def open_with_load_bert(directory, tmp_path):
    from bert_repro.model.conversion import load_bert

    load_bert(directory, "base")


def open_with_hub_push(directory, tmp_path):
    from bert_repro.hub.push import main

    main([str(directory), "--repo_id", "someone/model"])


def open_with_study_reuse(directory, tmp_path):
    from bert_repro.training.studies import StudyArguments, run_study

    run_study(StudyArguments(study="table5", reuse=[f"mlm={directory}"], output_dir=str(tmp_path / "out")))


def open_with_finetuning(directory, tmp_path):
    argv = ["--task", "sst2", "--model", str(directory), "--data", str(tmp_path / "data")]  # checked before the data
    run_finetuning(FineTuningRecipe.from_args([*argv, "--output_dir", str(tmp_path / "out")]))


def open_with_init_from(directory, tmp_path):
    from bert_repro.training.pretraining.model import model_config

    recipe = pretraining("--init_from", str(directory), "--output_dir", str(tmp_path / "out"))
    model_config(recipe.model)


@pytest.mark.parametrize("problem", ["pickle", "truncated", "config"])
@pytest.mark.parametrize(
    "opener",
    [open_with_load_bert, open_with_hub_push, open_with_study_reuse, open_with_init_from, open_with_finetuning],
)
def test_every_opener_checks_the_model_directory(opener, problem, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    directory = tmp_path / "model"
    BertReproForPreTraining(tiny_config()).save_pretrained(directory)
    expected = damage_model_dir(directory, problem)
    with pytest.raises((ValueError, SystemExit)) as error:
        opener(directory, tmp_path)
    if error.type is SystemExit:  # a command: one line, exit code 2
        assert error.value.code == 2
        message = capsys.readouterr().err
        assert "Traceback" not in message
    else:
        message = str(error.value)
    assert expected in message
    if problem == "pickle":
        command = f"bert_repro.model.conversion import {directory} {directory}-safetensors --trust_pickle"
        assert command in message
    assert not (directory / "ran").exists()
    assert not (tmp_path / "exported").exists() and not (tmp_path / "out").exists()


def test_the_named_command_converts_a_trusted_pickle(tmp_path):
    from bert_repro.model.conversion import check_model_dir, load_bert, main

    directory = tmp_path / "model"
    BertReproForPreTraining(tiny_config()).save_pretrained(directory)
    state = load_bert(directory, "pretraining").state_dict()
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin")
    main(["import", str(directory), f"{directory}-safetensors", "--trust_pickle"])
    check_model_dir(f"{directory}-safetensors")
    converted = load_bert(f"{directory}-safetensors", "pretraining").state_dict()
    assert all(torch.equal(converted[k], v) for k, v in state.items())
    assert json.loads((tmp_path / "model-safetensors" / "config.json").read_text())["hidden_size"] == 32


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--learning_rates", "-1", "2e-5"), "--learning_rates -1"),
        (("--learning_rate", "0"), "--learning_rates 0"),
        (("--max_seq_length", "0"), "--max_seq_length 0"),
        (("--per_device_train_batch_size", "0"), "--per_device_train_batch_size 0"),
        (("--per_device_eval_batch_size", "0"), "--per_device_eval_batch_size 0"),
        (("--max_train_samples", "0"), "--max_train_samples 0"),
        (("--max_eval_samples", "-5"), "--max_eval_samples -5"),
        (("--seeds", "-1"), "--seeds -1"),
        (("--num_train_epochs", "0"), "--num_train_epochs 0"),
        (("--weight_decay", "-1"), "--weight_decay -1.0"),
        (("--gradient_accumulation_steps", "0"), "--gradient_accumulation_steps 0"),
        (("--doc_stride", "0"), "--doc_stride 0"),
        (("--max_query_length", "0"), "--max_query_length 0"),
        (("--n_best_size", "0"), "--n_best_size 0"),
        (("--max_answer_length", "0"), "--max_answer_length 0"),
        (("--num_proc", "0"), "--num_proc 0"),
        (("--attn_implementation", "flash"), "--attn_implementation flash"),
        (("--seeds", "1", "2", "1"), "--seeds 1 2 1"),  # the same run twice
        (("--learning_rates", "0.5", "0.5"), "--learning_rates 0.5 0.5"),
        (("--fp16", "true", "--use_cpu", "true"), "--fp16 true"),  # ran in fp32 where --bf16 is refused
    ],
)
def test_fine_tuning_values_no_run_can_use_are_refused_while_parsing(flags, named):
    with pytest.raises(ConfigurationError) as error:
        finetuning("--task", "mrpc", "--model", "m", *flags)
    assert str(error.value).startswith(f"{named}:")


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--load_best_model_at_end", "true"), "--load_best_model_at_end true"),
        (("--lr_scheduler_type", "reduce_lr_on_plateau"), "--lr_scheduler_type reduce_lr_on_plateau"),
        (("--save_strategy", "best"), "--save_strategy best"),
    ],
)
def test_a_training_setting_in_an_evaluation_only_run_asks_for_do_train(flags, named):
    with pytest.raises(ConfigurationError) as error:
        finetuning("--task", "mrpc", "--model", "m", "--do_eval", *flags)
    assert str(error.value) == f"{named} without --do_train: a setting of training, and this run trains nothing."


def test_a_sequence_longer_than_the_models_positions_is_refused_before_any_data(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 128}))
    run, _ = finetuning("--task", "mrpc", "--model", str(tmp_path), "--max_seq_length", "128")
    check_model_config(run)  # as many as the model has: fine
    run.max_seq_length = 129
    with pytest.raises(
        ConfigurationError, match=r"--max_seq_length 129 is longer than .*\(max_position_embeddings 128"
    ):
        check_model_config(run)


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--learning_rate", "-1"), "--learning_rate -1.0"),
        (("--max_steps", "0"), "--max_steps 0"),
        (("--global_batch_size", "0"), "--global_batch_size 0"),
        (("--eval_fraction", "1.5"), "--eval_fraction 1.5"),
        (("--phase2_fraction", "2"), "--phase2_fraction 2.0"),
        (("--eval_max_examples", "0"), "--eval_max_examples 0"),
        (("--num_proc", "0"), "--num_proc 0"),
        (("--max_documents", "0"), "--max_documents 0"),
        (("--stop_after_steps", "0"), "--stop_after_steps 0"),
        (("--stream_document_buffer", "0"), "--stream_document_buffer 0"),
        (("--stream_shuffle_buffer", "-1"), "--stream_shuffle_buffer -1"),
        (("--stream_held_out_documents", "-1"), "--stream_held_out_documents -1"),
        (("--weight_decay", "-0.1"), "--weight_decay -0.1"),
        (("--seed", "-1"), "--seed -1"),
        (("--save_steps", "0"), "--save_steps 0.0"),
        (("--attn_implementation", "sdap"), "--attn_implementation sdap"),
        (("--fp16", "true", "--use_cpu", "true"), "--fp16 true"),
        # the recipe derives it from the batch sizes: a value it would override is refused, with the flag to use
        (("--gradient_accumulation_steps", "3"), "--gradient_accumulation_steps 3"),
    ],
)
def test_pretraining_values_no_run_can_use_are_refused_before_any_data(flags, named, tmp_path):
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

    out = tmp_path / "out"
    with pytest.raises(ConfigurationError) as error:
        config = ROOT / "recipes" / "configs" / "quickstart.yaml"
        run_pretraining(PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", str(out), *flags]))
    assert str(error.value).startswith(f"{named}:") and not out.exists()


def test_a_tokenizer_that_cannot_load_is_refused_before_the_data_is_read(tmp_path, tiny_model):
    damaged = tmp_path / "tok"
    damaged.mkdir()
    (damaged / "tokenizer.json").write_text("{not json")
    out = tmp_path / "out"
    argv = ["--task", "mrpc", "--model", str(tiny_model), "--tokenizer", str(damaged), "--output_dir", str(out)]
    with pytest.raises(ConfigurationError, match=r"^--tokenizer .*tok: "):
        run_finetuning(FineTuningRecipe.from_args([*argv, "--data", str(tmp_path / "no-data")]))
    assert not out.exists()


# --- Defaults that cost, and what a run says of them


def test_a_finetuning_run_says_first_how_many_runs_its_grid_trains(tmp_path, tiny_model, caplog):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("not a run")  # the run stops at its output directory, before any work
    base = ["--task", "sst2", "--model", str(tiny_model), "--output_dir", str(out)]
    for extra, said in (
        ([], "4 learning rate(s) x 1 seed(s) = 4 run(s) (the paper's grid for sst2: 5e-05 4e-05 3e-05 2e-05); pass "),
        (["--learning_rate", "2e-5", "--seeds", "1", "2"], "1 learning rate(s) x 2 seed(s) = 2 run(s)"),
    ):
        caplog.clear()
        with caplog.at_level("INFO"), pytest.raises(FileExistsError):
            run_finetuning(FineTuningRecipe.from_args(base + extra))
        assert said in caplog.text


def test_help_without_a_task_shows_no_tasks_defaults_as_everyones(capsys):
    with pytest.raises(SystemExit):
        FineTuningRecipe.from_args(["--help"])
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert "mrpc's grid" not in text and "(default: 3.0)" not in text
    for flag in ("--num_train_epochs", "--per_device_train_batch_size", "--max_seq_length"):
        entry = " ".join(out[out.index(f"  {flag} ") :].split("\n  --")[0].split())
        assert "(default: the task's; --task T --help shows them)" in entry, entry
    assert "(default: the task's grid (GLUE: 5e-5 4e-5 3e-5 2e-5; SQuAD, SWAG, CoNLL-2003: 5e-5 3e-5 2e-5))" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="bf16 is kept where CUDA is")
@pytest.mark.parametrize("config", ["bert_tiny.yaml", "bert_base.yaml"])
def test_the_shipped_configs_train_in_float32_on_a_cpu_and_say_so(config, caplog):
    path = str(ROOT / "recipes" / "configs" / config)
    with caplog.at_level("WARNING"):
        assert not pretraining("--config", path, "--output_dir", "unused").training.bf16
    assert "bf16: auto: no CUDA device, so training in float32" in caplog.text
    assert not pretraining("--config", path, "--output_dir", "unused", "--use_cpu", "true").training.bf16
    # what the command line says wins: bf16 on a CPU when asked for in so many words (transformers allows it there)
    assert pretraining("--config", path, "--output_dir", "unused", "--use_cpu", "--bf16", "true").training.bf16


def test_warm_up_over_half_the_run_is_said():
    from bert_repro.training.pretraining.plan import warmup_warning

    recipe = pretraining("--config", str(ROOT / "recipes/configs/bert_tiny.yaml"), "--output_dir", "x")
    assert warmup_warning(recipe.training) is None  # 10,000 of 1,000,000
    short = recipe.replace(max_steps=500).training
    assert warmup_warning(short).startswith("--warmup_steps 10,000 of --max_steps 500: the learning rate rises for ")
    assert "peaks at 5e-06 (--learning_rate 0.0001)" in warmup_warning(short)
    assert warmup_warning(recipe.replace(max_steps=500, warmup_steps=0.01).training) is None


def test_a_held_out_split_of_a_few_examples_is_said():
    from bert_repro.training.pretraining.records import held_out_warning

    assert held_out_warning({"held_out": {"examples": 6}}).startswith("the held-out split holds 6 examples")
    assert held_out_warning({"held_out": {"examples": 5000}}) is None
    assert held_out_warning({}) is None  # nothing held out: said elsewhere


def test_a_model_path_that_is_nothing_is_one_message(tmp_path, tiny_model):
    # A relative path that does not exist reads as a Hub id: neither in the cache nor on a Hub that answers, it is
    # said before any work (the recipes print these errors in one line, exit 2), not by a loader's traceback.
    from bert_repro.model.conversion import CheckpointError
    from bert_repro.training.pretraining.plan import plan

    for args in (["--model", "runs/missing"], ["--model", str(tiny_model), "--tokenizer", "runs/missing"]):
        run, training = FineTuningRecipe.from_args(["--task", "sst2", *args, "--output_dir", str(tmp_path)]).resolved()
        with pytest.raises((CheckpointError, ConfigurationError), match="runs/missing: .*local cache"):
            check_inputs(run, training)
    quickstart = ["--config", str(ROOT / "recipes/configs/quickstart.yaml"), "--output_dir", str(tmp_path)]
    for flag in ("--init_from", "--tokenizer"):
        with pytest.raises((CheckpointError, ConfigurationError), match="runs/missing"):
            plan(pretraining(*quickstart, flag, "runs/missing"))
