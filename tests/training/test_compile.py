"""`--torch_compile true`: no graph break and at most one recompilation per phase over 20+ real batches of the
project's collators (padded and packed, both phases, fine-tuning), counted by dynamo over a counting "eager" backend;
and the masked positions keep the losses."""

import datasets
import pytest
import torch
import torch._dynamo
from support.corpora import pseudo_text, wordpiece_tokenizer
from support.models import tiny_config
from support.task_files import finetune_args
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from transformers import DataCollatorWithPadding

from bert_repro import BertReproForMaskedLM, BertReproForPreTraining, BertReproForSequenceClassification
from bert_repro.data.pack_examples import PackingCollator, packed_rows_per_example, padding_statistics
from bert_repro.data.pretraining_examples import IGNORE_INDEX, PreTrainingDataConfig, create_pretraining_dataset
from bert_repro.data.wordpiece import save_tokenizer
from bert_repro.training.cli import SpeedSwitches
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning
from bert_repro.training.pretraining.phases import PhaseCollator
from bert_repro.training.pretraining.trainer import pretraining_sums

# (max_seq_length, max_predictions_per_seq, short_seq_prob) of phase 1 and phase 2, scaled down; phase 1's short
# examples raised for batches of many widths.
PHASES = [(64, 10, 0.9), (96, 15, 0.1)]
BATCH = 4


@pytest.fixture(scope="module")
def tokenizer():
    return wordpiece_tokenizer(pseudo_text(30), vocab_size=150)


@pytest.fixture(scope="module")
def phases(tokenizer):
    """(data config, examples) of each phase, built as the recipe builds them."""
    documents = datasets.Dataset.from_dict({"text": pseudo_text(30)})
    out = []
    for length, predictions, short in PHASES:
        config = PreTrainingDataConfig(length, max_predictions_per_seq=predictions, dupe_factor=2, short_seq_prob=short)
        out.append((config, create_pretraining_dataset(documents, tokenizer, config).to_list()))
    return out


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts with no compiled code, empty counters and dynamo's default settings."""
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=False, capture_scalar_outputs=False):
        yield
    torch._dynamo.reset()


def phase_batches(tokenizer, phases, packing: bool, count: int = 22) -> list[list[dict]]:
    """`count` batches of each phase from `PhaseCollator`, with packed rows per example as the recipe sets them."""
    shares = [
        packed_rows_per_example(padding_statistics([len(r["input_ids"]) for r in rows], BATCH, cfg.max_seq_length))
        for cfg, rows in phases
    ]
    collator = PhaseCollator(
        tokenizer, [cfg for cfg, _ in phases], packing=packing, compiled=True, rows_per_example=shares
    )
    return [[collator(rows[i * BATCH : (i + 1) * BATCH]) for i in range(count)] for _, rows in phases]


def pretraining_model(tokenizer, **fields):
    config = tiny_config(
        vocab_size=len(tokenizer), max_position_embeddings=128, **{"sparse_prediction": True, **fields}
    )
    torch.manual_seed(0)
    return BertReproForPreTraining(config).train()


def compiles_per_phase(model, phases_of_batches) -> list[int]:
    """Graphs compiled in each phase of training steps (forward + backward), after checking there was no break."""
    backend = CompileCounterWithBackend("eager")
    compiled = torch.compile(model, backend=backend)  # dynamic=None, as Trainer and accelerate compile
    per_phase = []
    for batches in phases_of_batches:
        before = backend.frame_count
        for batch in batches:
            compiled(**batch).loss.backward()
        per_phase.append(backend.frame_count - before)
    assert dict(counters["graph_break"]) == {}
    return per_phase


@pytest.mark.slow  # compiles (about 30 s of CPU each)
def test_pretraining_step_is_one_graph_with_one_recompilation_per_phase(tokenizer, phases):
    batches = phase_batches(tokenizer, phases, packing=False)
    widths = {b["input_ids"].shape[1] for b in batches[0]}
    masked = {int((b["labels"] != IGNORE_INDEX).sum()) for b in batches[0]}
    assert len(widths) > 2 and len(masked) > 2, "the batches must differ in padding and masked-token count"
    # The first graph, then one recompilation as the width turns dynamic; phase 2 recompiles for its slots.
    assert compiles_per_phase(pretraining_model(tokenizer), batches) in ([2, 1], [2, 0], [1, 1])


