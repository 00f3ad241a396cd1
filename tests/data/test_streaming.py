"""Streamed pre-training examples (bert_repro.data.streaming): the map-style laws, resumable without rereading."""

import dataclasses
import functools
import itertools
import json
import math
import random

import datasets
import pytest
from support.pretraining_runs import launch, run_recipe, weights, write_config
from torch.utils.data import DataLoader

from bert_repro.data.corpus import CorpusError
from bert_repro.data.example_statistics import pretraining_statistics
from bert_repro.data.pretraining_config import PreTrainingDataConfig
from bert_repro.data.pretraining_examples import create_pretraining_dataset
from bert_repro.data.streaming import (
    DatasetDocuments,
    StreamingExamples,
    TextFileDocuments,
    WorkerStreams,
    open_document_source,
    open_stream,
)
from bert_repro.data.training_instances import IS_NEXT, NOT_NEXT

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
DOCUMENTS, WORDS_PER_DOCUMENT = 40, 12


def word(document, j):
    return f"d{document}w{j}"


@pytest.fixture(scope="module")
def marked(tmp_path_factory):
    """4 files whose every word belongs to one document (a token id names it), and a tokenizer of just those words."""
    from bert_repro.data.wordpiece import load_tokenizer

    root = tmp_path_factory.mktemp("marked")
    rng = random.Random(0)
    texts = []
    for d in range(DOCUMENTS):
        sentences = [
            " ".join(word(d, rng.randrange(WORDS_PER_DOCUMENT)) for _ in range(rng.randint(3, 9))) + " ."
            for _ in range(rng.randint(1, 9))
        ]
        texts.append("\n".join(sentences))  # one sentence a line, as the reference's input
    folder = root / "corpus"
    folder.mkdir()
    for f in range(4):
        (folder / f"part{f}.txt").write_text("\n\n".join(texts[f * 10 : (f + 1) * 10]) + "\n")
    vocab = SPECIAL + ["."] + [word(d, j) for d in range(DOCUMENTS) for j in range(WORDS_PER_DOCUMENT)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tokenizer = load_tokenizer(root / "vocab.txt")
    owner = {
        tokenizer.convert_tokens_to_ids(word(d, j)): d for d in range(DOCUMENTS) for j in range(WORDS_PER_DOCUMENT)
    }
    return folder, texts, tokenizer, owner


CONFIG = PreTrainingDataConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=3, random_seed=7)
LONG = PreTrainingDataConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3, random_seed=7)


def examples_of(source, tokenizer, config=CONFIG, **kwargs):
    """The corpus holds one sentence a line: split_lines."""
    return StreamingExamples(source, tokenizer, config, split_lines=True, **kwargs)


def from_folder(folder, tokenizer, config=CONFIG, **kwargs):
    return examples_of(open_document_source(str(folder)), tokenizer, config, **kwargs)


def take(examples, n):
    it = iter(examples)
    return [next(it) for _ in range(n)]


def originals(example):
    """The example's tokens before masking."""
    ids = list(example["input_ids"])
    for position, original in zip(example["masked_lm_positions"], example["masked_lm_ids"]):
        ids[position] = original
    return ids


def segments(example, tokenizer):
    ids, types = originals(example), example["token_type_ids"]
    special = {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.convert_tokens_to_ids(".")}
    a = [t for t, s in zip(ids, types) if s == 0 and t not in special]
    b = [t for t, s in zip(ids, types) if s == 1 and t not in special]
    return a, b


def test_source_reads_every_document_once_per_pass(marked):
    folder, texts, _, _ = marked
    source = open_document_source(str(folder))
    assert isinstance(source, TextFileDocuments)
    assert list(source) == texts and list(source) == []  # one pass, then nothing until rewound
    source.rewind()
    assert list(source) == texts and source.documents_read == 2 * DOCUMENTS
    # Two processes: each its own files, together every document once.
    parts = [list(open_document_source(str(folder), rank=r, world_size=2)) for r in range(2)]
    assert not set(parts[0]) & set(parts[1]) and sorted(parts[0] + parts[1]) == sorted(texts)
    # More processes than files: every 5th document each.
    parts = [list(open_document_source(str(folder), rank=r, world_size=5)) for r in range(5)]
    assert [len(p) for p in parts] == [8] * 5 and sorted(t for p in parts for t in p) == sorted(texts)


