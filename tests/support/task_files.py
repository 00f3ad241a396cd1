"""Task files in their original layouts (GLUE, SQuAD, SWAG, CoNLL-2003), and the canonical rows each GLUE file
must give."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

BOM = "\ufeff"


def tsv(header, rows, bom=False):
    lines = ([] if header is None else ["\t".join(header)]) + ["\t".join(map(str, row)) for row in rows]
    return (BOM if bom else "") + "\n".join(lines) + "\n"


def write(directory: Path, files: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


# GLUE in its original layout, and the canonical rows each file must give

MNLI_HEAD = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
]
STSB_HEAD = ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]
MRPC_HEAD = ["#1 ID", "#2 ID", "#1 String", "#2 String"]
PARSES = ["( a )", "( b )", "(ROOT a)", "(ROOT b)"]  # the binary and full parse columns, one sentence each
QUOTED_1 = "He said the pie business \"doesn't fit."  # unbalanced: would swallow the next line if quoted
QUOTED_2 = '"The pie business does not fit our strategy.'

GLUE_FIXTURES = {
    "cola": (
        {
            "train.tsv": tsv(
                None, [["gj04", 1, "", "Our friends won't buy this analysis."], ["gj04", 0, "*", "They drank the pub."]]
            ),
            "dev.tsv": tsv(None, [["cj99", 1, "", "The sailors rode the breeze."]]),
            "test.tsv": tsv(["index", "sentence"], [[0, "Bill whistled past the house."], [1, "Mary ran."]]),
        },
        {
            "train": {
                "sentence": ["Our friends won't buy this analysis.", "They drank the pub."],
                "label": [1, 0],
                "idx": [0, 1],
            },
            "validation": {"sentence": ["The sailors rode the breeze."], "label": [1], "idx": [0]},
            "test": {"sentence": ["Bill whistled past the house.", "Mary ran."], "label": [-1, -1], "idx": [0, 1]},
        },
    ),
    "sst2": (
        {
            "train.tsv": tsv(
                ["sentence", "label"], [["hide new secretions ", 0], ['a "charming journey ', 1]], bom=True
            ),
            "dev.tsv": tsv(["sentence", "label"], [["unflinchingly bleak ", 0]]),
            "test.tsv": tsv(["index", "sentence"], [[0, "uneasy mishmash "]]),
        },
        {
            "train": {"sentence": ["hide new secretions ", 'a "charming journey '], "label": [0, 1], "idx": [0, 1]},
            "validation": {"sentence": ["unflinchingly bleak "], "label": [0], "idx": [0]},
            "test": {"sentence": ["uneasy mishmash "], "label": [-1], "idx": [0]},
        },
    ),
    "mrpc": (
        {
            "train.tsv": tsv(
                ["Quality"] + MRPC_HEAD,
                [
                    [1, 702876, 702977, QUOTED_1, QUOTED_2],
                    [0, 2108705, 2108831, "Yucaipa owned it.", "Yucaipa sold it."],
                ],
                bom=True,
            ),
            "dev.tsv": tsv(
                ["Quality"] + MRPC_HEAD, [[0, 1, 2, '"Sanitation is poor," he said.', "Water is bad."]], bom=True
            ),
            "test.tsv": tsv(
                ["index"] + MRPC_HEAD, [[0, 1089874, 1089925, "PCCW's officer.", "The officer."]], bom=True
            ),
        },
        {
            "train": {
                "sentence1": [QUOTED_1, "Yucaipa owned it."],
                "sentence2": [QUOTED_2, "Yucaipa sold it."],
                "label": [1, 0],
                "idx": [0, 1],
            },
            "validation": {
                "sentence1": ['"Sanitation is poor," he said.'],
                "sentence2": ["Water is bad."],
                "label": [0],
                "idx": [0],
            },
            "test": {"sentence1": ["PCCW's officer."], "sentence2": ["The officer."], "label": [-1], "idx": [0]},
        },
    ),
    "qqp": (
        {
            "train.tsv": tsv(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [
                    [133273, 213221, 213222, "How is air traffic controlled?", "How do you become an ATC?", 0],
                    [402555, 536040, 536041, "Why do we sleep?", "Why do people sleep?", 1],
                ],
            ),
            "dev.tsv": tsv(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [[201359, 303345, 303346, "Why are African-Americans so beautiful?", "Why are hispanics?", 0]],
            ),
            "test.tsv": tsv(
                ["id", "question1", "question2"],
                [[0, "Would Trump win?", "Will Trump win?"], [1, "What is X?", "What is Y?"]],
            ),
        },
        {
            "train": {
                "question1": ["How is air traffic controlled?", "Why do we sleep?"],
                "question2": ["How do you become an ATC?", "Why do people sleep?"],
                "label": [0, 1],
                "idx": [0, 1],
            },
            "validation": {
                "question1": ["Why are African-Americans so beautiful?"],
                "question2": ["Why are hispanics?"],
                "label": [0],
                "idx": [0],
            },
            "test": {
                "question1": ["Would Trump win?", "What is X?"],
                "question2": ["Will Trump win?", "What is Y?"],
                "label": [-1, -1],
                "idx": [0, 1],
            },
        },
    ),
    "stsb": (
        {
            "train.tsv": tsv(
                STSB_HEAD + ["score"],
                [
                    [
                        0,
                        "main-captions",
                        "MSRvid",
                        "2012test",
                        "0001",
                        "none",
                        "none",
                        "A plane is taking off.",
                        "An air plane is taking off.",
                        "5.000",
                    ],
                    [
                        1,
                        "main-captions",
                        "MSRvid",
                        "2012test",
                        "0004",
                        "none",
                        "none",
                        "A man plays a flute.",
                        "A man plays a bamboo flute.",
                        "3.750",
                    ],
                ],
            ),
            "dev.tsv": tsv(
                STSB_HEAD + ["score"],
                [[0, "main-forums", "f", "2014", "1", "none", "none", "A man.", "A dog.", "0.500"]],
            ),
            "test.tsv": tsv(STSB_HEAD, [[0, "main-news", "f", "2016", "1", "none", "none", "A girl.", "A boy."]]),
        },
        {
            "train": {
                "sentence1": ["A plane is taking off.", "A man plays a flute."],
                "sentence2": ["An air plane is taking off.", "A man plays a bamboo flute."],
                "label": [5.0, 3.75],
                "idx": [0, 1],
            },
            "validation": {"sentence1": ["A man."], "sentence2": ["A dog."], "label": [0.5], "idx": [0]},
            "test": {"sentence1": ["A girl."], "sentence2": ["A boy."], "label": [-1.0], "idx": [0]},
        },
    ),
    "mnli": (
        {
            "train.tsv": tsv(
                MNLI_HEAD + ["label1", "gold_label"],
                [
                    [
                        0,
                        31193,
                        "31193n",
                        "government",
                        "( ( x ) )",
                        "( y )",
                        "(ROOT x)",
                        "(ROOT y)",
                        "Conceptually cream skimming has two dimensions.",
                        "Product and geography matter.",
                        "neutral",
                        "neutral",
                    ],
                    [
                        1,
                        101457,
                        "101457e",
                        "telephone",
                        *PARSES,
                        "you know during the season",
                        "You lose the things.",
                        "entailment",
                        "entailment",
                    ],
                ],
            ),
            "dev_matched.tsv": tsv(
                MNLI_HEAD + ["label1", "label2", "label3", "label4", "label5", "gold_label"],
                [
                    [
                        0,
                        63735,
                        "63735n",
                        "slate",
                        *PARSES,
                        "The new rights are nice enough",
                        "Everyone really likes them.",
                        "neutral",
                        "entailment",
                        *["neutral"] * 4,
                    ]
                ],
            ),
            "dev_mismatched.tsv": tsv(
                MNLI_HEAD + ["label1", "label2", "label3", "label4", "label5", "gold_label"],
                [
                    [
                        0,
                        75290,
                        "75290c",
                        "letters",
                        *PARSES,
                        "Your contribution helped.",
                        "Your contributions were of no help.",
                        *["contradiction"] * 6,
                    ]
                ],
            ),
            "test_matched.tsv": tsv(
                MNLI_HEAD, [[0, 31493, "31493", "travel", *PARSES, "Hierbas is a liqueur.", "Hierbas is a drink."]]
            ),
            "test_mismatched.tsv": tsv(
                MNLI_HEAD, [[0, 1, "1", "verbatim", *PARSES, "What have you decided?", "What are you doing?"]]
            ),
        },
        {
            "train": {
                "premise": ["Conceptually cream skimming has two dimensions.", "you know during the season"],
                "hypothesis": ["Product and geography matter.", "You lose the things."],
                "label": [1, 0],
                "idx": [0, 1],
            },
            "validation_matched": {
                "premise": ["The new rights are nice enough"],
                "hypothesis": ["Everyone really likes them."],
                "label": [1],
                "idx": [0],
            },
            "validation_mismatched": {
                "premise": ["Your contribution helped."],
                "hypothesis": ["Your contributions were of no help."],
                "label": [2],
                "idx": [0],
            },
            "test_matched": {
                "premise": ["Hierbas is a liqueur."],
                "hypothesis": ["Hierbas is a drink."],
                "label": [-1],
                "idx": [0],
            },
            "test_mismatched": {
                "premise": ["What have you decided?"],
                "hypothesis": ["What are you doing?"],
                "label": [-1],
                "idx": [0],
            },
        },
    ),
    "qnli": (
        {
            "train.tsv": tsv(
                ["index", "question", "sentence", "label"],
                [
                    [
                        0,
                        "What came into force after the new constitution?",
                        "The Convention came into force.",
                        "entailment",
                    ],
                    [1, "What is the first major city?", "The city has more than 2 million.", "not_entailment"],
                ],
            ),
            "dev.tsv": tsv(["index", "question", "sentence", "label"], [[0, "What is X?", "X is Y.", "entailment"]]),
            "test.tsv": tsv(["index", "question", "sentence"], [[0, "What is Z?", "Nothing."]]),
        },
        {
            "train": {
                "question": ["What came into force after the new constitution?", "What is the first major city?"],
                "sentence": ["The Convention came into force.", "The city has more than 2 million."],
                "label": [0, 1],
                "idx": [0, 1],
            },
            "validation": {"question": ["What is X?"], "sentence": ["X is Y."], "label": [0], "idx": [0]},
            "test": {"question": ["What is Z?"], "sentence": ["Nothing."], "label": [-1], "idx": [0]},
        },
    ),
    "rte": (
        {
            "train.tsv": tsv(
                ["index", "sentence1", "sentence2", "label"],
                [
                    [0, "No weapons were found in Iraq.", "Weapons were found in Iraq.", "not_entailment"],
                    [1, "A place of sorrow.", "Pope was buried.", "entailment"],
                ],
            ),
            "dev.tsv": tsv(
                ["index", "sentence1", "sentence2", "label"], [[0, "Dana Reeve died.", "Reeve died.", "entailment"]]
            ),
            "test.tsv": tsv(["index", "sentence1", "sentence2"], [[0, "Mangla was built.", "Mangla is a dam."]]),
        },
        {
            "train": {
                "sentence1": ["No weapons were found in Iraq.", "A place of sorrow."],
                "sentence2": ["Weapons were found in Iraq.", "Pope was buried."],
                "label": [1, 0],
                "idx": [0, 1],
            },
            "validation": {"sentence1": ["Dana Reeve died."], "sentence2": ["Reeve died."], "label": [0], "idx": [0]},
            "test": {"sentence1": ["Mangla was built."], "sentence2": ["Mangla is a dam."], "label": [-1], "idx": [0]},
        },
    ),
    "wnli": (
        {
            "train.tsv": tsv(
                ["index", "sentence1", "sentence2", "label"],
                [
                    [0, "I stuck a pin through a carrot.", "The carrot had a hole.", 1],
                    [1, "John couldn't see the stage.", "The stage was short.", 0],
                ],
            ),
            "dev.tsv": tsv(
                ["index", "sentence1", "sentence2", "label"], [[0, "The drain is clogged.", "It is clogged.", 0]]
            ),
            "test.tsv": tsv(
                ["index", "sentence1", "sentence2"], [[0, "Maude and Dora saw trains.", "Dora saw trains."]]
            ),
        },
        {
            "train": {
                "sentence1": ["I stuck a pin through a carrot.", "John couldn't see the stage."],
                "sentence2": ["The carrot had a hole.", "The stage was short."],
                "label": [1, 0],
                "idx": [0, 1],
            },
            "validation": {
                "sentence1": ["The drain is clogged."],
                "sentence2": ["It is clogged."],
                "label": [0],
                "idx": [0],
            },
            "test": {
                "sentence1": ["Maude and Dora saw trains."],
                "sentence2": ["Dora saw trains."],
                "label": [-1],
                "idx": [0],
            },
        },
    ),
}


CONTEXT = "Architecturally, the school has a Catholic character. Atop the Main Building's gold dome is a statue."


def squad_json(questions, title="University_of_Notre_Dame"):
    return json.dumps(
        {"version": "1.1", "data": [{"title": title, "paragraphs": [{"context": CONTEXT, "qas": questions}]}]}
    )


def qa(qid, question, answers, **extra):
    return {"id": qid, "question": question, "answers": [{"text": t, "answer_start": s} for t, s in answers], **extra}


SWAG_HEAD = [
    "",
    "video-id",
    "fold-ind",
    "startphrase",
    "sent1",
    "sent2",
    "gold-source",
    "ending0",
    "ending1",
    "ending2",
    "ending3",
    "label",
]
SWAG_ROW = [
    "0",
    "anetv_jkn6uvmqwh4",
    "3416",
    "Members of the procession walk. A drum line",
    "Members of the procession walk.",
    "A drum line",
    "gold",
    'passes by, "playing" drums.',
    "has heard approaching them.",
    "arrives and they're outside dancing.",
    "turns the lead singer.",
    "0",
]


def swag_csv(rows, header=SWAG_HEAD):
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header] + rows)
    return buffer.getvalue()


CONLL_TRAIN = """-DOCSTART- -X- O O

