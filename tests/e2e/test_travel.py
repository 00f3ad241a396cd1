"""The corpus that travels (bert_repro.data.travel_corpus, benchmarks/corpus/), Table 5's QNLI and SQuAD subsets
(benchmarks/corpus/task_data.py) and the GPU study command (benchmarks/gpu/study_gpu.sh) dry-run on the CPU at a tiny
budget: the same script and flags as on the GPU."""

import importlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.corpora import WORDS as CORPUS_WORDS
from support.device_machine import device_machine_env
from support.task_files import GLUE_FIXTURES, squad_files, write

from bert_repro.data.corpus import load_corpus
from bert_repro.data.travel_corpus import build, main
from bert_repro.data.wordpiece import load_tokenizer

WORDS = [*CORPUS_WORDS, "good", "bad", "movie", "film"]


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


def _corpus_script(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks" / "corpus"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


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
    book_text = _corpus_script("gutenberg_books").book_text
    raw = (
        "The Project Gutenberg EBook of Emma\n\nRelease Date: 1994\n\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK EMMA ***\n\n\nEMMA\n\nBy Jane Austen\n\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK EMMA ***\n\nLicence.\n"
    )
    assert book_text(raw) == "EMMA\n\nBy Jane Austen\n"
    assert book_text("A file without the lines.\n") is None


@pytest.mark.slow
def test_the_gpu_study_command_dry_runs_on_the_cpu(travelled):
    """benchmarks/gpu/study_gpu.sh with the GPU machine's studies, folder and flags, only small and without bf16
    (it needs CUDA, the one thing the GPU alone checks)."""
    root, _, _ = travelled
    small = dict(PRESET="tiny", STEPS="2", BATCH="8", MICRO="8", BF16="false", CPU="1", WORKERS="0", NUM_PROC="1")
    small.update(SEEDS="1", JOBS="1")  # several: the emulated device machine's test below
    where = dict(PYTHON=sys.executable, TRAVEL=str(root / ".travel"), RESULTS=str(root / "runs"))
    env = {**os.environ, **where, **small}
    studies = (("pretraining", ["pretrained", "random"]), ("table5", ["mlm_nsp", "mlm", "ltr", "ltr_bilstm"]))
    # Table 5 reusing the first study's model (its own pre-trainings: test_table5_runs_on_a_bare_...)
    more = {"TABLE5_REUSE": "1", "TABLE5_TASKS": "mrpc sst2", "TABLE5_VARIANTS": "mlm_nsp mlm ltr ltr_bilstm"}
    for study, rows in studies:
        done = subprocess.run(
            ["bash", "benchmarks/gpu/study_gpu.sh"],
            cwd=ROOT,
            env={**env, **more, "STUDY": study},
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
    """`PARTS="probe study" bash benchmarks/gpu/run_gpu.sh` on an emulated device machine (DRY_RUN=1, no network, a
    `python` without torch): the table, log and packed model come back within its limits (8 files of 16 MiB)."""
    root, _, _ = travelled
    settings = dict(TRAVEL=str(root / ".travel"), PARTS="probe study", DRY_RUN="1", BUDGET="900")
    with device_machine_env(tmp_path, **settings) as env:
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks/gpu/run_gpu.sh")], env=env, capture_output=True, text=True, timeout=1200
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


def _explorer_page(title: str, paragraphs: list[tuple[str, list[tuple[str, list[str]]]]]) -> str:
    """A page as the SQuAD explorer renders an article: a paragraph, then its questions and their answers."""
    blocks = []
    for context, qas in paragraphs:
        questions = "".join(
            f'<div class="qa-wrap"><p> <strong class="question">{q}</strong></p><ol class="list-unstyled">'
            + "".join(
                f'<li><p><i>Answer {i + 1}: </i><span class="answer">{a}</span></p></li>' for i, a in enumerate(a)
            )
            + "</ol></div>"
            for q, a in qas
        )
        blocks.append(
            f'<div class="para-wrap"><div class="row"><div class="col-md-6"><pre>{context}</pre></div>'
            f'<div class="col-md-6 rightCol">{questions}</div></div></div>'
        )
    return f'<html><body><h1 id="title">{title}</h1><div>' + "".join(blocks) + "</div></div></div></div></div></body>"


def test_squad_from_explorer_pages_keeps_answers_whose_offset_is_certain():
    task_data = _corpus_script("task_data")
    page = _explorer_page(
        "Caf&eacute;",
        [
            (
                "Tea &amp; coffee: the caf&eacute; sells tea. It opened in 1901.",
                [
                    ("When did it open?", ["1901", "in 1901"]),  # once: kept, the first answer
                    ("What does it sell?", ["tea"]),  # lower-case "tea" occurs once ("Tea" is another string)
                    ("What is sold?", ["e"]),  # many times: its start would be a guess, left out
                    ("Who owns it?", ["a baker"]),  # not in the paragraph: left out
                ],
            ),
            ("A paragraph without a certain answer.", [("Which?", ["a"])]),
        ],
    )
    article = task_data.squad_articles_from_explorer_page(page)
    assert article["title"] == "Café" and len(article["paragraphs"]) == 1
    paragraph = article["paragraphs"][0]
    assert paragraph["context"] == "Tea & coffee: the café sells tea. It opened in 1901."
    for qa in paragraph["qas"]:
        (answer,) = qa["answers"]
        assert paragraph["context"][answer["answer_start"] :].startswith(answer["text"])
    kept = [("When did it open?", "1901"), ("What does it sell?", "tea")]
    assert [(q["question"], q["answers"][0]["text"]) for q in paragraph["qas"]] == kept
    assert [q["id"] for q in paragraph["qas"]] == ["Café-0-0", "Café-0-1"]


def test_squad_subset_takes_whole_paragraphs_round_the_articles():
    task_data = _corpus_script("task_data")

    def article(title, sizes):
        return {
            "title": title,
            "paragraphs": [{"context": f"{title}{p}", "qas": list(range(n))} for p, n in enumerate(sizes)],
        }

    subset = task_data.first_questions([article("a", [2, 2, 2]), article("b", [3]), article("c", [1, 5])], 9)
    paragraphs = [("a", ["a0", "a1"]), ("b", ["b0"]), ("c", ["c0", "c1"])]
    assert [(a["title"], [p["context"] for p in a["paragraphs"]]) for a in subset] == paragraphs
    assert sum(len(p["qas"]) for a in subset for p in a["paragraphs"]) == 9  # c1 cut to the 1 question left
    cut = task_data.first_questions([article("a", [2, 2, 2]), article("b", [3]), article("c", [1, 5])], 4)
    assert [(a["title"], [p["qas"] for p in a["paragraphs"]]) for a in cut] == [("a", [[0, 1]]), ("b", [[0, 1]])]
    assert task_data.first_questions([article("a", [2])], 5)[0]["paragraphs"][0]["qas"] == [0, 1]


def test_task_data_check_finds_a_missing_or_changed_file(tmp_path, capsys):
    task_data = _corpus_script("task_data")
    files = {"QNLI/train.tsv": b"index\tquestion\tsentence\tlabel\n", "SQuAD/dev.json": b'{"data": []}'}
    manifest = {"built": {n: {"sha256": task_data.sha256(d)} for n, d in files.items()}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    for name, data in files.items():
        (tmp_path / "out" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "out" / name).write_bytes(data)
    args = ["check", str(tmp_path / "out"), "--manifest", str(tmp_path / "manifest.json")]
    assert task_data.main(args) == 0
    (tmp_path / "out" / "SQuAD" / "dev.json").write_bytes(b'{"data": [1]}')
    (tmp_path / "out" / "QNLI" / "train.tsv").unlink()
    assert task_data.main(args) == 2
    err = capsys.readouterr().err
    assert "QNLI/train.tsv: missing" in err and "SQuAD/dev.json: SHA-256" in err
    # the repository's manifest names every file the study reads, each with a hash
    built = json.loads(task_data.MANIFEST.read_text())["built"]
    assert sorted(built) == ["QNLI/dev.tsv", "QNLI/train.tsv", "SQuAD/dev.json", "SQuAD/train.json"]
    assert all(len(r["sha256"]) == 64 for r in built.values())


@pytest.mark.slow
def test_table5_runs_on_a_bare_emulated_device_machine(travelled, tmp_path):
    """`PARTS="probe table5" bash benchmarks/gpu/run_gpu.sh` with no earlier study (DRY_RUN=1): three objectives
    pre-trained with the same flags, each fine-tuned on MRPC, SST-2, QNLI and SQuAD (fixture rows checked against
    their own manifest) with 2 seeds; the table comes back in results.json."""
    root, _, _ = travelled
    travel = tmp_path / ".travel"
    travel.mkdir()
    (travel / "books").symlink_to(root / ".travel" / "books", target_is_directory=True)
    for task, folder in (("mrpc", "MRPC"), ("sst2", "SST-2"), ("qnli", "QNLI")):
        write(travel / "glue" / folder, {n: GLUE_FIXTURES[task][0][n] for n in ("train.tsv", "dev.tsv")})
    squad = squad_files(1)
    write(travel / "glue" / "SQuAD", {"train.json": squad["train-v1.1.json"], "dev.json": squad["dev-v1.1.json"]})
    task_data = _corpus_script("task_data")
    built = {
        f"{task}/{f.name}": {"sha256": task_data.sha256(f.read_bytes())}
        for task in ("QNLI", "SQuAD")
        for f in sorted((travel / "glue" / task).iterdir())
    }
    (tmp_path / "manifest.json").write_text(json.dumps({"built": built}))
    settings = dict(
        TRAVEL=str(travel),
        PARTS="probe table5",
        DRY_RUN="1",
        BUDGET="1500",
        STUDY_ENV=f"TASK_MANIFEST={tmp_path / 'manifest.json'}",
    )
    with device_machine_env(tmp_path, **settings) as env:
        run = subprocess.run(
            ["bash", str(ROOT / "benchmarks/gpu/run_gpu.sh")], env=env, capture_output=True, text=True, timeout=1800
        )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    table = results["study"]["table5"]
    assert [r["variant"] for r in table["rows"]] == ["mlm_nsp", "mlm", "ltr"]
    assert [c["task"] for c in table["columns"]] == ["qnli", "mrpc", "sst2", "squad"]
    assert all(len(c["seeds"]) == 2 for r in table["rows"] for c in r["cells"].values())
    # each variant pre-trained here, on the same corpus for the same steps; only the objective differs
    configs = {}
    for variant in ("mlm_nsp", "mlm", "ltr"):
        record = json.loads(
            (tmp_path / "results" / "study_table5" / "pretrain" / variant / "run_config.json").read_text()
        )
        configs[variant] = record
        assert record["examples"]["objective"] == variant
    for variant in ("mlm_nsp", "ltr"):
        for section in ("data", "model", "phases", "optimization", "output"):
            assert configs[variant][section] == configs["mlm"][section]
        assert {**configs[variant]["examples"], "objective": "mlm"} == configs["mlm"]["examples"]
        assert {**configs[variant]["training"], "output_dir": ""} == {**configs["mlm"]["training"], "output_dir": ""}
