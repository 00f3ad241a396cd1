"""Model cards (`bert_repro.hub.model_card`) of fake but realistic run directories, against the paper's tables and
huggingface_hub's parsers; offline, so no `validate()` (it calls the Hub's /api/validate-yaml)."""

import os

from support import ROOT
from support.run_records import FAKE_TOKEN, bert_config, finetuning_run, make_pretraining_run, update_json, write_json
from support.task_files import GLUE_HP

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.resources
import json
import re
from pathlib import Path

import jinja2
import numpy as np
import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard import REGEX_YAML_BLOCK
from huggingface_hub.repocard_data import eval_results_to_model_index, model_index_to_eval_results

import bert_repro
from bert_repro.hub import model_card, numbers
from bert_repro.hub.card_base import parameter_count, safetensors_parameter_count
from bert_repro.hub.model_card import CardError, PreTrainedFacts, card_for_finetuning
from bert_repro.versions import framework_versions

REPO = "someone/bert-tiny-wikitext"
SECTIONS = ("## Model", "## Training data", "## Training procedure", "### All hyper-parameters")
SECTIONS += ("### Framework versions", "## Evaluation", "## How to use", "## Intended uses & limitations")
SECTIONS += ("## Licence", "## Citation")


@pytest.fixture(autouse=True)
def secret_environment(monkeypatch):
    """A token in the environment during every test: no card may contain it."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)


# --- Fake run directories, in the formats bert_repro.training.pretrain / finetuning / reproduce write


def make_mrpc_run(root: Path, model: str = "runs/base") -> Path:
    grid, run = [5e-05, 4e-05, 3e-05, 2e-05], {"seed": 42, "train_seconds": 311.2}
    scores = {"accuracy": 0.8137254901960784, "f1": 0.873}  # the kept run's, at 2e-05
    runs = [
        {"learning_rate": lr, **run, "validation": {"accuracy": s - 0.06, "f1": s}, "score": s}
        for lr, s in zip(grid, (0.8512, 0.8601, 0.8689, 0.873))
    ]
    best = {"_main": "f1", **runs[-1], "validation": scores}
    return finetuning_run(root, "mrpc", best, runs, model=model, hp={**GLUE_HP, "learning_rates": grid})


def make_squad_v2_run(root: Path) -> Path:
    names = ("exact_match", "f1", "best_exact_match", "best_f1", "best_f1_threshold", "has_ans_f1", "no_ans_f1")
    scores = {f"squad_{k}": v for k, v in zip(names, (71.2, 74.6, 72.9, 75.8, -1.73, 78.1, 71.0))}
    runs = [{"learning_rate": 5e-05, "seed": 42, "train_seconds": 5400.0, "validation": scores, "score": 75.8}]
    best = {"_main": "squad_f1", **runs[0]}
    hp = {**GLUE_HP, "learning_rates": [5e-05], "num_train_epochs": 2.0, "per_device_train_batch_size": 48}
    fields = dict(run_fields={"data": ["/home/someone/private/data/SQuAD2"]}, head="BertReproForQuestionAnswering")
    model = "google-bert/bert-base-uncased"
    return finetuning_run(root, "squad_v2", best, runs, model=model, hp={**hp, "max_seq_length": 384}, **fields)


def pretrained(out: Path, repo_id: str = REPO, **kwargs) -> ModelCard:
    return PreTrainedFacts.from_run(out, repo_id, **kwargs).to_model_card()


def glue_scores(card: ModelCard) -> dict[tuple[str, str], float]:
    return {
        (r.dataset_config, r.metric_type): r.metric_value for r in card.data.eval_results if "glue" in r.dataset_type
    }


# --- Templates and counts


def test_templates_ship_inside_the_package():
    folder = importlib.resources.files("bert_repro.hub").joinpath(model_card.TEMPLATE_PACKAGE_DIR)
    names = {p.name for p in folder.iterdir()}
    for template in ("pretrained.md", "finetuned.md", "study.md"):
        included = re.findall(r'{%\s*include\s+"([^"]+)"', folder.joinpath(template).read_text())
        assert included and set(included) <= names
    assert "bert_repro/hub/card_templates" in (ROOT / "model_cards" / "README.md").read_text()


def test_a_misspelt_variable_fails_even_inside_a_filter(tmp_path):
    # StrictUndefined makes `{{ typo }}` fail; the cards' number filters must not turn it into "not recorded"
    (tmp_path / "pretrained.md").write_text("{{ results.get('global_step') | count }} {{ resluts | count }}")
    with pytest.raises(jinja2.UndefinedError, match="resluts"):
        PreTrainedFacts.from_run(make_pretraining_run(tmp_path), REPO).to_model_card(tmp_path)


def test_parameter_counts_match_the_spec():
    from bert_repro.model.configuration_bert_repro import PRESETS

    def config(preset):
        return {"vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2, **PRESETS[preset]}

    counts = {p: parameter_count(config(p)) for p in ("base", "tiny", "large")}
    assert counts == {"base": 110_106_428, "tiny": 4_433_468, "large": 336_226_108}
    # BertForSequenceClassification (bert-base, 2 labels): encoder with pooler 109,482,240 + 768 * 2 + 2
    assert parameter_count({**config("base"), "id2label": {"0": "a", "1": "b"}}, "classification") == 109_483_778


def test_safetensors_header_count(tmp_path):
    from safetensors.numpy import save_file

    tensors = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(5, np.float32)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    assert safetensors_parameter_count(tmp_path / "m.safetensors") == 11
    assert safetensors_parameter_count(tmp_path / "missing.safetensors") is None


# --- Pre-trained card


def test_pretraining_metadata(tmp_path):
    card = pretrained(make_pretraining_run(tmp_path))
    data = card.data
    assert data.library_name == "transformers" and data.license == "apache-2.0" and data.language == "en"
    assert data.pipeline_tag == "fill-mask"
    assert {"bert", "bert_repro", "fill-mask"} <= set(data.tags)
    assert data.datasets == ["Salesforce/wikitext"]
    assert data.base_model is None and data.model_name == "bert-tiny-wikitext"
    results = {r.task_type: r for r in data.eval_results}
    # fractions, as evaluate's accuracy gives them and as the fine-tuned cards' (the table: percent)
    assert results["fill-mask"].metric_value == 0.09757961783439491
    assert results["text-classification"].metric_value == 0.5113122171945701
    assert {r.metric_name for r in data.eval_results} == {"MLM accuracy", "NSP accuracy"}
    held_out = {(r.metric_type, r.dataset_type, r.dataset_split) for r in data.eval_results}
    assert held_out == {("accuracy", "Salesforce/wikitext", "held-out")}


def test_pretraining_body(tmp_path):
    out = make_pretraining_run(tmp_path)
    history = [{"loss": 9.25, "step": 50}, {"loss": 7.5, "step": 100}, {"eval_loss": 6.9, "step": 100}]
    write_json(out / "log_history.json", history)
    text = pretrained(out).text
    sizes = [
        "| Layers (L) | 2 |",
        "| Hidden size (H) | 128 |",
        "| Attention heads (A) | 2 |",
        "| Feed-forward size | 512",
    ]
    assert "| Preset | `tiny` (BERT-Tiny size) |" in text and all(row in text for row in sizes)
    assert "| Parameters | 1,552,898 |" in text  # tiny sizes with an 8,192-entry vocabulary
    assert "[Salesforce/wikitext](https://huggingface.co/datasets/Salesforce/wikitext)" in text
    assert "split train; 612 documents." in text  # 600 trained on, 12 held out
    assert "| phase 1 | 128 | 600 | 85,211 | 46,441 | 5,674,364 | 47.1% | 14.9% | 80.0% / 10.0% / 10.0% |" in text
    assert "| phase 2 | 512 |" in text and "| held-out |" in text
    assert "1,000 optimizer steps of 32 sequences" in text
    assert "then the last 10% of the steps at 512 tokens" in text
    assert "12.2 min\n  of training at 5,350.1 tokens/s" in text  # the whole run timed (730.8 s)
    # train_loss is the mean over the run; alone it would read as the final loss
    assert "(Trainer's train_loss): 7.0781; the last logged: 7.5000 at step 100" in text
    assert "| MLM accuracy | 9.76 |" in text and "| NSP accuracy | 51.13 | 97–98" in text
    assert "![Training and held-out curves" in text and "(training_curves.png)" in text
    # every recorded setting, in its section
    settings = ["`dupe_factor` | 3", "`masked_lm_prob` | 0.15", "`global_batch_size` | 32", "`adam_epsilon` | 1e-06"]
    assert all(s in text for s in [*settings, "`optim` | adamw_torch_fused", "`max_grad_norm` | 1.0"])
    assert "CC BY-SA 3.0 and GFDL" in text  # the corpus's licence, in the licence section
    assert "Wikipedia text" in text  # the corpus-specific limitation


def test_the_card_says_what_part_of_the_run_was_timed_and_on_what(tmp_path):
    out = make_pretraining_run(tmp_path)
    assert "tokens/s. Hardware: not recorded." in " ".join(pretrained(out).text.split())  # a run from before the field
    # resumed from a checkpoint without its training time: part of a run is not the whole run's time
    update_json(out / "results.json", train_runtime_from_step=800, hardware="NVIDIA H200", processes=2)
    text = pretrained(out).text
    assert "12.2 min\n  of training from step 800 (the time before it was\n  not recorded) at 5,350.1 tokens/s" in text
    assert "tokens/s. Hardware: NVIDIA H200." in " ".join(text.split()) and "- 2 processes," in text


def test_pretraining_without_phase2_warns_about_untrained_positions(tmp_path):
    text = pretrained(make_pretraining_run(tmp_path, phase2=False)).text
    assert "no 512-token phase" in text
    assert "Position embeddings beyond 128 were never trained" in text


def test_pretraining_with_benchmark(tmp_path):
    bench = tmp_path / "reproduce"
    mrpc = {"task": "mrpc", "metric": "f1", "ours": 87.3, "paper": 88.9, "paper_split": "test", "majority": 81.22}
    squad = {"task": "squad", "metric": "squad_f1", "ours": 88.1, "paper": 88.5, "paper_split": "validation"}
    report = {"paper_model": "base", "glue_average": 78.91, "paper_glue_average": 79.6}
    write_json(bench / "report.json", {**report, "tasks": [{**mrpc, "one_label": "equivalent"}, squad]})
    text = pretrained(make_pretraining_run(tmp_path), benchmark_dir=bench).text
    # the majority class beside each score, and a run that predicted one label marked
    assert '| GLUE MRPC | F1 | 87.30 (every prediction "equivalent") | 81.22 | 88.9 | test |' in text
    assert "| SQuAD v1.1 | F1 | 88.10 | – | 88.5 | dev |" in text  # not a classification task
    assert "GLUE average (eight tasks, WNLI left out): 78.91; paper 79.60" in text
    with pytest.raises(CardError, match="report.json"):
        pretrained(make_pretraining_run(tmp_path), benchmark_dir=tmp_path / "nowhere")


def test_pretraining_with_missing_values(tmp_path):
    corpus = [str(tmp_path / "private" / "books")]
    out = make_pretraining_run(tmp_path, with_results=False, corpus=corpus, eval_fraction=0.0)
    statistics = json.loads((out / "data_statistics.json").read_text())
    del statistics["held_out"]
    write_json(out / "data_statistics.json", statistics)
    card = pretrained(out)
    text = str(card)
    assert card.data.eval_results is None and "model-index" not in text
    assert card.data.datasets is None  # a local corpus is no Hub dataset
    assert "| MLM accuracy | not recorded |" in text
    assert "optimizer steps" in text and "not recorded" in text
    assert "Corpus: the local files given as `--corpus`: `books`; 600 documents." in text  # an absolute path: its name
    assert str(tmp_path) not in text  # no local path from this machine
    (out / "data_statistics.json").unlink()
    assert "`books`; number of documents not recorded." in pretrained(out).text


def test_a_local_corpus_is_named_as_the_run_was_given_it(tmp_path, monkeypatch):
    # the paths of --corpus as run_config.json records them, and the corpus's README or manifest
    monkeypatch.chdir(tmp_path)
    shipped = Path("recipes/data/quickstart_corpus")
    (shipped / "gutenberg").mkdir(parents=True)
    (shipped / "state_union").mkdir()
    (shipped / "README.md").write_text("where each text comes from")
    Path("README.md").write_text("the working directory's own README: not the corpus's")
    out = make_pretraining_run(tmp_path, corpus=[str(shipped / "gutenberg"), str(shipped / "state_union")])
    text = " ".join(pretrained(out).text.split())
    assert (
        "Corpus: the local files given as `--corpus`: `recipes/data/quickstart_corpus/gutenberg` and "
        "`recipes/data/quickstart_corpus/state_union`; 612 documents. Where its texts come from: "
        "`recipes/data/quickstart_corpus/README.md`, beside the corpus's files." in text
    )
    # a corpus built by bert_repro.data.travel_corpus: its manifest, and the folder's name rather than the file's
    Path(".travel/books").mkdir(parents=True)
    Path(".travel/books/manifest.json").write_text("{}")
    out = make_pretraining_run(tmp_path / "gpu", corpus=[".travel/books/corpus.parquet"])
    card = pretrained(out)
    text = " ".join(card.text.split())
    assert "`.travel/books/corpus.parquet`; 612 documents. Where its texts come from: `.travel/books/manifest" in text
    assert {r.dataset_name for r in card.data.eval_results} == {"books, held-out documents"}
    # a single folder at the top of the working directory: the README beside it is the project's, not named
    out = make_pretraining_run(tmp_path / "top", corpus=["recipes"])
    assert "Where its texts come from" not in pretrained(out).text


def test_a_run_from_a_hub_checkpoint_names_it_and_shows_the_vocabulary_the_model_has(tmp_path):
    bert = "google-bert/bert-base-uncased"
    out = make_pretraining_run(tmp_path, init_from=bert, tokenizer=bert)
    # --tokenizer overrides the YAML's vocab_size: the card shows the model's 30,522, not the run's 8192
    write_json(out / "config.json", bert_config(vocab_size=30522))
    card = pretrained(out)
    assert card.data.base_model == bert and f"Pre-training continued from [{bert}]" in card.text
    text = card.text
    assert "| Vocabulary | 30,522 |" in text
    assert "`vocab_size` | 30522 (the model's, from config.json; the run's setting was 8192)" in text
    assert "8192 |" not in text


def make_study(root: Path, pretrained_model: str) -> Path:
    """What `recipes/study.py --study pretraining --seeds 1 2 3` writes: a pre-trained row and a random-init row."""

    def row(variant, model, global_step, cells):  # cells: (mean, se, one score per seed) of each column
        cells = {k: {"ours": c[0], "se": c[1], "seeds": dict(zip("123", c[2:]))} for k, c in zip(keys, cells)}
        pretraining = {"global_step": global_step, "train_runtime_s": 0.0}
        return {"variant": variant, "label": variant, "model": model, "pretraining": pretraining, "cells": cells}

    keys = ("sst2", "mrpc", "mrpc_f1")
    columns = [("sst2", "sst2", "accuracy"), ("mrpc", "mrpc", "accuracy"), ("mrpc_f1", "mrpc", "f1")]
    ours = [(83.49, 0.4, 84.29, 83.03, 83.14), (71.41, 1.14, 69.12, 72.55, 72.55), (79.93, 0.84, 78.28, 80.49, 81.02)]
    random = [(81.69, 0.27, 81.54, 81.31, 82.22), (69.5, 0.16, 69.4, 69.8, 69.3), (75.59, 0.13, 75.63, 75.36, 75.79)]
    random_model = "/home/someone/private/study/pretrain/random"
    study = {
        "study": "pretraining",
        "columns": [{"key": k, "label": k, "task": t, "metric": m, "split": "validation"} for k, t, m in columns],
        "rows": [row("pretrained", pretrained_model, 1000, ours), row("random", random_model, 0, random)],
        "finetune_args": "--learning_rates 3e-4 --data_root /home/someone/private/glue",
        "finetune_args_for": ["sst2=--num_train_epochs 1"],
        "seeds": [1, 2, 3],
        "majority_baseline": {"sst2": 50.92, "mrpc": 68.38, "mrpc_f1": 81.22},
    }
    write_json(root / "study.json", study)
    return root


def test_pretraining_with_study(tmp_path):
    out = make_pretraining_run(tmp_path)
    study = make_study(tmp_path / "study", "/home/someone/private/study/pretrain/pretrained")
    card = pretrained(out, study_dir=study)
    # the study's percent back in each metric's own scale
    assert glue_scores(card) == {("sst2", "accuracy"): 0.8349, ("mrpc", "accuracy"): 0.7141, ("mrpc", "f1"): 0.7993}
    for r in card.data.eval_results[2:]:  # after the held-out MLM and NSP accuracies
        assert (r.task_type, r.dataset_type, r.dataset_split) == ("text-classification", "nyu-mll/glue", "validation")
        assert r.metric_name.endswith("fine-tuned, mean of 3 seeds")
    text = card.text
    assert "| GLUE SST-2 | Accuracy (dev) | 83.49 ± 0.40 | 81.69 ± 0.27 | +1.80 ± 0.48 | 50.92 |" in text
    assert "| GLUE MRPC | F1 (dev) | 79.93 ± 0.84 | 75.59 ± 0.13 | +4.34 ± 0.85 | 81.22 |" in text
    assert "mean ± standard error over the 3 fine-tuning seeds" in text and "seeds 1, 2, 3" in text
    # MRPC accuracy: +1.91 ± 1.15, more than one standard error but within two
    assert "on GLUE SST-2 Accuracy, GLUE MRPC F1 only" in text
    assert "majority class still scores higher on GLUE MRPC F1 (81.22 against 79.93)" in text
    assert "GLUE SST-2 also `--num_train_epochs 1`" in text
    assert "/home/someone" not in str(card) and "glue (local)" in text  # the study's local paths stay out


def test_a_study_without_seeds_shows_the_best_runs(tmp_path):
    study = make_study(tmp_path / "study", "/elsewhere/pretrained")
    data = json.loads((study / "study.json").read_text())
    for row in data["rows"]:
        row["cells"] = {k: {"ours": c["ours"], "paper": None} for k, c in row["cells"].items()}
    write_json(study / "study.json", {**data, "seeds": []})
    card = pretrained(make_pretraining_run(tmp_path), study_dir=study)
    assert {r.metric_name for r in card.data.eval_results[2:]} == {
        "Accuracy, fine-tuned, best of the learning-rate grid",
        "F1, fine-tuned, best of the learning-rate grid",
    }
    assert "| GLUE SST-2 | Accuracy (dev) | 83.49 | 81.69 | +1.80 | 50.92 |" in card.text
    assert "best run of its learning-rate grid (one seed)" in card.text and "standard error" not in card.text


def test_the_study_row_is_this_checkpoints_or_the_card_is_refused(tmp_path):
    out = make_pretraining_run(tmp_path)
    with pytest.raises(CardError, match="nowhere/study.json: no such file"):
        pretrained(out, study_dir=tmp_path / "nowhere")
    study = make_study(tmp_path / "study", "/elsewhere/pretrained")
    rows = json.loads((study / "study.json").read_text())["rows"]
    other = {**rows[0], "variant": "other", "cells": {k: {**c, "ours": 11.0} for k, c in rows[0]["cells"].items()}}
    update_json(study / "study.json", rows=[other, *rows])
    # no path matches: the first pre-trained row; else the row of this checkpoint's directory
    assert glue_scores(pretrained(out, study_dir=study))[("sst2", "accuracy")] == 0.11
    rows[0]["model"] = str(out)
    update_json(study / "study.json", rows=[other, *rows])
    assert glue_scores(pretrained(out, study_dir=study))[("sst2", "accuracy")] == 0.8349
    update_json(study / "study.json", rows=[{**rows[0], "pretraining": {"global_step": 6000}}, rows[1]])
    with pytest.raises(CardError, match="pre-trained for 6,000 steps, this checkpoint for 1,000"):
        pretrained(out, study_dir=study)
    update_json(study / "study.json", rows=rows[1:])
    with pytest.raises(CardError, match="only randomly initialised"):
        pretrained(out, study_dir=study)


# --- Fine-tuned cards


def test_mrpc_metadata_and_table(tmp_path):
    card = card_for_finetuning(make_mrpc_run(tmp_path), "someone/bert-mrpc", base_model="someone/bert-base-repro")
    data = card.data
    assert data.pipeline_tag == "text-classification" and data.base_model == "someone/bert-base-repro"
    assert data.datasets == ["nyu-mll/glue"] and {"bert", "bert_repro", "glue", "mrpc"} <= set(data.tags)
    assert data.metrics == ["accuracy", "f1"]
    values = {(r.dataset_split, r.metric_name): r.metric_value for r in data.eval_results}
    assert values[("validation", "F1")] == 0.873  # fractions, as evaluate's metrics give them (the table: percent)
    assert values[("validation", "Accuracy")] == 0.8137254901960784
    expected = ("text-classification", "nyu-mll/glue", "mrpc", "validation")
    for r in data.eval_results:
        assert (r.task_type, r.dataset_type, r.dataset_config, r.dataset_split) == expected
    text = card.text
    assert "| dev | F1 (main) | 87.30 | – | 88.9 (test) | 89.3 (test) |" in text  # beside the paper's Table 1
    assert "| dev | Accuracy | 81.37 | – | – | – |" in text
    assert "Majority class: not recorded by the run" in text
    assert "GLUE test-server scores" in text and "ours are dev scores" in text
    assert "| 2e-05 | 42 | 87.30 | 311.2 | yes |" in text and "| 5e-05 | 42 | 85.12 | 311.2 |  |" in text
    assert "Learning rates 5e-05, 4e-05, 3e-05, 2e-05 x seeds 42: 4 runs" in text
    assert "warm-up over 10% of the steps" in text
    assert "| Parameters | 109,483,778 |" in text
    assert "F1 88.85 on dev (bert-base-cased; transformers run_glue README" in text
    assert 'classifier({"text": ' in text and "AutoModelForSequenceClassification" in text
    # the base model: the run's --model when it is a Hub id; a local checkpoint is none, and named by its folder
    hub = card_for_finetuning(make_mrpc_run(tmp_path / "b", model="google-bert/bert-base-uncased"), "someone/m")
    local = card_for_finetuning(make_mrpc_run(tmp_path / "a", model="/home/someone/runs/base"), "someone/m")
    assert hub.data.base_model == "google-bert/bert-base-uncased" and local.data.base_model is None
    assert "Pre-trained checkpoint: base (local)." in local.text


def test_epochs_and_times_read_as_people_write_them(tmp_path):
    out = make_mrpc_run(tmp_path)
    text = card_for_finetuning(out, "someone/bert-mrpc").text
    assert "- 3 epochs (steps not recorded)" in text and "- 21.5 min for the whole grid." in text  # 1,290.4 s
    cases = ((1, 1, 42.2, "- 1 epoch (1 step)", "- 42 s for"), (2.5, 25, 7200, "- 2.5 epochs (25 steps)", "- 2.0 h"))
    for epochs, steps, seconds, trained, took in cases:
        summary = json.loads((out / "results.json").read_text())
        update_json(out / "results.json", best={**summary["best"], "epochs": epochs, "steps": steps}, seconds=seconds)
        text = card_for_finetuning(out, "someone/bert-mrpc").text
        assert trained in text and took in text, (trained, took)
    durations = map(numbers.duration, (42.2, 59.4, 59.6, 186, 3569, 3571, None))
    assert " / ".join(durations) == "42 s / 59 s / 1.0 min / 3.1 min / 59.5 min / 1.0 h / not recorded"


def test_a_run_that_predicts_one_label_is_flagged_beside_the_majority_class(tmp_path):
    # MRPC at 81.22 F1 with every prediction "equivalent" (paraphrase) is the majority class's score, not a model's.
    out = make_mrpc_run(tmp_path)
    best = {**json.loads((out / "results.json").read_text())["best"], "one_label": {"validation": "equivalent"}}
    scores = {"validation": {"accuracy": 0.6838, "f1": 0.8122}}
    update_json(out / "results.json", best={**best, **scores}, majority_baseline=scores)
    text = card_for_finetuning(out, "someone/bert-mrpc").text
    assert "| dev | F1 (main) | 81.22 | 81.22 | 88.9 (test) | 89.3 (test) |" in text
    assert "| dev | Accuracy | 68.38 | 68.38 | – | – |" in text
    assert "the score a model must\nbeat to have learned anything" in text
    assert '**This model predicts "equivalent" for every example of the dev split: it learned nothing' in text


def test_squad_v2_card(tmp_path):
    card = card_for_finetuning(make_squad_v2_run(tmp_path), "someone/bert-squad2")
    data = card.data
    assert data.pipeline_tag == "question-answering" and data.datasets == ["rajpurkar/squad_v2"]
    assert data.base_model == "google-bert/bert-base-uncased"
    types = {r.metric_type: r.metric_value for r in data.eval_results}
    # SQuAD metrics are percent already: not multiplied again
    expected = {"exact_match": 71.2, "f1": 74.6, "best_exact": 72.9, "best_f1": 75.8, "HasAns_f1": 78.1}
    assert types == {**expected, "NoAns_f1": 71.0}
    assert all(r.dataset_config is None and r.dataset_split == "validation" for r in data.eval_results)
    text = card.text
    assert "| dev | F1, null threshold tuned on this split | 75.80 | – | – | 81.9 (dev) |" in text
    assert "| dev | Exact match, null threshold tuned on this split | 72.90 | – | – | 78.7 (dev) |" in text
    assert "threshold chosen: -1.73" in text and "like ours" in text
    assert "SQuAD2 (local)" in text and "/home/someone" not in text
    assert "CC BY-SA 4.0" in text
    assert "qa(question=" in text and "AutoModelForQuestionAnswering" in text


def test_a_fine_tune_says_what_its_run_config_says_or_that_it_has_none(tmp_path):
    out = make_mrpc_run(tmp_path)
    update_json(out / "run_config.json", finetuning={"max_train_samples": 500, "data": ["train=/x/mrpc/train.tsv"]})
    text = " ".join(card_for_finetuning(out, "someone/bert-mrpc").text.split())
    assert "Fine-tuned on the first 500 rows of the train split only, the paper on the whole split." in text
    assert "read from local files (train.tsv); only its first 500 rows." in text
    (out / "run_config.json").unlink()
    (out / "config.json").unlink()
    text = str(card_for_finetuning(out, "someone/bert-mrpc"))
    assert "The run's settings (`run_config.json`): not recorded." in text and "Architecture: not recorded" in text


# --- Every card: valid, readable, private


CARDS = {  # name: (repository id, the card of a fake run under a folder)
    "pretraining": (REPO, lambda root: pretrained(make_pretraining_run(root))),
    "pretraining_study": (
        REPO,
        lambda root: pretrained(
            make_pretraining_run(root), study_dir=make_study(root / "s", "/home/someone/private/p")
        ),
    ),
    "mrpc": (
        "someone/bert-mrpc",
        lambda root: card_for_finetuning(
            make_mrpc_run(root), "someone/bert-mrpc", base_model="someone/bert-base-repro"
        ),
    ),
    "squad_v2": (
        "someone/bert-squad2",
        lambda root: card_for_finetuning(make_squad_v2_run(root), "someone/bert-squad2"),
    ),
}


@pytest.mark.parametrize("name", CARDS)
def test_every_card_parses_back_reads_well_and_keeps_secrets_out(name, tmp_path):
    repo, make = CARDS[name]
    card = make(tmp_path)
    text = str(card)
    # huggingface_hub reads back what it wrote: the metadata and the model-index
    parsed = ModelCard(text)
    assert parsed.data.to_dict() == card.data.to_dict() and parsed.data.eval_results == card.data.eval_results
    assert str(parsed) == text
    front_matter = yaml.safe_load(REGEX_YAML_BLOCK.search(text).group(2))
    assert front_matter == card.data.to_dict()
    model_name, results = model_index_to_eval_results(front_matter["model-index"])
    assert model_name == card.data.model_name and results == card.data.eval_results
    assert eval_results_to_model_index(model_name, results) == front_matter["model-index"]
    # every section in order; no template syntax, Python value or run of blank lines left; this repository's snippets
    body = card.text
    positions = [body.find(section) for section in SECTIONS]
    assert -1 not in positions and positions == sorted(positions), positions
    assert not re.search(r"{{|}}|{%|%}|{#|#}", body.replace("{BERT}", "").replace("{A}", ""))
    assert not re.search(r"\bNone\b|\bnan\b|\bNaN\b", body) and "\n\n\n" not in body
    assert f'AutoTokenizer.from_pretrained("{repo}")' in body
    assert re.search(rf'from_pretrained\("{re.escape(repo)}", trust_remote_code=True\)', body)
    assert "import bert_repro" in body and "Apache License 2.0" in body
    assert "@inproceedings{devlin-etal-2019-bert" in body and "N19-1423" in body
    assert all(line.endswith("|") for line in body.splitlines() if line.startswith("|"))
    for line in (line for line in body.splitlines() if "training loss" in line.lower()):
        assert "mean over" in line or "last logged" in line, line
    # no token, local path, run name or setting of outputs, logs and the Hub
    private = ("/home/someone", "private-run-name", "someone/private-repo", "someone/private-space", "hub_token")
    assert [p for p in (FAKE_TOKEN, "<HUB_TOKEN>", "output_dir", *private) if p in text] == []


def test_cards_say_what_the_model_is_for_and_not(tmp_path):
    # as transformers' Trainer cards' "## Intended uses & limitations"
    def section(name):
        text = " ".join(CARDS[name][1](tmp_path / name).text.split())
        return text[text.index("## Intended uses & limitations") :]

    pretraining = section("pretraining")
    assert "Intended use: a pre-trained encoder to fine-tune on a downstream task" in pretraining
    assert "it does not generate text" in pretraining
    assert (
        "This checkpoint saw 0.0125% of the paper's pre-training sequences, from 612 documents (1,931,270 tokens); the "
        "paper's came from BooksCorpus and English Wikipedia (3,300 million words)" in pretraining
    )
    mrpc = section("mrpc")
    assert "Intended use: text classification of inputs like those of GLUE MRPC (`sentence1`, `sentence2`)" in mrpc
    assert "the paper's scores are those of BERT-BASE and BERT-LARGE" in mrpc and "does not generate text" in mrpc
    squad = section("squad_v2")
    assert "Intended use: question answering of inputs like those of SQuAD v2.0 (`question`, `context`)" in squad


def test_cards_list_the_framework_versions_the_run_recorded_else_say_whose(tmp_path):
    # as Trainer's cards: Transformers, Pytorch, Datasets and Tokenizers
    import torch
    import transformers

    out = make_pretraining_run(tmp_path)
    text = pretrained(out).text
    now = "(installed when this card was made; the run did not record it)"
    assert f"- Transformers {transformers.__version__} {now}" in text and f"- Pytorch {torch.__version__} {now}" in text
    assert f"- bert_repro {bert_repro.__version__} {now}" in text
    write_json(out / "config.json", bert_config(transformers_version="5.17.0"))
    text = pretrained(out).text
    assert "- Transformers 5.17.0 (config.json: the version that saved the model)" in text
    versions = framework_versions()
    assert set(versions) == {"transformers", "torch", "datasets", "tokenizers", "bert_repro"}
    update_json(out / "results.json", versions={**versions, "torch": "2.11.0"})
    text = pretrained(out).text
    assert "- Pytorch 2.11.0\n" in text and "installed when this card was made" not in text
    mrpc = make_mrpc_run(tmp_path)
    write_json(mrpc / "config.json", bert_config("base", 30522, transformers_version="5.17.0"))
    assert "- Transformers 5.17.0 (config.json" in card_for_finetuning(mrpc, "someone/bert-mrpc").text


def test_a_card_holding_a_secret_is_refused(tmp_path):
    out = make_pretraining_run(tmp_path, model_overrides=json.dumps({"note": FAKE_TOKEN}))
    with pytest.raises(CardError, match="HF_TOKEN"):
        pretrained(out)


# --- Picking the card for a directory, and the command line


def test_a_directory_gets_the_card_of_its_kind_beside_its_weights(tmp_path, capsys):
    pre, mrpc = make_pretraining_run(tmp_path), make_mrpc_run(tmp_path)
    assert model_card.run_kind(pre) == "pretraining" and model_card.run_kind(mrpc) == "finetuning"
    assert model_card.card_for_directory(pre, REPO).data.pipeline_tag == "fill-mask"
    assert model_card.card_for_directory(mrpc, "someone/m").data.pipeline_tag == "text-classification"
    written = model_card.main([str(mrpc), "someone/bert-mrpc", "--base_model", "someone/bert-base-repro"])
    assert written == mrpc / "README.md"
    card = ModelCard.load(written)
    assert card.data.base_model == "someone/bert-base-repro" and card.data.eval_results
    study = make_study(tmp_path / "study", "/elsewhere/pretrained")
    written = model_card.main([str(pre), REPO, "--study", str(study)])
    assert written == pre / "README.md"
    assert glue_scores(ModelCard.load(written))[("mrpc", "f1")] == 0.7993
    with pytest.raises(SystemExit):
        model_card.main([str(mrpc), "someone/bert-mrpc", "--study", str(study)])


def test_the_command_line_on_bad_input_is_one_line_exit_2(tmp_path, capsys):
    def error(*argv):
        with pytest.raises(SystemExit) as exited:
            model_card.main(list(map(str, argv)))
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "Traceback" not in err, err
        return err

    assert error().startswith("usage: python -m bert_repro.hub.model_card")  # argparse's, for no arguments
    (tmp_path / "empty").mkdir()
    out = make_mrpc_run(tmp_path)
    cases = [((tmp_path / "missing", REPO), f"{tmp_path / 'missing'}: no such directory.")]
    cases += [((tmp_path / "empty", REPO), "neither a pre-training run"), ((out, "not an id!"), "'not an id!'")]
    for argv, expected in cases:
        assert expected in error(*argv) and len(error(*argv).strip().splitlines()) == 1
    for content, expected in (("{", "results.json: not a JSON record"), ('{"task": "paws", "best": {}}', "'paws'")):
        (out / "results.json").write_text(content)  # a torn record; a task this version does not know
        assert expected in error(out, REPO)
    assert not (out / "README.md").exists()


def test_each_dev_split_sits_beside_its_paper_number(tmp_path):
    """MNLI: dev matched / mismatched beside the paper's test matched / mismatched; CoNLL: dev and test each."""
    mnli = {"validation_matched": {"accuracy": 0.8412}, "validation_mismatched": {"accuracy": 0.8455}}
    run = {"learning_rate": 2e-05, "seed": 42, "train_seconds": 9000.0, **mnli, "score": 0.8412}
    out = finetuning_run(tmp_path, "mnli", {"_main": "accuracy", **run}, [run], num_labels=3)
    card = card_for_finetuning(out, "someone/bert-mnli")
    assert "| dev matched | Accuracy (main) | 84.12 | – | 84.6 (test matched) | 86.7 (test matched) |" in card.text
    mismatched = "| dev mismatched | Accuracy (main) | 84.55 | – | 83.4 (test mismatched) | 85.9 (test mismatched) |"
    assert mismatched in card.text
    assert {r.dataset_split for r in card.data.eval_results} == {"validation_matched", "validation_mismatched"}

    names = ("entity_f1", "entity_precision", "entity_recall", "accuracy")
    dev, test = dict(zip(names, (0.951, 0.948, 0.954, 0.99))), dict(zip(names, (0.912, 0.905, 0.919, 0.98)))
    conll = {"validation": dev, "test": test}
    run = {"learning_rate": 3e-05, "seed": 42, "train_seconds": 900.0, **conll, "score": 0.951}
    head = "BertReproForTokenClassification"
    out = finetuning_run(tmp_path, "conll2003", {"_main": "entity_f1", **run}, [run], num_labels=9, head=head)
    card = card_for_finetuning(out, "someone/bert-conll")
    assert card.data.pipeline_tag == "token-classification"
    assert "| dev | Entity F1 (main) | 95.10 | – | 96.4 (dev) | 96.6 (dev) |" in card.text
    assert "| test | Entity F1 (main) | 91.20 | – | 92.4 (test) | 92.8 (test) |" in card.text
    assert "Evaluated on the dev and test splits" in card.text and 'tagger("' in card.text
