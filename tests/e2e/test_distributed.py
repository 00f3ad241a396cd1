"""The engines of recipes/accelerate/ (FSDP2, DeepSpeed ZeRO-2) with two CPU processes (gloo), against one process
with the same global batch: the same weights, resumption from their own checkpoints, one model.safetensors that our
class and transformers' Auto classes load, fine-tuning under FSDP; and every shipped accelerate config parses.

TOLERANCE (float32): both runs add the same per-sequence gradients in another order, a 1e-7 relative rounding that 8
AdamW steps carry into the weights (6e-8 to 1.2e-7 measured). 1e-5 is a hundred times that and a hundred times below
one step's change at lr 2e-3, so a step done differently (loss scaled by the process count, a batch seen twice) fails.
Gradient norms are compared too, because AdamW's update barely changes when every gradient is scaled alike."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import ROOT
from support.models import tiny_config
from support.pretraining_runs import ONE_PROCESS, accelerate_launch, hide_packages, run_recipe, write_config
from support.task_files import finetune_args, fixture_files, write

ACCELERATE = ROOT / "recipes" / "accelerate"
TOLERANCE = 1e-5


def has_deepspeed() -> bool:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return False
    return True


def engine(config_name: str) -> list[str]:
    return ["--config_file", str(ACCELERATE / config_name), "--main_process_port", "0"]


def pretrain_under(accelerate_config, config, output_dir, *extra):
    """Pre-training of `config` under recipes/accelerate/`accelerate_config` (or that file elsewhere)."""
    args = ("--config", config, "--output_dir", output_dir, *extra)
    return accelerate_launch(engine(accelerate_config), "pretrain.py", *args)


def worst_difference(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max((a[k] - b[k]).abs().max().item() for k in a)


def training_log(directory: Path) -> list[dict]:
    return [e for e in json.loads((directory / "log_history.json").read_text()) if "grad_norm" in e]


def assert_same_training(one: Path, many: Path) -> None:
    """Same weights within TOLERANCE, and the same loss and gradient norm at every step."""
    worst = worst_difference(load_file(one / "model.safetensors"), load_file(many / "model.safetensors"))
    assert worst < TOLERANCE, worst
    steps_one, steps_many = training_log(one), training_log(many)
    assert len(steps_one) == len(steps_many) == 8
    for a, b in zip(steps_one, steps_many):
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 * a["grad_norm"], (a, b)
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a, b)


# --- The shipped accelerate configs


@pytest.mark.parametrize("path", sorted(ACCELERATE.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_accelerate_config_parses(path):
    """accelerate's own loader (what `accelerate launch --config_file` reads): an unknown or misspelt key fails."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from bert_repro.model import modeling_bert_repro

    config = load_config_from_file(str(path))
    assert config.num_processes >= 2 and config.num_machines == 1
    on_cpu = path.stem.endswith("_cpu")
    assert bool(config.use_cpu) == on_cpu
    if config.distributed_type == DistributedType.FSDP:
        fsdp = config.fsdp_config
        assert fsdp["fsdp_version"] == 2  # FSDP1 cannot run on CPU; FSDP2 is what the CPU tests prove
        assert hasattr(modeling_bert_repro, fsdp["fsdp_transformer_layer_cls_to_wrap"])
        assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"
        assert config.mixed_precision == ("no" if on_cpu else "bf16")
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            auto_wrap_policy=fsdp["fsdp_auto_wrap_policy"],
            transformer_cls_names_to_wrap=fsdp["fsdp_transformer_layer_cls_to_wrap"],
            state_dict_type=fsdp["fsdp_state_dict_type"],
            cpu_ram_efficient_loading=fsdp["fsdp_cpu_ram_efficient_loading"],
            reshard_after_forward=fsdp["fsdp_reshard_after_forward"],
        )
        assert plugin.transformer_cls_names_to_wrap == ["BertReproLayer"]
    elif config.distributed_type == DistributedType.DEEPSPEED:
        ds_file = ROOT / config.deepspeed_config["deepspeed_config_file"]
        ds = json.loads(ds_file.read_text())
        assert config.mixed_precision is None  # accelerate refuses it next to a DeepSpeed config file
        assert ds["zero_optimization"]["stage"] == 2
        # Trainer fills these from the recipe's arguments; the recipe's optimizer and schedule are used.
        batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
        for key in (*batch, "gradient_clipping"):
            assert ds[key] == "auto", key
        assert ds["bf16"]["enabled"] == "auto"
        assert "optimizer" not in ds and "scheduler" not in ds
    else:
        assert config.distributed_type == DistributedType.MULTI_GPU