def test_not_next_segments_come_from_other_documents_of_the_buffer(marked):
    folder, _, tokenizer, owner = marked
    buffer = 4
    examples = take(from_folder(folder, tokenizer, document_buffer=buffer, shuffle_buffer=50), 1500)
    counts = {IS_NEXT: 0, NOT_NEXT: 0}
    for example in examples:
        a, b = segments(example, tokenizer)
        a_docs, b_docs = {owner[t] for t in a}, {owner[t] for t in b}
        assert len(a_docs) == 1 and len(b_docs) == 1, example  # each segment from one document
        (a_doc,), (b_doc,) = a_docs, b_docs
        counts[example["next_sentence_label"]] += 1
        if example["next_sentence_label"] == IS_NEXT:
            assert b_doc == a_doc
        else:
            assert b_doc != a_doc  # never the same document (the buffer always holds `buffer` others)
            # From the buffer: one of the `buffer` documents before A's, or, for the first ones of a pass, after it.
            assert abs(b_doc - a_doc) <= buffer, (a_doc, b_doc)
    assert counts[IS_NEXT] > 300 and counts[NOT_NEXT] > 300


def test_shuffle_buffer_mixes_documents(marked):
    """No buffer: document order; a buffer: about half of neighbouring examples in decreasing order, as if shuffled."""
    folder, _, tokenizer, owner = marked

    def decreasing_share(shuffle_buffer):
        rows = take(from_folder(folder, tokenizer, shuffle_buffer=shuffle_buffer), 300)
        docs = [owner[segments(r, tokenizer)[0][0]] for r in rows]
        return sum(b < a for a, b in itertools.pairwise(docs)) / (len(docs) - 1)

    assert decreasing_share(0) < 0.02  # only where a pass starts again
    assert 0.35 < decreasing_share(100) < 0.65


def binomial_bound(p, n1, n2, sigmas=4.0):
    return sigmas * math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))


def test_streamed_examples_follow_the_laws_of_the_map_style_builder(marked):
    folder, texts, tokenizer, _ = marked
    config = PreTrainingDataConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=30, random_seed=3)
    reference = create_pretraining_dataset(
        datasets.Dataset.from_dict({"text": texts}), tokenizer, config, split_lines=True
    )
    n = len(reference)
    streamed = take(from_folder(folder, tokenizer, config, document_buffer=8, shuffle_buffer=200), n)
    mask = tokenizer.mask_token_id
    ours = pretraining_statistics(datasets.Dataset.from_list(streamed), mask_token_id=mask)
    theirs = pretraining_statistics(reference, mask_token_id=mask)
    # Both against the paper's laws (NotNext a bit over half: one-sentence chunks always are), then each other.
    for stats in (ours, theirs):
        assert 0.35 < stats["is_next_share"] < 0.5
        expected_masked = sum(min(5, max(1, round(len(e["input_ids"]) * 0.15))) for e in streamed) / ours["tokens"]
        assert abs(stats["masked_share"] - expected_masked) < 0.02
    p = theirs["is_next_share"]
    assert abs(ours["is_next_share"] - p) < binomial_bound(p, ours["examples"], theirs["examples"])
    for part, share in (("mask", 0.8), ("random", 0.1 - 0.1 / tokenizer.vocab_size), ("unchanged", 0.1)):
        for stats in (ours, theirs):
            assert (
                abs(stats["masked_split"][part] - share) < binomial_bound(share, stats["masked"], stats["masked"]) * 2
            )
        assert abs(ours["masked_split"][part] - theirs["masked_split"][part]) < binomial_bound(
            share, ours["masked"], theirs["masked"]
        )
    p = theirs["masked_share"]
    assert abs(ours["masked_share"] - p) < binomial_bound(p, ours["tokens"], theirs["tokens"]) + 0.01
    # Lengths: the same targets (short_seq_prob), so the same mean length within noise.
    assert abs(ours["tokens"] / ours["examples"] - theirs["tokens"] / theirs["examples"]) < 1.0


