"""A stored result, checkpoint or vocabulary is used only by the run its record names: another run's folder is
refused, or under `--overwrite_output_dir true` moved aside whole (never deleted, never mixed with the new run)."""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file
from support.pretraining_runs import first_documents, write_config
from support.task_files import fixture_files, write

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.lifecycle import _HELD, check_output_dir, lock_output_dir, move_aside


def aside_of(out):
    """The folder `out` was moved to, the only one."""
    (moved,) = out.parent.glob(f"{out.name}.replaced-*")
    return moved


def test_overwrite_moves_the_folder_aside_under_its_lock_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps({"run": {"preset": "base"}}))
    (out / "results.json").write_text("{}")
    check_output_dir(out, {"run": {"preset": "tiny"}}, resume=False, overwrite=True)  # no refusal, nothing moved
    assert move_aside(out) is None and (out / "results.json").exists()  # not locked by this process
    lock_output_dir(out)
    try:
        moved = move_aside(out)
        assert moved == aside_of(out) and moved.name.startswith("run.replaced-")
        assert json.loads((moved / "run_config.json").read_text()) == {"run": {"preset": "base"}}
        assert (moved / "results.json").exists()
        assert sorted(p.name for p in out.iterdir()) == ["run.lock"]  # a fresh folder, locked again
        fd = _HELD[str(out.resolve())]
        assert os.fstat(fd).st_ino == os.stat(out / "run.lock").st_ino
        assert move_aside(out) is None  # nothing left to move
    finally:
        os.close(_HELD.pop(str(out.resolve())))