def test_engine_checks_name_the_fix(monkeypatch):
    from transformers import TrainingArguments

    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.distributed import check_deepspeed_installed, check_engine

    cpu = TrainingArguments(output_dir="unused", use_cpu=True)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ConfigurationError, match="lamb cannot run under DeepSpeed ZeRO"):
        check_engine(cpu, optimizer="lamb")
    check_engine(cpu, optimizer="bert_adam")
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'bert-repro\[deepspeed\]'"):
        check_deepspeed_installed([])
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    check_deepspeed_installed([])  # not asked for: fine without it
    with pytest.raises(ConfigurationError, match="not installed"):
        check_deepspeed_installed(["--deepspeed", "ds.json"])

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(ConfigurationError, match="FSDP1 cannot run on CPU processes"):
        check_engine(cpu)
    monkeypatch.setenv("FSDP_VERSION", "2")
    check_engine(cpu)

    if not torch.cuda.is_available():
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(ConfigurationError, match="--use_cpu true"):
            check_engine(TrainingArguments(output_dir="unused", use_cpu=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="accelerate starts the processes asked for on a GPU")
def test_one_process_started_for_several_on_a_cpu_is_refused(monkeypatch):
    # `accelerate launch --cpu --num_processes 2` (or without --cpu, on a machine without a GPU) starts ONE process
    # with this environment: MASTER_ADDR for a world it never makes, and no WORLD_SIZE (torchrun's).
    from transformers import TrainingArguments

    from bert_repro.training.cli import ConfigurationError
    from bert_repro.training.distributed import check_engine

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    cpu = TrainingArguments(output_dir="unused", use_cpu=True)
    with pytest.raises(ConfigurationError, match="started one .* recipes/accelerate/ddp_cpu.yaml"):
        check_engine(cpu)
    monkeypatch.setenv("WORLD_SIZE", "2")  # the processes torchrun starts for ddp_cpu.yaml
    check_engine(cpu)
    monkeypatch.delenv("MASTER_ADDR")
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process, as asked
    check_engine(cpu)


@pytest.mark.slow
def test_deepspeed_missing_stops_the_recipe_with_exit_code_2(tmp_path, corpus_and_tokenizer):
    """A `deepspeed` that cannot be imported, under the DeepSpeed engine: one message naming the extra."""
    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer)
    env = {**hide_packages(tmp_path, "deepspeed"), "ACCELERATE_USE_DEEPSPEED": "true"}
    result = run_recipe("pretrain.py", "--config", config, "--output_dir", tmp_path / "out", env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "pip install 'bert-repro[deepspeed]'" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


# --- Pre-training: one process against two under FSDP2 / DeepSpeed ZeRO-2


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_and_tokenizer):
    """Configs of the same run (global batch 8, seed, data): one process with batches of 8, and two processes with
    batches of 2 and 2 accumulation steps; and the one-process run itself, the reference."""
    corpus, tokenizer = corpus_and_tokenizer
    root = tmp_path_factory.mktemp("engines")
    common = {"eval_fraction": 0.0, "save_steps": 100, "global_batch_size": 8}
    single = write_config(root / "single.yaml", corpus, tokenizer, per_device_train_batch_size=8, **common)
    double = write_config(root / "double.yaml", corpus, tokenizer, per_device_train_batch_size=2, **common)
    accelerate_launch(ONE_PROCESS, "pretrain.py", "--config", single, "--output_dir", root / "one")
    return root, double


def results(directory: Path) -> dict:
    return json.loads((directory / "results.json").read_text())


@pytest.fixture(scope="module")
def fsdp_run(runs):
    root, double = runs
    pretrain_under("fsdp_cpu.yaml", double, root / "fsdp")
    return root / "fsdp"


@pytest.mark.slow
def test_fsdp_two_processes_match_one_process(runs, fsdp_run):
    root, _ = runs
    one, two = results(root / "one"), results(fsdp_run)
    assert (one["engine"], one["processes"], one["gradient_accumulation_steps"]) == ("single process", 1, 1)
    assert (two["engine"], two["processes"], two["gradient_accumulation_steps"]) == ("FSDP2", 2, 2)
    assert_same_training(root / "one", fsdp_run)


