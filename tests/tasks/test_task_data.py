"""Task registry and task data: every task read from each on-disk layout into its canonical form.

Fixtures are tiny copies of the real files' shapes and quirks; bad input names the file and the line or row.
"""

import csv
import dataclasses
import io
import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.task_files import (
    CONLL_DEV,
    CONLL_TEST,
    CONLL_TRAIN,
    CONTEXT,
    GLUE_FIXTURES,
    MNLI_HEAD,
    MRPC_HEAD,
    STSB_HEAD,
    SWAG_HEAD,
    SWAG_ROW,
    qa,
    squad_json,
    swag_csv,
    tsv,
    write,
)

from bert_repro.tasks.files import (
    TaskDataError,
    answer_is_aligned,
    canonical_columns,
    describe_sources,
    iob1_to_iob2,
    load_task_data,
)
from bert_repro.tasks.kinds import REGRESSION, SPAN
from bert_repro.tasks.registry import GLUE_TASKS, KINDS, METRICS, TASKS, get_task

# GLUE in its original layout, and the canonical rows each file must give


def assert_canonical(data, expected: dict, task_name: str):
    assert list(data) == list(expected), f"splits {list(data)} != {list(expected)}"
    for split, columns in expected.items():
        assert data[split].column_names == list(canonical_columns(get_task(task_name)))
        assert data[split].to_dict() == columns, split


def test_glue_fixtures_cover_every_glue_task():
    assert set(GLUE_FIXTURES) == set(GLUE_TASKS)


@pytest.mark.parametrize("name", sorted(GLUE_FIXTURES))
def test_glue_original_layout(tmp_path, name):
    files, expected = GLUE_FIXTURES[name]
    data = load_task_data(name, write(tmp_path / name, files))
    assert_canonical(data, expected, name)
    task = get_task(name)
    if task.label_names:
        assert data["train"].features["label"].names == list(task.label_names)


def write_export(directory: Path, split: str, columns: dict, fmt: str, label_as_name=None) -> Path:
    """An HF export of canonical columns: parquet, csv (standard quoting) or jsonl."""
    directory.mkdir(parents=True, exist_ok=True)
    columns = dict(columns)
    if label_as_name:
        columns["label"] = [label_as_name[i] if i >= 0 else -1 for i in columns["label"]]
    path = directory / f"{split}.{fmt}"
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    if fmt == "parquet":
        pq.write_table(pa.table(columns), path)
    elif fmt == "csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
@pytest.mark.parametrize("name", sorted(GLUE_FIXTURES))
def test_glue_hf_exports(tmp_path, name, fmt):
    _, expected = GLUE_FIXTURES[name]
    for split, columns in expected.items():
        write_export(tmp_path, split, columns, fmt)
    assert_canonical(load_task_data(name, tmp_path), expected, name)


def test_exports_by_explicit_files_label_names_and_original_column_names(tmp_path):
    _, expected = GLUE_FIXTURES["mnli"]
    train = {
        "sentence1": expected["train"]["premise"],
        "sentence2": expected["train"]["hypothesis"],
        "label": expected["train"]["label"],
    }
    names = get_task("mnli").label_names
    files = {
        "train": write_export(tmp_path / "a", "train", train, "csv", label_as_name=names),
        "dev_matched": write_export(tmp_path / "b", "x", expected["validation_matched"], "jsonl", label_as_name=names),
    }
    data = load_task_data("mnli", files)
    assert list(data) == ["train", "validation_matched"]
    assert data["train"].to_dict() == expected["train"]
    assert data["validation_matched"].to_dict() == expected["validation_matched"]


def test_hub_style_shards_and_single_file(tmp_path):
    _, expected = GLUE_FIXTURES["rte"]
    columns = expected["train"]
    data_dir = tmp_path / "rte" / "data"
    data_dir.mkdir(parents=True)
    for k in range(2):
        shard = {name: values[k : k + 1] for name, values in columns.items()}
        pq.write_table(pa.table(shard), data_dir / f"train-0000{k}-of-00002.parquet")
    assert load_task_data("rte", tmp_path / "rte")["train"].to_dict() == columns
    single = write_export(tmp_path / "one", "dev", expected["validation"], "parquet")
    assert list(load_task_data("rte", single)) == ["validation"]


