"""recipes/study.py: the paper's section-5 tables as data, the selection of variants and tasks, bad input, the
report, and whole studies end to end on a tiny corpus and fixture tasks (each cell kept and not run again)."""

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from support.corpora import WORDS as CORPUS_WORDS
from support.pretraining_runs import write_config
from support.task_files import CONLL_DEV, CONLL_TEST, CONLL_TRAIN, GLUE_FIXTURES, write

from bert_repro.training.cli import ConfigurationError
from bert_repro.training.studies import run as study_module
from bert_repro.training.studies.report import write_study
from bert_repro.training.studies.run import (
    FineTuningRun,
    StudyArguments,
    check_same_study,
    fine_tuned_cell,
    majority_baseline,
    planned_runs,
    run_study,
    select,
)
from bert_repro.training.studies.tables import STUDIES, get_study

WORDS = [*CORPUS_WORDS, "good", "bad", "movie", "film"]


# --- The tables as data


@pytest.mark.parametrize("name", list(STUDIES))
def test_paper_numbers_name_real_variants_columns_and_tasks(name):
    from bert_repro.tasks.registry import get_task

    study = get_study(name)
    variants, columns = {v.key for v in study.variants}, {c.key for c in study.columns}
    assert set(study.paper) <= variants
    for row in study.paper.values():
        assert set(row) <= columns
    for variant in study.variants:
        assert variant.weights_of is None or variant.weights_of in variants
    for column in study.columns:
        if column.task is not None:
            task = get_task(column.task)
            assert column.metric in task.metrics and column.split in task.eval_splits


def test_paper_tables_hold_the_printed_numbers():
    # A few numbers read off the paper's tables, so that a typo in the data fails here.
    assert STUDIES["table5"].paper["ltr"]["mrpc"] == 77.5 and STUDIES["table5"].paper["ltr_bilstm"]["squad"] == 84.9
    assert STUDIES["table6"].paper["L12_H768_A12"] == {"mlm_ppl": 3.99, "mnli": 84.4, "mrpc": 86.7, "sst2": 92.9}
    assert STUDIES["table7"].paper["concat_last_four"]["conll2003"] == 96.1
    assert STUDIES["table8"].paper["mask100_same0_rnd0"]["conll2003_features"] == 94.0


# --- Selection and bad input


def test_selection_keeps_the_variants_whose_weights_are_used():
    study = select(get_study("table5"), StudyArguments(study="table5", variants=["ltr_bilstm"], tasks=["mrpc"]))
    assert [v.key for v in study.variants] == ["ltr", "ltr_bilstm"]
    assert [c.key for c in study.columns] == ["mrpc"]
    sized = select(get_study("table6"), StudyArguments(study="table6", sizes=["2/64/2", "4/128/4"], tasks=["sst2"]))
    assert [v.key for v in sized.variants] == ["L2_H64_A2", "L4_H128_A4"]
    assert [c.key for c in sized.columns] == ["mlm_ppl", "sst2"]  # the pre-training column stays
    assert json.loads(sized.variants[1].pretraining["model_overrides"])["intermediate_size"] == 512