def pretrain(config, out, *flags):
    from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

    return run_pretraining(PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", str(out), *flags]))


def vocabulary(folder):
    """A vocabulary's size: a tokenizer's folder, or a run's (tokenizer/ while training, beside the model once done)."""
    folder = folder / "tokenizer" if (folder / "tokenizer").is_dir() else folder
    return len((folder / "vocab.txt").read_text().splitlines())


def test_an_overwritten_pretraining_run_uses_its_own_vocabulary_and_resumes_itself(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, max_steps=4, save_steps=2)
    config.write_text(config.read_text().replace(f"tokenizer: {tokenizer}\n", ""))  # a vocabulary of its own
    out = tmp_path / "out"
    pretrain(config, out, "--vocab_size", "100")
    first = vocabulary(out)
    pretrain(config, out, "--vocab_size", "140", "--overwrite_output_dir", "true", "--stop_after_steps", "2")
    moved = aside_of(out)
    assert (moved / "results.json").exists() and vocabulary(moved) == first
    assert not (out / "results.json").exists() and vocabulary(out) > first
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    results = pretrain(config, out, "--vocab_size", "140", "--resume_from_checkpoint", "true")
    assert results["global_step"] == 4 and "stopped_at_step" not in results
    assert json.loads((out / "config.json").read_text())["vocab_size"] == vocabulary(out) > first
    pretrain(config, out, "--tokenizer", str(tokenizer), "--overwrite_output_dir", "true")
    assert vocabulary(out) == vocabulary(tokenizer) == json.loads((out / "config.json").read_text())["vocab_size"]
    assert len(list(tmp_path.glob("out.replaced-*"))) == 2


@pytest.fixture
def other_model(tmp_path, tiny_model):
    """tiny_model's architecture and vocabulary, drawn from another seed."""
    from bert_repro import BertReproConfig, BertReproForPreTraining

    directory = tmp_path / "other-model"
    shutil.copytree(tiny_model, directory)
    torch.manual_seed(1)
    BertReproForPreTraining(BertReproConfig.from_pretrained(tiny_model)).save_pretrained(directory)
    return directory


GRID = ["--learning_rates", "1e-4", "--max_steps", "2", "--use_cpu", "true", "--disable_tqdm", "true"]


def test_a_fine_tuning_overwrite_with_another_model_trains_that_model(tmp_path, tiny_model, other_model):
    from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning

    data, out = write(tmp_path / "mrpc", fixture_files("mrpc")), tmp_path / "out"
    argv = ["--task", "mrpc", "--data", str(data), "--output_dir", str(out), *GRID]
    run_finetuning(FineTuningRecipe.from_args([*argv, "--model", str(tiny_model)]))
    with pytest.raises(FileExistsError, match=r"holds a different run \(--model: other content than this run read\)"):
        run_finetuning(FineTuningRecipe.from_args([*argv, "--model", str(other_model)]))
    again = [*argv, "--model", str(other_model), "--overwrite_output_dir", "true"]
    summary = run_finetuning(FineTuningRecipe.from_args(again))
    moved = aside_of(out)
    assert json.loads((moved / "results.json").read_text())["model"] == str(tiny_model)
    assert summary["model"] == json.loads((out / "results.json").read_text())["model"] == str(other_model)
    before, now = (load_file(folder / "model.safetensors") for folder in (moved, out))
    assert before.keys() == now.keys() and not all(torch.equal(before[k], now[k]) for k in before)


def benchmark(tmp_path, model, *flags, **arguments):
    """recipes/reproduce.py on MRPC's fixture into tmp_path/bench: its report's text."""
    from bert_repro.training.studies import reproduce

    data = write(tmp_path / "glue" / "MRPC", fixture_files("mrpc")).parent
    arguments |= dict(model=str(model), output_dir=str(tmp_path / "bench"), tasks=["mrpc"], data_root=str(data))
    return reproduce.run_reproduce(reproduce.ReproduceArguments(**arguments), [*GRID, *flags])


def test_a_reproduce_rerun_uses_only_results_of_the_same_model_and_settings(tmp_path, tiny_model, other_model):
    out = tmp_path / "bench"
    benchmark(tmp_path, tiny_model)
    with pytest.raises(ConfigurationError, match=r"bench holds a different run \(--model: other content"):
        benchmark(tmp_path, other_model)
    with pytest.raises(FileExistsError, match=r"mrpc holds a different run \(finetuning.seeds: \[.*\] -> \[7\]"):
        benchmark(tmp_path, tiny_model, "--seeds", "7")
    assert "| mrpc |" in benchmark(tmp_path, other_model, overwrite_output_dir=True)
    moved = aside_of(out)
    for folder, model in ((moved, tiny_model), (out, other_model)):
        assert json.loads((folder / "report.json").read_text())["model"] == str(model)
        assert json.loads((folder / "mrpc" / "results.json").read_text())["model"] == str(model)
    benchmark(tmp_path, other_model, "--seeds", "7", "--overwrite_output_dir", "true")  # the flag after -- too
    assert len(list(tmp_path.glob("bench.replaced-*"))) == 2
    assert json.loads((out / "mrpc" / "results.json").read_text())["hyperparameters"]["seeds"] == [7]


def test_a_token_passed_on_to_fine_tuning_is_written_nowhere(tmp_path, tiny_model, capsys, caplog, monkeypatch):
    from bert_repro.training.studies import StudyArguments, run_study

    token = "hf_" + "Secret0" * 5
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with caplog.at_level("INFO"):
        shown = benchmark(tmp_path, tiny_model, "--hub_token", token)
        study = dict(study="pretraining", output_dir=str(tmp_path / "study"), reuse=[f"pretrained={tiny_model}"])
        study |= dict(data_root=str(tmp_path / "glue"), tasks=["mrpc"], finetune_args_for=[f"mrpc=--hub_token {token}"])
        shown += run_study(StudyArguments(**study, finetune_args=" ".join(GRID) + f" --hub_token={token}"))
    assert "--hub_token HIDDEN" in (tmp_path / "bench" / "report.md").read_text()
    assert "--hub_token=HIDDEN" in (tmp_path / "study" / "study.md").read_text()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 40 and not [p for p in written if token.encode() in p.read_bytes()]
    captured = capsys.readouterr()
    assert token not in shown + captured.out + captured.err + caplog.text


def test_a_corpus_changed_between_a_stop_and_the_resumption_is_refused_and_nothing_changes(
    tmp_path, corpus_and_tokenizer
):
    """Any edit, one that keeps every count too (a word for a word), is seen before anything is written."""
    corpus = first_documents(corpus_and_tokenizer[0], tmp_path / "corpus", 10)
    config = write_config(tmp_path / "c.yaml", corpus, corpus_and_tokenizer[1], max_steps=4, save_steps=2)
    out = tmp_path / "out"
    pretrain(config, out, "--stop_after_steps", "2")
    doc = corpus / "doc03.txt"
    text = doc.read_text()
    word = next(w for w in text.split() if w.isalpha() and len(w) > 3)
    doc.write_text(text.replace(word, word[::-1], 1))
    files = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(FileExistsError, match=r"holds a different run \(--corpus: other content than this run read"):
        pretrain(config, out, "--resume_from_checkpoint", "true", "--max_steps", "6")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == files


def test_a_file_named_as_a_folder_is_one_clear_error(tmp_path):
    from bert_repro.model.conversion import CheckpointError, check_model_dir

    file = tmp_path / "f.json"
    file.write_text("{}")
    with pytest.raises(ConfigurationError, match=r"--output_dir .*f.json is a file; choose a folder"):
        check_output_dir(file, {}, resume=False, overwrite=True)
    with pytest.raises(CheckpointError, match=r"f.json is a file; a model is a directory holding config.json"):
        check_model_dir(file)


def test_resuming_a_checkpoint_of_another_vocabulary_is_one_line(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, max_steps=4, save_steps=2)
    config.write_text(config.read_text().replace(f"tokenizer: {tokenizer}\n", ""))
    pretrain(config, tmp_path / "a", "--vocab_size", "100", "--stop_after_steps", "2")
    checkpoint = str(tmp_path / "a" / "checkpoint-2")
    with pytest.raises(ConfigurationError, match=r"checkpoint-2: its model is not this run's \(vocab_size \d+ there"):
        pretrain(config, tmp_path / "b", "--vocab_size", "140", "--resume_from_checkpoint", checkpoint)
