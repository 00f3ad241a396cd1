"""Task kinds (`bert_repro.tasks.kinds`): a new kind defined here alone runs through the whole recipe unchanged."""

import dataclasses
import json
import math
import re
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import transformers
from support.models import tiny_config
from transformers import DataCollatorWithPadding, TrainingArguments

import bert_repro
from bert_repro import BertReproForPreTraining, BertReproForSequenceClassification
from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece
from bert_repro.hub.card_base import TASK_TYPE_NAMES, parameter_count
from bert_repro.tasks import metrics
from bert_repro.tasks.columns import class_id, find_column, texts
from bert_repro.tasks.files import load_task_data
from bert_repro.tasks.kinds import KINDS, TaskKind, kind_named
from bert_repro.tasks.registry import TASKS, Task
from bert_repro.training.finetuning.recipe import FineTuningArguments
from bert_repro.training.finetuning.trainer import encode_splits, one_run

ATTRIBUTES = "name head_class auto_class pipeline_tag pipeline_task head_description uses_pooler decode_columns".split()
METHODS = (
    "num_labels head_parameters features canonicalise labelled encode collator decode score ranking_metric card_labels "
    "pipeline_example"
).split()


@pytest.fixture(scope="module")
def tokenizer():
    return train_wordpiece(iterator=["the cat sat on the mat", "a dog ran"] * 3, vocab_size=60, show_progress=False)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_kind_provides_every_hook(name, tokenizer):
    task = TASKS[name]
    kind = task.kind
    assert isinstance(kind, TaskKind) and kind in KINDS and kind_named(kind.name) is kind
    assert not type(kind).__abstractmethods__
    for attribute in ATTRIBUTES:
        assert hasattr(kind, attribute), attribute
    for method in METHODS:
        assert callable(getattr(kind, method)), method
    assert issubclass(kind.head_class, bert_repro.BertReproPreTrainedModel)
    assert kind.head_class.__name__ in bert_repro.AUTO_MAP[kind.auto_class]
    assert hasattr(transformers, kind.auto_class)
    assert kind.pipeline_tag in TASK_TYPE_NAMES and kind.head_description
    assert kind.pipeline_task in (None, kind.pipeline_tag)
    assert isinstance(kind.features(task), datasets.Features) and kind.features(task)
    assert kind.ranking_metric(task) in task.metrics
    assert kind.collator(tokenizer) is not None
    variable, call = kind.pipeline_example(task)
    assert call.startswith(f"{variable}(")
    labels = kind.card_labels(task)
    assert labels is None or set(labels) <= set(task.label_names)
    # The head's parameters, as the model card counts them, are those of the head class.
    config = tiny_config(num_labels=kind.num_labels(task))
    model = kind.head_class(config)
    assert parameter_count(config.to_dict(), kind) == sum(p.numel() for p in model.parameters())


# A kind the package does not have, defined here and nowhere else.


