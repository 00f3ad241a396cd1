"""Every task runs end to end on a tiny model and small fixture files: a few steps, then evaluation producing the
metric keys the task declares (and GLUE submission files where the task has a test split)."""

import json

import pytest
from support import ROOT
from support.task_files import CONLL_DEV, CONLL_TRAIN, TINY_RUN, finetune_args, fixture_files, fixture_rows, write

from bert_repro.tasks.registry import TASKS, get_task
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning
from bert_repro.training.lifecycle import RunFinished

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_end_to_end(tmp_path, tiny_model, name):
    task = get_task(name)
    data = write(tmp_path / "data", fixture_files(name))
    out = tmp_path / "out"
    argv = finetune_args(name, tiny_model, data, out, **TINY_RUN, doc_stride=16)
    summary = run_finetuning(FineTuningRecipe.from_args(argv))
    results = json.loads((out / "results.json").read_text())
    assert results["best"]["learning_rate"] == summary["best"]["learning_rate"] == 1e-4
    for split in task.eval_splits:
        assert set(task.metrics) <= set(results["best"][split]), (split, results["best"][split])
    assert (out / "results.md").read_text().startswith(f"# {name}")
    assert (out / "model.safetensors").exists() and (out / "README.md").exists()
    if task.glue_submission_names:  # every GLUE fixture has its test file(s): one submission file per test split
        for split in task.test_splits:
            lines = (out / "glue_submission" / task.glue_submission_name(split)).read_text().splitlines()
            assert lines[0] == "index\tprediction" and len(lines) == 1 + len(fixture_rows(name, split))

    # Run again (a requeued job): the run is finished, nothing is trained or written again.
    written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RunFinished, match="already holds this run, finished"):
        run_finetuning(FineTuningRecipe.from_args(argv))
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == written


def test_task_defaults_are_the_papers():
    run, training = FineTuningRecipe.from_args(["--task", "mrpc", "--model", "m"]).resolved()
    assert run.learning_rates == [5e-5, 4e-5, 3e-5, 2e-5]  # the GLUE grid
    assert training.num_train_epochs == 3 and training.per_device_train_batch_size == 32
    assert run.max_seq_length == 128 and training.warmup_steps == 0.1 and training.adam_epsilon == 1e-6
    run, training = FineTuningRecipe.from_args(
        ["--task", "squad_v2", "--model", "m", "--learning_rates", "3e-5"]
    ).resolved()
    assert run.learning_rates == [3e-5] and run.max_seq_length == 384
    assert training.num_train_epochs == 2 and training.per_device_train_batch_size == 48


def test_grid_and_restarts_keep_the_best(tmp_path, tiny_model):
    data = write(tmp_path / "data", fixture_files("sst2"))
    out = tmp_path / "out"
    argv = finetune_args("sst2", tiny_model, data, out, learning_rates=["1e-3", "1e-4"], seeds=[1, 2], max_steps=2)
    summary = run_finetuning(FineTuningRecipe.from_args(argv))
    assert [(r["learning_rate"], r["seed"]) for r in summary["runs"]] == [(1e-3, 1), (1e-3, 2), (1e-4, 1), (1e-4, 2)]
    assert summary["best"]["score"] == max(r["score"] for r in summary["runs"])
    table = (out / "results.md").read_text()
    assert table.count("\n| ") == 6 and "*" in table  # header + 4 runs (the best marked) + the majority class
    assert not (out / "run.lock").exists()  # the finished run's lock: removed
    # A different setting in the same directory is refused, never mixed into these results.
    with pytest.raises(FileExistsError, match="different run"):
        run_finetuning(FineTuningRecipe.from_args([*argv, "--learning_rates", "5e-5"]))


