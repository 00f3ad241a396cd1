"""The pre-training recipe: argument handling, output-directory protection, global-batch loss normalisation, and
end-to-end runs through the real launcher; the sampler is in test_resume.py, engines in e2e/test_distributed.py."""

import json

import pytest
import torch
import yaml
from support import ROOT
from support.models import tiny_config
from support.pretraining_runs import first_documents, launch, run_recipe, weights, write_config

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.lifecycle import check_output_dir
from bert_repro.training.pretraining.recipe import PAPER_TRAINING_DEFAULTS, Phase, PreTrainingRecipe
from bert_repro.training.pretraining.trainer import PreTrainingTrainer

# --- Arguments


def test_defaults_yaml_and_command_line_precedence(tmp_path):
    config = tmp_path / "c.yaml"
    settings = dict(corpus=["x"], learning_rate=5e-4, max_steps=50, preset="tiny")
    config.write_text(yaml.safe_dump({**settings, "model_overrides": {"hidden_dropout_prob": 0.0}}))
    recipe = PreTrainingRecipe.from_args(["--config", str(config), "--max_steps", "70", "--output_dir", "o"])
    run, data, training = recipe.model, recipe.examples, recipe.training
    assert training.learning_rate == 5e-4  # YAML over the paper default
    assert training.max_steps == 70  # command line over YAML
    assert training.adam_epsilon == PAPER_TRAINING_DEFAULTS["adam_epsilon"] == 1e-6  # paper default kept
    assert training.warmup_steps == 10_000 and training.weight_decay == 0.01 and training.max_grad_norm == 1.0
    assert data.max_seq_length == 128 and data.max_predictions_per_seq == 20 and data.dupe_factor == 10
    assert run.preset == "tiny" and json.loads(run.model_overrides) == {"hidden_dropout_prob": 0.0}
    assert recipe.optimization.global_batch_size == 256 and recipe.phases[1] == Phase(512, 80, 0.1)


def test_unknown_yaml_field_names_the_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("learning_rat: 0.1\n")
    expected = r"c.yaml: unknown field\(s\) learning_rat \(did you mean learning_rate\?\)"
    with pytest.raises(ValueError, match=expected):
        PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", "o"])


def test_the_logged_epoch_is_passes_over_the_examples():
    from types import SimpleNamespace

    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=2)  # 16 a step
    one_phase = SimpleNamespace(args=args, phase_sizes=[917 * 16], phase_samples=[20 * 16])
    assert PreTrainingTrainer.passes(one_phase, 20) == pytest.approx(20 / 917)  # Trainer logged 1.0
    two = SimpleNamespace(args=args, phase_sizes=[100, 40], phase_samples=[9 * 16, 1 * 16])
    assert PreTrainingTrainer.passes(two, 5) == pytest.approx(80 / 100)
    assert PreTrainingTrainer.passes(two, 10) == pytest.approx(144 / 100 + 16 / 40)


