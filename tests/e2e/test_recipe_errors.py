"""Bad input to the recipes, run in a subprocess as a user would, ends in one message and exit code 2, never a
traceback. A wrong flag is said before the model is checked, so ``--model`` names nothing real there."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.damaged import damage_model_dir


def recipe(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, str(ROOT / "recipes" / name), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def finetune(*args: str, model: str = "no-model-needed") -> subprocess.CompletedProcess:
    return recipe("finetune.py", "--task", "sst2", "--model", model, *args)


def sst2_data(directory: Path, label: str = "1") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "train.tsv").write_text(f"sentence\tlabel\ngood fun\t{label}\ndull\t0\n", encoding="utf-8")
    (directory / "dev.tsv").write_text("sentence\tlabel\nfun\t1\n", encoding="utf-8")
    return directory


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str, recipe: str = "finetune.py") -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{recipe}: error:" in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in: {result.stderr[-3000:]}"


def test_bad_task_data_is_one_message_and_records_no_run(tmp_path, tiny_model):
    data = sst2_data(tmp_path / "data", label="7")
    out = tmp_path / "out"
    result = finetune("--data", str(data), "--output_dir", str(out), model=str(tiny_model))
    assert_user_error(result, str(data / "train.tsv"), "line 2", "'7'", "negative, positive")
    # Nothing of the failed run is left behind: a retry with other --data is not refused as "a different run".
    assert not (out / "run_config.json").exists()


def test_output_dir_below_a_file_is_one_message(tmp_path, tiny_model):
    # A path through a regular file cannot be created, whoever runs the test (root included).
    (tmp_path / "a_file").write_text("not a directory")
    out = tmp_path / "a_file" / "run"
    result = finetune("--data", str(sst2_data(tmp_path / "data")), "--output_dir", str(out), model=str(tiny_model))
    assert_user_error(result, "cannot write to the output directory", str(out), "--output_dir")
    assert (tmp_path / "a_file").read_text() == "not a directory"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="bf16 is allowed where CUDA is")
def test_bf16_without_a_gpu_is_one_message(tmp_path):
    # TrainingArguments' own check (raised while the command line is parsed) reaches the user as our one line.
    data = sst2_data(tmp_path / "data")
    result = finetune("--data", str(data), "--output_dir", str(tmp_path / "out"), "--bf16", "true")
    assert_user_error(result, "bf16")


def denied(path: Path) -> bool:
    """Whether writing ``path`` (a directory, made if absent) fails with PermissionError for this user."""
    try:
        path.mkdir(exist_ok=True)
        (path / "probe").write_text("x")
    except PermissionError:
        return True
    (path / "probe").unlink()
    return False


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory this user may not write: a chmod 555 one, or for root (whom chmod does not stop) a path in
    sysfs, where even root may not create directories."""
    out = tmp_path / "read_only"
    out.mkdir()
    out.chmod(0o555)
    try:
        if denied(out):
            yield out
        elif Path("/sys/kernel").is_dir() and denied(Path("/sys/bert_repro_output")):
            yield Path("/sys/bert_repro_output")
        else:
            pytest.skip("this user can write into a read-only directory")
    finally:
        out.chmod(0o755)


def test_read_only_output_dir_is_one_message(tmp_path, unwritable_dir, tiny_model):
    data = sst2_data(tmp_path / "data")
    result = finetune("--data", str(data), "--output_dir", str(unwritable_dir), model=str(tiny_model))
    assert_user_error(result, "cannot write to the output directory", str(unwritable_dir))
    assert "Permission denied" in result.stderr or "Operation not permitted" in result.stderr


@pytest.mark.parametrize(
    "args,fragment",
    [
        (("--model_overrides", '{"num_attention_heads": 0}'), "num_attention_heads must be a positive integer, got 0"),
        (("--model_overrides", '{"vocab_size": "abc"}'), "vocab_size must be a positive integer, got 'abc'"),
        (("--model_overrides", "{hidden_size: 3}"), "--model_overrides is not valid JSON"),
        (("--vocab_size", "5"), "--vocab_size 5: a WordPiece vocabulary needs more than its 5 special tokens"),
        (("--tokenizer", "BAD"), "tokenizer.json' as a tokenizers tokenizer.json"),
        (("--dataloader_persistent_workers", "true"), "add --dataloader_num_workers N (N > 0)"),
    ],
)
def test_pretraining_with_an_invalid_model_config_is_one_message(tmp_path, args, fragment):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here. Another one there.\n\nA second document. It ends.\n", encoding="utf-8")
    (tmp_path / "BAD").mkdir()
    (tmp_path / "BAD" / "tokenizer.json").write_text("{not json")
    config = ROOT / "recipes" / "configs" / "quickstart.yaml"
    args = [str(tmp_path / a) if a == "BAD" else a for a in args]
    result = recipe("pretrain.py", "--config", config, "--corpus", corpus, "--output_dir", tmp_path / "out", *args)
    assert_user_error(result, fragment, recipe="pretrain.py")
    assert not (tmp_path / "out" / "run_config.json").exists()  # checked before anything is written


