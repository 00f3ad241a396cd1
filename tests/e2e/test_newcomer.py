"""A newcomer's first hour: the quick start runs offline on the shipped corpus, and bad input (not UTF-8, no text, a
missing optional package) gets one clear message, exit code 2, no traceback and nothing lost."""

import json
import logging
import sys

import pytest
from support import ROOT
from support.models import tiny_config
from support.pretraining_runs import ONE_PROCESS, hide_packages, run_recipe, write_config

SHIPPED = ROOT / "recipes" / "data" / "quickstart_corpus"


def test_shipped_corpus_is_documented_and_text():
    readme = (SHIPPED / "README.md").read_text()
    files = sorted(SHIPPED.rglob("*.txt"))
    assert len(files) == 68
    for path in files:
        assert path.name in readme or path.parent.name == "state_union", path
        text = path.read_bytes().decode("utf-8")  # UTF-8, as shipped
        assert "gutenberg" not in text.lower(), path  # the licence asks for no trademark in a redistribution
    assert sum(p.stat().st_size for p in files) < 5_000_000
    assert "public domain" in readme and "17 U.S.C." in readme


def test_quickstart_config_runs_offline_without_corpus(tmp_path):
    """The README's first command offline, without --corpus: the fast tier's one pre-training through the script."""
    out = tmp_path / "quickstart"
    settings = dict(max_documents=8, dupe_factor=1, max_steps=2, warmup_steps=1, eval_steps=2, save_steps=2)
    settings.update(eval_max_examples=16, report_to="none", plot="false", disable_tqdm="true")
    flags = [arg for name, value in settings.items() for arg in (f"--{name}", value)]
    result = run_recipe("pretrain.py", "--config", "recipes/configs/quickstart.yaml", "--output_dir", out, *flags)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "pin_memory" not in result.stderr
    # The project's own corpus is not warned about: its few sentences of prose over 1,000 characters are said once
    warned = [line for line in result.stderr.splitlines() if " WARNING " in line]
    assert not [line for line in warned if "sentence" in line], warned
    assert "'sentences' longer than 1000 characters in " in result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["global_step"] == 2 and "eval_mlm_accuracy" in results
    corpus = json.loads((out / "run_config.json").read_text())["data"]["corpus"]
    assert all("quickstart_corpus" in c for c in corpus)


# --- Corpus input: encodings, nothing to read

LATIN1_FEW = "Le café était fermé. Nous sommes partis à la maison.\n".encode("latin-1")
LATIN1_MOSTLY = ("àéèêëîïôöùûüç ÀÉÈÊ " * 50 + "\n").encode("latin-1")


def test_text_that_is_not_utf8_is_decoded_with_a_warning(caplog):
    from bert_repro.data.corpus import decode_text

    with caplog.at_level("WARNING"):
        assert decode_text(LATIN1_FEW, "few.txt") == LATIN1_FEW.decode("latin-1")
        assert decode_text(LATIN1_MOSTLY, "mostly.txt") == LATIN1_MOSTLY.decode("latin-1")  # not "binary"
        assert decode_text("Smart “quotes” – dash".encode("cp1252"), "win.txt") == "Smart “quotes” – dash"
        mixed = decode_text(("naïve text. " * 10).encode() + b"\xe9t\xe9", "mixed.txt")  # two stray latin-1 bytes
        assert mixed == "naïve text. " * 10 + "\ufffdt\ufffd"
    assert "few.txt is not UTF-8: read as Windows-1252" in caplog.text
    assert "mostly.txt is not UTF-8" in caplog.text
    assert "mixed.txt: 2 byte(s) are not UTF-8" in caplog.text
    assert decode_text("ünïcödé ok".encode()) == "ünïcödé ok"  # plain UTF-8: as is
    assert decode_text(b"\xef\xbb\xbfbom") == "bom"
    assert decode_text("utf-16 text".encode("utf-16")) == "utf-16 text"
    assert decode_text(bytes(range(256)) * 40) is None  # binary
    assert decode_text(bytes(range(1, 32)) * 40 + b"x" * 100) is None  # control characters: binary too


def test_latin1_file_keeps_its_accents_in_the_corpus(tmp_path):
    from bert_repro.data.corpus import load_corpus

    (tmp_path / "few.txt").write_bytes(LATIN1_FEW)
    (tmp_path / "mostly.txt").write_bytes(LATIN1_MOSTLY)
    docs = load_corpus(tmp_path, document_boundary="file", cache_dir=str(tmp_path / "cache"))
    texts = sorted(docs["text"])
    assert len(texts) == 2 and "café" in texts[0] and texts[1].startswith("àéèêëîïôöùûüç")


