"""Trainer integration: the gradient-accumulation loss-scaling trap of transformers 5.x is avoided.

A model whose forward takes **kwargs is assumed by Trainer to normalise its own loss by `num_items_in_batch`;
then Trainer skips the division by the accumulation steps and the update grows with them. Our models set
`accepts_loss_kwargs = False` and return per-batch means, so one batch of 16 and two accumulated batches of 8
give the same update (exactly so when every micro-batch holds the same number of masked tokens, as in the
paper's fixed-length pre-training data; each micro-batch's mean then weighs the same).
"""

import pytest
import torch
from support.models import tiny_config
from transformers import Trainer, TrainingArguments

from bert_repro import BertReproForPreTraining

MASKED_PER_SEQUENCE = 3


def pretraining_rows(n=16, seq=16, vocab=99):
    """n pre-training rows of different lengths (padding), each with exactly MASKED_PER_SEQUENCE masked tokens."""
    g = torch.Generator().manual_seed(2)
    rows = []
    for i in range(n):
        length = 8 + i % (seq - 7)
        input_ids = torch.zeros(seq, dtype=torch.long)
        input_ids[:length] = torch.randint(5, vocab, (length,), generator=g)
        labels = torch.full((seq,), -100)
        positions = torch.randperm(length - 2, generator=g)[:MASKED_PER_SEQUENCE] + 1
        labels[positions] = input_ids[positions]
        rows.append(
            {
                "input_ids": input_ids,
                "attention_mask": (torch.arange(seq) < length).long(),
                "token_type_ids": (torch.arange(seq) >= length // 2).long() * (torch.arange(seq) < length).long(),
                "labels": labels,
                "next_sentence_label": torch.tensor(i % 2),
            }
        )
    return rows


def one_update(tmp_path, batch_size, accumulation, accepts_loss_kwargs=None):
    torch.manual_seed(0)
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertReproForPreTraining(config)
    if accepts_loss_kwargs is not None:
        model.accepts_loss_kwargs = accepts_loss_kwargs
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(tmp_path / f"run_{batch_size}x{accumulation}"),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",  # the update is the gradient itself, so a mis-scaled loss shows in it (Adam would hide it)
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: it would hide a mis-scaled gradient too
        weight_decay=0.0,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=pretraining_rows()).train()
    return {k: before[k] - v.detach() for k, v in model.named_parameters()}


@pytest.mark.slow
def test_accumulation_gives_the_same_update(tmp_path):
    full = one_update(tmp_path, 16, 1)
    accumulated = one_update(tmp_path, 8, 2)
    worst = max((full[k] - accumulated[k]).abs().max().item() for k in full)
    scale = max(full[k].abs().max().item() for k in full)
    print(f"[accumulation] max |update(16) - update(8x2)| = {worst:.2e} (largest update {scale:.2e})")
    assert scale > 1e-3
    assert worst < 1e-6 * max(1.0, scale) + 1e-7

    # The trap this guards against: with loss kwargs claimed, Trainer skips the division and doubles the update.
    trapped = one_update(tmp_path, 8, 2, accepts_loss_kwargs=True)
    ratio = trapped["bert.embeddings.LayerNorm.weight"].norm() / full["bert.embeddings.LayerNorm.weight"].norm()
    assert abs(ratio.item() - 2.0) < 1e-3