@pytest.mark.slow
def test_fsdp_final_model_is_one_loadable_safetensors(runs, fsdp_run):
    from transformers import AutoModel, AutoModelForPreTraining

    from bert_repro import BertReproForPreTraining

    root, _ = runs
    saved = load_file(fsdp_run / "model.safetensors")
    # The same files as the one-process run: our code for remote loading (not torch's FSDP modules, whose class the
    # sharded model has), no FSDP leftovers, tied weights stored once.
    assert sorted(p.name for p in fsdp_run.glob("*.py")) == sorted(p.name for p in (root / "one").glob("*.py"))
    assert (fsdp_run / "modeling_bert_repro.py").exists() and not list(fsdp_run.glob("_fsdp*"))
    assert not list(fsdp_run.glob("pytorch_model_fsdp*")) and "cls.predictions.decoder.weight" not in saved
    ours = BertReproForPreTraining.from_pretrained(fsdp_run)
    assert torch.equal(ours.bert.embeddings.word_embeddings.weight, saved["bert.embeddings.word_embeddings.weight"])
    assert ours.cls.predictions.decoder.weight is ours.bert.embeddings.word_embeddings.weight
    native = AutoModelForPreTraining.from_pretrained(fsdp_run)
    assert type(native).__name__ == "BertForPreTraining"
    assert torch.equal(
        native.bert.encoder.layer[1].output.dense.weight, saved["bert.encoder.layer.1.output.dense.weight"]
    )
    assert type(AutoModel.from_pretrained(fsdp_run)).__name__ == "BertModel"


@pytest.mark.slow
def test_fsdp_resumes_from_its_checkpoint(runs, fsdp_run):
    root, double = runs
    resumed = root / "fsdp_resumed"
    pretrain_under("fsdp_cpu.yaml", double, resumed, "--stop_after_steps", "3")
    checkpoint = resumed / "checkpoint-3"
    # FSDP's own checkpoint: the gathered model, the optimizer state of both processes, each process's RNG state.
    for name in ("pytorch_model_fsdp.bin", "optimizer.bin", "rng_state_0.pth", "rng_state_1.pth", "model.safetensors"):
        assert (checkpoint / name).exists(), name
    assert not (resumed / "model.safetensors").exists()
    result = pretrain_under("fsdp_cpu.yaml", double, resumed, "--resume_from_checkpoint", "true")
    assert "Loading Optimizer state from" in result.stderr + result.stdout  # FSDP's loader, not a fresh start
    assert [e["step"] for e in training_log(resumed)] == list(range(1, 9))
    worst = worst_difference(load_file(fsdp_run / "model.safetensors"), load_file(resumed / "model.safetensors"))
    assert worst < 1e-6, worst


@pytest.mark.slow
def test_a_requeued_finished_run_says_so_once(runs, fsdp_run):
    """Both processes find the run finished; one line says it, and the exit status stays 0."""
    _, double = runs
    again = pretrain_under("fsdp_cpu.yaml", double, fsdp_run, "--resume_from_checkpoint", "true")
    said = [line for line in again.stderr.splitlines() if "already holds this run, finished" in line]
    assert len(said) == 1, again.stderr[-3000:]


@pytest.mark.slow
def test_fsdp_sharded_checkpoints_still_end_in_one_model(runs, fsdp_run):
    """SHARDED_STATE_DICT: checkpoints are torch.distributed.checkpoint folders (and count as complete for
    resuming); the final output is still the whole model, gathered for that save."""
    from bert_repro.training.checkpoints import checkpoint_problem

    root, double = runs
    sharded_config = root / "fsdp_sharded.yaml"
    sharded_config.write_text(
        (ACCELERATE / "fsdp_cpu.yaml")
        .read_text()
        .replace("fsdp_state_dict_type: FULL_STATE_DICT", "fsdp_state_dict_type: SHARDED_STATE_DICT")
    )
    out = root / "fsdp_sharded"
    pretrain_under(sharded_config, double, out, "--save_steps", "4")
    checkpoint = out / "checkpoint-4"
    assert (checkpoint / "pytorch_model_fsdp_0" / ".metadata").exists()
    assert not (checkpoint / "model.safetensors").exists() and checkpoint_problem(checkpoint) is None
    assert worst_difference(load_file(fsdp_run / "model.safetensors"), load_file(out / "model.safetensors")) < 1e-6


