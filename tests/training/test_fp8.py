"""`--fp8`: torchao's float8 training of the blocks' linears, run here with torchao's emulation (the float8 rounding
without float8 hardware), and refused where it cannot run."""

import sys

import pytest
import torch
from support.models import padded_batch, tiny_config

from bert_repro import BertReproForPreTraining
from bert_repro.training.cli import ConfigurationError
from bert_repro.training.fp8 import convert_to_fp8, fp8_problem
from bert_repro.training.pretraining.recipe import ModelSettings, PreTrainingRecipe, check_values

pytest.importorskip("torchao.float8")
from torchao.float8.float8_linear import Float8Linear

BLOCK_LINEARS = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")
BLOCK_LINEARS += ("intermediate.dense", "output.dense")


def tiny_model(seed: int = 0):
    """Sizes in multiples of 16 (float8 products need them), dropout off so that losses compare."""
    torch.manual_seed(seed)
    config = tiny_config(
        hidden_size=32, intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return BertReproForPreTraining(config).train()


def batch_with_labels():
    batch = padded_batch(99, batch=4, seq=16)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 1::5] = batch["input_ids"][:, 1::5]
    return {**batch, "labels": labels, "next_sentence_label": torch.tensor([0, 1, 0, 1])}


def loss(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(**batch).loss


def test_only_the_blocks_linears_are_converted():
    model = tiny_model()
    keys = {k: v.shape for k, v in model.state_dict().items()}
    convert_to_fp8(model, emulate=True)
    converted = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    expected = {f"bert.encoder.layer.{i}.{part}" for i in range(2) for part in BLOCK_LINEARS}
    assert converted == expected
    assert {k: v.shape for k, v in model.state_dict().items()} == keys


def test_trains_and_starts_at_the_bf16_loss():
    batch = batch_with_labels()
    bf16 = tiny_model()
    fp8 = convert_to_fp8(tiny_model(), emulate=True)
    first_bf16, first_fp8 = loss(bf16, batch).item(), loss(fp8, batch).item()
    assert abs(first_fp8 - first_bf16) <= 0.02 * first_bf16, (first_fp8, first_bf16)
    optimizer = torch.optim.AdamW(fp8.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        value = loss(fp8, batch)
        value.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(value.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.9 * losses[0], losses


def test_refused_where_it_cannot_run(tmp_path, monkeypatch):
    assert ModelSettings().fp8 is False
    recipe = PreTrainingRecipe.from_args(["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "true"])
    recipe = recipe.replace(max_steps=10)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="CUDA"):
            check_values(recipe.replace(fp8=True))
    check_values(recipe)  # the default asks nothing of the machine
    monkeypatch.setitem(sys.modules, "torchao.float8", None)  # as if torchao were not installed
    assert "torchao" in fp8_problem(bf16=True)


def test_the_recipe_converts_the_model_it_builds(monkeypatch):
    """`build_model` with --fp8 (where `check_values` let it through): the blocks' linears are float8 ones."""
    from bert_repro.data.pretraining_examples import PreTrainingDataConfig
    from bert_repro.training.pretraining import model as pretrain_model

    class Tokenizer:
        pad_token_id = 0

        def __len__(self):
            return 96

    monkeypatch.setattr(pretrain_model, "convert_to_fp8", lambda model: convert_to_fp8(model, emulate=True))
    phases = [PreTrainingDataConfig(max_seq_length=32)]
    model = pretrain_model.build_model(ModelSettings(preset="tiny", fp8=True), Tokenizer(), phases)
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 6 * model.config.num_hidden_layers
    plain = pretrain_model.build_model(ModelSettings(preset="tiny"), Tokenizer(), phases)
    assert not any(isinstance(m, Float8Linear) for m in plain.modules())


def test_fused_qkv_keeps_the_float8_projections():
    """With `fused_qkv`, converted projections are still called (a concatenated weight would bypass float8)."""
    torch.manual_seed(0)
    config = tiny_config(hidden_size=32, intermediate_size=64, fused_qkv=True)
    model = convert_to_fp8(BertReproForPreTraining(config), emulate=True)
    attention = model.bert.encoder.layer[0].attention.self
    hidden = torch.randn(2, 5, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = attention.query_key_value(hidden)
        expected = (attention.query(hidden), attention.key(hidden), attention.value(hidden))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