def test_hub_code_path_with_a_local_dataset_directory(tmp_path):
    import datasets

    _, expected = GLUE_FIXTURES["mrpc"]
    task = get_task("mrpc")
    string, labels = datasets.Value("string"), datasets.ClassLabel(names=list(task.label_names))
    features = datasets.Features(
        {"sentence1": string, "sentence2": string, "label": labels, "idx": datasets.Value("int32")}
    )
    repo = tmp_path / "glue_mrpc"
    repo.mkdir()
    for split, columns in expected.items():
        datasets.Dataset.from_dict(columns, features=features).to_parquet(str(repo / f"{split}.parquet"))
    local = dataclasses.replace(task, hub_id=str(repo), hub_config=None)
    assert_canonical(load_task_data(local, hub_cache_dir=tmp_path / "cache"), expected, "mrpc")


def test_hub_failure_says_what_to_pass_instead(tmp_path):
    task = dataclasses.replace(get_task("mrpc"), hub_id=str(tmp_path / "missing-dataset"))
    with pytest.raises(TaskDataError, match="train.tsv"):
        load_task_data(task, hub_cache_dir=tmp_path / "cache")


# SQuAD


def test_squad_v1_json_with_misaligned_training_answer_skipped_and_counted(tmp_path, caplog):
    catholic = CONTEXT.index("Catholic")
    files = {
        "train-v1.1.json": squad_json(
            [
                qa("q1", "What character does the school have?", [("Catholic", catholic)]),
                qa("q2", "What is atop the dome?", [("a statue", catholic)]),  # misaligned: skipped in train
                qa("q3", "Whose dome?", [("Main Building's", CONTEXT.index("Main") + 2)]),  # off inside the word: kept
            ]
        ),
        "dev-v1.1.json": squad_json(
            [qa("d1", "What is atop the dome?", [("a statue", CONTEXT.index("a statue")), ("statue", 0)])]
        ),
    }
    with caplog.at_level(logging.WARNING, logger="bert_repro.tasks.files"):
        data = load_task_data("squad", write(tmp_path, files))
    assert list(data) == ["train", "validation"]
    assert data["train"]["id"] == ["q1", "q3"]
    assert "skipped 1 of 3" in caplog.text and "train-v1.1.json" in caplog.text and "q2" in caplog.text
    assert data["train"][0] == {
        "id": "q1",
        "title": "University_of_Notre_Dame",
        "context": CONTEXT,
        "question": "What character does the school have?",
        "answers": {"text": ["Catholic"], "answer_start": [catholic]},
    }
    # Evaluation keeps every gold answer, aligned or not: the official evaluation compares texts.
    assert data["validation"][0]["answers"] == {
        "text": ["a statue", "statue"],
        "answer_start": [CONTEXT.index("a statue"), 0],
    }


def test_squad_duplicate_question_ids_are_refused_naming_both_places(tmp_path):
    # Scored by id, two questions with one id would count as one (the official evaluation counts every question).
    dev = [qa("d1", "Whose dome?", [("Main", 0)]), qa("d2", "Which?", [("a", 0)]), qa("d1", "What?", [("b", 0)])]
    write(tmp_path, {"dev-v1.1.json": squad_json(dev)})
    with pytest.raises(TaskDataError) as err:
        load_task_data("squad", tmp_path)
    assert str(err.value) == (
        f"{tmp_path / 'dev-v1.1.json'}, article 0, paragraph 0, question 2 (id d1): the question id 'd1' again, "
        f"first at {tmp_path / 'dev-v1.1.json'}, article 0, paragraph 0, question 0 (id d1); every question needs "
        "an id of its own."
    )
    # across the files of one split too
    row = {
        "id": "x",
        "title": "",
        "context": CONTEXT,
        "question": "Q?",
        "answers": {"text": ["a"], "answer_start": [0]},
    }
    write(tmp_path / "two", {"a.jsonl": json.dumps(row) + "\n"})
    (tmp_path / "two" / "b.jsonl").write_text((tmp_path / "two" / "a.jsonl").read_text())
    with pytest.raises(TaskDataError, match="the question id 'x' again"):
        load_task_data("squad", {"validation": [tmp_path / "two" / "a.jsonl", tmp_path / "two" / "b.jsonl"]})


