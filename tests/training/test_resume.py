"""Resuming pre-training: `--resume_from_checkpoint true` takes the newest checkpoint that can really be loaded,
says which newer ones it skipped and why, and ends with the same weights as a run that was never interrupted."""

import json
import os
import pickle
import zipfile
from types import SimpleNamespace

import pytest
import torch
from support.damaged import RunsCode, fake_checkpoint, truncate
from support.pretraining_runs import launch, run_recipe, weights, write_config

from bert_repro.training.checkpoints import (
    NoUsableCheckpoint,
    check_fits,
    checkpoint_problem,
    interrupted,
    newest_valid_checkpoint,
)
from bert_repro.training.cli import ConfigurationError


def test_each_kind_of_broken_checkpoint_is_named(tmp_path):
    good = fake_checkpoint(tmp_path / "checkpoint-5", 5)
    assert checkpoint_problem(good) is None
    cases = {
        "empty folder": lambda f: [p.unlink() for p in f.iterdir()],
        "trainer_state.json is missing": lambda f: (f / "trainer_state.json").unlink(),
        "trainer_state.json cannot be read": lambda f: (f / "trainer_state.json").write_text('{"global_st'),
        "model.safetensors is missing": lambda f: (f / "model.safetensors").unlink(),
        "model.safetensors cannot be read": lambda f: truncate(f / "model.safetensors"),
        "optimizer.pt is truncated": lambda f: truncate(f / "optimizer.pt"),
        # altered since its save, whole: another archive, a pickle of objects that Trainer refuses to load
        "optimizer.pt cannot be loaded (": lambda f: zipfile.ZipFile(f / "optimizer.pt", "w").writestr("a", "b"),
        "scheduler.pt cannot be loaded (": lambda f: torch.save({"x": RunsCode(f / "ran")}, f / "scheduler.pt"),
        "optimizer.pt cannot be loaded (not an optimizer's state": lambda f: torch.save(
            {"state": {}}, f / "optimizer.pt"
        ),
    }
    for i, (reason, damage) in enumerate(cases.items()):
        folder = fake_checkpoint(tmp_path / f"case{i}" / "checkpoint-9", 9)
        damage(folder)
        assert reason in (checkpoint_problem(folder) or ""), reason
        assert not (folder / "ran").exists()


def test_a_torch_file_that_would_not_load_is_named_by_its_error(tmp_path):
    """The reason is torch's error class and the first line of its message, at most 200 characters; a good file's
    tensors map onto the CPU; training_args.bin, a pickle Trainer never loads, is not tried."""
    folder = fake_checkpoint(tmp_path / "checkpoint-2", 2)
    torch.save({"state": {0: {"exp_avg": torch.ones(3)}}, "param_groups": []}, folder / "optimizer.pt")
    torch.save(RunsCode(folder / "ran"), folder / "training_args.bin")
    assert checkpoint_problem(folder) is None
    torch.save({"x": RunsCode(folder / "ran")}, folder / "scheduler.pt")
    with pytest.raises(pickle.UnpicklingError) as refused:  # torch's own words, whose first line is the reason
        torch.load(folder / "scheduler.pt", weights_only=True)
    first_line = str(refused.value).strip().splitlines()[0]
    assert checkpoint_problem(folder) == f"scheduler.pt cannot be loaded (UnpicklingError: {first_line})"
    (folder / "scheduler.pt").unlink()
    with zipfile.ZipFile(folder / "optimizer.pt", "w") as archive:  # torch's message names the entry: a long line
        archive.writestr("a" * 300, "b")
    reason = checkpoint_problem(folder)
    assert reason.startswith("optimizer.pt cannot be loaded (RuntimeError: [enforce fail at inline_container.cc:")
    assert len(reason) == len("optimizer.pt cannot be loaded (RuntimeError: )") + 200 and reason.endswith("aaa)")
    assert not (folder / "ran").exists()


