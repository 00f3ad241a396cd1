"""The corpus that travels (bert_repro.data.travel_corpus, benchmarks/corpus/) and the GPU study command
(benchmarks/study_gpu.sh) dry-run on the CPU at a tiny budget: the same script and flags as on the GPU."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import GLUE_FIXTURES, device_machine_env, write

from bert_repro.data.corpus import load_corpus
from bert_repro.data.travel_corpus import build, main
from bert_repro.data.wordpiece import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
WORDS = (
    "the a cat dog sat ran on under mat house garden quickly slowly big small red blue king queen river "
    "mountain old new green tree bird sang loud quiet night day good bad movie film"
).split()


def _books(folder: Path, n: int = 8, seed: int = 0) -> list[str]:
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    texts = []
    for d in range(n):
        sentences = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "." for _ in range(24)
        ]
        text = "\n\n".join(" ".join(sentences[i : i + 6]) for i in range(0, 24, 6)) + "\n"
        (folder / f"book{d}.txt").write_text(text)
        texts.append(text)
    (folder / "SOURCES.tsv").write_text("file\tlicence\nbook0.txt\tpublic domain\n")  # not text to train on
    return texts


@pytest.fixture(scope="module")
def travelled(tmp_path_factory):
    """A travel folder as benchmarks/corpus/travel.sh lays it out: books/ built from fixture text, glue/ with
    the training and dev files of MRPC and SST-2 only."""
    root = tmp_path_factory.mktemp("travel")
    texts = _books(root / "text")
    manifest = build(root / "text", root / ".travel" / "books", vocab_size=200, provenance="fixture text")
    for task, folder in (("mrpc", "MRPC"), ("sst2", "SST-2")):
        files = GLUE_FIXTURES[task][0]
        write(root / ".travel" / "glue" / folder, {name: files[name] for name in ("train.tsv", "dev.tsv")})
    return root, texts, manifest


def test_the_parquet_file_reads_back_as_the_documents_in_their_order(travelled):
    root, texts, manifest = travelled
    books = root / ".travel" / "books"
    assert load_corpus(str(books / "corpus.parquet"))["text"] == texts
    tokenizer = load_tokenizer(books / "tokenizer")
    assert manifest["tokens"] == sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    assert manifest["documents"] == 8 and manifest["provenance"] == "fixture text"
    assert [s["file"] for s in manifest["sources"]] == [f"book{d}.txt" for d in range(8)]
    assert (books / "SOURCES.tsv").is_file() and json.loads((books / "manifest.json").read_text()) == manifest


def test_check_finds_a_copy_cut_short_and_build_never_overwrites(travelled, tmp_path, capsys):
    root, _, _ = travelled
    assert main(["--check", str(root / ".travel" / "books")]) == 0
    copy = tmp_path / "books"
    copy.mkdir()
    for name in ("manifest.json", "corpus.parquet"):
        (copy / name).write_bytes((root / ".travel" / "books" / name).read_bytes())
    with open(copy / "corpus.parquet", "r+b") as f:
        f.truncate(100)
    assert main(["--check", str(copy)]) == 2
    assert "corpus.parquet: missing or not the file built (100 bytes" in capsys.readouterr().err
    assert main([str(root / "text"), str(copy)]) == 2  # not empty: nothing is overwritten
    assert "exists and is not an empty folder" in capsys.readouterr().err
    assert (copy / "manifest.json").read_text() == (root / ".travel" / "books" / "manifest.json").read_text()
    assert main([str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "no .txt files" in capsys.readouterr().err


def test_gutenberg_books_keep_only_the_text_between_the_start_and_end_lines(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks" / "corpus"))
    try:
        from gutenberg_books import book_text
    finally:
        sys.path.pop(0)
    raw = (
        "The Project Gutenberg EBook of Emma\n\nRelease Date: 1994\n\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK EMMA ***\n\n\nEMMA\n\nBy Jane Austen\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK EMMA ***\n\nLicence.\n"
    )
    assert book_text(raw) == "EMMA\n\nBy Jane Austen\n"
    assert book_text("A file without the lines.\n") is None


@pytest.mark.slow
def test_the_gpu_study_command_dry_runs_on_the_cpu(travelled):
    """benchmarks/study_gpu.sh as the GPU machine runs it (both studies, the travel folder, the pre-training
    flags, the fine-tuning on the full training sets), only the model, the steps and the number of seeds and
    processes small, and bf16 off: it needs CUDA (or --use_cpu), the one thing the GPU alone checks."""
    root, _, _ = travelled
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "TRAVEL": str(root / ".travel"),
        "RESULTS": str(root / "runs"),
        "PRESET": "tiny",
        "STEPS": "2",
        "BATCH": "8",
        "MICRO": "8",
        "BF16": "false",
        "CPU": "1",
        "WORKERS": "0",
        "NUM_PROC": "1",
        "SEEDS": "1",  # seeds, and runs in parallel processes: the emulated device machine's test below
        "JOBS": "1",
    }
    studies = (("pretraining", ["pretrained", "random"]), ("table5", ["mlm_nsp", "mlm", "ltr", "ltr_bilstm"]))
    for study, rows in studies:
        done = subprocess.run(
            ["bash", "benchmarks/study_gpu.sh"],
            cwd=ROOT,
            env={**env, "STUDY": study},
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = root / "runs" / f"study_{study}"
        saved = json.loads((out / "study.json").read_text())
        assert [r["variant"] for r in saved["rows"]] == rows
        assert all(c["ours"] is not None for r in saved["rows"] for c in r["cells"].values())
        assert (out / "study.md").is_file() and (out / "study.png").is_file()
    run = root / "runs" / "study_pretraining" / "pretrain" / "pretrained"
    pretrained = json.loads((run / "run_config.json").read_text())
    assert "corpus.parquet" in json.dumps(pretrained) and '"dupe_factor": 2' in json.dumps(pretrained)
    assert '"static_masking": false' in json.dumps(pretrained)  # dynamic masking: no masks to build
    # table5 reused the pre-trained model of the first study instead of training its own
    assert not (root / "runs" / "study_table5" / "pretrain" / "mlm_nsp").exists()


@pytest.mark.slow
def test_the_gpu_study_part_runs_on_an_emulated_device_machine(travelled, tmp_path):
    """`PARTS="probe study" bash benchmarks/run_gpu.sh` as on the device machine, only without CUDA (DRY_RUN=1:
    tiny sizes on the CPU): a network that accepts connections and never answers (Hub, index, proxy), a `python`
    that is not the one with torch, the carried travel folder; the study's table, the log and the packed model come
    back in OUT within the device's file limits (at most 8 files of 16 MiB)."""
    root, _, _ = travelled
    settings = dict(TRAVEL=str(root / ".travel"), PARTS="probe study", DRY_RUN="1", BUDGET="900")
    with device_machine_env(tmp_path, **settings) as env:
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks/run_gpu.sh")], env=env, capture_output=True, text=True, timeout=1200
        )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = tmp_path / "out"
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.stat().st_size < 16 * 2**20 for p in out.iterdir()), files
    assert {"results.json", "summary.txt", "progress.log", "logs.tgz", "pretrained.tar.0"} <= set(files)
    results = json.loads((out / "results.json").read_text())
    study = results["study"]["pretraining"]
    assert [r["variant"] for r in study["rows"]] == ["pretrained", "random"]
    assert all(len(c["seeds"]) == 2 for r in study["rows"] for c in r["cells"].values())
    assert "| majority class" in study["markdown"] and results["study_pretraining"]["steps"] == 4
    # the packed model unpacks into a directory that plain transformers loads
    import tarfile

    from transformers import AutoModelForPreTraining

    with open(tmp_path / "model.tar", "wb") as joined:
        for part in sorted(out.glob("pretrained.tar.*"), key=lambda p: int(p.suffix[1:])):
            joined.write(part.read_bytes())
    with tarfile.open(tmp_path / "model.tar") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    model = AutoModelForPreTraining.from_pretrained(tmp_path / "unpacked" / "pretrained")
    assert next(model.parameters()).dtype.is_floating_point
    assert (tmp_path / "unpacked" / "pretrained" / "data_statistics.json").is_file()