def test_squad_v2_json_unanswerable_questions(tmp_path):
    files = {
        "train-v2.0.json": squad_json(
            [
                qa("t1", "What character?", [("Catholic", CONTEXT.index("Catholic"))], is_impossible=False),
                qa(
                    "t2",
                    "What is below the dome?",
                    [],
                    is_impossible=True,
                    plausible_answers=[{"text": "a statue", "answer_start": 90}],
                ),
            ]
        ),
        "dev-v2.0.json": squad_json([qa("d2", "Who?", [], is_impossible=True)]),
    }
    data = load_task_data("squad_v2", write(tmp_path, files))
    assert data["train"]["answers"] == [
        {"text": ["Catholic"], "answer_start": [CONTEXT.index("Catholic")]},
        {"text": [], "answer_start": []},
    ]
    assert data["validation"]["answers"] == [{"text": [], "answer_start": []}]
    with pytest.raises(TaskDataError, match=r"train-v2.0.json, article 0, paragraph 0, question 1 \(id t2\).*squad_v2"):
        load_task_data("squad", {"train": tmp_path / "train-v2.0.json"})


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_squad_hf_exports(tmp_path, fmt):
    columns = {
        "id": ["a", "b"],
        "title": ["T", "T"],
        "context": [CONTEXT, CONTEXT],
        "question": ["Q1?", "Q2?"],
        "answers": [
            {"text": ["Catholic"], "answer_start": [CONTEXT.index("Catholic")]},
            {"text": [], "answer_start": []},
        ],
    }
    write_export(tmp_path, "validation", columns, fmt)
    assert load_task_data("squad_v2", tmp_path)["validation"].to_dict() == columns


def test_answer_alignment_follows_the_reference_word_test():
    assert answer_is_aligned("the cat sat", "cat", 4)
    assert answer_is_aligned("the cat sat", "cat", 5)  # start inside the word: the covering words contain it
    assert not answer_is_aligned("the cat sat", "sat", 4)
    assert not answer_is_aligned("the cat sat", "cat", 40)


# SWAG


SWAG_EXPECTED = {
    "context": ["Members of the procession walk."],
    "question": ["A drum line"],
    "endings": [
        [
            'passes by, "playing" drums.',
            "has heard approaching them.",
            "arrives and they're outside dancing.",
            "turns the lead singer.",
        ]
    ],
}


def test_swag_original_csv(tmp_path):
    second = SWAG_ROW[:-1] + ["2"]
    files = {
        "train.csv": swag_csv([SWAG_ROW, second]),
        "val.csv": swag_csv([SWAG_ROW]),
        "test.csv": swag_csv([SWAG_ROW[:-1]], header=SWAG_HEAD[:-1]),
    }
    data = load_task_data("swag", write(tmp_path, files))
    assert list(data) == ["train", "validation", "test"]
    assert data["train"].to_dict() == {key: value * 2 for key, value in SWAG_EXPECTED.items()} | {"label": [0, 2]}
    assert data["validation"].to_dict() == SWAG_EXPECTED | {"label": [0]}
    assert data["test"].to_dict() == SWAG_EXPECTED | {"label": [-1]}


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_swag_hf_exports_canonical_and_hub_columns(tmp_path, fmt):
    canonical = SWAG_EXPECTED | {"label": [3]}
    write_export(tmp_path / "canonical", "train", canonical, fmt)
    assert load_task_data("swag", tmp_path / "canonical")["train"].to_dict() == canonical
    hub_columns = {name: [value] for name, value in zip(SWAG_HEAD[1:], SWAG_ROW[1:])} | {"label": [3]}
    write_export(tmp_path / "hub", "validation", hub_columns, fmt)
    assert load_task_data("swag", tmp_path / "hub")["validation"].to_dict() == canonical