def test_a_checkpoint_of_another_shape_is_refused_by_name(tmp_path):
    from bert_repro import BertReproConfig

    config = BertReproConfig(vocab_size=800, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    (tmp_path / "config.json").write_text(json.dumps({**config.to_dict(), "vocab_size": 500, "hidden_dropout_prob": 0}))
    with pytest.raises(ConfigurationError) as refused:
        check_fits(tmp_path, config)
    assert str(refused.value) == (
        f"Cannot resume from {tmp_path}: its model is not this run's (vocab_size 500 there, 800 here). Resume a "
        "checkpoint of this run, or start it without --resume_from_checkpoint."
    )
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 800, "hidden_dropout_prob": 0.5}))
    check_fits(tmp_path, config)  # the same shapes (other fields may differ): accepted
    check_fits(tmp_path / "sharded", config)  # no config.json (FSDP's sharded checkpoints): left to Trainer


def test_ctrl_c_names_the_newest_complete_checkpoint(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    out = tmp_path / "run"
    assert interrupted("finetune.py", out) == 130
    assert capsys.readouterr().err == (
        "finetune.py: interrupted: no checkpoint was saved yet (--save_steps / --save_strategy): the same command "
        "starts again.\n"
    )
    assert interrupted("finetune.py", None) == 130 and "no checkpoint was saved yet" in capsys.readouterr().err
    # Newest by time, not by name: the older one sorts last by its path.
    older = fake_checkpoint(out / "runs" / "b" / "checkpoint-2", 2)
    newer = fake_checkpoint(out / "runs" / "a" / "checkpoint-4", 4)
    fake_checkpoint(out / "checkpoint-6.bak", 6)  # not a checkpoint's name
    os.utime(older, (1, 1))
    assert interrupted("pretrain.py", out) == 130
    said = f"pretrain.py: interrupted: the newest checkpoint is {newer}; the same command with "
    assert capsys.readouterr().err == said + "--resume_from_checkpoint true goes on from it.\n"
    (newer / "model.safetensors").unlink()  # the newest is incomplete: the one before it is named
    interrupted("pretrain.py", out)
    assert f"the newest checkpoint is {older};" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "1")  # only the first process speaks
    assert interrupted("pretrain.py", out) == 130 and capsys.readouterr().err == ""


def test_newest_valid_checkpoint_falls_back_and_reports(tmp_path, caplog):
    assert newest_valid_checkpoint(tmp_path) is None  # nothing saved yet
    fake_checkpoint(tmp_path / "checkpoint-5", 5)
    fake_checkpoint(tmp_path / "checkpoint-10", 10)
    truncate(tmp_path / "checkpoint-10" / "model.safetensors")
    (tmp_path / "checkpoint-20").mkdir()
    (tmp_path / "checkpoint-notes").mkdir()  # not a checkpoint name: ignored
    with caplog.at_level("WARNING"):
        assert newest_valid_checkpoint(tmp_path) == tmp_path / "checkpoint-5"  # numeric order, not text order
    assert "skipped checkpoint-20: empty folder" in caplog.text
    assert "skipped checkpoint-10: model.safetensors cannot be read" in caplog.text
    truncate(tmp_path / "checkpoint-5" / "model.safetensors")
    with pytest.raises(
        NoUsableCheckpoint, match="checkpoint-20: empty folder; checkpoint-10: .*--overwrite_output_dir"
    ):
        newest_valid_checkpoint(tmp_path)
    assert (tmp_path / "checkpoint-10" / "trainer_state.json").exists()  # nothing deleted


