"""SQuAD's `--doc_stride` is Google's step between window starts; transformers' run_qa.py's flag of the same name is
the overlap between windows. The conversion that `--help` and the fine-tuned card state is checked here against
run_qa's own windowing (an overflowing fast tokenizer with `stride`)."""

import random

import pytest
from support.corpora import SYLLABLES

from bert_repro.tasks.squad import NUM_SPECIAL_TOKENS, doc_spans

MAX_SEQ_LENGTH = 64


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

    rng = random.Random(0)
    trained = train_wordpiece(iterator=[words(rng, 400) for _ in range(3)], vocab_size=200, show_progress=False)
    directory = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(trained, directory)
    return AutoTokenizer.from_pretrained(directory)


def run_qa_windows(tokenizer, question: str, context: str, overlap: int) -> list[tuple[int, int]]:
    """(first context token, tokens) of each window run_qa.py's prepare_train_features cuts."""
    encoded = tokenizer(
        question,
        context,
        truncation="only_second",
        max_length=MAX_SEQ_LENGTH,
        stride=overlap,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    starts = {o: i for i, o in enumerate(tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"])}  # fmt: skip
    windows = []
    for i, offsets in enumerate(encoded["offset_mapping"]):
        context_offsets = [tuple(o) for o, s in zip(offsets, encoded.sequence_ids(i)) if s == 1]
        windows.append((starts[context_offsets[0]], len(context_offsets)))
    return windows


def test_run_qa_stride_r_cuts_our_windows_of_max_seq_length_minus_3_minus_question_minus_r(tokenizer):
    rng = random.Random(1)
    differ_with_the_same_number = 0
    for _ in range(200):
        question, context = words(rng, rng.randint(1, 8)) + "?", words(rng, rng.randint(5, 120))
        question_tokens = len(tokenizer(question, add_special_tokens=False)["input_ids"])
        window = MAX_SEQ_LENGTH - NUM_SPECIAL_TOKENS - question_tokens
        ours = rng.randint(1, window)
        overlap = MAX_SEQ_LENGTH - 3 - question_tokens - ours  # as --help and the card say
        spans = [(s.start, s.length) for s in doc_spans(len(tokenizer(context, add_special_tokens=False)[
            "input_ids"]), window, ours)]  # fmt: skip
        assert run_qa_windows(tokenizer, question, context, overlap) == spans, (question_tokens, ours, overlap)
        if ours < window and len(spans) > 1:
            differ_with_the_same_number += run_qa_windows(tokenizer, question, context, ours) != spans
    assert differ_with_the_same_number > 20  # the same number under both names cuts other windows


def test_help_and_the_squad_cards_say_which_stride(capsys, tmp_path):
    from bert_repro.hub.model_card import card_for_finetuning
    from bert_repro.training.finetune_recipe import FineTuningRecipe

    with pytest.raises(SystemExit):
        FineTuningRecipe.from_args(["--task", "squad", "--help"])
    out = capsys.readouterr().out
    entry = " ".join(out[out.index("  --doc_stride ") :].split("\n  --")[0].split())
    assert "the step between window starts" in entry and "run_qa.py --doc_stride R is the overlap" in entry
    assert "max_seq_length - 3 - (question tokens) - R" in entry
    for task in ("squad", "squad_v2", "mrpc"):
        text = card_for_finetuning(tmp_path, "someone/m", summary={"task": task, "best": {}}).text
        said = "`doc_stride` = `max_seq_length` - 3 - question tokens - R" in text
        assert said is task.startswith("squad"), task