def test_dupe_rounds_repeat_after_dupe_factor_passes(marked):
    folder, _, tokenizer, _ = marked
    config = PreTrainingDataConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, random_seed=1)
    examples = from_folder(folder, tokenizer, config, shuffle_buffer=0)
    passes = []
    it = iter(examples)
    while len(passes) < 3:
        current = examples._pass
        rows = []
        while examples._pass == current or not rows:
            rows.append(json.dumps(next(it), sort_keys=True))
            if examples._pass != current and len(rows) > 1:
                break
        passes.append(rows)
    first, second, third = (set(p) for p in passes)
    assert len(first & third) > 0.9 * len(first)  # round 0 again: same instances
    assert len(first & second) < 0.1 * len(first)  # round 1: other masks and pairs


@pytest.mark.parametrize("kind", ["files", "datasets"])
def test_resumed_stream_gives_the_same_examples_without_rereading(marked, kind):
    """A resumed stream reads only what the uninterrupted one read after the stop (datasets: not finished shards)."""
    folder, texts, tokenizer, _ = marked
    logs = []

    def rows(shards, which):
        for shard in shards:
            for i in range(shard * 5, shard * 5 + 5):
                logs[which].append(i)
                yield {"text": texts[i]}

    def fresh():
        if kind == "files":
            src = open_document_source(str(folder))
        else:
            logs.append([])
            src = DatasetDocuments(
                datasets.IterableDataset.from_generator(
                    rows, gen_kwargs={"shards": list(range(8)), "which": len(logs) - 1}
                )
            )
        return src, examples_of(src, tokenizer, CONFIG, document_buffer=5, shuffle_buffer=30)

    stop, total = 437, 700  # in the second pass over the stream (about 350 examples a pass here)
    full_source, full = fresh()
    expected = take(full, total)
    first_source, first = fresh()
    head = take(first, stop)
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint holds
    resumed_source, resumed = fresh()
    resumed.load_state_dict(state)
    tail = take(resumed, total - stop)
    assert head + tail == expected and resumed.state_dict()["examples"] == total
    if kind == "files":
        assert first_source.documents_read + resumed_source.documents_read == full_source.documents_read
        return
    full_reads, first_reads, resumed_reads = logs
    assert first_reads + resumed_reads[-(len(full_reads) - len(first_reads)) :] == full_reads
    again = resumed_reads[: len(resumed_reads) - (len(full_reads) - len(first_reads))]
    current_shard = first_reads[-1] // 5
    assert again == list(range(current_shard * 5, first_reads[-1] + 1))  # the current shard's consumed rows only


def test_phase_switch_and_state_checks(marked):
    folder, _, tokenizer, _ = marked
    examples = from_folder(folder, tokenizer, [CONFIG, LONG], phase_examples=[40], document_buffer=3, shuffle_buffer=20)
    rows = take(examples, 240)
    assert all(len(r["input_ids"]) <= 32 for r in rows[:40]) and examples._phase == 1
    assert max(len(r["input_ids"]) for r in rows[40:]) > 32 and all(len(r["masked_lm_ids"]) <= 10 for r in rows)
    other = examples_of(
        open_document_source(str(folder), rank=1, world_size=2), tokenizer, CONFIG, rank=1, world_size=2
    )
    with pytest.raises(ValueError, match="process 0 of 1, this is process 1 of 2"):
        other.load_state_dict(examples.state_dict())
    with pytest.raises(ValueError, match="document_buffer must be at least 1"):
        from_folder(folder, tokenizer, document_buffer=0)


def test_bad_streamed_corpus(tmp_path, marked):
    _, _, tokenizer, _ = marked
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(CorpusError, match="no document with text"):
        take(examples_of(open_document_source(str(empty)), tokenizer, CONFIG), 1)
    table = tmp_path / "docs.jsonl"
    table.write_text('{"body": "d0w1 d0w2 ."}\n')
    with pytest.raises(CorpusError, match="has no column 'text'"):
        list(open_document_source(str(table)))
    utf16 = tmp_path / "u.txt"
    utf16.write_text("d0w1 d0w2 .", encoding="utf-16")
    with pytest.raises(CorpusError, match="UTF-16"):
        list(open_document_source(str(utf16)))


# DataLoader workers