# CoNLL-2003


def tag_ids(*tags):
    names = get_task("conll2003").label_names
    return [names.index(tag) for tag in tags]


CONLL_EXPECTED = {
    "train": {
        "id": ["0", "1", "2"],
        "tokens": [
            ["EU", "rejects", "German", "call", "."],
            ["Peter", "Blackburn"],
            ["In", "Paris", "Lyon", "John", "Smith", "Corp"],
        ],
        "ner_tags": [
            tag_ids("B-ORG", "O", "B-MISC", "O", "O"),
            tag_ids("B-PER", "I-PER"),
            tag_ids("O", "B-LOC", "B-LOC", "B-PER", "I-PER", "B-ORG"),
        ],
    },
    "validation": {
        "id": ["0"],
        "tokens": [["CRICKET", "-", "LEICESTERSHIRE"]],
        "ner_tags": [tag_ids("O", "O", "B-ORG")],
    },
    "test": {"id": ["0"], "tokens": [["SOCCER", "-", "JAPAN"]], "ner_tags": [tag_ids("O", "O", "B-LOC")]},
}


@pytest.mark.parametrize("names", [("eng.train", "eng.testa", "eng.testb"), ("train.txt", "valid.txt", "test.txt")])
def test_conll_original_files_iob1_to_iob2(tmp_path, names):
    data = load_task_data("conll2003", write(tmp_path, dict(zip(names, (CONLL_TRAIN, CONLL_DEV, CONLL_TEST)))))
    assert_canonical(data, CONLL_EXPECTED, "conll2003")
    assert data["train"].features["ner_tags"].feature.names == list(get_task("conll2003").label_names)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_conll_hf_exports_with_ids_or_tag_names(tmp_path, fmt):
    columns = CONLL_EXPECTED["validation"]
    write_export(tmp_path / "ids", "validation", columns, fmt)
    assert load_task_data("conll2003", tmp_path / "ids")["validation"].to_dict() == columns
    names = get_task("conll2003").label_names
    named = columns | {"ner_tags": [[names[t] for t in tags] for tags in columns["ner_tags"]]}
    write_export(tmp_path / "names", "dev", named, fmt)
    assert load_task_data("conll2003", tmp_path / "names")["validation"].to_dict() == columns


def test_iob1_to_iob2():
    iob2 = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG", "B-MISC"]
    assert iob1_to_iob2(["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG", "I-MISC"]) == iob2
    assert iob1_to_iob2(["B-PER", "I-PER", "O"]) == ["B-PER", "I-PER", "O"]  # IOB2 unchanged


# TSV: GLUE's literal files and datasets/pandas exports with CSV quoting

RTE_QUOTED = {  # texts that a CSV writer must quote: a doubled quote, a tab, a line break, a lone quote
    "sentence1": ['Valero said it would make "extensive" repairs.', "A tab\tinside.", "Two\nlines.", "Plain text."],
    "sentence2": ['He said "no', "No tab.", 'x "y" z', ""],
    "label": [0, 1, 1, 0],
    "idx": [0, 1, 2, 3],
}


def quoted_tsv(columns: dict, quoting=csv.QUOTE_MINIMAL, terminator="\n") -> str:
    out = io.StringIO()
    writer = csv.writer(out, delimiter="\t", quoting=quoting, lineterminator=terminator)
    writer.writerow(columns)
    writer.writerows(zip(*columns.values()))
    return out.getvalue()


