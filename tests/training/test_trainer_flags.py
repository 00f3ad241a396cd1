"""Every TrainingArguments field that fine-tuning's `--help` lists, given a value other than its default, runs a
fine-tuning grid to the end or is refused in one line before any work. The fields a recipe must not take from a user
here (the Hub's, the engines', mixed precision on a CPU) have tests of their own."""

import dataclasses

import pytest
from support.task_files import finetune_args, fixture_files, write
from transformers import TrainingArguments

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning

pytestmark = pytest.mark.slow

SET_BY_THE_TEST = {"output_dir", "use_cpu", "disable_tqdm", "per_device_train_batch_size", "num_train_epochs"}
ELSEWHERE = {  # tested elsewhere (test_hub, test_distributed, test_cuda, test_recipe_errors, test_trainer_outputs)
    *("hub_token", "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision"),
    *("push_to_hub", "deepspeed", "fsdp", "fsdp_config", "local_rank", "resume_from_checkpoint", "accelerator_config"),
    *("parallelism_config", "ddp_backend", "bf16", "fp16", "bf16_full_eval", "fp16_full_eval", "tf32"),
    *("run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "debug"),
    *("use_liger_kernel", "liger_kernel_config", "optim_target_modules", "max_steps", "learning_rate", "seed"),
    *("do_train", "do_eval", "do_predict"),
}
VALUES = {
    "optim": ["adamw_torch", "sgd", "adafactor"],
    "lr_scheduler_type": ["cosine", "constant", "reduce_lr_on_plateau", "polynomial"],
    "lr_scheduler_kwargs": ['{"power": 2.0}'],
    "optim_args": ["foo=bar"],
    "report_to": ["none", "all"],
    "eval_strategy": ["no", "steps"],
    "save_strategy": ["no", "steps", "best"],
    "logging_strategy": ["epoch", "no"],
    "eval_delay": [1.0],
    "warmup_steps": [1],
    "label_names": ["labels"],
    "include_for_metrics": ["inputs"],
    "length_column_name": ["length"],
    "torch_compile_backend": ["eager"],
    "torch_compile_mode": ["default"],
    "dataloader_multiprocessing_context": ["spawn"],
    "train_sampling_strategy": ["sequential", "group_by_length"],
    "log_level": ["warning"],
    "log_level_replica": ["error"],
    "neftune_noise_alpha": [5.0],
    "torch_empty_cache_steps": [1],
    "include_num_input_tokens_seen": ["all"],
    "eval_steps": [1],
    "eval_accumulation_steps": [1],
    "save_total_limit": [2],
    "metric_for_best_model": ["accuracy", "f1"],
    "greater_is_better": [False],
    "data_seed": [3],
    "dataloader_prefetch_factor": [2],
    "ddp_find_unused_parameters": [True],
    "ddp_bucket_cap_mb": [25],
    "ddp_broadcast_buffers": [False],
    "ddp_static_graph": [True],
    "activation_checkpointing": [True],
    "gradient_checkpointing": [True],
    "activation_checkpointing_kwargs": ['{"use_reentrant": false}'],
    "gradient_checkpointing_kwargs": ['{"use_reentrant": false}'],
}


def trials() -> list[tuple[str, str]]:
    out = []
    for f in dataclasses.fields(TrainingArguments):
        if f.name in SET_BY_THE_TEST | ELSEWHERE or not f.init:
            continue
        default = None if f.default is dataclasses.MISSING else f.default
        if f.name in VALUES:
            values = VALUES[f.name]
        elif isinstance(default, bool):
            values = [not default]
        elif isinstance(default, int):
            values = [default + 1]
        elif isinstance(default, float):
            values = [0.5]
        else:
            values = []
        assert values, f"--{f.name}: no value to try (a new TrainingArguments field: add it to VALUES)"
        out += [(f.name, str(value)) for value in values]
    return out


@pytest.mark.parametrize("name, value", trials())
def test_every_trainer_flag_runs_or_is_refused_before_work(tmp_path, tiny_model, name, value):
    data = write(tmp_path / "data", fixture_files("sst2"))
    out = tmp_path / "out"
    small = dict(learning_rates="1e-4", per_device_train_batch_size=2, num_train_epochs=2, max_seq_length=32)
    argv = finetune_args("sst2", tiny_model, data, out, f"--{name}", value, **small)
    try:
        run_finetuning(FineTuningRecipe.from_args(argv))
    except ConfigurationError as refused:
        assert "\n" not in str(refused).strip() and not out.exists(), str(refused)
        return
    except SystemExit as stop:  # argparse: a value outside the field's choices
        assert stop.code == 2 and not out.exists()
        return
    assert (out / "results.json").exists() and (out / "runs" / "lr0.0001_seed42" / "trainer_state.json").exists()