def test_output_dir_protection(tmp_path):
    record = {"run": {"preset": "tiny"}, "training": {"learning_rate": 1e-4}}
    check_output_dir(tmp_path / "new", record, resume=False, overwrite=False)  # absent: fine
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no bert_repro run"):
        check_output_dir(tmp_path, record, resume=False, overwrite=False)
    (tmp_path / "run_config.json").write_text(json.dumps(record))
    check_output_dir(tmp_path, record, resume=False, overwrite=False)  # same run, nothing trained yet
    (tmp_path / "checkpoint-10").mkdir()
    with pytest.raises(FileExistsError, match="--resume_from_checkpoint true"):
        check_output_dir(tmp_path, record, resume=False, overwrite=False)
    check_output_dir(tmp_path, record, resume=True, overwrite=False)
    other = {"run": {"preset": "base"}, "training": {"learning_rate": 1e-4}}
    with pytest.raises(FileExistsError, match=r"different run \(run.preset: 'tiny' -> 'base'\)"):
        check_output_dir(tmp_path, other, resume=True, overwrite=False)
    check_output_dir(tmp_path, other, resume=False, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


# --- Global-batch normalisation inside Trainer


def pretraining_rows(masked, n=16, seq=16, vocab=99):
    """Rows of different lengths (padding); row i has `masked(i)` masked tokens."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for i in range(n):
        length = 6 + i % 10
        input_ids = torch.zeros(seq, dtype=torch.long)
        input_ids[:length] = torch.randint(5, vocab, (length,), generator=g)
        labels = torch.full((seq,), -100)
        positions = torch.randperm(length - 2, generator=g)[: masked(i)] + 1
        labels[positions] = input_ids[positions]
        rows.append(
            {
                "input_ids": input_ids,
                "attention_mask": (torch.arange(seq) < length).long(),
                "token_type_ids": torch.zeros(seq, dtype=torch.long),
                "labels": labels,
                "next_sentence_label": torch.tensor(i % 2),
            }
        )
    return rows


def one_update(tmp_path, per_device, accumulation, trainer=PreTrainingTrainer, masked=lambda i: 1 + i % 5, **model):
    """The update of one optimizer step by SGD at lr 1.0: the gradient itself, so a mis-scaled loss shows in it
    (Adam would hide it, and so would clipping)."""
    from transformers import TrainingArguments

    from bert_repro import BertReproForPreTraining

    torch.manual_seed(0)
    net = BertReproForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    for name, value in model.items():
        setattr(net, name, value)
    before = {k: v.detach().clone() for k, v in net.named_parameters()}
    sgd = dict(optim="sgd", learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0)
    quiet = dict(report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True)
    batch = dict(per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation)
    output_dir = str(tmp_path / f"r{per_device}x{accumulation}")
    args = TrainingArguments(
        output_dir, max_steps=1, use_cpu=True, seed=0, remove_unused_columns=False, **batch, **sgd, **quiet
    )
    trainer(model=net, args=args, train_dataset=pretraining_rows(masked)).train()
    return {k: before[k] - v.detach() for k, v in net.named_parameters()}


@pytest.mark.slow
def test_global_batch_normalisation_with_unequal_mask_counts(tmp_path):
    full = one_update(tmp_path, 16, 1)
    for per_device, accumulation in ((8, 2), (4, 4)):
        accumulated = one_update(tmp_path, per_device, accumulation)
        worst = max((full[k] - accumulated[k]).abs().max().item() for k in full)
        assert worst < 1e-6, (per_device, accumulation, worst)


@pytest.mark.slow
def test_plain_trainer_accumulation_gives_the_same_update(tmp_path):
    """transformers 5.x skips dividing by the accumulation steps for a model whose forward takes **kwargs (it is
    assumed to normalise by `num_items_in_batch`); ours set `accepts_loss_kwargs = False`, so plain Trainer gives the
    same update for 16 as for 8 x 2 when every micro-batch holds as many masked tokens."""
    from transformers import Trainer

    full = one_update(tmp_path, 16, 1, Trainer, masked=lambda i: 3)
    accumulated = one_update(tmp_path, 8, 2, Trainer, masked=lambda i: 3)
    worst = max((full[k] - accumulated[k]).abs().max().item() for k in full)
    scale = max(full[k].abs().max().item() for k in full)
    assert scale > 1e-3
    assert worst < 1e-6 * max(1.0, scale) + 1e-7
    # With loss kwargs claimed, Trainer skips the division and doubles the update.
    trapped = one_update(tmp_path, 8, 2, Trainer, masked=lambda i: 3, accepts_loss_kwargs=True)
    ratio = trapped["bert.embeddings.LayerNorm.weight"].norm() / full["bert.embeddings.LayerNorm.weight"].norm()
    assert abs(ratio.item() - 2.0) < 1e-3


# --- End to end, through the real launcher


@pytest.mark.slow
def test_repeating_the_data_more_than_the_paper_is_warned_about():
    from bert_repro.data.pretraining_examples import PreTrainingDataConfig
    from bert_repro.training.pretraining.records import repetition_warnings

    static = PreTrainingDataConfig(max_seq_length=64, dupe_factor=3)
    stats = {"phase1": {"examples": 77_422}}
    # the paper's 4 showings of each masked example: no warning; budget 2's 12,000 x 32 (4.96): one
    assert repetition_warnings(stats, [9_000], 32, [static]) == []
    (warning,) = repetition_warnings(stats, [12_000], 32, [static])
    shown = "phase1: 12,000 steps of 32 show each of its 77,422 examples 5.0 times with the same masks"
    assert warning.startswith(shown) and "--static_masking false" in warning
    # fresh masks per batch: only passes over the text count (3 maskings' worth of text per showing; paper 40)
    dynamic = PreTrainingDataConfig(max_seq_length=64, dupe_factor=3, static_masking=False)
    assert repetition_warnings(stats, [12_000], 32, [dynamic]) == []
    (warning,) = repetition_warnings(stats, [40_000], 32, [dynamic])
    assert "pass over its text about 50 times (the paper: 40)" in warning
    # each phase on its own; a phase without examples (streaming statistics) is not judged
    two_phases = {"phase1": {"examples": 77_422}, "phase2": {"examples": 10}}
    assert len(repetition_warnings(two_phases, [100, 10], 32, [static, static])) == 1
    assert repetition_warnings({}, [12_000], 32, [static]) == []


@pytest.mark.slow
def test_the_recipe_says_when_it_repeats_a_small_corpus(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    small = first_documents(corpus, tmp_path / "small", 2)
    config = write_config(tmp_path / "small.yaml", small, tokenizer, max_steps=40, save_steps=100, eval_fraction=0.0)
    result = launch(config, tmp_path / "out")
    examples = json.loads((tmp_path / "out" / "data_statistics.json").read_text())["phase1"]["examples"]
    assert 30 * 8 / examples > 4  # phase 1's 30 steps of 8 show each example more than the paper's 4 times
    assert "phase1: 30 steps of 8 show each of its" in result.stderr and "--static_masking false" in result.stderr


def test_pretrain_end_to_end_and_resume(tmp_path, corpus_and_tokenizer):
    from transformers import AutoModelForPreTraining

    corpus, tokenizer = corpus_and_tokenizer
    config = write_config(
        tmp_path / "tiny.yaml", corpus, tokenizer, max_steps=24, save_steps=12, eval_steps=12, plot=True
    )
    full = tmp_path / "full"
    launch(config, full)

    history = json.loads((full / "log_history.json").read_text())
    train = [e for e in history if "mlm_loss" in e]
    assert len(train) == 24 and all(0.0 <= e["nsp_accuracy"] <= 1.0 for e in train)
    first, last = sum(e["loss"] for e in train[:4]) / 4, sum(e["loss"] for e in train[-4:]) / 4
    assert last < first - 0.1, (first, last)
    results = json.loads((full / "results.json").read_text())
    assert {"eval_mlm_loss", "eval_nsp_loss", "eval_mlm_accuracy", "eval_nsp_accuracy"} <= set(results)
    assert results["hardware"].startswith("CPU (") and "cores" in results["hardware"]  # the model card names it
    stats = json.loads((full / "data_statistics.json").read_text())
    assert stats["phase1"]["max_seq_length"] == 32 and stats["phase2"]["max_seq_length"] == 64
    for name in ("vocab.txt", "tokenizer.json", "run_config.json", "training_curves.png", "config.json"):
        assert (full / name).exists(), name
    # transformers' own format: the Auto class gives transformers' BERT, our class reads the same directory
    assert type(AutoModelForPreTraining.from_pretrained(full)).__name__ == "BertForPreTraining"
    from bert_repro import BertReproForPreTraining

    assert type(BertReproForPreTraining.from_pretrained(full)).__name__ == "BertReproForPreTraining"

    # Stopped after 10 steps (crossing no checkpoint boundary on purpose), then resumed from the last checkpoint.
    resumed = tmp_path / "resumed"
    launch(config, resumed, "--stop_after_steps", "13")
    assert (resumed / "checkpoint-13").exists() and not (resumed / "model.safetensors").exists()
    refused = launch(config, resumed, check=False)
    assert refused.returncode != 0 and "--resume_from_checkpoint true" in refused.stderr
    launch(config, resumed, "--resume_from_checkpoint", "true")
    a, b = weights(full), weights(resumed)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-6, worst


@pytest.mark.parametrize("config", sorted((ROOT / "recipes" / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_configs_parse(config):
    from bert_repro import PRESETS
    from bert_repro.training.pretraining.recipe import gradient_accumulation

    # use_cpu: a run on the CPU, wherever the test runs (the configs ask for bf16 where a CUDA device has it).
    recipe = PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", "unused", "--use_cpu", "true"])
    assert recipe.model.preset in PRESETS and recipe.data.corpus
    assert all(phase.max_seq_length <= 512 for phase in recipe.phases)
    assert gradient_accumulation(recipe) >= 1


@pytest.mark.slow
def test_no_hub_and_no_local_text_stops_fast_with_advice(tmp_path):
    import time

    start = time.time()
    quickstart = ROOT / "recipes" / "configs" / "quickstart.yaml"
    argv = ["--config", quickstart, "--output_dir", tmp_path / "out", "--corpus", "Salesforce/wikitext"]
    wikitext = ["--hub_config", "wikitext-2-raw-v1", "--document_boundary", "wikitext"]
    result = run_recipe("pretrain.py", *argv, *wikitext, timeout=120)
    assert result.returncode == 2
    assert "Salesforce/wikitext" in result.stderr and "Pass local text instead" in result.stderr
    assert "Traceback" not in result.stderr
    assert time.time() - start < 30


@pytest.mark.slow
def test_bad_corpus_inputs(tmp_path, corpus_and_tokenizer):
    """Empty, binary, 100,000-character-line and one-sentence documents are skipped or handled, not a crash."""
    corpus, tokenizer = corpus_and_tokenizer
    messy = first_documents(corpus, tmp_path / "messy", 6)
    (messy / "empty.txt").write_text("")
    (messy / "junk.txt").write_bytes(bytes(range(256)) * 40)
    (messy / "long.txt").write_text(("the cat sat on the mat " * 5000).strip() + ".")
    (messy / "one.txt").write_text("Only one sentence here.")
    config = write_config(tmp_path / "messy.yaml", messy, tokenizer, max_steps=2, save_steps=100, eval_fraction=0.0)
    launch(config, tmp_path / "out")
    stats = json.loads((tmp_path / "out" / "data_statistics.json").read_text())
    assert stats["phase1"]["examples"] > 0

    table = tmp_path / "docs.jsonl"
    table.write_text('{"body": "A sentence. Another one."}\n')
    config = write_config(tmp_path / "table.yaml", table, tokenizer, max_steps=2)
    result = launch(config, tmp_path / "out2", check=False)
    assert result.returncode != 0
    assert "has no column 'text'; its columns are ['body']" in result.stderr

    config = write_config(tmp_path / "long.yaml", corpus, tokenizer, max_seq_length=1024, phase2_fraction=0.0)
    result = launch(config, tmp_path / "out3", check=False)
    assert result.returncode != 0 and "longer than the model's max_position_embeddings" in result.stderr


@pytest.mark.slow
def test_dynamic_whole_word_masking_with_lamb(tmp_path, corpus_and_tokenizer):
    """The options: RoBERTa's dynamic masking, whole-word masking, NVIDIA's LAMB, a 30% mask rate."""
    corpus, tokenizer = corpus_and_tokenizer
    options = dict(static_masking=False, do_whole_word_mask=True, optimizer="lamb", masked_lm_prob=0.3)
    config = write_config(tmp_path / "o.yaml", corpus, tokenizer, max_predictions_per_seq=10, max_steps=4, **options)
    launch(config, tmp_path / "out")
    stats = json.loads((tmp_path / "out" / "data_statistics.json").read_text())
    assert "masked" not in stats["phase1"]  # nothing stored: masks are drawn per batch
    assert stats["held_out"]["masked_share"] > 0.25  # the held-out slice keeps fixed masks, at the 30% rate
    history = json.loads((tmp_path / "out" / "log_history.json").read_text())
    assert all(e["mlm_loss"] > 0 for e in history if "mlm_loss" in e)


def test_the_readmes_python_api_builds_the_run_the_command_line_does(monkeypatch):
    """README, "From Python": the recipe from a YAML file with changes under the flags' names is the recipe of
    `recipes/pretrain.py --config ... --max_steps 500 --output_dir runs/mine`, and `run_pretraining` takes it."""
    import bert_repro.training.pretraining as pretraining

    text = (ROOT / "README.md").read_text()
    snippet = text[text.index("from bert_repro.training import PreTrainingRecipe") :].split("```")[0]
    taken = []
    monkeypatch.setattr(pretraining, "run_pretraining", taken.append)
    monkeypatch.chdir(ROOT)
    exec(snippet, {})
    config = ["--config", "recipes/configs/quickstart.yaml"]
    assert taken == [PreTrainingRecipe.from_args([*config, "--max_steps", "500", "--output_dir", "runs/mine"])]
    assert taken[0].training.max_steps == 500 and taken[0].phases[0].max_seq_length == 128
    with pytest.raises(ConfigurationError, match="no setting 'max_step'.*max_steps"):
        taken[0].replace(max_step=1)


def test_a_finished_run_leaves_one_tokenizer_no_lock_and_says_its_held_out_split_is_small(
    tmp_path, corpus_and_tokenizer, caplog
):
    from bert_repro.training.pretraining import run_pretraining

    corpus, _ = corpus_and_tokenizer
    overrides = dict(vocab_size=200, phase2_fraction=0.0, max_steps=2, warmup_steps=0, save_steps=1)
    config = write_config(tmp_path / "tiny.yaml", corpus, None, **overrides)
    config.write_text("\n".join(line for line in config.read_text().splitlines() if not line.startswith("tokenizer")))
    out = tmp_path / "out"
    with caplog.at_level("WARNING"):
        run_pretraining(PreTrainingRecipe.from_args(["--config", str(config), "--output_dir", str(out)]))
    assert (out / "tokenizer.json").exists() and not (out / "tokenizer").exists()  # beside the model, once
    assert not (out / "run.lock").exists()
    assert "the held-out split holds" in caplog.text and "--eval_fraction" in caplog.text
    assert "--warmup_steps" not in caplog.text
    # extended, the finished run reads its vocabulary where it left it (a new one would not be the model's)
    vocabulary = (out / "vocab.txt").read_text()
    argv = ["--config", str(config), "--output_dir", str(out), "--max_steps", "3", "--resume_from_checkpoint", "true"]
    run_pretraining(PreTrainingRecipe.from_args(argv))
    assert (out / "vocab.txt").read_text() == vocabulary and not (out / "tokenizer").exists()