EU NNP I-NP I-ORG
rejects VBZ I-VP O
German JJ I-NP I-MISC
call NN I-NP O
. . O O

Peter NNP I-NP I-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- O O

In IN I-PP O
Paris NNP I-NP I-LOC
Lyon NNP I-NP B-LOC
John NNP I-NP I-PER
Smith NNP I-NP I-PER
Corp NNP I-NP I-ORG
"""
CONLL_DEV = "-DOCSTART- -X- O O\n\nCRICKET NNP I-NP O\n- : O O\nLEICESTERSHIRE NNP I-NP I-ORG\n"
CONLL_TEST = "SOCCER NN I-NP O\n- : O O\nJAPAN NNP I-NP I-LOC\n"


def squad_files(version):
    start = CONTEXT.index("Catholic")
    questions = [qa(f"q{i}", "What character does the school have?", [("Catholic", start)]) for i in range(3)]
    if version == 2:
        questions.append({"id": "q9", "question": "What is below the dome?", "answers": [], "is_impossible": True})
        return {"train-v2.0.json": squad_json(questions), "dev-v2.0.json": squad_json(questions)}
    return {"train-v1.1.json": squad_json(questions), "dev-v1.1.json": squad_json(questions)}


def fixture_files(name):
    if name in GLUE_FIXTURES:
        files = dict(GLUE_FIXTURES[name][0])
        if name == "stsb":  # a correlation needs two rows: repeat the dev row with another score
            header, row = files["dev.tsv"].rstrip("\n").split("\n")[-2:]
            files["dev.tsv"] += row.rsplit("\t", 1)[0] + "\t0.5\n"
        return files
    if name in ("squad", "squad_v2"):
        return squad_files(2 if name == "squad_v2" else 1)
    if name == "swag":
        second = SWAG_ROW[:-1] + ["2"]
        return {"train.csv": swag_csv([SWAG_ROW, second]), "val.csv": swag_csv([SWAG_ROW, second])}
    return {"eng.train": CONLL_TRAIN, "eng.testa": CONLL_DEV, "eng.testb": CONLL_TEST}


def fixture_rows(name, split):
    return GLUE_FIXTURES[name][1][split]["idx"]


# Two steps of two examples at the tiny model's 64 positions.
TINY_RUN = {"learning_rates": "1e-4", "max_steps": 2, "per_device_train_batch_size": 2, "max_seq_length": 64}


def finetune_args(task, model, data=None, output_dir=None, *extra, cpu=True, **flags):
    """`recipes/finetune.py`'s arguments: ``--task``, ``--model``, ``--data`` and ``--output_dir`` when given, then
    (with ``cpu``) ``--use_cpu true --disable_tqdm true``, then each keyword as ``--key value`` (a list gives
    several values, True/False give true/false), then ``extra`` as written."""
    args = ["--task", task, "--model", str(model)]
    args += ["--data", str(data)] if data is not None else []
    args += ["--output_dir", str(output_dir)] if output_dir is not None else []
    for key, value in {**({"use_cpu": True, "disable_tqdm": True} if cpu else {}), **flags}.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        args += [f"--{key}", *(str(v).lower() if isinstance(v, bool) else str(v) for v in values)]
    return [*args, *map(str, extra)]


# results.json's hyper-parameters of a BERT-BASE GLUE grid, as recipes/finetune.py writes them.
GLUE_HP = {
    "learning_rates": [2e-05],
    "seeds": [42],
    "num_train_epochs": 3.0,
    "per_device_train_batch_size": 32,
    "max_seq_length": 128,
    "warmup": 0.1,
    "weight_decay": 0.01,
}