class PairAgreement(TaskKind):
    """Toy kind: does b say the same as a? P(same) above a threshold, with its own columns ("a", "b", "same")."""

    name = "pair_agreement"
    head_class = BertReproForSequenceClassification
    auto_class = "AutoModelForSequenceClassification"
    pipeline_tag = pipeline_task = "text-classification"
    head_description = "a linear layer on the pooled [CLS] output, P(same) thresholded"
    uses_pooler = True
    threshold = 0.5

    def __init__(self):
        self.calls = []

    def features(self, task):
        string = datasets.Value("string")
        return datasets.Features({"a": string, "b": string, "same": datasets.ClassLabel(names=list(task.label_names))})

    def canonicalise(self, task, split, raw):
        self.calls.append(("canonicalise", split))
        return {
            "a": texts(raw, find_column(task, raw, "a"), "a"),
            "b": texts(raw, find_column(task, raw, "b"), "b"),
            "same": [class_id(task, raw, i, v, False) for i, v in enumerate(find_column(task, raw, "same"))],
        }

    def labelled(self, task, split):
        return True

    def encode(self, task, split, tokenizer, settings, *, train):
        self.calls.append(("encode", train))

        def encode_batch(batch):
            encoded = tokenizer(batch["a"], batch["b"], truncation=True, max_length=settings.max_seq_length)
            return {**encoded, "labels": batch["same"]}

        return split.map(encode_batch, batched=True, remove_columns=split.column_names)

    def collator(self, tokenizer):
        return DataCollatorWithPadding(tokenizer)

    def decode(self, task, logits, raw, encoded, settings):
        self.calls.append(("decode", len(raw)))
        probabilities = torch.softmax(torch.as_tensor(logits), -1)[:, 1].numpy()
        return (probabilities > self.threshold).astype(np.int64)

    def score(self, task, raw, predictions):
        self.calls.append(("score", len(raw)))
        return metrics.compute(task.metrics, predictions, np.asarray(raw["same"]))

    def pipeline_example(self, task):
        return "classifier", 'classifier({"text": "a cat", "text_pair": "the cat"})'


def test_a_new_kind_runs_through_finetuning_in_one_place(tmp_path: Path):
    kind = PairAgreement()
    task = Task(
        name="toy_pairs",
        kind=kind,
        text_columns=("a", "b"),
        label_names=("different", "same"),
        metrics=("accuracy", "f1"),
        main_metric="f1",
        hub_id="local/toy_pairs",
        hub_config=None,
        test_splits=(),
    )
    rows = [
        {"a": "the cat sat", "b": "the cat sat", "same": "same"},
        {"a": "a dog ran", "b": "the mat", "same": 0},
        {"a": "the mat", "b": "the mat", "same": 1},
        {"a": "a cat", "b": "a dog ran", "same": "different"},
    ]
    files = {}
    for split in ("train", "validation"):
        files[split] = tmp_path / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = load_task_data(task, files)
    assert data["validation"]["same"] == [1, 0, 1, 0] and data["train"].features == kind.features(task)

    tokenizer = train_wordpiece(iterator=[r["a"] + " " + r["b"] for r in rows] * 3, vocab_size=60, show_progress=False)
    model_dir = tmp_path / "tiny"
    torch.manual_seed(0)
    BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer))).save_pretrained(model_dir)
    save_tokenizer(tokenizer, model_dir)
    run = FineTuningArguments(task=task.name, model=str(model_dir), max_seq_length=32)
    quiet = {"use_cpu": True, "report_to": "none", "disable_tqdm": True, "save_strategy": "no"}
    training = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2, **quiet)
    splits = encode_splits(task, data, tokenizer, run)
    result, trainer = one_run(task, splits, tokenizer, run, training, 1e-4, 0, tmp_path / "out" / "run")

    assert isinstance(trainer.model, BertReproForSequenceClassification) and trainer.model.num_labels == 2
    assert set(result["validation"]) == {"accuracy", "f1"}
    assert result["score"] == result["validation"]["f1"]
    canonicalised = [("canonicalise", "train"), ("canonicalise", "validation")]
    assert kind.calls == [*canonicalised, ("encode", True), ("encode", False), ("decode", 4), ("score", 4)]


# Nothing outside the kinds module decides by kind.

_KIND_TEST = re.compile(r"\bkind(?:\.name)?\s*(?:==|!=|(?:not\s+)?in\b)|\[[^\]\n]*\.kind\]")


def test_no_module_outside_the_kinds_compares_kinds():
    package = Path(bert_repro.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "kinds.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _KIND_TEST.search(line)
    ]
    assert not found, "\n".join(found)


# Each kind's hooks on hand-checked rows: encode (label alignment included), decode, score, the head's choice.
# A vocabulary written out here, so that "cats" is two pieces (cat ##s) and "brussels" three.

VOCAB = (
    "[PAD] [UNK] [CLS] [SEP] [MASK] the cat ##s sat on mat a dog ran is in paris france where ? . red car blue sky "
    "london bru ##ss ##els met what"
).split()


