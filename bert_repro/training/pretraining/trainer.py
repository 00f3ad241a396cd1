"""`PreTrainingTrainer`: Trainer that logs the MLM and NSP losses and accuracies separately and averages each loss over
the GLOBAL batch: one batch of 16, two accumulated batches of 8 and two DDP ranks of 8 give the same update."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ...data.pretraining_examples import IGNORE_INDEX
from ...data.streaming import WorkerStreams
from ...model.configuration_bert_repro import PreTrainingObjective
from ..distributed import EngineTrainer
from .phases import PhasedSampler

_SUMS = ("mlm_loss", "mlm_correct", "mlm_count", "nsp_loss", "nsp_correct", "nsp_count")


def pretraining_sums(
    prediction_logits, seq_relationship_logits, labels, next_sentence_label, masked_positions=None
) -> torch.Tensor:
    """Summed losses and counts of a batch: (mlm loss sum, mlm correct, masked tokens, nsp loss sum, nsp correct, n).

    `prediction_logits` is (batch, seq, vocab), (masked positions, vocab) from a sparse prediction, or (slots,
    vocab) with `masked_positions`. Without `next_sentence_label` the NSP entries are 0."""
    if prediction_logits.dim() == 2 and masked_positions is not None:
        mlm_logits, mlm_labels = prediction_logits.float(), labels.reshape(-1)[masked_positions.reshape(-1)]
    else:
        masked = labels != IGNORE_INDEX
        mlm_logits = prediction_logits if prediction_logits.dim() == 2 else prediction_logits[masked]
        mlm_logits, mlm_labels = mlm_logits.float(), labels[masked]
    predicted = mlm_labels != IGNORE_INDEX
    mlm = [
        F.cross_entropy(mlm_logits, mlm_labels, reduction="sum", ignore_index=IGNORE_INDEX),
        ((mlm_logits.argmax(-1) == mlm_labels) & predicted).sum().float(),
        predicted.sum().float(),
    ]
    if next_sentence_label is None:
        return torch.stack(mlm + [mlm_logits.new_zeros(())] * 3)
    nsp_logits = seq_relationship_logits.float()
    nsp = [
        F.cross_entropy(nsp_logits, next_sentence_label, reduction="sum"),
        (nsp_logits.argmax(-1) == next_sentence_label).sum().float(),
        next_sentence_label.ne(IGNORE_INDEX).sum().float(),  # a fixed-shape packed batch pads with -100
    ]
    return torch.stack(mlm + nsp)


def metrics_from_sums(sums: torch.Tensor, prefix: str, objective: PreTrainingObjective) -> dict[str, float]:
    """The token-level task's loss and accuracy (`mlm_*`, or `lm_*` for "ltr") and, with NSP, NSP's."""
    s = dict(zip(_SUMS, sums.tolist()))
    mlm_n, nsp_n = max(s["mlm_count"], 1.0), max(s["nsp_count"], 1.0)
    task, nsp = f"{prefix}{objective.token_task}", objective.next_sentence
    metrics = {f"{task}_loss": s["mlm_loss"] / mlm_n}
    metrics.update({f"{prefix}nsp_loss": s["nsp_loss"] / nsp_n} if nsp else {})
    metrics[f"{task}_accuracy"] = s["mlm_correct"] / mlm_n
    metrics.update({f"{prefix}nsp_accuracy": s["nsp_correct"] / nsp_n} if nsp else {})
    return metrics


class PreTrainingTrainer(EngineTrainer):
    """Trainer for MLM + NSP with global-batch loss normalisation and the four pre-training metrics."""

    def __init__(self, *args, phase_sizes: list[int] | None = None, phase_samples: list[int] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.phase_sizes, self.phase_samples = phase_sizes, phase_samples
        self.loss_is_scaled_for_ga = True  # compute_loss divides by the global counts itself
        self._train_sums: torch.Tensor | None = None
        self.tokens_seen = 0  # this invocation's real training tokens in this process

    def _get_train_sampler(self, train_dataset=None):
        if self.phase_sizes is None:
            return super()._get_train_sampler(train_dataset)
        return PhasedSampler(self.phase_sizes, self.phase_samples, self.args.seed)

    def get_train_dataloader(self):
        if not isinstance(self.train_dataset, WorkerStreams):
            return super().get_train_dataloader()
        # This process's own part of the stream: accelerate's sharding would make every process read everything.
        workers = self.args.dataloader_num_workers
        return DataLoader(
            self.train_dataset,
            batch_size=self._train_batch_size,
            collate_fn=self.data_collator,
            pin_memory=self.args.dataloader_pin_memory,
            num_workers=workers,
            prefetch_factor=self.args.dataloader_prefetch_factor if workers else None,
        )

    def _get_num_items_in_batch(self, batch_samples, device):
        """Masked tokens and sequences in the whole global batch (all accumulation steps, all processes)."""
        self.tokens_seen += sum(int(b["attention_mask"].sum()) for b in batch_samples)  # on the CPU: no sync
        masked = sum(int(b["labels"].ne(IGNORE_INDEX).sum()) for b in batch_samples)
        labels = [b["next_sentence_label"] for b in batch_samples if "next_sentence_label" in b]
        sequences = sum(int(label.ne(IGNORE_INDEX).sum()) for label in labels)
        counts = torch.tensor([masked, sequences], dtype=torch.float64, device=device)
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
        return counts

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        next_sentence_label = inputs.pop("next_sentence_label", None)  # None: an objective without NSP
        outputs = model(**inputs, labels=labels)
        sums = pretraining_sums(
            outputs.prediction_logits,
            outputs.seq_relationship_logits,
            labels,
            next_sentence_label,
            inputs.get("masked_positions"),
        )
        if num_items_in_batch is None:  # one batch on its own
            mlm_n, nsp_n = sums[2].clamp(min=1), sums[5].clamp(min=1)
            loss = sums[0] / mlm_n + sums[3] / nsp_n
        else:
            mlm_n, nsp_n = num_items_in_batch.to(sums.dtype).clamp(min=1)
            # DDP averages gradients over processes: scale back up so the sum over the global batch is kept.
            loss = (sums[0] / mlm_n + sums[3] / nsp_n) * self.accelerator.num_processes
        if model.training:
            detached = sums.detach()
            self._train_sums = detached if self._train_sums is None else self._train_sums + detached
        return (loss, outputs) if return_outputs else loss

    def passes(self, step: int) -> float:
        """Passes over the training examples after `step` optimizer steps, summed over the phases; Trainer's epoch
        counts passes over the sampler instead, 1.0 at the end of any run (`PhasedSampler`)."""
        args = self.args
        drawn = step * args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        total = 0.0
        for size, samples in zip(self.phase_sizes, self.phase_samples):
            here = min(drawn, samples)
            total += here / size
            drawn -= here
        return total

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs and self._train_sums is not None:
            sums = self._train_sums
            if self.accelerator.num_processes > 1:
                sums = self.accelerator.reduce(sums, reduction="sum")
            logs.update(metrics_from_sums(sums, "", self.model.config.pretraining_objective))
            self._train_sums = None
        epoch = self.state.epoch
        if self.phase_sizes is not None and epoch is not None:  # a stream's size is unknown: Trainer's count stays
            self.state.epoch = round(self.passes(self.state.global_step), 4)  # only for the record Trainer logs
        try:
            super().log(logs, start_time)
        finally:
            self.state.epoch = epoch

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        dataloader = self.get_eval_dataloader(eval_dataset)
        model = self.model
        was_training = model.training
        model.eval()
        sums = torch.zeros(len(_SUMS), device=self.args.device)
        start = time.time()
        with torch.no_grad():
            for batch in dataloader:
                batch = self._prepare_inputs(batch)
                labels, nsp = batch.pop("labels"), batch.pop("next_sentence_label", None)
                with self.autocast_smart_context_manager():
                    out = model(**batch, labels=labels)
                sums += pretraining_sums(
                    out.prediction_logits, out.seq_relationship_logits, labels, nsp, batch.get("masked_positions")
                )
        if self.accelerator.num_processes > 1:
            sums = self.accelerator.reduce(sums, reduction="sum")
        model.train(was_training)
        metrics = metrics_from_sums(sums, f"{metric_key_prefix}_", self.model.config.pretraining_objective)
        metrics[f"{metric_key_prefix}_loss"] = sum(v for k, v in metrics.items() if k.endswith("_loss"))
        metrics[f"{metric_key_prefix}_runtime"] = round(time.time() - start, 3)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
