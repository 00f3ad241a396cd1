"""Helpers shared by the test modules: plain functions, constants and fixture data (the fixtures themselves
are in conftest.py). Test modules import from here, never from one another."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------
# Tiny models and batches
# ----------------------------------------------------------------------------------------------------------

# The architecture fields shared by BertConfig and BertReproConfig.
ARCH_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "initializer_range",
    "num_labels",
)


def tiny_config(**overrides):
    from bert_repro import BertReproConfig

    fields = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    return BertReproConfig(**{**fields, **overrides})


def hf_config_like(config, **overrides):
    """transformers' BertConfig with the same architecture as a BertReproConfig."""
    from transformers import BertConfig

    return BertConfig(**{**{k: getattr(config, k) for k in ARCH_FIELDS}, **overrides})


def padded_batch(vocab_size: int, batch: int = 3, seq: int = 16, seed: int = 0):
    """Random ids with a pair structure and padding of different lengths in the batch."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, vocab_size, (batch, seq), generator=g)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    for row in range(batch):
        length = seq - (row * seq) // (batch + 1)
        attention_mask[row, length:] = 0
        input_ids[row, length:] = 0
        token_type_ids[row, length // 2 : length] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


# Worst differences measured by the parity tests, printed at the end of every run (not only with -s).
PARITY_REPORT: list[tuple[str, float]] = []


# ----------------------------------------------------------------------------------------------------------
# Damaged model directories and checkpoints
# ----------------------------------------------------------------------------------------------------------


class RunsCode:
    """Unpickled, it would create the file `path`: what a malicious pickle does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def damage_model_dir(directory: Path, problem: str) -> str:
    """Give a saved model directory one problem: "pickle" (its weights only as a pytorch_model.bin that would
    create `directory / "ran"` if unpickled), "truncated" (model.safetensors cut short) or "config" (a broken
    config.json). Returns the start of the message that names the problem."""
    weights = directory / "model.safetensors"
    if problem == "pickle":
        weights.unlink()
        torch.save(
            {"bert.pooler.dense.bias": torch.zeros(32), "code": RunsCode(directory / "ran")},
            directory / "pytorch_model.bin",
        )
        return f"{directory} holds its weights only as a pickle (pytorch_model.bin), which is not opened"
    if problem == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
        return f"{weights} cannot be read as safetensors (Error while deserializing header: incomplete"
    assert problem == "config", problem
    (directory / "config.json").write_text('{"hidden_size": 32,\n')
    return f"{directory / 'config.json'} is not a valid config.json (Expecting property name"


def fake_checkpoint(folder, step):
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(64, 64)}, str(folder / "model.safetensors"))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    torch.save({"state": {}}, folder / "optimizer.pt")
    return folder


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ----------------------------------------------------------------------------------------------------------
# Pre-training runs through the real launcher
# ----------------------------------------------------------------------------------------------------------

WORDS = (
    "the a cat dog sat ran on under mat house garden quickly slowly big small red blue king queen river "
    "mountain old new green tree bird sang loud quiet night day"
).split()


def write_config(path, corpus, tokenizer, **overrides):
    config = {
        "corpus": [str(corpus)],
        "document_boundary": "file",
        "tokenizer": str(tokenizer),
        "preset": "tiny",
        "model_overrides": {
            "hidden_size": 32,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
        },
        "max_seq_length": 32,
        "max_predictions_per_seq": 5,
        "dupe_factor": 2,
        "phase2_fraction": 0.25,
        "phase2_max_seq_length": 64,
        "phase2_max_predictions_per_seq": 10,
        "global_batch_size": 8,
        "per_device_train_batch_size": 8,
        "max_steps": 8,
        "warmup_steps": 2,
        "learning_rate": 0.002,
        "logging_steps": 1,
        "save_steps": 4,
        "eval_steps": 4,
        "eval_fraction": 0.2,
        "use_cpu": True,
        "report_to": "none",
        "disable_tqdm": True,
        "num_proc": 1,
        "plot": False,
        **overrides,
    }
    path.write_text(yaml.safe_dump(config))
    return path