@pytest.fixture(scope="module")
def pieces(tmp_path_factory):
    from bert_repro.data.wordpiece import load_tokenizer

    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(f"{token}\n" for token in VOCAB))
    tok = load_tokenizer(path)
    assert tok.tokenize("The cats met in Brussels") == ["the", "cat", "##s", "met", "in", "bru", "##ss", "##els"]
    return tok


def settings(**changes):
    from types import SimpleNamespace

    values = {"max_seq_length": 32, "doc_stride": 128, "max_query_length": 64, "n_best_size": 20}
    return SimpleNamespace(**{**values, "max_answer_length": 30, "num_proc": None, **changes})


def test_token_labels_sit_on_each_words_first_piece(pieces):
    """Paper §5.3: a word's tag on its first sub-token, -100 elsewhere; a word cut off scores as "O"."""
    task = TASKS["conll2003"]
    kind = task.kind
    rows = {
        "id": ["0", "1"],
        "tokens": [["The", "cats", "met"], ["cats", "cats", "Brussels"]],
        "ner_tags": [[0, 3, 0], [1, 2, 5]],
    }
    split = datasets.Dataset.from_dict(rows)
    encoded = kind.encode(task, split, pieces, settings(), train=True)
    assert encoded.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    assert encoded["labels"] == [
        [-100, 0, 3, -100, 0, -100],  # [CLS] the cat ##s met [SEP]
        [-100, 1, -100, 2, -100, 5, -100, -100, -100],  # [CLS] cat ##s cat ##s bru ##ss ##els [SEP]
    ]
    assert encoded["input_ids"][1] == pieces("cats cats Brussels")["input_ids"]
    short = kind.encode(task, split, pieces, settings(max_seq_length=4), train=False)
    assert short["labels"] == [[-100, 0, 3, -100], [-100, 1, -100, -100]]  # words cut off: no label
    assert kind.labelled(task, split) and kind.labelled(task, split.select([]))

    # decode: the argmax tag at the labelled positions only; score: the cut words count as "O".
    logits = np.zeros((2, 4, len(task.label_names)))
    for row, tags in enumerate([[7, 0, 3, 8], [8, 1, 6, 6]]):
        logits[row, range(4), tags] = 1.0
    predictions = kind.decode(task, logits, split, short, settings())
    assert predictions == [["O", "B-ORG"], ["B-PER"]]
    scores = kind.score(task, split, predictions)
    # Gold: O B-ORG O | B-PER I-PER B-LOC; predicted, padded: O B-ORG O | B-PER O O. Chunks: ORG right, PER cut
    # short, LOC missed: precision 1/2, recall 1/3; 4 of 6 tags right.
    expected = {"entity_f1": 2 * 0.5 * (1 / 3) / (0.5 + 1 / 3), "entity_precision": 0.5, "entity_recall": 1 / 3}
    assert scores == pytest.approx({**expected, "accuracy": 4 / 6})
    assert list(scores) == ["entity_f1", "entity_precision", "entity_recall", "accuracy"]