def test_reproduce_report_and_resume(tmp_path, tiny_model):
    import zipfile

    from bert_repro.training.studies import reproduce

    root = tmp_path / "glue"
    write(root / "MRPC", fixture_files("mrpc"))
    write(root / "SST-2", fixture_files("sst2"))
    args = reproduce.ReproduceArguments(
        model=str(tiny_model), output_dir=str(tmp_path / "out"), tasks=["mrpc", "sst2"], data_root=str(root)
    )
    common = ["--learning_rates", "1e-4", "--max_steps", "2", "--use_cpu", "true", "--disable_tqdm", "true"]
    text = reproduce.run_reproduce(args, common)
    assert "| mrpc | f1 |" in text and "| sst2 | accuracy |" in text and "88.9" in text and "93.5" in text
    assert "n/a (not all eight tasks ran)" in text
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [r["task"] for r in report["tasks"]] == ["mrpc", "sst2"]
    assert (tmp_path / "out" / "report.png").exists()
    with zipfile.ZipFile(tmp_path / "out" / "glue_submission.zip") as archive:
        assert sorted(archive.namelist()) == ["MRPC.tsv", "SST-2.tsv"]

    # Resumes: finished tasks (their record this run's) are not fine-tuned again, nothing in them is written.
    tasks = {
        p: p.read_bytes() for task in ("mrpc", "sst2") for p in (tmp_path / "out" / task).rglob("*") if p.is_file()
    }
    assert reproduce.run_reproduce(args, common).splitlines()[6:8] == text.splitlines()[6:8]
    assert {p: p.read_bytes() for p in tasks} == tasks