def first_documents(corpus: Path, folder: Path, n: int) -> Path:
    """A corpus folder holding copies of the fixture corpus's first `n` documents."""
    folder.mkdir()
    for path in sorted(corpus.glob("*.txt"))[:n]:
        (folder / path.name).write_text(path.read_text())
    return folder


def launch(config, output_dir, *extra, processes=1, check=True, env=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    if processes == 2:  # the shipped config that really runs DDP on CPU (gloo)
        launcher = ["--config_file", str(ROOT / "recipes" / "accelerate" / "ddp_cpu.yaml")]
    else:
        launcher = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *launcher,
        str(ROOT / "recipes" / "pretrain.py"),
        "--config",
        str(config),
        "--output_dir",
        str(output_dir),
        *extra,
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def weights(directory):
    return load_file(Path(directory) / "model.safetensors")


# ----------------------------------------------------------------------------------------------------------
# Pseudo-text and a WordPiece tokenizer trained on it
# ----------------------------------------------------------------------------------------------------------

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ren",
    "tor",
    "vel",
    "sha",
    "qui",
    "bra",
    "don",
    "ex",
    "pu",
    "nor",
    "ti",
    "gan",
]


def pseudo_text(num_docs: int, seed: int = 0, min_sentences: int = 2, max_sentences: int = 14) -> list[str]:
    """Documents of paragraphs of sentences of pseudo-words (which a small WordPiece vocabulary splits)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(min_sentences, max_sentences)):
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 18)))
            sentences.append(sentence.capitalize() + rng.choice([".", ".", "!", "?"]))
        cut = len(sentences) // 2
        docs.append(" ".join(sentences[:cut]) + "\n\n" + "\n".join(sentences[cut:]))
    return docs


def wordpiece_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return BertTokenizer(tokenizer_object=tok)


# ----------------------------------------------------------------------------------------------------------
# Task files in their original layouts (GLUE, SQuAD, SWAG, CoNLL-2003)
# ----------------------------------------------------------------------------------------------------------

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
STSB_HEAD = [
    "index",
    "genre",
    "filename",
    "year",
    "old_index",
    "source1",
    "source2",
    "sentence1",
    "sentence2",
]
MRPC_HEAD = ["#1 ID", "#2 ID", "#1 String", "#2 String"]
QUOTED_1 = "He said the pie business \"doesn't fit."  # unbalanced: would swallow the next line if quoted
QUOTED_2 = '"The pie business does not fit our strategy.'

GLUE_FIXTURES = {
    "cola": (
        {
            "train.tsv": tsv(
                None,
                [
                    ["gj04", 1, "", "Our friends won't buy this analysis."],
                    ["gj04", 0, "*", "They drank the pub."],
                ],
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
            "test": {
                "sentence": ["Bill whistled past the house.", "Mary ran."],
                "label": [-1, -1],
                "idx": [0, 1],
            },
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
            "train": {
                "sentence": ["hide new secretions ", 'a "charming journey '],
                "label": [0, 1],
                "idx": [0, 1],
            },
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
                ["Quality"] + MRPC_HEAD,
                [[0, 1, 2, '"Sanitation is poor," he said.', "Water is bad."]],
                bom=True,
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
            "test": {
                "sentence1": ["PCCW's officer."],
                "sentence2": ["The officer."],
                "label": [-1],
                "idx": [0],
            },
        },
    ),
    "qqp": (
        {
            "train.tsv": tsv(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [
                    [
                        133273,
                        213221,
                        213222,
                        "How is air traffic controlled?",
                        "How do you become an ATC?",
                        0,
                    ],
                    [402555, 536040, 536041, "Why do we sleep?", "Why do people sleep?", 1],
                ],
            ),
            "dev.tsv": tsv(
                ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                [
                    [
                        201359,
                        303345,
                        303346,
                        "Why are African-Americans so beautiful?",
                        "Why are hispanics?",
                        0,
                    ]
                ],
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
                        "( a )",
                        "( b )",
                        "(ROOT a)",
                        "(ROOT b)",
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
                        "( a )",
                        "( b )",
                        "(ROOT a)",
                        "(ROOT b)",
                        "The new rights are nice enough",
                        "Everyone really likes them.",
                        "neutral",
                        "entailment",
                        "neutral",
                        "neutral",
                        "neutral",
                        "neutral",
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
                        "( a )",
                        "( b )",
                        "(ROOT a)",
                        "(ROOT b)",
                        "Your contribution helped.",
                        "Your contributions were of no help.",
                        "contradiction",
                        "contradiction",
                        "contradiction",
                        "contradiction",
                        "contradiction",
                        "contradiction",
                    ]
                ],
            ),
            "test_matched.tsv": tsv(
                MNLI_HEAD,
                [
                    [
                        0,
                        31493,
                        "31493",
                        "travel",
                        "( a )",
                        "( b )",
                        "(ROOT a)",
                        "(ROOT b)",
                        "Hierbas is a liqueur.",
                        "Hierbas is a drink.",
                    ]
                ],
            ),
            "test_mismatched.tsv": tsv(
                MNLI_HEAD,
                [
                    [
                        0,
                        1,
                        "1",
                        "verbatim",
                        "( a )",
                        "( b )",
                        "(ROOT a)",
                        "(ROOT b)",
                        "What have you decided?",
                        "What are you doing?",
                    ]
                ],
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
                    [
                        1,
                        "What is the first major city?",
                        "The city has more than 2 million.",
                        "not_entailment",
                    ],
                ],
            ),
            "dev.tsv": tsv(["index", "question", "sentence", "label"], [[0, "What is X?", "X is Y.", "entailment"]]),
            "test.tsv": tsv(["index", "question", "sentence"], [[0, "What is Z?", "Nothing."]]),
        },
        {
            "train": {
                "question": [
                    "What came into force after the new constitution?",
                    "What is the first major city?",
                ],
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
                ["index", "sentence1", "sentence2", "label"],
                [[0, "Dana Reeve died.", "Reeve died.", "entailment"]],
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
            "validation": {
                "sentence1": ["Dana Reeve died."],
                "sentence2": ["Reeve died."],
                "label": [0],
                "idx": [0],
            },
            "test": {
                "sentence1": ["Mangla was built."],
                "sentence2": ["Mangla is a dam."],
                "label": [-1],
                "idx": [0],
            },
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
                ["index", "sentence1", "sentence2", "label"],
                [[0, "The drain is clogged.", "It is clogged.", 0]],
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
    return {
        "id": qid,
        "question": question,
        "answers": [{"text": t, "answer_start": s} for t, s in answers],
        **extra,
    }


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


# ----------------------------------------------------------------------------------------------------------
# Google's TensorFlow checkpoints: a tiny model in Google's layout, and what it must become
# ----------------------------------------------------------------------------------------------------------

NUM_LAYERS = 2
HIDDEN = 8
HEADS = 2
INTERMEDIATE = 16
VOCAB = 20
MAX_POSITIONS = 32
TYPE_VOCAB = 2

SKIPPED_NAMES = [
    "bert/embeddings/word_embeddings/adam_m",
    "bert/embeddings/word_embeddings/adam_v",
    "bert/encoder/layer_0/attention/self/query/kernel/adam_m",
    "bert/encoder/layer_0/attention/self/query/kernel/adam_v",
    "global_step",
]


# ---------------------------------------------------------------------------------------------
# A tiny model in Google's layout, and what it must become
# ---------------------------------------------------------------------------------------------


def google_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Every weight of Google's BERT pre-training graph, named as Google's code names them."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    weights = {
        "bert/embeddings/word_embeddings": rand(VOCAB, HIDDEN),
        "bert/embeddings/position_embeddings": rand(MAX_POSITIONS, HIDDEN),
        "bert/embeddings/token_type_embeddings": rand(TYPE_VOCAB, HIDDEN),
        "bert/embeddings/LayerNorm/gamma": rand(HIDDEN),
        "bert/embeddings/LayerNorm/beta": rand(HIDDEN),
        "bert/pooler/dense/kernel": rand(HIDDEN, HIDDEN),
        "bert/pooler/dense/bias": rand(HIDDEN),
        "cls/predictions/output_bias": rand(VOCAB),
        "cls/predictions/transform/dense/kernel": rand(HIDDEN, HIDDEN),
        "cls/predictions/transform/dense/bias": rand(HIDDEN),
        "cls/predictions/transform/LayerNorm/gamma": rand(HIDDEN),
        "cls/predictions/transform/LayerNorm/beta": rand(HIDDEN),
        "cls/seq_relationship/output_weights": rand(2, HIDDEN),
        "cls/seq_relationship/output_bias": rand(2),
    }
    for i in range(NUM_LAYERS):
        layer = f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            weights[f"{layer}/attention/self/{proj}/kernel"] = rand(HIDDEN, HIDDEN)
            weights[f"{layer}/attention/self/{proj}/bias"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/dense/kernel"] = rand(HIDDEN, HIDDEN)
        weights[f"{layer}/attention/output/dense/bias"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/LayerNorm/gamma"] = rand(HIDDEN)
        weights[f"{layer}/attention/output/LayerNorm/beta"] = rand(HIDDEN)
        weights[f"{layer}/intermediate/dense/kernel"] = rand(HIDDEN, INTERMEDIATE)
        weights[f"{layer}/intermediate/dense/bias"] = rand(INTERMEDIATE)
        weights[f"{layer}/output/dense/kernel"] = rand(INTERMEDIATE, HIDDEN)
        weights[f"{layer}/output/dense/bias"] = rand(HIDDEN)
        weights[f"{layer}/output/LayerNorm/gamma"] = rand(HIDDEN)
        weights[f"{layer}/output/LayerNorm/beta"] = rand(HIDDEN)
    return weights


def expected_hf(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The HF ``BertForPreTraining`` state dict, spelled out by hand (independent of the module)."""
    w = weights
    out = {
        "bert.embeddings.word_embeddings.weight": w["bert/embeddings/word_embeddings"],
        "bert.embeddings.position_embeddings.weight": w["bert/embeddings/position_embeddings"],
        "bert.embeddings.token_type_embeddings.weight": w["bert/embeddings/token_type_embeddings"],
        "bert.embeddings.LayerNorm.weight": w["bert/embeddings/LayerNorm/gamma"],
        "bert.embeddings.LayerNorm.bias": w["bert/embeddings/LayerNorm/beta"],
        "bert.pooler.dense.weight": w["bert/pooler/dense/kernel"].T,
        "bert.pooler.dense.bias": w["bert/pooler/dense/bias"],
        "cls.predictions.bias": w["cls/predictions/output_bias"],
        "cls.predictions.transform.dense.weight": w["cls/predictions/transform/dense/kernel"].T,
        "cls.predictions.transform.dense.bias": w["cls/predictions/transform/dense/bias"],
        "cls.predictions.transform.LayerNorm.weight": w["cls/predictions/transform/LayerNorm/gamma"],
        "cls.predictions.transform.LayerNorm.bias": w["cls/predictions/transform/LayerNorm/beta"],
        "cls.seq_relationship.weight": w["cls/seq_relationship/output_weights"],  # already [2, H]
        "cls.seq_relationship.bias": w["cls/seq_relationship/output_bias"],
    }
    for i in range(NUM_LAYERS):
        tf_layer, hf_layer = f"bert/encoder/layer_{i}", f"bert.encoder.layer.{i}"
        for proj in ("query", "key", "value"):
            out[f"{hf_layer}.attention.self.{proj}.weight"] = w[f"{tf_layer}/attention/self/{proj}/kernel"].T
            out[f"{hf_layer}.attention.self.{proj}.bias"] = w[f"{tf_layer}/attention/self/{proj}/bias"]
        out[f"{hf_layer}.attention.output.dense.weight"] = w[f"{tf_layer}/attention/output/dense/kernel"].T
        out[f"{hf_layer}.attention.output.dense.bias"] = w[f"{tf_layer}/attention/output/dense/bias"]
        attention_ln = f"{tf_layer}/attention/output/LayerNorm"
        out[f"{hf_layer}.attention.output.LayerNorm.weight"] = w[f"{attention_ln}/gamma"]
        out[f"{hf_layer}.attention.output.LayerNorm.bias"] = w[f"{attention_ln}/beta"]
        out[f"{hf_layer}.intermediate.dense.weight"] = w[f"{tf_layer}/intermediate/dense/kernel"].T
        out[f"{hf_layer}.intermediate.dense.bias"] = w[f"{tf_layer}/intermediate/dense/bias"]
        out[f"{hf_layer}.output.dense.weight"] = w[f"{tf_layer}/output/dense/kernel"].T
        out[f"{hf_layer}.output.dense.bias"] = w[f"{tf_layer}/output/dense/bias"]
        out[f"{hf_layer}.output.LayerNorm.weight"] = w[f"{tf_layer}/output/LayerNorm/gamma"]
        out[f"{hf_layer}.output.LayerNorm.bias"] = w[f"{tf_layer}/output/LayerNorm/beta"]
    return out