@pytest.mark.slow  # compiles (about 10 s of CPU)
def test_packed_pretraining_step_is_one_graph_with_one_recompilation_per_phase(tokenizer, phases):
    """Fixed-shape packed batches under dynamo's default settings: one graph per phase (phase 2's rows are wider)."""
    batches = phase_batches(tokenizer, phases, packing=True)
    for (cfg, _), phase in zip(phases, batches, strict=True):
        assert len({tuple(b["input_ids"].shape) for b in phase}) == 1  # one row count, rows of max_seq_length
        assert {b["input_ids"].shape[1] for b in phase} == {cfg.max_seq_length}
        assert all(b["next_sentence_label"].numel() == b["cls_positions"].numel() == BATCH for b in phase)
        assert any(not b["attention_mask"][-1].any() for b in phase), "some batch must have an empty row"
    assert compiles_per_phase(pretraining_model(tokenizer), batches) == [1, 1]


@pytest.mark.slow  # compiles (about 10 s of CPU)
def test_packed_step_recompiles_once_for_more_rows_and_not_for_fewer_examples(tokenizer, phases):
    """Too few fixed rows for some batches: those get one row per example, the one other row count (one
    recompilation, whose graph takes both); an epoch's last, smaller batch keeps the shapes."""
    config, rows = phases[0]
    collator = PackingCollator.from_config(
        tokenizer, config, fixed_shape=True, examples=BATCH, rows_per_example=3 / BATCH
    )
    batches = [collator(rows[i * BATCH : (i + 1) * BATCH]) for i in range(22)] + [collator(rows[:3])]
    shapes = [tuple(b["input_ids"].shape) for b in batches]
    assert set(shapes) == {(3, config.max_seq_length), (BATCH, config.max_seq_length)}
    assert shapes[-1] == (3, config.max_seq_length)
    assert batches[-1]["next_sentence_label"].tolist()[-1] == IGNORE_INDEX
    assert compiles_per_phase(pretraining_model(tokenizer), [batches]) == [2]