def test_sentence_kinds_encode_decode_and_score(pieces):
    pair, single, regression = TASKS["mrpc"], TASKS["sst2"], TASKS["stsb"]
    split = datasets.Dataset.from_dict(
        {"sentence1": ["the cat sat on the mat", "a dog"], "sentence2": ["a cat ran", "the dog ran"], "label": [1, 0]}
    )
    encoded = pair.kind.encode(pair, split, pieces, settings(max_seq_length=8), train=True)
    assert encoded.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    expected = pieces(list(split["sentence1"]), list(split["sentence2"]), truncation=True, max_length=8)
    assert encoded["input_ids"] == expected["input_ids"] and max(map(len, encoded["input_ids"])) == 8
    assert encoded["token_type_ids"] == expected["token_type_ids"] and encoded["labels"] == [1, 0]
    sentences = datasets.Dataset.from_dict({"sentence": ["the cat sat", "a dog ran on the mat"], "label": [0, 1]})
    encoded = single.kind.encode(single, sentences, pieces, settings(max_seq_length=5), train=False)
    assert encoded["input_ids"] == pieces(list(sentences["sentence"]), truncation=True, max_length=5)["input_ids"]

    logits = np.array([[0.1, 0.9], [2.0, -1.0], [0.0, 0.5]])
    assert pair.kind.decode(pair, logits, split, encoded, settings()).tolist() == [1, 0, 1]
    scores = regression.kind.decode(regression, np.array([[0.5], [4.0]]), split, encoded, settings())
    assert scores.tolist() == [0.5, 4.0]
    assert pair.kind.score(pair, split, np.array([1, 1])) == pytest.approx({"accuracy": 0.5, "f1": 2 / 3})

    # The majority baseline: the most frequent training label; of a tie, the smaller id.
    for labels, majority in (([1, 1, 0, 2], 1), ([2, 1, 1, 2, 0], 1), ([2, 2, 0], 2)):
        train = datasets.Dataset.from_dict({"label": labels})
        assert pair.kind.majority_predictions(pair, train, split).tolist() == [majority] * 2
    assert regression.kind.majority_predictions(regression, train, split) is None


def test_labelled_means_every_row_has_a_gold_label():
    task = TASKS["sst2"]
    for labels, expected in (([0, 1], True), ([1], True), ([0, -1], False), ([-1, -1], False), ([], False)):
        split = datasets.Dataset.from_dict(
            {"label": labels}, features=datasets.Features({"label": datasets.Value("int64")})
        )
        assert task.kind.labelled(task, split) is expected, labels


def test_multiple_choice_encodes_each_ending_after_the_question(pieces):
    task = TASKS["swag"]
    endings = [["sat", "ran", "met", "is"], ["on the mat", "in paris", "a car", "the sky"]]
    split = datasets.Dataset.from_dict(
        {"context": ["the cat", "a dog ran"], "question": ["a dog", ""], "endings": endings, "label": [2, 0]}
    )
    encoded = task.kind.encode(task, split, pieces, settings(max_seq_length=7), train=True)
    assert encoded.column_names == ["input_ids", "token_type_ids", "attention_mask", "labels"]
    assert encoded["labels"] == [2, 0]
    for i, (context, question) in enumerate(zip(split["context"], split["question"])):
        seconds = [f"{question} {ending}".strip() for ending in endings[i]]
        expected = pieces([context] * 4, seconds, truncation=True, max_length=7)
        assert encoded["input_ids"][i] == expected["input_ids"]
        assert encoded["token_type_ids"][i] == expected["token_type_ids"]
    # A task that leaves num_choices unset takes the number of endings of the rows.
    unset_task = dataclasses.replace(task, num_choices=None)
    unset = task.kind.encode(unset_task, split, pieces, settings(max_seq_length=7), train=True)
    assert unset.to_dict() == encoded.to_dict()
    logits = np.array([[0.0, 1.0, 3.0, 2.0], [5.0, 1.0, 0.0, 0.0]])
    predictions = task.kind.decode(task, logits, split, encoded, settings())
    assert predictions.tolist() == [2, 0]
    assert task.kind.score(task, split, np.array([2, 1])) == {"accuracy": 0.5}
    batch = task.kind.collator(pieces)([{k: encoded[k][i] for k in encoded.column_names} for i in range(2)])
    assert tuple(batch["input_ids"].shape) == (2, 4, 7)


def squad_split(ids_answers: list[tuple[str, str, list[str]]]) -> datasets.Dataset:
    context = "the red car is in paris . a blue sky in london ."
    return datasets.Dataset.from_dict(
        {
            "id": [row[0] for row in ids_answers],
            "title": [""] * len(ids_answers),
            "context": [context] * len(ids_answers),
            "question": [row[1] for row in ids_answers],
            "answers": [{"text": row[2], "answer_start": [context.index(a) for a in row[2]]} for row in ids_answers],
        }
    )