def test_csv_quoted_tsv_export_is_unquoted_and_logged(tmp_path, caplog):
    text = quoted_tsv(RTE_QUOTED)
    assert '"Valero said it would make ""extensive"" repairs."' in text and '"A tab\tinside."' in text
    write(tmp_path, {"train.tsv": text})
    with caplog.at_level(logging.INFO, logger="bert_repro.tasks.files"):
        data = load_task_data("rte", tmp_path)
    assert data["train"].to_dict() == RTE_QUOTED
    logged = [r.getMessage() for r in caplog.records]
    assert any(str(tmp_path / "train.tsv") in m and "CSV-style quoting" in m for m in logged), logged


def test_csv_quoted_tsv_written_by_datasets_all_quoted_and_crlf(tmp_path):
    import datasets

    datasets.Dataset.from_dict(RTE_QUOTED).to_csv(tmp_path / "train.tsv", sep="\t")
    write(tmp_path, {"dev.tsv": quoted_tsv(RTE_QUOTED, quoting=csv.QUOTE_ALL)})
    (tmp_path / "test.tsv").write_bytes(quoted_tsv(RTE_QUOTED, terminator="\r\n").encode())
    data = load_task_data("rte", tmp_path)
    for split in ("train", "validation", "test"):
        assert data[split].to_dict() == RTE_QUOTED, split


def test_original_glue_tsv_with_lone_and_wrapping_quotes_is_read_literally(tmp_path, caplog):
    # MRPC's own lines: a quotation that opens and never closes, and a field that is one whole quotation
    # (which no CSV writer would quote, since it holds no tab, quote or line break once unquoted).
    rows = [
        [1, 702876, 702977, 'Amrozi called him "the witness".', '"The witness was lying," he said.'],
        [0, 2044342, 2044457, "\"I think you'll see a lot of job growth.", '"The result is a package."'],
    ]
    write(tmp_path, {"train.tsv": tsv(["Quality"] + MRPC_HEAD, rows, bom=True)})
    with caplog.at_level(logging.INFO, logger="bert_repro.tasks.files"):
        data = load_task_data("mrpc", tmp_path)
    assert data["train"]["sentence1"] == [rows[0][3], rows[1][3]]
    assert data["train"]["sentence2"] == [rows[0][4], rows[1][4]]
    assert not [r for r in caplog.records if "CSV" in r.getMessage()]


def test_tsv_only_partly_csv_quoted_is_read_literally_with_a_warning(tmp_path, caplog):
    lines = ["sentence\tlabel", '"She said ""hi"" twice."\t1', 'A lone " quote.\t0']
    write(tmp_path, {"train.tsv": "\n".join(lines) + "\n"})
    with caplog.at_level(logging.INFO, logger="bert_repro.tasks.files"):
        data = load_task_data("sst2", tmp_path)
    assert data["train"]["sentence"] == ['"She said ""hi"" twice."', 'A lone " quote.']
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(tmp_path / "train.tsv") in warnings[0], warnings
    assert "read literally" in warnings[0] and "line 2" in warnings[0] and "line 3" in warnings[0]


# Bad input: the message names the file, the line or row, and what was expected


def expect_error(task, source, *fragments):
    with pytest.raises(TaskDataError) as caught:
        load_task_data(task, source)
    for fragment in fragments:
        assert fragment in str(caught.value), f"{fragment!r} not in: {caught.value}"
    return str(caught.value)


def test_label_outside_the_label_set(tmp_path):
    write(tmp_path / "sst2", {"train.tsv": tsv(["sentence", "label"], [["good", 1], ["odd", 2]])})
    expect_error("sst2", tmp_path / "sst2", "train.tsv, line 3", "'2'", "negative, positive")
    mnli = tsv(MNLI_HEAD + ["gold_label"], [[0, 1, "1n", "g", "a", "b", "a", "b", "A.", "B.", "-"]])
    write(tmp_path / "mnli", {"dev_matched.tsv": mnli})
    expect_error("mnli", tmp_path / "mnli", "dev_matched.tsv, line 2", "'-'", "entailment, neutral, contradiction")
    rte = pa.table({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [1, 5]})
    pq.write_table(rte, tmp_path / "validation.parquet")
    expect_error("rte", {"validation": tmp_path / "validation.parquet"}, "validation.parquet, row 1", "5")