@pytest.mark.slow  # compiles (about 30 s of CPU each)
def test_finetuning_step_is_one_graph_with_one_recompilation(tokenizer):
    """Sequence classification with transformers' padding collator (the GLUE tasks' collator)."""
    texts = pseudo_text(60, seed=3, max_sentences=4)
    collator = DataCollatorWithPadding(tokenizer)
    batches = []
    for i in range(22):
        encoded = [
            dict(tokenizer(t[:200], truncation=True, max_length=64), labels=j % 3)
            for j, t in enumerate(texts[i * 2 : i * 2 + BATCH])
        ]
        batches.append(collator(encoded))
    batches.append(collator(encoded[:3]))  # an epoch's last, smaller batch
    assert len({b["input_ids"].shape for b in batches}) > 2
    config = tiny_config(vocab_size=len(tokenizer), num_labels=3)
    torch.manual_seed(0)
    model = BertReproForSequenceClassification(config).train()
    # The first graph, one recompilation as the width turns dynamic, and one for the epoch's last, smaller batch
    # (Trainer keeps it; once per run).
    assert compiles_per_phase(model, [batches])[0] <= 3


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_masked_positions_keep_the_loss_and_gradients(tokenizer, phases, packing):
    """Gathered at `masked_positions` (fixed slots) the MLM loss, Trainer's summed metrics and every gradient equal
    those of dense labels and of boolean selection, eager and compiled (aot_eager: the backward traced too)."""
    batch = phase_batches(tokenizer, phases, packing, count=1)[0][0]
    results = {}
    for name, sparse, positions, compiled in [
        ("dense", False, False, False),
        ("selected", True, False, False),
        ("slots", True, True, False),
        ("slots compiled", True, True, True),
    ]:
        model = pretraining_model(
            tokenizer, sparse_prediction=sparse, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        inputs = {k: v for k, v in batch.items() if positions or k != "masked_positions"}
        run = torch.compile(model, backend="aot_eager") if compiled else model
        out = run(**inputs)
        out.loss.backward()
        labels = (batch["labels"], batch["next_sentence_label"], inputs.get("masked_positions"))
        sums = pretraining_sums(out.prediction_logits, out.seq_relationship_logits, *labels)
        grads = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
        results[name] = (out.masked_lm_loss.detach(), sums, grads)
    slots = batch["masked_positions"].numel()
    assert slots == BATCH * PHASES[0][1] > int((batch["labels"] != IGNORE_INDEX).sum())
    dense_loss, dense_sums, dense_grads = results["dense"]
    for name, (loss, sums, grads) in results.items():
        assert torch.allclose(loss, dense_loss, atol=1e-6), name
        assert torch.allclose(sums, dense_sums, atol=1e-4), name
        assert grads.keys() == dense_grads.keys(), name
        assert max((grads[k] - dense_grads[k]).abs().max().item() for k in grads) < 1e-6, name


def test_masked_lm_model_reads_the_slots_too(tokenizer, phases):
    batch = phase_batches(tokenizer, phases, packing=False, count=1)[0][0]
    config = tiny_config(vocab_size=len(tokenizer), max_position_embeddings=128, sparse_prediction=True)
    model = BertReproForMaskedLM(config).eval()
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}
    selected = model(**inputs)
    slots = model(**inputs, masked_positions=batch["masked_positions"])
    assert slots.logits.shape == (batch["masked_positions"].numel(), config.vocab_size)
    assert torch.allclose(slots.loss, selected.loss, atol=1e-6)


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_masked_positions_name_every_label_once(tokenizer, phases, packing):
    for batch in phase_batches(tokenizer, phases, packing, count=6)[1]:
        positions = batch["masked_positions"]
        assert positions.shape == (BATCH, PHASES[1][1])  # a fixed number of slots: examples x the budget
        labels = batch["labels"].flatten()[positions]
        used = positions[labels != IGNORE_INDEX]
        assert used.tolist() == sorted(used.tolist())  # the examples in order, each example's positions sorted
        assert used.tolist() == (batch["labels"].flatten() != IGNORE_INDEX).nonzero().flatten().tolist()
        assert (batch["attention_mask"].flatten()[positions] == 1).all()  # unused slots: unlabelled tokens


def test_recipes_name_the_switches_that_do_not_compile_to_one_graph():
    assert SpeedSwitches().torch_compile_warning(True) is None
    assert SpeedSwitches(unpad_inputs=True).torch_compile_warning(False) is None
    warning = SpeedSwitches(unpad_inputs=True, tied_gradients=True).torch_compile_warning(True)
    assert "--unpad_inputs, --tied_gradients" in warning and "benchmarks/LOG.md" in warning


@pytest.mark.slow  # compiles (about 30 s of CPU)
def test_compiled_finetuning_recipe_trains_one_graph(tmp_path, tokenizer):
    """Fine-tuning with --torch_compile true: many widths and an epoch's smaller last batch train through one graph."""
    model_dir = tmp_path / "model"
    torch.manual_seed(0)
    BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer))).save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    texts = [" ".join(t.split()) for t in pseudo_text(38, seed=5, max_sentences=3)]
    pairs = zip(texts[::2], texts[1::2])
    rows = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"] + [
        f"{i % 2}\t{i}\t{i + 100}\t{a[: 40 + 4 * i]}\t{b[:30]}" for i, (a, b) in enumerate(pairs)
    ]  # many widths
    data = tmp_path / "mrpc"
    data.mkdir()
    for split in ("train.tsv", "dev.tsv"):
        (data / split).write_text("\n".join(rows) + "\n")  # 19 pairs: batches of 4, then 3
    settings = dict(learning_rates="1e-4", num_train_epochs=1, per_device_train_batch_size=4, max_seq_length=64)
    compiled = dict(torch_compile=True, torch_compile_backend="eager")
    argv = finetune_args("mrpc", model_dir, data, tmp_path / "out", "--no_predict_test", **settings, **compiled)
    run_finetuning(FineTuningRecipe.from_args(argv))
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1  # dynamo's default: 3 (the first width, another, the last batch)
