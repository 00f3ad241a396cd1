"""The engines behind `accelerate launch --config_file recipes/accelerate/<engine>.yaml` (DDP, FSDP2, DeepSpeed
ZeRO-2) for both recipes. `check_engine` refuses what the processes cannot run before any work; `EngineTrainer`
shards with FSDP2 on CPU processes too (accelerate 1.15 silently drops its FSDP plugin for MULTI_CPU, though
`fully_shard` runs on gloo), stages every save under `.saving/` and saves the final model whole; `engine`
records what really ran, so a silent fall-back shows in results.json.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from accelerate.utils import parse_flag_from_env
from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import rotate_checkpoints

from ..atomic import write_json
from .checkpoints import checkpoints_newest_first
from .cli import ConfigurationError, accelerator_available
from .cluster import STAGING, StopOnSignal, catching_stop_signals, disk_full, folder_bytes, publish

DEEPSPEED_EXTRA = "pip install 'bert-repro[deepspeed]'"
TRUE = ("yes", "true", "t", "y", "1")  # as transformers' HfArgumentParser reads a boolean flag


def requested_engine() -> str:
    """The engine `accelerate launch` asked for: 'fsdp', 'deepspeed' or 'ddp' (one or several plain processes)."""
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if parse_flag_from_env("ACCELERATE_USE_FSDP"):
        return "fsdp"
    return "ddp"


def _given(argv: list[str], name: str):
    """`--name`'s value on the command line (the last; True without one), else `name:` in the recipe's `--config`
    YAML; None when neither gives it. For the checks made before the recipe parses its arguments."""
    value = None
    for at, arg in enumerate(argv):
        if arg == f"--{name}":
            value = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("--") else True
        elif arg.startswith(f"--{name}="):
            value = arg.partition("=")[2]
    if value is None and "--config" in argv and argv.index("--config") + 1 < len(argv):
        import yaml

        try:
            with open(argv[argv.index("--config") + 1]) as file:
                values = yaml.safe_load(file)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return None  # the recipe's own parsing names the file and the problem
        value = values.get(name) if isinstance(values, dict) else None
    return value


def _refuse(message: str) -> None:
    """A fault every process finds alike: the first process of each machine says it (the recipe prints it, exit
    code 2) once the others have left quietly with 0, so that torchrun reports one failure, not one per process
    and the others stopped by its SIGTERM."""
    if int(os.environ.get("LOCAL_RANK", "0") or 0) > 0:
        sys.exit(0)
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun's processes: the others are this one's siblings
        import psutil  # accelerate's dependency

        me = psutil.Process()
        psutil.wait_procs([p for p in me.parent().children() if p.pid != me.pid], timeout=120)
    raise ConfigurationError(message) from None  # a refusal, not a consequence of what was being handled


def check_deepspeed_installed(argv: list[str]) -> None:
    """The checks the command line allows before TrainingArguments: DeepSpeed asked for but not installed (it then
    fails with an unrelated TypeError), and several processes without a GPU nor --use_cpu (said before the
    processes print anything else)."""
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    use_cpu = parse_flag_from_env("ACCELERATE_USE_CPU") or str(_given(argv, "use_cpu")).lower() in TRUE
    # Only the process's own command line: from Python, `replace(use_cpu=True)` may follow (check_engine sees it).
    if argv == sys.argv[1:] and launched > 1 and not use_cpu and not accelerator_available():
        _refuse(
            f"{launched} processes were launched on a machine without a GPU, without --use_cpu true. On CPUs: "
            "accelerate launch --config_file recipes/accelerate/ddp_cpu.yaml (two processes), the recipe and its "
            "arguments, then --use_cpu true; one process: python instead of accelerate launch."
        )
    if requested_engine() != "deepspeed" and not _given(argv, "deepspeed"):
        return
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        _refuse(
            "The DeepSpeed engine was asked for (accelerate config distributed_type: DEEPSPEED, or --deepspeed) but "
            f"the deepspeed package is not installed: {DEEPSPEED_EXTRA}."
        )


def _one_process_of_several() -> bool:
    """Whether accelerate started one process for `--num_processes N > 1` (without a GPU it exports MASTER_ADDR but
    no world size, which torchrun and MPI export)."""
    sizes = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    env = os.environ
    return "ACCELERATE_USE_CPU" in env and "MASTER_ADDR" in env and not any(map(env.get, sizes))


# Optimizers whose update reads whole tensors (LAMB's trust ratio): ZeRO's flat partitions cut across tensors.
# FSDP2's DTensors have global norms and run them unchanged.
PER_TENSOR_OPTIMIZERS = ("lamb",)


def check_engine(training, *, optimizer: str | None = None) -> None:
    """Refuse before any work an engine setting these processes cannot run (`optimizer`: pre-training's)."""
    on_cpu = training.use_cpu or parse_flag_from_env("ACCELERATE_USE_CPU")  # TrainingArguments reads both
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if _one_process_of_several() and not accelerator_available():
        _refuse(
            "accelerate launch was asked for several processes on a machine without a GPU and started one (its --cpu "
            "and MULTI_CPU launches do). For several CPU processes: accelerate launch --config_file "
            "recipes/accelerate/ddp_cpu.yaml ... --use_cpu true; for one, leave out --num_processes (and MASTER_ADDR)."
        )
    if launched > 1 and not on_cpu and not accelerator_available():
        _refuse(
            f"{launched} processes were launched on a machine without a GPU, but --use_cpu is false: "
            "they would not train as one job (accelerate gives each its own world, DeepSpeed sees a batch size that "
            "does not add up). Pass --use_cpu true (or use_cpu: true in the recipe's YAML config)."
        )
    if requested_engine() == "deepspeed" and optimizer in PER_TENSOR_OPTIMIZERS:
        _refuse(
            f"--optimizer {optimizer} cannot run under DeepSpeed ZeRO: its trust ratio needs whole tensors and ZeRO "
            "gives the optimizer flat partitions across tensors. Use FSDP (recipes/accelerate/fsdp.yaml) or DDP for "
            f"{optimizer}, or --optimizer adamw / bert_adam with DeepSpeed."
        )
    fsdp1 = os.environ.get("FSDP_VERSION", "1").strip() != "2"  # accelerate's default is FSDP1
    if requested_engine() == "fsdp" and fsdp1 and (on_cpu or not accelerator_available()):
        _refuse(
            'FSDP1 cannot run on CPU processes (torch: "Inconsistent compute device and `device_id` on rank 0: '
            'cpu vs cpu:0"). Set fsdp_version: 2 in the accelerate config (as recipes/accelerate/fsdp_cpu.yaml).'
        )


class EngineTrainer(Trainer):
    """Trainer for every engine the accelerate configs name; both recipes train with it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop_on_signal = StopOnSignal(self.accelerator)
        self.add_callback(self.stop_on_signal)
        self._staged = None  # (run directory, output_dir) while a checkpoint is being written under .saving/

    def train(self, *args, **kwargs):
        with catching_stop_signals():
            return super().train(*args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        """Trainer's checkpoint, written under `.saving/` (`args.output_dir` points there, for the callbacks'
        `on_save` too); `_maybe_log_save_evaluate` then gives the complete folder its name."""
        run_dir = Path(self._get_output_dir(trial))
        self._clear_staging(run_dir)  # what a killed save left
        self.accelerator.wait_for_everyone()
        self._staged = (run_dir, self.args.output_dir)
        self.args.output_dir = str(run_dir / STAGING)
        super()._save_checkpoint(model, trial)  # its rotation sees one staged checkpoint: deletes nothing

    def _maybe_log_save_evaluate(self, *args, **kwargs) -> None:
        if self.control.should_save or self.control.should_training_stop:
            # A checkpoint's log history covers every step before it: a resumed run's `whole_run_loss` reads it.
            self.control.should_log = True
        try:
            super()._maybe_log_save_evaluate(*args, **kwargs)
        except Exception as err:
            if self._staged is None:
                raise
            run_dir = self._unstage()
            newest = checkpoints_newest_first(run_dir)
            # The last checkpoint's size, or the weights and Adam's two moments.
            needed = folder_bytes(newest[0]) if newest else 3 * self._model_bytes()
            self._failed_save(err, run_dir, needed, f"checkpoint-{self.state.global_step}")
            raise
        if self._staged is not None:
            run_dir = self._unstage()
            self.accelerator.wait_for_everyone()  # every process's files are in
            if self.args.should_save:
                name = f"checkpoint-{self.state.global_step}"
                if self.state.best_model_checkpoint == str(run_dir / STAGING / name):
                    # Trainer named the best checkpoint where it was written: name it where it stays, also in the
                    # checkpoint's own copy of the state (a resumed run reads that one).
                    self.state.best_model_checkpoint = str(run_dir / name)
                    write_trainer_state(self.state, run_dir / STAGING / name / TRAINER_STATE_NAME)
                publish(run_dir / STAGING / name, run_dir / name)
                (run_dir / STAGING).rmdir()
                # Only now that the new checkpoint is complete may the oldest go.
                rotate_checkpoints(str(run_dir), self.args.save_total_limit, self.state.best_model_checkpoint)

    def _unstage(self) -> Path:
        run_dir, self.args.output_dir = self._staged
        self._staged = None
        return run_dir

    def _clear_staging(self, folder: Path) -> None:
        if self.args.should_save:
            shutil.rmtree(folder / STAGING, ignore_errors=True)

    def _failed_save(self, err: Exception, folder: Path, needed: int, what: str) -> None:
        self._clear_staging(folder)
        if (full := disk_full(err, folder, needed, what)) is not None:
            raise full from None

    def _model_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def create_accelerator_and_postprocess(self) -> None:
        """Give CPU processes the FSDP plugin that accelerate dropped."""
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        if requested_engine() != "fsdp" or state.distributed_type != DistributedType.MULTI_CPU:
            return
        plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables, as accelerate builds it
        if state.mixed_precision != "no":
            plugin.set_mixed_precision(state.mixed_precision)
        state.fsdp_plugin = plugin
        state.distributed_type = DistributedType.FSDP
        # As AcceleratorState.__init__ ends: every later AcceleratorState() copies the process state's type back.
        PartialState._shared_state["distributed_type"] = DistributedType.FSDP
        self.is_fsdp_enabled = True

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Under FSDP2 the model's class is torch's `FSDP<Name>`: `save_pretrained` would copy torch's files as remote
        code and read sharded parameters. So the gathered `state_dict` is saved through a plain model of the original
        class holding its tensors (no copy), tied weights tied again."""
        if (
            state_dict is not None
            and self.args.should_save
            and self.is_deepspeed_enabled
            and (self.accelerator.state.deepspeed_plugin.zero_stage < 3)
        ):
            # ZeRO-1/2 keep parameters whole; DeepSpeed's state dict would save tied weights twice.
            return super()._save(output_dir)
        try:
            from torch.distributed.fsdp import FSDPModule
        except ImportError:  # a torch without FSDP2
            FSDPModule = None
        sharded = self.model
        fsdp2 = FSDPModule is not None and isinstance(sharded, FSDPModule)
        if not fsdp2 or state_dict is None or not self.args.should_save:
            return super()._save(output_dir, state_dict=state_dict)
        import torch

        original_class = next(c for c in type(sharded).__mro__[1:] if not issubclass(c, FSDPModule))
        with torch.device("meta"):
            plain = original_class(sharded.config)
        plain.load_state_dict(state_dict, assign=True)
        plain.tie_weights()  # the gathered copies of tied weights are separate tensors: one of each pair is kept
        self.model = plain
        try:
            super()._save(output_dir)  # the plain model's own state dict, with its ties
        finally:
            self.model = sharded

    @property
    def engine(self) -> str:
        """What really runs: 'FSDP2', 'FSDP1', 'DeepSpeed ZeRO-<stage>', 'DDP' or 'single process'."""
        from accelerate.utils import DistributedType

        state = self.accelerator.state
        if state.distributed_type == DistributedType.FSDP:
            return f"FSDP{state.fsdp_plugin.fsdp_version}"
        if state.distributed_type == DistributedType.DEEPSPEED:
            return f"DeepSpeed ZeRO-{state.deepspeed_plugin.zero_stage}"
        return "DDP" if state.num_processes > 1 else "single process"

    def save_full_model(self, output_dir: str) -> None:
        """`save_model` that always writes the whole model, staged; every process calls it (FSDP gathers)."""
        target = Path(output_dir)
        staging = target / STAGING
        self._clear_staging(target)  # what a killed save left
        self.accelerator.wait_for_everyone()
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None) if self.is_fsdp_enabled else None
        sharded = plugin is not None and "FULL_STATE_DICT" not in str(plugin.state_dict_type)
        if sharded:  # Trainer.save_model writes no weights for sharded checkpoints
            kept = plugin.state_dict_type
            plugin.set_state_dict_type("FULL_STATE_DICT")
        try:
            self.save_model(str(staging))
        except Exception as err:
            self._failed_save(err, target, self._model_bytes(), "the model")
            raise
        finally:
            if sharded:
                plugin.set_state_dict_type(kept)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            publish(staging, target)
        self.accelerator.wait_for_everyone()


def write_trainer_state(state, path: Path) -> None:
    """`TrainerState.save_to_json`, written whole (`bert_repro.atomic`)."""
    write_json(path, asdict(state), sort_keys=True)


def hardware(device) -> str:
    """What a run trained on, for results.json and the model card."""
    import platform

    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def end_processes() -> None:
    """The processes leave together: else one exiting while another talks over gloo can abort (exit -6), failing
    a run whose model was already saved."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