def test_the_clock_starts_where_the_checkpoint_says(tmp_path, caplog):
    from bert_repro.training.pretraining.resume import TrainingClock

    assert (TrainingClock(None).before, TrainingClock(None).from_step) == (0.0, 0)
    timed = tmp_path / "checkpoint-6"
    timed.mkdir()
    (timed / "training_time.json").write_text(json.dumps({"train_seconds": 1000.0, "global_step": 6}))
    (timed / "trainer_state.json").write_text(json.dumps({"global_step": 6}))
    clock = TrainingClock(timed)
    assert (clock.before, clock.from_step) == (1000.0, 0) and 1000.0 <= clock.seconds() < 1010.0
    # A checkpoint without the record: the time before it is unknown, and said to be.
    old = tmp_path / "checkpoint-8"
    old.mkdir()
    (old / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    with caplog.at_level("WARNING"):
        clock = TrainingClock(old)
    assert (clock.before, clock.from_step) == (0.0, 8) and clock.seconds() < 10.0
    assert "time trained before step 8 is unknown" in caplog.text


def test_tokens_per_second_counts_the_steps_the_clock_timed():
    from bert_repro.training.pretraining.examples import tokens_trained

    statistics = {"phase1": {"tokens": 1000, "examples": 10}, "phase2": {"tokens": 4000, "examples": 10}}
    assert tokens_trained(statistics, [90, 10], 2) == 90 * 2 * 100 + 10 * 2 * 400
    assert tokens_trained(statistics, [90, 10], 2, after_step=80) == 10 * 2 * 100 + 10 * 2 * 400
    assert tokens_trained(statistics, [90, 10], 2, after_step=95) == 5 * 2 * 400


@pytest.mark.slow
def test_resume_from_truncated_newest_checkpoint_matches_uninterrupted_run(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    steps = {"max_steps": 16, "save_steps": 6, "eval_steps": 100, "eval_fraction": 0.0, "phase2_fraction": 0.0}
    config = write_config(tmp_path / "tiny.yaml", corpus, tokenizer, **steps)
    full = tmp_path / "full"
    launch(config, full)

    broken = tmp_path / "broken"
    launch(config, broken, "--stop_after_steps", "9")  # checkpoint-6 (save_steps) and checkpoint-9 (the stop)
    assert (broken / "checkpoint-6").is_dir() and (broken / "checkpoint-9").is_dir()
    # Each checkpoint carries the training time up to it; the resumed run's time starts there (checkpoint-6:
    # checkpoint-9 is broken below), so its results are the whole run's, not the last invocation's.
    trained = json.loads((broken / "checkpoint-6" / "training_time.json").read_text())
    assert trained["global_step"] == 6 and trained["train_seconds"] > 0
    (broken / "checkpoint-6" / "training_time.json").write_text(json.dumps({"train_seconds": 1000.0, "global_step": 6}))
    truncate(broken / "checkpoint-9" / "model.safetensors")  # killed while saving
    (broken / "checkpoint-12").mkdir()  # killed before writing anything
    result = launch(config, broken, "--resume_from_checkpoint", "true")
    assert "skipped checkpoint-12: empty folder" in result.stderr
    assert "skipped checkpoint-9: model.safetensors cannot be read" in result.stderr
    assert "Traceback" not in result.stderr
    a, b = weights(full), weights(broken)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-6, worst
    results = json.loads((broken / "results.json").read_text())
    uninterrupted = json.loads((full / "results.json").read_text())["train_runtime_s"]
    assert 1000.0 < results["train_runtime_s"] < 1000.0 + uninterrupted * 5, results["train_runtime_s"]

    # No usable checkpoint at all: one message, exit code 2, nothing deleted.
    nothing = tmp_path / "nothing"
    launch(config, nothing, "--stop_after_steps", "3")
    truncate(nothing / "checkpoint-3" / "model.safetensors")
    # Without accelerate's launcher, which wraps a failed script in a traceback of its own.
    result = run_recipe(
        "pretrain.py", "--config", config, "--output_dir", nothing, "--resume_from_checkpoint", "true", timeout=600
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "No checkpoint in" in result.stderr and "checkpoint-3: model.safetensors cannot be read" in result.stderr
    assert "Traceback" not in result.stderr and (nothing / "checkpoint-3" / "trainer_state.json").exists()


# ---------------------------------------------------------------------------------------------------------
# Each check of a checkpoint folder, and the callbacks and helpers of a resumed run, on hand-made inputs.


def test_each_problem_is_said_in_its_own_words(tmp_path):
    assert checkpoint_problem(tmp_path / "nothing") == "not a folder"
    folder = fake_checkpoint(tmp_path / "checkpoint-3", 3)
    (folder / "trainer_state.json").unlink()
    assert checkpoint_problem(folder) == "trainer_state.json is missing"
    folder = fake_checkpoint(tmp_path / "checkpoint-4", 4)
    (folder / "model.safetensors").unlink()
    assert checkpoint_problem(folder) == "model.safetensors is missing"
    for name in ("rng_state.pth", "optimizer.bin"):
        folder = fake_checkpoint(tmp_path / name / "checkpoint-5", 5)
        torch.save({"state": {}}, folder / name)
        assert checkpoint_problem(folder) is None
        truncate(folder / name)
        assert checkpoint_problem(folder) == f"{name} is truncated or not a torch file"


def test_a_streamed_runs_position_must_be_there_and_readable(tmp_path):
    folder = fake_checkpoint(tmp_path / "checkpoint-6", 6)
    assert checkpoint_problem(folder) is None  # not streamed: no position needed
    assert checkpoint_problem(folder, streamed=True) == "data_state-rank0.json is missing (the stream's position)"
    with pytest.raises(NoUsableCheckpoint, match="checkpoint-6: data_state-rank0.json is missing"):
        newest_valid_checkpoint(tmp_path, streamed=True)
    (folder / "data_state-rank0.json").write_text(json.dumps({"position": 12}), encoding="utf-8")
    (folder / "data_state-rank1.json").write_text(json.dumps({"note": "é"}), encoding="utf-8")
    assert checkpoint_problem(folder, streamed=True) is None
    assert newest_valid_checkpoint(tmp_path, streamed=True) == folder
    (folder / "data_state-rank1.json").write_text('{"position": 1')
    assert checkpoint_problem(folder, streamed=True).startswith("data_state-rank1.json cannot be read (")
    assert checkpoint_problem(folder).startswith("data_state-rank1.json cannot be read (")


def test_sharded_weights_index_and_fsdp_folders(tmp_path):
    from safetensors.torch import save_file

    folder = fake_checkpoint(tmp_path / "checkpoint-7", 7)
    (folder / "model.safetensors").unlink()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for i, name in enumerate(shards):
        save_file({f"w{i}": torch.zeros(32, 32)}, str(folder / name))
    weight_map = {"w0": shards[0], "w1": shards[1], "w2": shards[1]}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}), encoding="utf-8")
    assert checkpoint_problem(folder) is None
    truncate(folder / shards[1])
    assert checkpoint_problem(folder).startswith(f"{shards[1]} cannot be read (")
    (folder / "model.safetensors.index.json").write_text('{"weight_m')
    assert checkpoint_problem(folder).startswith("model.safetensors.index.json cannot be read (")

    fsdp = fake_checkpoint(tmp_path / "checkpoint-8", 8)
    (fsdp / "model.safetensors").unlink()
    (fsdp / "pytorch_model_fsdp_0").mkdir()
    assert checkpoint_problem(fsdp) == "model.safetensors is missing"  # no .metadata: not written to the end
    (fsdp / "pytorch_model_fsdp_0" / ".metadata").write_bytes(b"x")
    assert checkpoint_problem(fsdp) is None