def test_score_out_of_range_and_missing_label(tmp_path):
    row = [0, "g", "f", "y", "1", "n", "n", "A.", "B."]
    write(tmp_path / "stsb", {"train.tsv": tsv(STSB_HEAD + ["score"], [row + ["7.5"]])})
    expect_error("stsb", tmp_path / "stsb", "train.tsv, line 2", "7.5", "0.0..5.0")
    write(tmp_path / "qnli", {"dev.tsv": tsv(["index", "question", "sentence", "label"], [[0, "Q?", "S.", ""]])})
    expect_error("qnli", tmp_path / "qnli", "dev.tsv, line 2", "no label")


def test_missing_column_lists_the_columns_present(tmp_path):
    write_export(tmp_path, "train", {"sentence1": ["a"], "label": [1]}, "csv")
    expect_error("mrpc", tmp_path, "train.csv", "'sentence2'", "#2 String", "columns present: sentence1, label")


def test_wrong_number_of_fields_in_a_glue_row(tmp_path):
    rows = [[1, 1, 2, "a", "b"], [0, 3, 4, "only one sentence"]]
    write(tmp_path, {"train.tsv": tsv(["Quality"] + MRPC_HEAD, rows, bom=True)})
    expect_error("mrpc", tmp_path, "train.tsv, line 3", "expected 5 tab-separated fields", "found 4")


def test_empty_split(tmp_path):
    write(tmp_path, {"train.tsv": tsv(["sentence", "label"], [["fine", 1]]), "dev.tsv": tsv(["sentence", "label"], [])})
    expect_error("sst2", tmp_path, "dev.tsv", "validation split of sst2 is empty")


def test_swag_row_with_three_endings(tmp_path):
    short = SWAG_ROW[:10] + ["", "1"]
    write(tmp_path, {"train.csv": swag_csv([SWAG_ROW, short])})
    expect_error("swag", tmp_path, "train.csv, line 3", "3 endings, expected 4", "ending3")
    write(tmp_path / "b", {"val.csv": swag_csv([SWAG_ROW[:10] + ["0"]])})
    expect_error("swag", tmp_path / "b", "val.csv, line 2", "expected 12 comma-separated fields")


def test_malformed_conll_line_and_unknown_tag(tmp_path):
    write(tmp_path / "a", {"eng.train": "-DOCSTART- -X- O O\n\nEU NNP I-ORG\n"})
    expect_error("conll2003", tmp_path / "a", "eng.train, line 3", "expected 4", "token POS chunk NER")
    write(tmp_path / "b", {"eng.testa": "EU NNP I-NP I-ORG\nrejects VBZ I-VP B-FOO\n"})
    expect_error("conll2003", tmp_path / "b", "eng.testa, line 2", "'B-FOO'", "B-MISC")


def test_squad_structure_errors(tmp_path):
    bad = json.dumps({"data": [{"title": "T", "paragraphs": [{"context": CONTEXT, "qas": [{"id": "x"}]}]}]})
    write(tmp_path, {"dev-v1.1.json": bad})
    expect_error("squad", tmp_path, "dev-v1.1.json, article 0, paragraph 0, question 0", "'question'")