def test_span_kind_encode_and_decode_pass_the_settings_on(pieces):
    from bert_repro.tasks import squad

    task = TASKS["squad_v2"]
    raw = squad_split([("q1", "where is the red car ?", ["paris"]), ("q2", "what is blue ?", [])])
    run = settings(max_seq_length=16, doc_stride=2, max_query_length=3)
    columns = raw.remove_columns([]).to_dict()
    kwargs = {"max_seq_length": 16, "doc_stride": 2, "max_query_length": 3}
    train = task.kind.encode(task, raw, pieces, run, train=True)
    assert train.to_dict() == squad.prepare_train_features(columns, pieces, **kwargs)
    encoded = task.kind.encode(task, raw, pieces, run, train=False)
    expected = squad.prepare_eval_features(columns, pieces, **kwargs)  # offsets as tuples; Arrow gives lists
    assert encoded.to_dict() == json.loads(json.dumps(expected))
    assert task.kind.labelled(task, raw)

    # q1's first window holds "the red car" from its first context position a; [CLS] scores 6 + 6 everywhere.
    rows = len(encoded)
    start, end = np.full((rows, 16), -9.0), np.full((rows, 16), -9.0)
    start[:, 0] = end[:, 0] = 6.0
    first = encoded["example_id"].index("q1")
    a = next(p for p, o in enumerate(encoded["offset_mapping"][first]) if o is not None)
    start[first, a], end[first, a + 1], end[first, a + 2] = 5.0, 4.0, 15.0
    # "the red car" (20) is 3 tokens, over max_answer_length 2: "the red" (9) wins; s_null 12 beats it by 3, and
    # the answer is still the span (threshold +inf: the threshold is applied when scoring).
    predictions = task.kind.decode(task, (start, end), raw, encoded, settings(max_answer_length=2))
    assert predictions["answers"]["q1"] == "the red" and predictions["null_diffs"]["q1"] == pytest.approx(3.0)
    assert task.kind.decode(task, (start, end), raw, encoded, settings())["answers"]["q1"] == "the red car"
    # n_best_size 1: the best start ("red", 7) and the best end ("the", 15) make no span; 20 would give "the".
    start[first, a + 1], end[first, a], end[first, a + 2] = 7.0, 15.0, 4.0
    predictions = task.kind.decode(task, (start, end), raw, encoded, settings(n_best_size=1))
    assert predictions["answers"]["q1"] == "" and predictions["null_diffs"]["q1"] == math.inf
    assert task.kind.decode(task, (start, end), raw, encoded, settings())["answers"]["q1"] == "the"
    v1 = TASKS["squad"]
    assert task.kind.decode(v1, (start, end), raw, encoded, settings())["null_diffs"] == {}