def test_checkpoint_to_resume_checks_what_it_is_given(tmp_path):
    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.pretraining.resume import checkpoint_to_resume

    assert checkpoint_to_resume(tmp_path, True) is None  # nothing saved yet
    for nothing in (None, False, ""):
        assert checkpoint_to_resume(tmp_path, nothing) is None
    good = fake_checkpoint(tmp_path / "checkpoint-5", 5)
    assert checkpoint_to_resume(tmp_path, True) == str(good)
    assert checkpoint_to_resume(tmp_path, str(good)) == str(good)
    with pytest.raises(NoUsableCheckpoint, match="data_state-rank0.json is missing"):
        checkpoint_to_resume(tmp_path, True, streamed=True)
    with pytest.raises(
        ConfigurationError, match=r"^Cannot resume from .*checkpoint-5: data_state-rank0.json is missing"
    ):
        checkpoint_to_resume(tmp_path, str(good), streamed=True)
    (good / "model.safetensors").unlink()
    with pytest.raises(
        ConfigurationError, match=r"^Cannot resume from .*checkpoint-5: model.safetensors is missing\.$"
    ):
        checkpoint_to_resume(tmp_path, str(good))


def test_forget_unstarted_run_removes_only_what_the_run_wrote(tmp_path):
    from bert_repro.training.lifecycle import RUN_CONFIG
    from bert_repro.training.pretraining.examples import TOKENIZER_DIR
    from bert_repro.training.pretraining.resume import forget_unstarted_run

    for keep in (False, True):
        out = tmp_path / f"run-{keep}"
        (out / TOKENIZER_DIR).mkdir(parents=True)
        (out / TOKENIZER_DIR / "vocab.txt").write_text("[PAD]\n")
        (out / RUN_CONFIG).write_text("{}")
        if keep:
            (out / "notes.txt").write_text("mine")
        forget_unstarted_run(out)
        assert (sorted(p.name for p in out.iterdir()) == ["notes.txt"]) if keep else not out.exists()
    forget_unstarted_run(tmp_path / "never-made")  # nothing there: nothing to do