def test_no_data_ambiguity_and_unknown_split(tmp_path):
    message = expect_error("mrpc", write(tmp_path / "empty", {"notes.md": "x"}), "no data for mrpc in", "train.tsv")
    assert "train.*" in message and "parquet" in message
    _, expected = GLUE_FIXTURES["sst2"]
    write(tmp_path / "both", {"train.tsv": tsv(["sentence", "label"], [["a", 1]])})
    write_export(tmp_path / "both", "train", expected["train"], "parquet")
    both = ("several candidates for the train split", "train.tsv", "train.parquet")
    message = expect_error("sst2", tmp_path / "both", *both)
    # The advice is in the recipes' command-line form (FineTuningArguments.data), not a Python dict.
    assert f"--data train={tmp_path / 'both' / 'train.tsv'}" in message and "{'train'" not in message
    expect_error("sst2", {"training": tmp_path / "both" / "train.tsv"}, "unknown split 'training'")
    write(tmp_path / "odd", {"sst.tsv": tsv(["sentence", "label"], [["a", 1]])})
    odd = tmp_path / "odd" / "sst.tsv"
    expect_error("sst2", odd, "cannot tell which split", f"--data train={odd}")


# The registry


def test_registry_is_complete_and_consistent():
    assert set(TASKS) == set("mnli qqp qnli sst2 cola stsb mrpc rte wnli squad squad_v2 swag conll2003".split())
    for name, task in TASKS.items():
        assert task.name == name and task.kind in KINDS
        assert task.metrics and set(task.metrics) <= set(METRICS), name
        assert task.main_metric in task.metrics, name
        if task.kind not in (REGRESSION, SPAN):
            assert task.label_names and len(set(task.label_names)) == len(task.label_names), name
        else:
            assert task.label_names is None, name
        hyperparameters = {"learning_rate", "num_train_epochs", "per_device_train_batch_size", "max_seq_length"}
        assert hyperparameters <= set(task.defaults), name
        assert task.hub_id and task.original_files and set(task.original_files) <= set(task.splits), name
        assert task.splits[0] == "train" and task.eval_splits, name
        for result in task.paper + task.other_reported:
            assert result.metric in task.metrics and result.split in task.splits, (name, result)
        if name in GLUE_TASKS:
            assert task.hub_id == "nyu-mll/glue" and task.hub_config == name
            assert set(task.glue_submission_names) == set(task.test_splits)
            assert task.in_glue_average == (name != "wnli")
            assert task.defaults["per_device_train_batch_size"] == 32 and task.defaults["num_train_epochs"] == 3
            assert task.grid["learning_rate"] == (5e-5, 4e-5, 3e-5, 2e-5)
        if name != "wnli":
            assert any(r.metric == task.main_metric or name == "squad_v2" for r in task.paper), name
        assert describe_sources(task)


def test_registry_values_from_the_paper():
    assert get_task("mnli").label_names == ("entailment", "neutral", "contradiction")
    assert get_task("mnli").eval_splits == ("validation_matched", "validation_mismatched")
    assert get_task("mnli").glue_submission_name("test_mismatched") == "MNLI-mm.tsv"
    assert get_task("MRPC").glue_submission_name() == "MRPC.tsv" and get_task("mrpc").main_metric == "f1"
    assert get_task("sts-b").main_metric == "spearman" and get_task("cola").main_metric == "matthews_correlation"
    assert get_task("rte").format_submission_value(1) == "not_entailment"
    assert get_task("wnli").format_submission_value(1) == "1"
    assert get_task("stsb").format_submission_value(3.14159) == "3.142"
    conll = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
    assert get_task("conll2003").label_names == conll

    def defaults(task, names):
        return [get_task(task).defaults[name] for name in names.split()]

    assert defaults("squad", "max_seq_length doc_stride max_query_length") == [384, 128, 64]
    schedule = "learning_rate num_train_epochs per_device_train_batch_size"
    assert defaults("squad", schedule) == [5e-5, 3, 32] and defaults("swag", schedule) == [2e-5, 3, 16]
    assert defaults("squad_v2", "num_train_epochs per_device_train_batch_size") == [2, 48]
    assert {(r.model, r.split, r.value) for r in get_task("mnli").paper} == {
        ("base", "test_matched", 84.6),
        ("large", "test_matched", 86.7),
        ("base", "test_mismatched", 83.4),
        ("large", "test_mismatched", 85.9),
    }
    with pytest.raises(KeyError, match="Known tasks: mnli, qqp"):
        get_task("imdb")