def test_span_scores_v1_and_v2_hand_checked():
    """v2.0 at the threshold 0 (a span where the diff is <= 0), and the official best-threshold search."""
    v2, v1 = TASKS["squad_v2"], TASKS["squad"]
    raw = squad_split([("q1", "", ["paris"]), ("q4", "", ["blue sky"]), ("q3", "", ["the red car"]), ("q2", "", [])])
    answers = {"q1": "paris", "q4": "sky", "q3": "red car", "q2": "london"}
    diffs = {"q1": -1.0, "q4": -2.0, "q3": 0.5, "q2": 2.0}
    scores = v2.kind.score(v2, raw, {"answers": answers, "null_diffs": diffs})
    # At 0: q1 right, q4 F1 2/3, q3 and q2 "" (q2 right). Best threshold 0.5 keeps q3 (exact after "the" goes).
    assert scores == pytest.approx(
        {
            "squad_exact_match": 50.0,
            "squad_f1": 100 * (1 + 2 / 3 + 0 + 1) / 4,
            "squad_best_exact_match": 75.0,
            "squad_best_f1": 100 * (1 + 2 / 3 + 1 + 1) / 4,
            "squad_best_f1_threshold": 0.5,
            "squad_has_ans_f1": 100 * (1 + 2 / 3) / 3,
            "squad_no_ans_f1": 100.0,
        }
    )
    assert all(type(value) is float for value in scores.values())
    tie = v2.kind.score(v2, raw.select([0]), {"answers": {"q1": "paris"}, "null_diffs": {"q1": 0.0}})
    assert tie["squad_exact_match"] == 100.0  # s_null - best span = 0 does not exceed the threshold 0: the span
    answerable = raw.select(range(3))
    scores = v2.kind.score(v2, answerable, {"answers": answers, "null_diffs": diffs})
    assert math.isnan(scores["squad_no_ans_f1"]) and scores["squad_has_ans_f1"] == pytest.approx(100 * (5 / 3) / 3)
    scores = v1.kind.score(v1, answerable, {"answers": answers, "null_diffs": {}})
    assert scores == pytest.approx({"squad_exact_match": 200 / 3, "squad_f1": 100 * (1 + 2 / 3 + 1) / 3})
    assert (v1.kind.ranking_metric(v1), v2.kind.ranking_metric(v2)) == ("squad_f1", "squad_best_f1")
    assert v1.kind.num_labels(v1) == 2


def test_the_head_each_choice_gives():
    from bert_repro.model.bilstm_heads import BertReproForSequenceClassificationWithBiLSTM

    kind = TASKS["mrpc"].kind
    assert kind.model_class() is BertReproForSequenceClassification
    assert kind.model_class("linear") is BertReproForSequenceClassification
    assert kind.model_class(feature_based=True) is BertReproForSequenceClassificationWithBiLSTM
    assert kind.model_class("bilstm") is BertReproForSequenceClassificationWithBiLSTM
    kinds = "classification, regression, span, token_classification"
    with pytest.raises(ValueError, match=rf"^multiple_choice tasks have no BiLSTM head \(there is one for {kinds}\)"):
        TASKS["swag"].kind.model_class("bilstm")
    with pytest.raises(ValueError, match="Unknown head 'lstm'"):
        kind.model_class("lstm")
    with pytest.raises(ValueError, match="feature-based approach"):
        kind.model_class("linear", feature_based=True)


def test_pipeline_examples_and_collators(pieces):
    assert TASKS["sst2"].kind.pipeline_example(TASKS["sst2"]) == (
        "classifier",
        'classifier("A gripping, well-acted film.")',
    )
    variable, call = TASKS["mrpc"].kind.pipeline_example(TASKS["mrpc"])
    assert variable == "classifier" and json.loads(call[len("classifier(") : -1]) == {
        "text": "The company posted record profits this quarter.",
        "text_pair": "Profits at the company reached a record this quarter.",
    }
    assert TASKS["squad"].kind.pipeline_example(TASKS["squad"]) == (
        "qa",
        'qa(question="Where is the Eiffel Tower?", context="The Eiffel Tower is a landmark in Paris.")',
    )
    assert TASKS["conll2003"].kind.pipeline_example(TASKS["conll2003"]) == (
        "tagger",
        'tagger("The European Commission met in Brussels on Monday.")',  # cased: names are what NER finds
    )
    rows = [{"input_ids": [2, 5, 3]}, {"input_ids": [2, 5, 6, 7, 3]}]
    for name in ("mrpc", "squad"):
        batch = TASKS[name].kind.collator(pieces)([dict(r) for r in rows])
        assert batch["input_ids"].tolist() == [[2, 5, 3, 0, 0], [2, 5, 6, 7, 3]]
    batch = TASKS["conll2003"].kind.collator(pieces)([{**r, "labels": [-100] * len(r["input_ids"])} for r in rows])
    assert batch["labels"].tolist()[0] == [-100] * 5
