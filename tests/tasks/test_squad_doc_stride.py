"""SQuAD's `--doc_stride` (Google's window step) against run_qa.py's (an overlap): what `--help` and the card say."""

import random

import pytest
from support.corpora import WORDS
from transformers import AutoTokenizer

from bert_repro.tasks.squad import doc_spans


def test_run_qa_stride_r_cuts_our_windows_of_max_seq_length_minus_3_minus_question_minus_r(corpus_and_tokenizer):
    tokenizer, rng, length = AutoTokenizer.from_pretrained(corpus_and_tokenizer[1]), random.Random(1), 48
    for _ in range(200):
        question, context = (" ".join(rng.choices(WORDS, k=rng.randint(a, b))) for a, b in ((1, 8), (5, 120)))
        question_ids, context_ids = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in (question, context))
        window = length - 3 - len(question_ids)
        ours = rng.randint(1, window)
        spans = [context_ids[s.start : s.start + s.length] for s in doc_spans(len(context_ids), window, ours)]

        def run_qa(stride: int) -> list[list[int]]:  # the context tokens of each window run_qa.py cuts
            encoded = tokenizer(question, context, truncation="only_second", max_length=length, stride=stride,
                                return_overflowing_tokens=True)  # fmt: skip
            return [[t for t, s in zip(ids, encoded.sequence_ids(i)) if s == 1] for i, ids in enumerate(encoded[
                "input_ids"])]  # fmt: skip

        assert run_qa(length - 3 - len(question_ids) - ours) == spans, (question, ours)  # as --help and the card say


def test_help_and_the_squad_cards_say_which_stride(capsys, tmp_path):
    from bert_repro.hub.model_card import card_for_finetuning
    from bert_repro.training.finetuning import FineTuningRecipe

    with pytest.raises(SystemExit):
        FineTuningRecipe.from_args(["--task", "squad", "--help"])
    entry = " ".join(capsys.readouterr().out.split("  --doc_stride ")[1].split("\n  --")[0].split())
    assert "step between window starts" in entry and "run_qa.py --doc_stride R is the overlap" in entry
    assert "max_seq_length - 3 - (question tokens) - R" in entry
    for task in ("squad", "squad_v2", "mrpc"):
        text = card_for_finetuning(tmp_path, "someone/m", summary={"task": task, "best": {}}).text
        assert ("`doc_stride` = `max_seq_length` - 3 - question tokens - R" in text) is task.startswith("squad")