@pytest.mark.parametrize(
    "args, message",
    [
        (dict(study="table9"), "Unknown study 'table9'; choose one of: table5, table6"),
        (dict(study="table5", tasks=["cola"]), "--tasks cola: not in study table5"),
        (dict(study="table5", variants=["nsp"]), "--variants nsp: not in study table5"),
        (dict(study="table5", sizes=["2/64/2"]), "--sizes applies to --study table6 only"),
        (dict(study="table6", sizes=["2x64"]), "'2x64' is not L/H/A"),
        (dict(study="table5", reuse=["mlm"]), "expected VARIANT=DIR"),
        (dict(study="table5", reuse=["mlm=/nonexistent"]), "/nonexistent is not a directory"),
        (dict(study="table5", tasks=["mrpc"]), "No local data for task(s) mrpc"),
        (dict(study="pretraining", pretrain_args="--preset 'mini"), "--pretrain_args: cannot split"),
        (dict(study="pretraining", pretrain_args="--learning_rate -1"), "--learning_rate -1.0: the learning rate"),
        (dict(study="pretraining", finetune_args_for=["nsp=--learning_rates 1e-4"]), "KEY a variant or task of"),
        (dict(study="pretraining", finetune_args_for=["random"]), 'expected KEY="ARGS"'),
        (dict(study="pretraining", seeds=[1, 2], finetune_args="--seeds 7"), "leave --seed(s) out"),
        (dict(study="pretraining", seeds=[1], finetune_args_for=["random=--seed 3"]), "leave --seed(s) out"),
        (dict(study="pretraining", jobs=0), "--jobs 0: at least 1"),
        # checked before any pre-training
        (dict(study="pretraining", finetune_args="--learning_rat 1e-4"), "did you mean --learning_rate or --learning"),
    ],
)
def test_bad_input_is_one_clear_error(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(study_module, "run_pretraining", lambda recipe: pytest.fail("pre-training started"))
    if args.get("study") == "pretraining":  # its data is there: the error comes from the arguments
        root = _glue(tmp_path / "glue")
        args = {**args, "data_root": str(root)}
    with pytest.raises(ConfigurationError) as err:
        run_study(StudyArguments(output_dir=str(tmp_path / "out"), **args))
    assert message in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing ran, nothing written


def test_planned_runs_one_per_seed_each_with_its_task_and_variant_arguments(tmp_path):
    study = get_study("pretraining")
    args = StudyArguments(study="pretraining", finetune_args="--weight_decay 0.0 --learning_rates 3e-4", seeds=[5, 6])
    args.finetune_args_for = ["random=--learning_rates 1e-3", "sst2=--num_train_epochs 1"]
    models = {"pretrained": "P", "random": "R"}
    runs = planned_runs(study, args, tmp_path, models, {"sst2": Path("glue/SST-2"), "mrpc": None})
    # seed by seed, each seed's runs of both variants side by side; MRPC's accuracy and F1 read one run
    assert [(r.seed, r.run, r.variant) for r in runs] == [
        (seed, task, variant) for seed in (5, 6) for task in ("sst2", "mrpc") for variant in ("pretrained", "random")
    ]
    assert runs[0].directory == tmp_path / "finetune" / "pretrained" / "sst2" / "seed5"
    run, training = runs[1].recipe.finetuning, runs[1].recipe.training  # the random model on SST-2
    assert (run.task, run.model, training.output_dir) == ("sst2", "R", str(runs[1].directory))
    # the common arguments, then the task's, then the variant's (the variant's rate over the common one)
    assert training.weight_decay == 0.0 and training.num_train_epochs == 1 and run.learning_rates == [1e-3]
    assert run.seeds == [5] and run.data == ["glue/SST-2"]
    mrpc = runs[2].recipe  # MRPC: the Hub, no task arguments (the task's 3 epochs), the common rate
    assert (
        mrpc.finetuning.data == [] and mrpc.finetuning.learning_rates == [3e-4] and mrpc.training.num_train_epochs == 3
    )
    # without --seeds: one run per cell, in the cell's own directory, the recipe's seeds
    plain = planned_runs(study, StudyArguments(study="pretraining"), tmp_path, models, {"sst2": None, "mrpc": None})
    assert [r.directory.name for r in plain] == ["sst2", "sst2", "mrpc", "mrpc"]
    assert plain[0].recipe.finetuning.seeds == [42]


def _finished(directory: Path, seed: int, accuracy: float, f1: float) -> FineTuningRun:
    directory.mkdir(parents=True)
    best = {"validation": {"accuracy": accuracy, "f1": f1}}
    (directory / "results.json").write_text(json.dumps({"best": best, "seconds": 1.0}))
    return FineTuningRun("pretrained", "mrpc", seed, directory, None)


def test_a_cell_over_seeds_is_the_mean_and_its_standard_error(tmp_path):
    from scipy.stats import sem

    column = get_study("pretraining").columns[2]  # MRPC F1
    f1s = [0.7776, 0.7671, 0.7884]
    runs = [_finished(tmp_path / str(s), s, 0.5, f) for s, f in zip((1, 2, 3), f1s)]
    runs.append(FineTuningRun("pretrained", "mrpc", 4, tmp_path / "4", None))  # not finished: not counted
    cell = fine_tuned_cell(column, runs)
    percent = [100 * f for f in f1s]
    # the mean and its standard error, rounded to the table's two decimals (77.77 and 0.6149 -> 0.61)
    assert cell["ours"] == round(sum(percent) / 3, 2) == 77.77
    assert cell["se"] == round(sem(percent), 2) == 0.61
    assert cell["seeds"] == {1: 77.76, 2: 76.71, 3: 78.84}
    assert fine_tuned_cell(column, runs[:1]) == {"ours": 77.76, "se": None, "seeds": {1: 77.76}}
    assert fine_tuned_cell(column, runs[3:]) == {"ours": None}
    single = _finished(tmp_path / "single", None, 0.5, 0.8)  # no --seeds: the run's own number
    assert fine_tuned_cell(column, [single]) == {"ours": 80.0}


def test_the_majority_baseline_scores_the_most_frequent_training_label(tmp_path):
    from sklearn.metrics import accuracy_score, f1_score

    header = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"

    def mrpc(labels):
        return header + "".join(f"{y}\t{i}\t{i + 1}\tSentence {i}.\tSentence {i + 1}.\n" for i, y in enumerate(labels))

    def sst2(labels):
        return "sentence\tlabel\n" + "".join(f"words {i} \t{y}\n" for i, y in enumerate(labels))

    # training sets whose majority is 1 (MRPC) and 0 (SST-2); dev sets with both labels
    train = {"mrpc": [1, 1, 0, 1, 0], "sst2": [0, 1, 0, 0, 1]}
    dev = {"mrpc": [0, 1, 1, 0, 1, 1, 0], "sst2": [1, 0, 1, 1, 0, 1]}
    write(tmp_path / "MRPC", {"train.tsv": mrpc(train["mrpc"]), "dev.tsv": mrpc(dev["mrpc"])})
    write(tmp_path / "SST-2", {"train.tsv": sst2(train["sst2"]), "dev.tsv": sst2(dev["sst2"])})
    baseline = majority_baseline(get_study("pretraining"), {"sst2": tmp_path / "SST-2", "mrpc": tmp_path / "MRPC"})
    assert baseline == {
        "sst2": round(100 * accuracy_score(dev["sst2"], [0] * 6), 2),  # 33.33
        "mrpc": round(100 * accuracy_score(dev["mrpc"], [1] * 7), 2),  # 57.14
        "mrpc_f1": round(100 * f1_score(dev["mrpc"], [1] * 7), 2),  # 72.73
    }
    # a tie in the training set: the smaller label id
    write(tmp_path / "tie" / "SST-2", {"train.tsv": sst2([1, 0]), "dev.tsv": sst2(dev["sst2"])})
    only_sst2 = select(get_study("pretraining"), StudyArguments(tasks=["sst2"]))
    assert majority_baseline(only_sst2, {"sst2": tmp_path / "tie" / "SST-2"}) == {"sst2": 33.33}


def test_a_study_folder_is_the_same_study_by_its_arguments_and_what_its_inputs_hold(tmp_path, tiny_model):
    """More seeds or jobs, a reused model moved or spelled otherwise: the same study; other arguments or a model
    changed in place: refused, each named."""
    out, model = tmp_path / "out", shutil.copytree(tiny_model, tmp_path / "model")
    first = StudyArguments(study="pretraining", pretrain_args="--max_steps 5000", reuse=[f"pretrained={model}"])
    check_same_study(out, first)
    assert json.loads((out / "study_args.json").read_text())["pretrain_args"] == first.pretrain_args
    moved = shutil.copytree(model, tmp_path / "elsewhere")
    check_same_study(out, replace(first, seeds=[1, 2, 3], jobs=12, reuse=[f"pretrained={moved}/"]))
    with pytest.raises(ConfigurationError) as err:
        check_same_study(out, replace(first, pretrain_args="--max_steps 6000"))
    assert "(--pretrain_args '--max_steps 5000' then, '--max_steps 6000' now)" in str(err.value)
    assert "Pass another --output_dir" in str(err.value)
    (moved / "config.json").write_text((moved / "config.json").read_text().replace("{", '{"edited": 1, ', 1))
    with pytest.raises(ConfigurationError, match=r"\(--reuse pretrained: other content than this study read\)"):
        check_same_study(out, replace(first, reuse=[f"pretrained={moved}"]))


# --- The report


def _row(study, variant, cells, finetune_seconds, pretraining):
    """A row of the table as `run.table_row` makes it."""
    row = {"variant": variant, "label": study.variant(variant).label, "model": "m", "cells": cells}
    return {**row, "finetune_seconds": finetune_seconds, "pretraining": dict(pretraining)}


def test_report_table_ordering_and_chart(tmp_path):
    study = get_study("table5")
    values = {"mlm_nsp": 80.0, "mlm": 78.0, "ltr": 70.0, "ltr_bilstm": 71.0}
    pretraining = {"global_step": 100, "train_runtime_s": 30.0}
    cells = {k: {c.key: {"ours": v + i} for i, c in enumerate(study.columns)} for k, v in values.items()}
    rows = [_row(study, k, cells[k], 12.0, pretraining) for k in values]
    text = write_study(tmp_path, study, rows, StudyArguments(study="table5"), 3600.0)
    assert "| No NSP | 78.00 | 83.9 | 79.00 | 84.9 |" in text
    assert "| 100 | 30 | 12 |" in text  # steps, pre-training and fine-tuning seconds
    # the runs' time, each model's pre-training once (the BiLSTM row fine-tunes the LTR model), and the invocation's
    for r in rows:
        r["model"], r["pretraining"]["train_runtime_s"] = r["variant"], 360.0
    rows[3]["model"] = "ltr"
    text = write_study(tmp_path, study, rows, StudyArguments(study="table5"), 3600.0)
    assert (
        "Time of the runs: 0.31 h (pre-training 0.30 h, fine-tuning 0.01 h; each model counted once, kept runs "
        "included); this invocation 1.00 h."
    ) in text
    assert "- ours: BERT (MLM + NSP) > No NSP > + BiLSTM > LTR & No NSP" in text
    assert "- paper: BERT (MLM + NSP) > No NSP > + BiLSTM > LTR & No NSP" in text  # the BiLSTM's SQuAD gain
    saved = json.loads((tmp_path / "study.json").read_text())
    assert saved["ordering"]["ours"] == ["mlm_nsp", "mlm", "ltr_bilstm", "ltr"]
    assert saved["rows"][2]["cells"]["mrpc"]["ours"] == 72.0
    assert (tmp_path / "study.png").stat().st_size > 0
    # A variant resumed from a checkpoint that did not record its training time: the time is only from that step.
    rows[1]["pretraining"]["train_runtime_from_step"] = 80
    text = write_study(tmp_path, study, rows, StudyArguments(study="table5"), 3600.0)
    assert "| 100 | 360 (from step 80) | 12 |" in text and text.count("(from step") == 1
    assert "pre-training 0.30 h, part of it timed only from a step," in text


def test_equal_means_are_reported_as_a_tie(tmp_path):
    # Every variant at the majority class (a budget too small to learn anything) is a tie, not a ranking.
    study = get_study("pretraining")
    rows = [_row(study, k, {c.key: {"ours": 68.38} for c in study.columns}, 1.0, {}) for k in ("pretrained", "random")]
    text = write_study(tmp_path, study, rows, StudyArguments(study="pretraining"), 60.0)
    assert "- ours: pre-trained (MLM + NSP) = random initialisation" in text
    rows[1]["cells"]["sst2"]["ours"] = 67.0
    text = write_study(tmp_path, study, rows, StudyArguments(study="pretraining"), 60.0)
    assert "- ours: pre-trained (MLM + NSP) > random initialisation" in text


# --- End to end


def _glue(root: Path) -> Path:
    """Tiny MRPC, SST-2 and CoNLL-2003 directories in their original layouts."""
    write(root / "MRPC", GLUE_FIXTURES["mrpc"][0])
    write(root / "SST-2", GLUE_FIXTURES["sst2"][0])
    write(root / "CoNLL-2003", {"eng.train": CONLL_TRAIN, "eng.testa": CONLL_DEV, "eng.testb": CONLL_TEST})
    return root


@pytest.fixture(scope="module")
def pretrain_config(tmp_path_factory):
    """A pre-training config: a small corpus, a tokenizer trained on it and the fixture tasks, a tiny model, 3 steps."""
    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

    root = tmp_path_factory.mktemp("study")
    corpus = root / "corpus"
    corpus.mkdir()
    rng = random.Random(0)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."

    texts = [" ".join(sentence() for _ in range(20)) for _ in range(8)]
    for d, text in enumerate(texts):
        (corpus / f"doc{d}.txt").write_text(text)
    fixtures = [t for name in ("mrpc", "sst2") for t in GLUE_FIXTURES[name][0].values()] + [CONLL_TRAIN]
    tokenizer = train_wordpiece(iterator=texts + fixtures * 3, vocab_size=200, show_progress=False)
    save_tokenizer(tokenizer, root / "tokenizer")
    # four layers: Tables 7 and 8 read the last four; phase 1 only, few steps, no checkpoint
    model = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64, "num_hidden_layers": 4}
    settings = dict(model_overrides=model, dupe_factor=1, phase2_fraction=0.0, eval_fraction=0.25)
    steps = dict(max_steps=3, warmup_steps=1, save_steps=100, eval_steps=100)
    return write_config(root / "pretrain.yaml", corpus, root / "tokenizer", **settings, **steps)