def google_config() -> dict:
    return {
        "attention_probs_dropout_prob": 0.1,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": HIDDEN,
        "initializer_range": 0.02,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_POSITIONS,
        "num_attention_heads": HEADS,
        "num_hidden_layers": NUM_LAYERS,
        "type_vocab_size": TYPE_VOCAB,
        "vocab_size": VOCAB,
    }


def write_google_checkpoint(tf, prefix: Path, variables: dict[str, np.ndarray]) -> None:
    """Save ``variables`` TF1-style, so the checkpoint keys are exactly these names (as Google's are).

    ``tf.train.Checkpoint`` would store object-graph keys (``.../.ATTRIBUTES/VARIABLE_VALUE``)
    instead, which is not what Google's releases contain.
    """
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        for name, value in variables.items():
            v1.get_variable(name, initializer=tf.constant(value))
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            v1.train.Saver().save(sess, str(prefix), write_meta_graph=False)


def optimizer_state(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    state = {name: np.zeros_like(weights[name.rsplit("/", 1)[0]]) for name in SKIPPED_NAMES[:-1]}
    state["global_step"] = np.array(1000, dtype=np.int64)
    return state


# ----------------------------------------------------------------------------------------------------------
# Loading in a process where bert_repro cannot be imported
# ----------------------------------------------------------------------------------------------------------

TOLERANCE = 1e-5
SENTENCES = ["the cat sat on the mat", "a big red dog ran under the old house", "the queen"]
MASKED = "the cat sat on the [MASK]"

# The child process: a machine where bert_repro was never installed. It runs a plan of loads and records what it got.
CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.modules["bert_repro"] = None  # `import bert_repro` fails from here on
    import torch, transformers
    try:
        import bert_repro  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("bert_repro is importable in the child process")
    plan = json.load(open(sys.argv[1]))
    results = {"models": {}, "tokenizers": {}, "fill_mask": {}, "sentence_transformers": {}}
    for key, job in plan.get("models", {}).items():
        auto = getattr(transformers, job["auto"])
        try:
            model = auto.from_pretrained(job["dir"], **job.get("kwargs", {})).eval()
        except Exception as err:  # recorded: some loads are expected to be refused
            results["models"][key] = {"error": f"{type(err).__name__}: {err}"}
            continue
        inputs = torch.load(job["inputs"], weights_only=True)
        with torch.no_grad():
            output = model(**inputs)
            encoder = model.base_model(**torch.load(job["encoder_inputs"], weights_only=True))[0]
        results["models"][key] = {"class": type(model).__name__, "module": type(model).__module__,
                        "config_class": type(model.config).__name__, "encoder": encoder,
                        "outputs": {k: v for k, v in output.items() if torch.is_tensor(v)}}
    for key, directory in plan.get("tokenizers", {}).items():
        start = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
        seconds = time.perf_counter() - start
        results["tokenizers"][key] = {"class": type(tokenizer).__name__, "seconds": seconds,
                        "ids": tokenizer(plan["sentences"])["input_ids"]}
    for key, directory in plan.get("fill_mask", {}).items():
        fill = transformers.pipeline("fill-mask", model=directory, device="cpu")
        results["fill_mask"][key] = [(r["token"], r["score"]) for r in fill(plan["masked"], top_k=3)]
    for key, directory in plan.get("sentence_transformers", {}).items():
        from sentence_transformers import SentenceTransformer

        encoder = SentenceTransformer(directory, device="cpu")
        results["sentence_transformers"][key] = encoder.encode(plan["sentences"], convert_to_tensor=True).cpu()
    torch.save(results, sys.argv[2])
    """
)


def run_without_package(tmp_path: Path, plan: dict, *, refusals: bool = False) -> dict:
    """Run `plan` in a fresh interpreter where bert_repro cannot be imported, with stdin closed (a prompt for
    remote code would read end-of-file and fail, not wait), outside the source tree, offline. Unless `refusals`
    (the plan holds loads that must be refused), nothing may ask whether to run remote code."""
    work = tmp_path / f"child-{len(list(tmp_path.glob('child-*')))}"
    work.mkdir()
    (work / "plan.json").write_text(json.dumps({"sentences": SENTENCES, "masked": MASKED, **plan}))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(work / "modules"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(work / "plan.json"), str(work / "out.pt")],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    if not refusals:
        assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    return torch.load(work / "out.pt", weights_only=False)


def inputs_for(auto_name: str, vocab_size: int, path: Path) -> str:
    batch = padded_batch(vocab_size, batch=4, seq=12)
    if auto_name == "AutoModelForMultipleChoice":
        batch = {k: v.reshape(2, 2, -1) for k, v in batch.items()}
    torch.save(batch, path)
    return str(path)


def our_outputs(model, inputs_file: str) -> dict:
    with torch.no_grad():
        output = model.eval()(**torch.load(inputs_file, weights_only=True))
    return {k: v for k, v in output.items() if torch.is_tensor(v)}


def assert_same_outputs(got: dict, ours: dict, what: str) -> None:
    """Every output both models return agrees within the tolerance (logits, hidden states, pooled output)."""
    shared = set(got) & set(ours)
    assert shared, (what, sorted(got), sorted(ours))
    for name in sorted(shared):
        diff = (got[name] - ours[name]).abs().max().item()
        assert diff <= TOLERANCE, f"{what}: {name} differs by {diff:.3e}"


# ----------------------------------------------------------------------------------------------------------
# An emulated device machine (benchmarks/gpu/run_gpu.sh's conditions, without CUDA)
# ----------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def device_machine_env(tmp_path: Path, **settings: str):
    """The environment of benchmarks/gpu/run_gpu.sh on a lent GPU machine, CUDA aside: a network that accepts
    connections and never answers (Hub, package index, proxies), a `python` first on PATH that is not the one with
    torch (a symlink that lost its venv), OUT and RESULTS in `tmp_path`, no kit; `settings` added. Its bin folder
    (`tmp_path / "bin"`) takes more stand-ins."""
    import socket

    hole = socket.socket()  # a black hole: connections are accepted into the backlog, no byte ever comes back
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)
    url = f"http://127.0.0.1:{hole.getsockname()[1]}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").write_text("#!/bin/sh\necho 'No module named torch' >&2\nexit 1\n")
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "PIP_", "TRANSFORMERS_"))}
    env.update(
        PATH=f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        HTTP_PROXY=url,
        HTTPS_PROXY=url,
        http_proxy=url,
        https_proxy=url,
        HF_ENDPOINT=url,
        PIP_INDEX_URL=f"{url}/simple",
        OUT=str(tmp_path / "out"),
        RESULTS=str(tmp_path / "results"),
        KIT=str(tmp_path / "no-kit"),
        **settings,
    )
    try:
        yield env
    finally:
        hole.close()
