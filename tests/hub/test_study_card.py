"""Model cards from a study's results file (bert_repro.hub.study_card): each checked-in card is what its study file
gives, to the last digit; each score names its split and seeds; the baselines, budget and limits are there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from support import ROOT

from bert_repro.hub.study_card import StudyFacts, differences, main

SOURCE = re.compile(r"comes from one file, `([^`]+)`")
REPO = re.compile(r'from_pretrained\("([^"]+)"')


def _cards() -> list[tuple[Path, Path, str]]:
    """(card, its study file, its repository id) for every card under model_cards/ written from a study file."""
    out = []
    for card in sorted((ROOT / "model_cards").glob("*/README.md")):
        text = card.read_text(encoding="utf-8")
        if source := SOURCE.search(text):
            out.append((card, ROOT / source.group(1), REPO.search(text).group(1)))
    return out


CARDS = _cards()
CARD, STUDY_FILE, REPO_ID = CARDS[0]


def card_from(study_file: Path, repo_id: str = REPO_ID) -> str:
    return str(StudyFacts.from_study_file(study_file, repo_id).to_model_card())


def test_there_is_a_card_written_from_a_study_file():
    assert [c.parent.name for c, _, _ in CARDS] == ["bert-small-books-6k"]


@pytest.mark.parametrize(("card", "study_file", "repo_id"), CARDS, ids=[c.parent.name for c, _, _ in CARDS])
def test_a_checked_in_card_is_what_its_study_file_gives(card, study_file, repo_id, monkeypatch):
    monkeypatch.chdir(ROOT)  # the card names its study file relative to the checkout
    assert differences(card.read_text(encoding="utf-8"), card_from(study_file.relative_to(ROOT), repo_id)) == []


def test_a_number_changed_in_the_card_or_the_file_is_found(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    expected = card_from(STUDY_FILE.relative_to(ROOT))
    edited = expected.replace("| 83.49 ± 0.40 |", "| 83.94 ± 0.40 |")
    found = differences(edited, expected)
    assert edited != expected and len(found) == 1 and "83.94" in found[0] and "83.49" in found[0]
    # the other way: a study file re-recorded with another score gives another card, and --check says so
    results = json.loads(STUDY_FILE.read_text())
    results["study"]["pretraining"]["rows"][0]["cells"]["sst2"]["ours"] = 84.0
    changed = tmp_path / "study.json"
    changed.write_text(json.dumps(results))
    found = differences(expected, card_from(changed))
    assert any("83.49 ± 0.40" in line and "84.00 ± 0.40" in line for line in found), found
    assert main([str(changed), REPO_ID, "--output", str(CARD), "--check"]) == 1
    assert main([str(STUDY_FILE.relative_to(ROOT)), REPO_ID, "--output", str(CARD), "--check"]) == 0
    with pytest.raises(SystemExit) as exited:  # a file that is not there: one line, exit 2
        main([str(tmp_path / "missing.json"), REPO_ID, "--output", str(tmp_path / "card.md")])
    assert exited.value.code == 2


def test_each_score_names_its_split_and_seeds_beside_the_baselines_budget_and_limits():
    text = CARD.read_text(encoding="utf-8")
    metadata = yaml.safe_load(text.split("---\n")[1])
    results = [r for m in metadata["model-index"] for r in m["results"]]
    assert len(results) == 4  # MLM, NSP, SST-2, MRPC (accuracy and F1)
    for result in results:
        split = result["dataset"]["split"]
        assert split in ("validation", "held-out")
        for metric in result["metrics"]:
            assert ("dev, mean of 3 seeds" if split == "validation" else "held-out, one evaluation") in metric["name"]
    study = json.loads(STUDY_FILE.read_text())["study"]["pretraining"]
    header = next(line for line in text.splitlines() if line.startswith("| Task | Metric (split)"))
    assert "This model, 3 fine-tuning seeds" in header and "Random initialisation, 3 fine-tuning seeds" in header
    assert "Majority class" in header
    rows = [line for line in text.splitlines() if line.startswith("| GLUE ")]
    assert len(rows) == len(study["columns"]) and all("(dev)" in row for row in rows)
    for row, key in zip(rows, ("sst2", "mrpc", "mrpc_f1")):
        cells = [c.strip() for c in row.split("|")[1:-1]]
        assert cells[5] == f"{study['majority_baseline'][key]:.2f}"
        assert cells[3].startswith(f"{study['rows'][1]['cells'][key]['ours']:.2f} ± ")
    assert "6,000 optimizer steps of 256 sequences" in text and "about 179 million tokens" in text
    assert "pre-training 2.9 min" in text and "A budget model: not a substitute for BERT-Small" in text
    assert "name: books, held-out documents" in text


@pytest.mark.parametrize(
    "said",
    [
        # what the model is for, and how little it saw
        "Intended use: a small pre-trained encoder to fine-tune",
        "It saw 0.6% of the paper's pre-training sequences",
        "it does not generate text",
        # the versions the study file recorded, bert_repro by its commit
        "### Framework versions - Transformers 5.17.0 - Pytorch 2.11.0 - Datasets 5.2.0 - Tokenizers 0.23.2 - "
        "bert_repro commit 529bdf5f977a ##",
        # the corpus as the study named it (not its internal corpus.parquet), with its manifest
        "Corpus: `.travel/books/corpus.parquet`, built by benchmarks/corpus/travel.sh",
        "`.travel/books/manifest.json` lists its source files",
        "number of documents: not recorded in the study file",
    ],
)
def test_the_card_says(said):
    text = " ".join(CARD.read_text(encoding="utf-8").split())
    assert said in text
    assert "corpus.parquet," not in text and "type: corpus.parquet" not in text