def test_corpus_with_no_text_is_one_clear_error(tmp_path):
    from bert_repro.data.corpus import CorpusError, load_corpus

    (tmp_path / "a.txt").write_text("")
    (tmp_path / "b.txt").write_text("  \n\n ")
    (tmp_path / "c.txt").write_bytes(bytes(range(256)) * 40)
    with pytest.raises(CorpusError, match="the corpus holds no text"):
        load_corpus(tmp_path, document_boundary="file", cache_dir=str(tmp_path / "cache"))


@pytest.mark.slow
def test_failed_corpus_exits_2_and_leaves_nothing_behind(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "junk.txt").write_bytes(bytes(range(256)) * 40)
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, max_steps=2, save_steps=100, eval_fraction=0.0)
    out = tmp_path / "out"
    result = run_recipe("pretrain.py", "--config", config, "--output_dir", out, "--corpus", empty)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the corpus holds no text" in result.stderr and str(empty) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (out / "run_config.json").exists()
    assert (empty / "junk.txt").read_bytes() == bytes(range(256)) * 40  # the user's files untouched
    result = run_recipe(
        "pretrain.py", "--config", config, "--output_dir", out
    )  # a retry with another corpus is the same new run
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["global_step"] == 2


# --- Optional dependencies


@pytest.mark.slow
def test_missing_plotting_and_tensorboard_are_skipped_with_a_warning(tmp_path, corpus_and_tokenizer):
    corpus, tokenizer = corpus_and_tokenizer
    settings = dict(max_steps=2, save_steps=100, eval_fraction=0.0, plot=True, report_to="tensorboard")
    config = write_config(tmp_path / "c.yaml", corpus, tokenizer, **settings)
    env = hide_packages(tmp_path, "matplotlib", "tensorboard")
    out = tmp_path / "out"
    result = run_recipe("pretrain.py", "--config", config, "--output_dir", out, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "matplotlib is not installed (pip install 'bert-repro[train]')" in result.stderr
    assert "tensorboard is not installed" in result.stderr
    warned_at = result.stderr.index("matplotlib is not installed")
    assert warned_at < result.stderr.index("pre-training data")  # at the start, before any work
    assert (out / "model.safetensors").exists() and not (out / "training_curves.png").exists()


def test_a_report_without_matplotlib_is_written_without_its_chart(tmp_path, monkeypatch, caplog):
    from bert_repro.training.studies.report import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    chart = dict(panels={"score (%)": (["mrpc"], [80.0], None, [84.0], None)})
    with caplog.at_level("WARNING"):
        assert write_report(tmp_path, "report", ["# Benchmark"], {}, chart) == "# Benchmark\n"
    assert "not writing report.png" in caplog.text and not (tmp_path / "report.png").exists()
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.json").is_file()


def test_recipes_drop_the_load_report_table_but_keep_shape_mismatches(tmp_path, caplog):
    """A fine-tuning head on a pre-trained checkpoint: one line names the new weights, not transformers' table."""
    from transformers.utils import logging as hf_logging

    from bert_repro import BertReproForPreTraining, BertReproForSequenceClassification
    from bert_repro.training.cli import quiet_load_reports

    BertReproForPreTraining(tiny_config()).save_pretrained(tmp_path)
    hf_logging.set_verbosity_warning()
    root = logging.getLogger("transformers")
    propagate = root.propagate
    hf_logging.enable_propagation()  # to pytest's log capture
    target = logging.getLogger("transformers.modeling_utils")
    saved = list(target.filters)
    target.filters[:] = [f for f in saved if getattr(f, "__name__", "") != "_no_load_report"]  # an earlier run's
    try:
        BertReproForSequenceClassification.from_pretrained(tmp_path)
        assert "LOAD REPORT" in caplog.text  # the library's own behaviour, for library users
        caplog.clear()
        quiet_load_reports()
        quiet_load_reports()  # idempotent
        BertReproForSequenceClassification.from_pretrained(tmp_path)
        assert "LOAD REPORT" not in caplog.text
        assert "newly initialised" in caplog.text and "classifier.weight" in caplog.text
        caplog.clear()
        with pytest.raises(ValueError, match="other shapes"):
            BertReproForPreTraining.from_pretrained(tmp_path, vocab_size=50)
        assert "LOAD REPORT" in caplog.text  # a mismatch keeps its table: the error points at it
    finally:
        target.filters[:] = saved
        root.propagate = propagate


@pytest.mark.slow
def test_accelerate_launch_quiet_shows_the_recipes_error_alone(tmp_path):
    """docs/pretraining.md's advice for one process: `accelerate launch -q` leaves our one-line error alone."""
    missing, out = tmp_path / "missing", tmp_path / "out"
    result = run_recipe("pretrain.py", "--corpus", missing, "--output_dir", out, launcher=["-q", *ONE_PROCESS])
    assert result.returncode == 1  # accelerate's own code for a failed process in quiet mode
    assert f"pretrain.py: error: {tmp_path / 'missing'}: no such file or directory" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