def test_tokens_trained_per_phase_with_few_examples():
    from bert_repro.training.pretraining.examples import tokens_trained

    statistics = {f"phase{i}": {"tokens": 6 * i, "examples": 1} for i in (1, 2, 3)}
    statistics["phase2"]["examples"] = 0  # no examples counted: a tokens-per-example of tokens / 1
    # Phases of 2, 3 and 4 steps, batch 10: 2*10*6 + 3*10*12 + 4*10*18.
    assert tokens_trained(statistics, [2, 3, 4], 10) == 120 + 360 + 720
    assert tokens_trained(statistics, [2, 3, 4], 10, after_step=6) == 3 * 10 * 18


def test_stop_after_steps_counts_from_the_resumed_step():
    from bert_repro.training.pretraining.resume import StopAfterSteps

    callback = StopAfterSteps(3)
    state = SimpleNamespace(global_step=10, max_steps=20)
    callback.on_train_begin(None, state, None)
    stops = []
    for step in (11, 12, 13, 19, 20):
        state.global_step = step
        control = SimpleNamespace(should_save=False, should_training_stop=False)
        assert callback.on_step_end(None, state, control) is control
        stops.append((control.should_save, control.should_training_stop))
    # Stop at step 13 (3 steps after 10), and on every later step but the last (Trainer saves and stops there).
    assert stops == [(False, False), (False, False), (True, True), (True, True), (False, False)]


def test_a_longer_schedule_sets_the_rate_of_the_checkpoints_step():
    from bert_repro.training.pretraining.resume import LongerSchedule

    def scheduler(lr):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr * 10})
        return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda s: 1 - s / 100, lambda s: 0.5])

    plain = scheduler(1.0)
    for _ in range(40):
        plain.optimizer.step()
        plain.step()
    for group in plain.optimizer.param_groups:
        group["lr"] = 0.0  # as the shorter schedule left it
    LongerSchedule().on_train_begin(None, None, None, lr_scheduler=plain)
    assert [g["lr"] for g in plain.optimizer.param_groups] == pytest.approx([0.6, 5.0])
    assert plain.get_last_lr() == pytest.approx([0.6, 5.0])
    wrapped = scheduler(2.0)
    wrapped.last_epoch = 50
    LongerSchedule().on_train_begin(None, None, None, lr_scheduler=SimpleNamespace(scheduler=wrapped))
    assert [g["lr"] for g in wrapped.optimizer.param_groups] == pytest.approx([1.0, 10.0])
    other = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.3), 5)
    other.optimizer.param_groups[0]["lr"] = 0.0
    LongerSchedule().on_train_begin(None, None, None, lr_scheduler=other)  # not a LambdaLR: left alone
    assert other.optimizer.param_groups[0]["lr"] == 0.0


def test_the_clock_writes_its_record_into_rank_zeros_checkpoint(tmp_path, monkeypatch):
    import bert_repro.training.pretraining.resume as resume

    now = [1000.0]
    monkeypatch.setattr(resume.time, "time", lambda: now[0])
    clock = resume.TrainingClock(None)
    now[0] = 1100.0
    clock.on_train_begin(None, None, None)  # the clock starts when training does
    now[0] = 1112.34567
    (tmp_path / "checkpoint-7").mkdir()
    args = SimpleNamespace(output_dir=str(tmp_path))
    clock.on_save(args, SimpleNamespace(global_step=7, is_world_process_zero=False), None)
    assert not (tmp_path / "checkpoint-7" / "training_time.json").exists()
    clock.on_save(args, SimpleNamespace(global_step=7, is_world_process_zero=True), None)
    record = (tmp_path / "checkpoint-7" / "training_time.json").read_text()
    assert record == '{"train_seconds": 12.346, "global_step": 7}'  # one line
    clock.on_save(args, SimpleNamespace(global_step=9, is_world_process_zero=True), None)  # no such folder
    assert not (tmp_path / "checkpoint-9").exists()