def _args(tmp_path: Path, pretrain_config: Path, **more) -> StudyArguments:
    """A study into tmp_path/out, pre-trained from `pretrain_config`, fine-tuned 2 steps a run on the fixture tasks."""
    finetune_args = "--learning_rates 1e-4 --max_steps 2 --use_cpu true --disable_tqdm true --report_to none"
    out, data = str(tmp_path / "out"), str(_glue(tmp_path / "data"))
    return StudyArguments(
        output_dir=out, pretrain_config=str(pretrain_config), data_root=data, finetune_args=finetune_args, **more
    )


@pytest.mark.slow
def test_pretraining_study_end_to_end_and_resume(tmp_path, pretrain_config, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # each fine-tuning run in a process of its own, two at a time
    args = _args(tmp_path, pretrain_config, study="pretraining", seeds=[1, 2], jobs=2)
    text = run_study(args)
    out = tmp_path / "out"
    assert "| pre-trained (MLM + NSP) |" in text and "| random initialisation |" in text
    assert "| majority class (the training set's most frequent label) |" in text
    saved = json.loads((out / "study.json").read_text())
    assert [r["variant"] for r in saved["rows"]] == ["pretrained", "random"]
    for row in saved["rows"]:
        assert set(row["cells"]) == {"sst2", "mrpc", "mrpc_f1"}
        assert all(0 <= cell["ours"] <= 100 and list(cell["seeds"]) == ["1", "2"] for cell in row["cells"].values())
    assert sorted(p.name for p in (out / "logs").iterdir())[0] == "pretrained-mrpc-seed1.log"  # a log per process
    assert saved["rows"][0]["pretraining"]["global_step"] == 3 and saved["rows"][1]["pretraining"]["global_step"] == 0
    assert (out / "study.png").exists()

    # The random variant: the pre-trained model's architecture and vocabulary, other weights.
    from safetensors.torch import load_file

    trained, drawn = (load_file(out / "pretrain" / k / "model.safetensors") for k in ("pretrained", "random"))
    assert trained.keys() == drawn.keys()
    vocabularies = [(out / "pretrain" / k / "tokenizer.json").read_text() for k in ("pretrained", "random")]
    assert vocabularies[0] == vocabularies[1]
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert not (trained[name] == drawn[name]).all()

    # Run again: every finished run is kept, nothing trains.
    def refuse(*_):
        raise AssertionError("a finished run ran again")

    monkeypatch.setattr(study_module, "run_pretraining", refuse)
    monkeypatch.setattr(study_module, "run_finetuning", refuse)
    assert run_study(args).splitlines()[4:8] == text.splitlines()[4:8]


@pytest.mark.slow
# An "ltr" checkpoint is saved for bert_repro / remote code only, with its warning (tests/training/test_objectives.py).
@pytest.mark.filterwarnings("ignore::bert_repro.model.checkpoint_format.NotTransformersBertWarning")
@pytest.mark.parametrize(
    "name, selection, rows",
    [
        # every variant of Table 5: three pre-training objectives, and the BiLSTM head on the left-to-right model
        ("table5", dict(tasks=["mrpc"]), ["mlm_nsp", "mlm", "ltr", "ltr_bilstm"]),
        ("table6", dict(tasks=["sst2"], sizes=["1/32/2", "2/32/2"]), ["L1_H32_A2", "L2_H32_A2"]),
        ("table7", dict(variants=["concat_last_four"]), ["finetune", "concat_last_four"]),
        ("table8", dict(tasks=["conll2003"], variants=["mask100_same0_rnd0"]), ["mask100_same0_rnd0"]),
    ],
)
def test_each_study_runs_end_to_end_and_writes_its_table(name, selection, rows, tmp_path, pretrain_config, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out"
    args = _args(tmp_path, pretrain_config, study=name, **selection)
    text = run_study(args)
    saved = json.loads((out / "study.json").read_text())
    assert [r["variant"] for r in saved["rows"]] == rows
    # every cell has our number, but the perplexity of a row fine-tuning another's pre-trained model
    weights_of = {v.key: v.weights_of for v in select(get_study(name), args).variants}
    cells = [(row["variant"], key, cell) for row in saved["rows"] for key, cell in row["cells"].items()]
    assert all(cell["ours"] is not None for variant, key, cell in cells if key != "mlm_ppl" or not weights_of[variant])
    assert (out / "study.png").exists() and text.startswith(f"# {get_study(name).title}")
    if name == "table5":  # the checkpoints carry their objective, and the fine-tunes kept it
        models = [out / "pretrain" / "mlm", out / "pretrain" / "ltr", out / "finetune" / "ltr_bilstm" / "mrpc"]
        assert [json.loads((m / "config.json").read_text())["objective"] for m in models] == ["mlm", "ltr", "ltr"]
    if name == "table6":  # perplexity of each size's held-out MLM loss
        assert all(r["cells"]["mlm_ppl"]["ours"] > 1 for r in saved["rows"])
        config = json.loads((out / "pretrain" / "L1_H32_A2" / "config.json").read_text())
        assert config["num_hidden_layers"] == 1 and config["intermediate_size"] == 128
    if name == "table7":  # the feature-based row froze the pre-trained encoder: one pre-training only
        assert not (out / "pretrain" / "concat_last_four").exists()
    if name == "table8":
        config = json.loads((out / "pretrain" / "mask100_same0_rnd0" / "run_config.json").read_text())
        assert "mask_replace_prob" in json.dumps(config) and '"random_replace_prob": 0.0' in json.dumps(config)