def corpus_of(kind, marked, tmp_path):
    """The marked corpus as 4 text files, or as 4 Parquet files (read through a datasets IterableDataset)."""
    folder, texts = marked[0], marked[1]
    if kind == "files":
        return str(folder)
    for f in range(4):
        datasets.Dataset.from_dict({"text": texts[f * 10 : (f + 1) * 10]}).to_parquet(tmp_path / f"part{f}.parquet")
    return str(tmp_path)


def worker_streams(source, tokenizer, streams, phase_batches=(7,)):
    settings = {"reading": {}, "split_lines": True, "document_buffer": 5, "shuffle_buffer": 30}
    make = functools.partial(open_stream, source, tokenizer, [CONFIG, LONG], **settings)
    return WorkerStreams(make, streams=streams, batch_size=4, phase_batches=phase_batches)


def batches_of(streams, workers, n):
    """The first n batches (lists of examples) a DataLoader with `workers` workers gives."""
    loader = DataLoader(streams, batch_size=4, num_workers=workers, collate_fn=list)
    return list(itertools.islice(loader, n))


@pytest.mark.parametrize("kind", ["files", "datasets"])
def test_workers_give_their_streams_batches_in_turn(marked, tmp_path, kind):
    """Batch i is the next of worker i % 2's stream (its half of the corpus), whatever the speeds, phase switch too."""
    source, tokenizer = corpus_of(kind, marked, tmp_path), marked[2]
    streams = worker_streams(source, tokenizer, 2)
    got = batches_of(streams, 2, 24)
    alone = [take(worker_streams(source, tokenizer, 2).stream(v), 48) for v in range(2)]
    assert [e for b in got for e in b] == [e for i in range(24) for e in alone[i % 2][i // 2 * 4 : i // 2 * 4 + 4]]
    owner = marked[3]
    documents = [{owner[t] for e in rows for t in originals(e) if t in owner} for rows in alone]
    assert not documents[0] & documents[1]  # each stream its own documents
    assert all(len(e["input_ids"]) <= 32 for b in got[:7] for e in b)  # phase 1 for the first 7 batches
    assert max(len(e["input_ids"]) for b in got[7:] for e in b) > 32  # phase 2 after them, in both streams
    assert max(len(e["input_ids"]) for b in got[8:] for e in b if e in alone[1]) > 32


def test_one_worker_reads_what_the_process_would(marked):
    source, tokenizer = str(marked[0]), marked[2]
    expected = batches_of(worker_streams(source, tokenizer, 1), 0, 12)
    first = worker_streams(source, tokenizer, 1)
    first.plan_saves(every=[5])
    assert batches_of(first, 1, 5) == expected[:5]
    resumed = worker_streams(source, tokenizer, 1)
    resumed.load_states(json.loads(first.state_text(5)))
    assert batches_of(resumed, 1, 7) == expected[5:]


@pytest.mark.parametrize("kind", ["files", "datasets"])
def test_resumed_workers_give_the_uninterrupted_batches(marked, tmp_path, kind):
    """Stopped after an odd number of batches, the workers' positions resume the uninterrupted run's batches."""
    source, tokenizer = corpus_of(kind, marked, tmp_path), marked[2]
    stop, total = 23, 40
    expected = batches_of(worker_streams(source, tokenizer, 2), 2, total)
    first = worker_streams(source, tokenizer, 2)
    first.plan_saves(every=[10], at=[stop])
    head = batches_of(first, 2, stop)
    state = json.loads(first.state_text(stop))  # what the checkpoint holds
    assert [s["examples"] for s in state["streams"]] == [12 * 4, 11 * 4]
    resumed = worker_streams(source, tokenizer, 2)
    resumed.load_states(state)
    assert head + batches_of(resumed, 2, total - stop) == expected
    with pytest.raises(ValueError, match="--dataloader_num_workers 2, this run has 1 with 3"):
        worker_streams(source, tokenizer, 3).load_states(state)
    with pytest.raises(ValueError, match="--dataloader_num_workers 2, this run has 1 with 0"):
        worker_streams(source, tokenizer, 1).load_states(state)


# Through the recipe

STREAMED = {
    "streaming": True,
    "stream_document_buffer": 4,
    "stream_shuffle_buffer": 16,
    "stream_held_out_documents": 4,
    "document_boundary": "blank_line",
    "split_lines": True,
}


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_streamed_pretraining_stopped_and_resumed_matches_uninterrupted(tmp_path, marked, workers):
    folder = marked[0]
    steps = {"max_steps": 12, "save_steps": 5, "eval_steps": 6, "phase2_fraction": 0.25, "eval_fraction": 0.0}
    config = write_config(
        tmp_path / "stream.yaml",
        folder,
        folder.parent / "vocab.txt",
        **STREAMED,
        **steps,
        dataloader_num_workers=workers,
    )
    full = tmp_path / "full"
    launch(config, full)
    stats = json.loads((full / "data_statistics.json").read_text())
    assert stats["phase1"]["streamed"] and stats["held_out"]["examples"] > 0
    stopped = tmp_path / "stopped"
    launch(config, stopped, "--stop_after_steps", "7")  # checkpoint-5 (save_steps) and checkpoint-7 (the stop)
    state = json.loads((stopped / "checkpoint-7" / "data_state-rank0.json").read_text())
    examples = [4 * 8, 3 * 8] if workers else [7 * 8]  # batch i from stream i % 2
    assert [s["examples"] for s in state["streams"]] == examples and state["streams"][0]["phase"] == 0
    if workers:
        resume = ("--config", config, "--output_dir", stopped, "--resume_from_checkpoint", "true")
        wrong = run_recipe("pretrain.py", *resume, "--dataloader_num_workers", "3", timeout=600)
        assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr[-3000:]
        assert "--dataloader_num_workers 2, this run has 1 with 3: resume with as many" in wrong.stderr
    launch(config, stopped, "--resume_from_checkpoint", "true")
    a, b = weights(full), weights(stopped)
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst < 1e-6, worst
    history = [e for e in json.loads((stopped / "log_history.json").read_text()) if "mlm_loss" in e]
    assert len(history) == 12


@pytest.mark.slow
def test_streamed_pretraining_with_two_processes_reads_different_files(tmp_path, marked):
    folder, _, _, _ = marked
    steps = {"max_steps": 6, "save_steps": 3, "eval_steps": 3, "phase2_fraction": 0.0, "eval_fraction": 0.0}
    config = write_config(
        tmp_path / "ddp.yaml", folder, folder.parent / "vocab.txt", **STREAMED, **steps, per_device_train_batch_size=4
    )
    out = tmp_path / "two"
    launch(config, out, "--stop_after_steps", "5", processes=2)
    states = [
        json.loads((out / "checkpoint-3" / f"data_state-rank{r}.json").read_text())["streams"][0] for r in range(2)
    ]
    assert [(s["rank"], s["world_size"], s["examples"]) for s in states] == [(0, 2, 12), (1, 2, 12)]
    assert [s["source"]["files"] for s in states] == [2, 2]  # each process its own 2 of the 4 files
    buffered = [{tuple(map(tuple, entry[2])) for entry in s["buffer"]} for s in states]
    assert not buffered[0] & buffered[1]
    launch(config, out, "--resume_from_checkpoint", "true", processes=2)
    results = json.loads((out / "results.json").read_text())
    assert results["processes"] == 2 and results["global_step"] == 6 and results["tokens_per_second"] > 0


@pytest.mark.parametrize("objective", ["mlm", "ltr"])
def test_streamed_examples_follow_the_objective(marked, objective):
    """Table 5's objectives stream like the map-style builder writes them: one segment, no NSP, masks for "mlm" only."""
    folder, _, tokenizer, owner = marked
    config = dataclasses.replace(CONFIG, dupe_factor=1, objective=objective)
    examples = take(examples_of(open_document_source([str(folder)]), tokenizer, config, document_buffer=4), 30)
    for example in examples:
        assert "next_sentence_label" not in example and set(example["token_type_ids"]) == {0}
        assert example["input_ids"].count(tokenizer.sep_token_id) == 1
        assert ("masked_lm_positions" in example) == (objective == "mlm")
        ids = originals(example) if objective == "mlm" else example["input_ids"]
        assert (
            len({owner[t] for t in ids if t in owner}) == 1
        )  # contiguous text of one document: no segment B from another