def test_whole_run_loss_weights_each_logged_mean_by_its_steps():
    from bert_repro.training.pretraining.resume import whole_run_loss

    history = [
        {"loss": 9.0},  # no step: not a training log
        {"loss": 2.0, "step": 10},
        {"eval_loss": 7.0, "step": 10},
        {"loss": 1.0, "step": 30},
        {"loss": float("inf"), "step": 30},  # the same step again (the end of a resumed run): counted once
        {"loss": 9.0, "step": 20},
    ]
    assert whole_run_loss(history) == pytest.approx((2.0 * 10 + 1.0 * 20) / 30)
    assert whole_run_loss([{"eval_loss": 1.0, "step": 5}]) is None
    assert whole_run_loss([]) is None


# ---------------------------------------------------------------------------------------------------------
# The two phases in one run (bert_repro.training.pretraining.phases): configurations, steps, sampler, collators.


def test_phase_configs_and_steps():
    from bert_repro.data.pretraining_examples import PreTrainingDataConfig
    from bert_repro.training.pretraining import PreTrainingRecipe
    from bert_repro.training.pretraining.phases import phase_configs, phase_steps

    data = PreTrainingDataConfig(max_seq_length=64, max_predictions_per_seq=9, dupe_factor=3, random_seed=7)
    recipe = PreTrainingRecipe.from_args(["--output_dir", "unused", "--phase2_fraction", "0"])
    recipe = recipe.replace(max_seq_length=64, max_predictions_per_seq=9, dupe_factor=3, random_seed=7)
    assert phase_configs(recipe) == [data]
    recipe = recipe.replace(phase2_fraction=0.1, phase2_max_seq_length=256, phase2_max_predictions_per_seq=40)
    first, second = phase_configs(recipe)
    assert first == data
    assert second == PreTrainingDataConfig(max_seq_length=256, max_predictions_per_seq=40, dupe_factor=3, random_seed=7)
    assert phase_steps(1000, 0.1, 2) == [900, 100] and phase_steps(7, 0.5, 1) == [7]
    assert phase_steps(10, 0.25, 2) == [8, 2]  # round(2.5) = 2
    assert phase_steps(10, 0.35, 2) == [6, 4]  # round(3.5) = 4
    assert phase_steps(5, 0.01, 2) == [4, 1]  # at least one step in phase 2


def test_phased_sampler_draws_each_phase_in_reshuffled_passes():
    import numpy as np

    from bert_repro.training.pretraining.phases import PhasedSampler

    sizes, samples = [3, 0, 4], [7, 0, 2]
    sampler = PhasedSampler(sizes, samples, seed=5)
    rng = np.random.default_rng(5)
    expected = []
    for offset, size, n in ((0, 3, 7), (3, 4, 2)):  # passes of 3, 3 and 1 over phase 1; 2 of phase 3's 4
        drawn = 0
        while drawn < n:
            order = rng.permutation(size)[: n - drawn]
            expected += (offset + order).tolist()
            drawn += len(order)
    assert list(sampler) == expected and len(sampler) == 9
    assert sorted(expected[:3]) == sorted(expected[3:6]) == [0, 1, 2] and set(expected[7:]) <= {3, 4, 5, 6}
    with pytest.raises(ValueError, match=r"A phase has no examples to draw from \(sizes \[4, 0\]\)"):
        PhasedSampler([4, 0], [2, 1], seed=0)


def test_packed_rows_default_to_one_row_per_example():
    from bert_repro.training.pretraining.phases import packed_rows

    assert packed_rows({}, 2) == [1.0, 1.0]
    assert packed_rows({"phase1": {"examples": 3}}, 2) == [1.0, 1.0]


@pytest.fixture(scope="module")
def small_tokenizer():
    from bert_repro.data.wordpiece import train_wordpiece

    return train_wordpiece(iterator=["the cat sat on the mat", "a dog ran"] * 3, vocab_size=60, show_progress=False)