def test_a_model_directory_that_cannot_be_opened_is_one_message(tmp_path, tiny_model):
    # every problem, found before any work: test_arguments.py's test_every_opener_checks_the_model_directory
    model = shutil.copytree(tiny_model, tmp_path / "model")
    expected = damage_model_dir(model, "truncated")
    out = tmp_path / "out"
    result = finetune("--data", str(sst2_data(tmp_path / "data")), "--output_dir", str(out), model=str(model))
    assert_user_error(result, expected)
    assert not out.exists()


# --- Flags


def test_transformers_names_and_one_learning_rate_run_one_fine_tuning(tmp_path, tiny_model):
    """run_glue.py's flags with --learning_rate / --seed: one run at that rate and seed, not the task's grid."""
    data = sst2_data(tmp_path / "data")
    (data / "train.tsv").rename(data / "rows.tsv")
    out = tmp_path / "out"
    result = recipe(
        "finetune.py",
        *("--task_name", "sst2", "--model_name_or_path", tiny_model),
        *("--train_file", data / "rows.tsv", "--validation_file", data / "rows.tsv", "--max_seq_length", 16),
        *("--learning_rate", "3e-4", "--seed", 7, "--max_steps", 1, "--output_dir", out),
        *("--use_cpu", "true", "--disable_tqdm", "true", "--predict_test", "false"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [(r["learning_rate"], r["seed"]) for r in runs] == [(3e-4, 7)]
    recorded = json.loads((out / "run_config.json").read_text())["finetuning"]
    assert recorded["data"] == [f"train={data / 'rows.tsv'}", f"validation={data / 'rows.tsv'}"]
    assert recorded["max_seq_length"] == 16 and recorded["model"] == str(tiny_model)


# recipes/pretrain.py parses as finetune.py does: its unknown flags are in test_arguments.py.
@pytest.mark.parametrize(
    "name, flag, suggestion",
    [
        ("finetune.py", "--task_nme", "--task"),
        ("study.py", "--finetune_arg", "--finetune_args or --finetune_args_for"),
        ("reproduce.py", "--data_rot", "--data_root"),
    ],
)
def test_unknown_flag_names_the_closest_in_every_recipe(name, flag, suggestion):
    result = recipe(name, flag, "1")
    unknown = f"unknown argument(s): {flag} (did you mean {suggestion}?)"
    assert_user_error(result, unknown, f"See python recipes/{name} --help", recipe=name)


@pytest.mark.parametrize("name", ["pretrain.py", "finetune.py"])
def test_ctrl_c_says_where_the_newest_checkpoint_is_and_exits_130(tmp_path, name, monkeypatch, capsys):
    # Ctrl-C while training (the run's function raising KeyboardInterrupt) is one line, not a traceback.
    import runpy

    import torch
    from safetensors.torch import save_file

    import bert_repro.training.finetuning as finetuning
    import bert_repro.training.pretraining as pretraining

    out = tmp_path / "out"
    for step, where in ((2, out), (4, out / "runs" / "lr2e-05_seed42"), (6, out / "runs" / "lr3e-05_seed42")):
        folder = where / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
        if step < 6:  # the newest is cut short, so the one before it is named
            save_file({"w": torch.zeros(1)}, folder / "model.safetensors")

    def stop(recipe):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretraining, "run_pretraining", stop)
    monkeypatch.setattr(finetuning, "run_finetuning", stop)
    args = ["--config", str(ROOT / "recipes/configs/quickstart.yaml")] if name == "pretrain.py" else ["--task", "sst2"]
    args += ["--model", "m"] if name == "finetune.py" else []
    monkeypatch.setattr(sys, "argv", [name, *args, "--output_dir", str(out)])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(ROOT / "recipes" / name), run_name="__main__")
    assert ended.value.code == 130
    newest = out / "runs" / "lr2e-05_seed42" / "checkpoint-4"
    said = capsys.readouterr().err
    assert said.startswith(f"{name}: interrupted: the newest checkpoint is {newest}; the same command with "), said
