"""Shared fixtures (helpers and fixture data are in support/). No test reaches the network: the Hub client is put
offline before any import. No test touches the user's caches: they move into the session's temporary folder before
the test modules import the libraries (pytest_configure)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread here and in every recipe started (they inherit it): OpenMP threads waiting for a core another
# process holds (DDP ranks, DataLoader workers) made a tiny model's step tens of times slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Our Triton kernels (fused_dropout_add_norm) run on the CPU under Triton's interpreter, so tests check the kernels
# themselves; set before any import of triton, which decides then whether tl.sum etc. are interpreted.
os.environ.setdefault("TRITON_INTERPRET", "1")

import json
import random

import pytest
import torch
from support.corpora import WORDS
from support.google_checkpoint import google_config, google_weights, optimizer_state, write_google_checkpoint
from support.models import PARITY_REPORT, PARITY_TOLERANCE, tiny_config
from support.task_files import fixture_files
from support.user_caches import compared, files, isolate, user_caches

USER_CACHES = pytest.StashKey[tuple[list, dict]]()


@pytest.hookimpl(trylast=True)  # after pytest's own, which makes the factory of temporary folders
def pytest_configure(config):
    """The caches in the session's temporary folder (each xdist worker its own), kept or removed with it by pytest,
    as the environment of every process a test starts; the user's measured first (controller only). The crash
    harness's sample is drawn here, so that xdist's workers, which inherit the environment, draw the same."""
    if not hasattr(config, "workerinput"):
        config.stash[USER_CACHES] = user_caches(), files(user_caches())
        os.environ.setdefault("WRITE_POINTS_SEED", str(random.randrange(10**6)))
    # The basetemp the tmp_path fixtures use (xdist reads it the same way); the fixtures come after the imports.
    isolate(config._tmp_path_factory.getbasetemp() / "caches")


def pytest_report_header(config):
    seed = os.environ["WRITE_POINTS_SEED"]
    return f"crash harness: write points sampled with WRITE_POINTS_SEED={seed} (WRITE_POINTS=all: every point)"


@pytest.fixture(scope="session")
def corpus_and_tokenizer(tmp_path_factory):
    """A small corpus of documents (one per file) and a tokenizer trained once, so every run shares its vocabulary
    (WordPiece training in the tokenizers library is not deterministic). Tests read it, never write into it."""
    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    texts = []
    for d in range(12):
        paragraphs = []
        for _ in range(6):
            sentences = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(5)
            ]
            paragraphs.append(" ".join(sentences))
        text = "\n\n".join(paragraphs)
        (root / f"doc{d:02d}.txt").write_text(text)
        texts.append(text)
    tokenizer = train_wordpiece(iterator=texts, vocab_size=120, show_progress=False)
    directory = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(tokenizer, directory)
    return root, directory


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A tiny pre-trained-shaped checkpoint with a tokenizer trained on every task fixture's text."""
    from bert_repro import BertReproForPreTraining
    from bert_repro.data.wordpiece import save_tokenizer, train_wordpiece
    from bert_repro.tasks.registry import TASKS

    texts = [text for name in TASKS for text in fixture_files(name).values()]
    tokenizer = train_wordpiece(iterator=texts * 3, vocab_size=300, show_progress=False)
    directory = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    model = BertReproForPreTraining(tiny_config(vocab_size=len(tokenizer), max_position_embeddings=512))
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory)
    return directory


@pytest.fixture(scope="session")
def tf():
    return pytest.importorskip("tensorflow")


@pytest.fixture(scope="session")
def google_checkpoint(tf, tmp_path_factory):
    """A Google-layout checkpoint (bert_model.ckpt.{index,data-*} plus optimizer state) and its weights."""
    directory = tmp_path_factory.mktemp("uncased_L-2_H-8_A-2")
    weights = google_weights()
    write_google_checkpoint(tf, directory / "bert_model.ckpt", {**weights, **optimizer_state(weights)})
    (directory / "bert_config.json").write_text(json.dumps(google_config()))
    return directory, weights


@pytest.fixture
def local_hub(tmp_path):
    """A started LocalHub (hub_server.py) storing its repos under ``tmp_path / "hub"``."""
    from hub_server import LocalHub

    with LocalHub(root=tmp_path / "hub") as hub:
        yield hub


def pytest_terminal_summary(terminalreporter, config):
    """The user's caches before and after; the worst differences of the parity tests, printed at the end of every run
    (not only with -s)."""
    if USER_CACHES in config.stash:
        folders, before = config.stash[USER_CACHES]
        terminalreporter.section("the user's caches (tests write only into their temporary folders)")
        for line in compared(folders, before, files(folders)):
            terminalreporter.write_line(line)
    if not PARITY_REPORT:
        return
    terminalreporter.section("parity with transformers (max absolute difference, fp32, eval mode)")
    for name, diff in PARITY_REPORT:
        terminalreporter.write_line(f"{diff:10.3e}  {name}")
    worst_name, worst = max(PARITY_REPORT, key=lambda item: item[1])
    terminalreporter.write_line(f"worst: {worst:.3e} ({worst_name}); tolerance {PARITY_TOLERANCE:g}")


@pytest.fixture
def one_thread():
    """Tiny models train faster on one thread, many times faster when other processes share the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