def test_phase_collator_builds_each_phases_collators(small_tokenizer):
    from bert_repro.data.pack_examples import PackingCollator
    from bert_repro.data.pretraining_examples import PreTrainingCollator, PreTrainingDataConfig
    from bert_repro.training.pretraining.phases import PhaseCollator

    phases = [
        PreTrainingDataConfig(max_seq_length=16, max_predictions_per_seq=3, static_masking=False, masked_lm_prob=0.2),
        PreTrainingDataConfig(max_seq_length=32, max_predictions_per_seq=5),
    ]

    def described(pairs):
        """(length, class, dynamic_masking, max_predictions_per_seq, masked_lm_prob, the packing collator's fields)."""
        packing = ("max_seq_length", "fixed_shape", "rows_per_example")
        masking = ("dynamic_masking", "max_predictions_per_seq", "masked_lm_prob")
        return [
            (n, type(c).__name__, *(getattr(c, a) for a in masking), *(getattr(c, a, None) for a in packing))
            for n, c in pairs
        ]

    plain = PhaseCollator(small_tokenizer, phases)
    assert described(plain.collators) == [
        (16, "PreTrainingCollator", True, 3, 0.2, None, None, None),
        (32, "PreTrainingCollator", False, 5, 0.15, None, None, None),
    ]
    assert described(plain.static) == [
        (16, "PreTrainingCollator", False, 3, 0.15, None, None, None),
        (32, "PreTrainingCollator", False, 5, 0.15, None, None, None),
    ]
    packed = PhaseCollator(small_tokenizer, phases, packing=True)
    assert described(packed.collators) == [
        (16, "PackingCollator", True, 3, 0.2, 16, False, 1.0),
        (32, "PackingCollator", False, 5, 0.15, 32, False, 1.0),
    ]
    assert described(packed.static) == [
        (16, "PackingCollator", False, 3, 0.15, 16, False, 1.0),
        (32, "PackingCollator", False, 5, 0.15, 32, False, 1.0),
    ]
    compiled = PhaseCollator(small_tokenizer, phases, packing=True, compiled=True, rows_per_example=[0.5, 0.75])
    assert [row[5:] for row in described(compiled.collators)] == [(16, True, 0.5), (32, True, 0.75)]
    assert [row[5:] for row in described(compiled.static)] == [(16, True, 0.5), (32, True, 0.75)]
    compiled = PhaseCollator(small_tokenizer, phases, packing=True, compiled=True)
    assert [row[5:] for row in described(compiled.static)] == [(16, True, 1.0), (32, True, 1.0)]
    unpacked = PhaseCollator(small_tokenizer, phases, compiled=True, rows_per_example=[0.5, 0.75])
    assert all(isinstance(c, PreTrainingCollator) and not isinstance(c, PackingCollator) for _, c in unpacked.static)
    with pytest.raises(ValueError):
        PhaseCollator(small_tokenizer, phases, rows_per_example=[0.5])  # one share per phase


def test_phase_collator_routes_a_batch_by_its_longest_row(small_tokenizer):
    from bert_repro.data.pretraining_examples import PreTrainingDataConfig
    from bert_repro.training.pretraining.phases import PhaseCollator

    phases = [PreTrainingDataConfig(max_seq_length=n) for n in (16, 32, 64)]
    collator = PhaseCollator(small_tokenizer, phases)

    def named(name):
        return lambda features: (name, features)

    collator.collators = [(n, named(f"phase {i}")) for i, n in enumerate((16, 32, 64), start=1)]
    collator.static = [(n, named(f"phase {i}, stored masks")) for i, n in enumerate((16, 32, 64), start=1)]

    def batch(*lengths, stored=False):
        return [{"input_ids": [5] * n, **({"masked_lm_positions": [1]} if stored else {})} for n in lengths]

    for lengths, stored, expected in [
        ((4, 16), False, "phase 1"),
        ((17, 3), False, "phase 2"),
        ((33,), False, "phase 3"),
        ((90,), False, "phase 3"),  # longer than every phase: the last
        ((16,), True, "phase 1, stored masks"),
        ((30,), True, "phase 2, stored masks"),
        ((99,), True, "phase 3, stored masks"),
    ]:
        features = batch(*lengths, stored=stored)
        name, passed = collator(features)
        assert name == expected and passed is features, (lengths, stored)