def test_reproduce_checks_every_task_before_the_first_runs(tmp_path, tiny_model, monkeypatch, caplog):
    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.studies import reproduce

    root = tmp_path / "glue"
    write(root / "MRPC", fixture_files("mrpc"))
    calls = []
    monkeypatch.setattr(reproduce, "run_finetuning", lambda argv: calls.append(argv))
    args = reproduce.ReproduceArguments(
        model=str(tiny_model), output_dir=str(tmp_path / "out"), tasks=["mrpc", "sst2"], data_root=str(root)
    )
    with pytest.raises(ConfigurationError, match=r"No local data for task\(s\) sst2 under --data_root"):
        reproduce.run_reproduce(args, ["--use_cpu", "true"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # online: said once, then from the Hub
    assert reproduce.check_task_data([reproduce.get_task("sst2")], str(root)) == {"sst2": None}
    assert "No directory for sst2 under --data_root" in caplog.text
    args.tasks = ["mrpc", "squad"]  # SQuAD's 384 tokens against the tiny model's 512 positions: fine; 600 is not
    with pytest.raises(ConfigurationError, match=r"--max_seq_length 600 is longer than"):
        reproduce.run_reproduce(args, ["--max_seq_length", "600"])
    assert calls == [] and not (tmp_path / "out").exists()


def test_glue_average_needs_all_eight():
    from bert_repro.training.studies.reproduce import glue_average

    rows = [{"task": t, "ours": 80.0} for t in ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")]
    assert glue_average(rows + [{"task": "wnli", "ours": 0.0}]) == 80.0  # WNLI is left out, as in the paper
    assert glue_average(rows[:-1]) is None


def test_speed_switches_reach_the_model(tmp_path, tiny_model):
    """--unpad_inputs / --fast_dropout / --last_layer_subset are set on the fine-tuned model (and saved with it)."""
    data = write(tmp_path / "data", fixture_files("mrpc"))
    out = tmp_path / "out"
    switches = dict(unpad_inputs=True, fast_dropout=True, last_layer_subset=True)
    run_finetuning(FineTuningRecipe.from_args(finetune_args("mrpc", tiny_model, data, out, **TINY_RUN, **switches)))
    config = json.loads((out / "config.json").read_text())
    assert config["unpad_inputs"] and config["fast_dropout"] and config["last_layer_subset"]


def test_a_missing_later_evaluation_split_is_said_and_recorded_a_missing_first_one_is_an_error(tmp_path, tiny_model):
    # CoNLL-2003 as many copies lay it out: train.txt and valid.txt, no test.txt. Its test set is an evaluation
    # split of the task (the paper's number); without it the run evaluates on dev and says so.
    from bert_repro.tasks.columns import TaskDataError

    data = write(tmp_path / "data", {"train.txt": CONLL_TRAIN, "valid.txt": CONLL_DEV})
    argv = finetune_args("conll2003", tiny_model, data, None, learning_rates="1e-4", max_steps=1, max_seq_length=32)
    summary = run_finetuning(FineTuningRecipe.from_args([*argv, "--output_dir", str(tmp_path / "out")]))
    assert summary["missing_splits"] == ["test"] and set(summary["best"]) >= {"validation"}
    assert "test" not in summary["best"]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["missing_splits"] == ["test"]
    # without the split that ranks the runs: one line before anything is loaded or written
    write(tmp_path / "no_dev", {"train.txt": CONLL_TRAIN})
    argv[argv.index(str(data))] = str(tmp_path / "no_dev")
    with pytest.raises(TaskDataError, match=r"no validation split of conll2003 \(found: train\)"):
        run_finetuning(FineTuningRecipe.from_args([*argv, "--output_dir", str(tmp_path / "out2")]))
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("initializer, cut", [("reference", True), ("transformers", False)])
def test_the_new_heads_initializer_is_a_choice(tmp_path, tiny_model, initializer, cut):
    # The reference code draws new heads from a normal cut at 2 standard deviations, transformers from a plain
    # normal; only the head differs (the checkpoint's weights are loaded either way).
    from safetensors.torch import load_file

    data = write(tmp_path / "data", fixture_files("sst2"))
    argv = finetune_args("sst2", tiny_model, data, tmp_path / "o", learning_rates="1e-30", max_steps=1, seeds=3)
    run_finetuning(FineTuningRecipe.from_args([*argv, "--head_initializer", initializer, "--max_seq_length", "32"]))
    weights = load_file(tmp_path / "o" / "model.safetensors")
    head = next(w for name, w in weights.items() if "classifier" in name and name.endswith("weight"))
    assert (head.abs().max().item() <= 2 * 0.02 + 1e-6) == cut, head.abs().max().item()
    trained = load_file(tiny_model / "model.safetensors")
    name = "bert.embeddings.word_embeddings.weight"
    assert (weights[name] - trained[name]).abs().max() < 1e-6  # the encoder as loaded


def test_the_readmes_python_api_builds_the_run_the_command_line_does(monkeypatch):
    """README, "From Python": a fine-tuning recipe read with its task, changed with `replace`, is the recipe of the
    command line with the same flags; the task's defaults are resolved when the run reads it."""
    import bert_repro.training.finetuning as finetune

    text = (ROOT / "README.md").read_text()
    snippet = text[text.index("from bert_repro.training import FineTuningRecipe") :].split("```")[0]
    taken = []
    monkeypatch.setattr(finetune, "run_finetuning", taken.append)
    exec(snippet, {})
    flags = ["--task", "mrpc", "--model", "runs/mine", "--output_dir", "runs/mine-mrpc"]
    assert taken == [FineTuningRecipe.from_args([*flags, "--learning_rate", "2e-5"])]
    run, training = taken[0].resolved()
    assert run.learning_rates == [2e-5] and run.max_seq_length == 128  # one run, not the paper's grid of four
    assert training.output_dir == "runs/mine-mrpc" and training.num_train_epochs == 3
    # the feature-based approach takes its own grid when set by replace, as on the command line
    given = FineTuningRecipe.from_args([*flags, "--features", "concat_last_four"]).resolved()[0]
    replaced = FineTuningRecipe.from_args(flags).replace(features="concat_last_four").resolved()[0]
    assert replaced.learning_rates == given.learning_rates
    with pytest.raises(ConfigurationError, match="no setting 'learning_rat'.*learning_rate"):
        taken[0].replace(learning_rat=1e-5)
    with pytest.raises(ConfigurationError, match="a task's defaults"):
        taken[0].replace(task="sst2")