@pytest.mark.slow
@pytest.mark.skipif(not has_deepspeed(), reason="deepspeed is not installed (pip install 'bert-repro[deepspeed]')")
def test_deepspeed_zero2_two_processes_match_one_process(runs):
    """DeepSpeed's CPU accelerator over gloo; its shared-memory collective is compiled the first time (minutes)."""
    root, double = runs
    pretrain_under("deepspeed_zero2_cpu.yaml", double, root / "ds")
    two = results(root / "ds")
    assert (two["engine"], two["processes"], two["gradient_accumulation_steps"]) == ("DeepSpeed ZeRO-2", 2, 2)
    assert_same_training(root / "one", root / "ds")
    assert (root / "ds" / "modeling_bert_repro.py").exists()
    assert "cls.predictions.decoder.weight" not in load_file(root / "ds" / "model.safetensors")


@pytest.mark.slow
@pytest.mark.skipif(not has_deepspeed(), reason="deepspeed is not installed (pip install 'bert-repro[deepspeed]')")
def test_deepspeed_zero2_resumes_from_its_checkpoint(runs):
    """Stopped after 3 of 8 steps and resumed from DeepSpeed's own checkpoint (read by DeepSpeed, which unpickles:
    this run wrote it): the same steps and weights as the uninterrupted one-process run."""
    root, double = runs
    resumed = root / "ds_resumed"
    pretrain_under("deepspeed_zero2_cpu.yaml", double, resumed, "--stop_after_steps", "3")
    checkpoint = resumed / "checkpoint-3"
    # DeepSpeed's checkpoint: its global_step folder (model and the partitioned optimizer states of both
    # processes), each process's RNG state, and our whole model beside it.
    assert list(checkpoint.glob("global_step3/*optim_states.pt")), sorted(p.name for p in checkpoint.rglob("*"))
    for name in ("rng_state_0.pth", "rng_state_1.pth", "model.safetensors"):
        assert (checkpoint / name).exists(), name
    assert not (resumed / "model.safetensors").exists()
    resume = ("--resume_from_checkpoint", "true", "--log_level", "info")
    result = pretrain_under("deepspeed_zero2_cpu.yaml", double, resumed, *resume)
    # Trainer continued at step 3 (a fresh start would end in the same weights too).
    assert "Resuming training from checkpoint with epoch 0 and global step 3" in result.stdout + result.stderr
    assert [e["step"] for e in training_log(resumed)] == list(range(1, 9))
    assert results(resumed)["engine"] == "DeepSpeed ZeRO-2"
    worst = worst_difference(load_file(root / "one" / "model.safetensors"), load_file(resumed / "model.safetensors"))
    assert worst < TOLERANCE, worst


# --- Fine-tuning under FSDP2


@pytest.mark.slow
def test_finetuning_under_fsdp_matches_one_process(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from bert_repro import BertReproForPreTraining
    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

    files = fixture_files("mrpc")
    tokenizer = train_wordpiece(iterator=list(files.values()) * 3, vocab_size=300, show_progress=False)
    model_dir = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=512, **no_dropout)
    BertReproForPreTraining(config).save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    data = write(tmp_path / "data", files)
    args = finetune_args("mrpc", model_dir, data, learning_rates="1e-3", max_steps=3, max_seq_length=64)
    accelerate_launch(
        ONE_PROCESS, "finetune.py", *args, "--output_dir", tmp_path / "one", "--per_device_train_batch_size", "2"
    )
    accelerate_launch(
        engine("fsdp_cpu.yaml"),
        "finetune.py",
        *args,
        "--output_dir",
        tmp_path / "fsdp",
        "--per_device_train_batch_size",
        "1",
    )
    assert json.loads((tmp_path / "fsdp" / "results.json").read_text())["best"]["engine"] == "FSDP2"
    fine_tuned, reference = (load_file(tmp_path / d / "model.safetensors") for d in ("fsdp", "one"))
    assert worst_difference(fine_tuned, reference) < TOLERANCE
    start = load_file(model_dir / "model.safetensors")
    assert max((fine_tuned[k] - start[k]).abs().max().item() for k in start if k in fine_tuned) > 100 * TOLERANCE
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "fsdp")
    assert torch.equal(loaded.classifier.weight, fine_tuned["classifier.weight"])
