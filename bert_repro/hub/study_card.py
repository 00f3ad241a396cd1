"""The card of a model published from a study, written from the study's recorded results file alone.

The run's own directory does not come back from the GPU machine, so the card says only what
`benchmarks/gpu/gpu_session.py record` kept in `benchmarks/results/<date>-<device>-study*.json` (the study's table,
`study.<name>`, and its model's pre-training, `study_<name>`). `--check` fails where a card differs from its file
(tests/hub/test_study_card.py runs it on every checked-in card).

    python -m bert_repro.hub.study_card benchmarks/results/2026-11-26-nvidia-h200-study-2.json \\
        bert-repro/bert-small-books-6k --output model_cards/bert-small-books-6k/README.md [--check]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from huggingface_hub import ModelCardData

from ..data.travel_corpus import CORPUS_FILE, MANIFEST_FILE
from ..model.configuration_bert_repro import PRESETS, PRETRAINING_OBJECTIVES
from ..training.cli import values_of
from . import card_base as base
from .pretrained_card import PAPER_BATCH, PAPER_STEPS, _corpus_name, _shown_path
from .secrets import CardError
from .study_comparison import StudyComparison, is_random_init


def _flag(args: list[str], name: str) -> str | None:
    """The value of ``--name`` in an argument list (the last one wins, as the recipes parse it)."""
    return (values_of(args, name) or [None])[-1]


@dataclass
class StudyFacts(base.CardFacts):
    """What the card of a study's pre-trained model states, all from the study's results file: the template reads
    ``results`` (the file), ``study`` (its study) and ``pretraining`` (its model's pre-training as the study recorded
    it); the other fields are what the card derives from them."""

    template: ClassVar[str] = "study.md"
    repo_id: str
    source_file: str
    results: dict[str, Any]
    study: dict[str, Any]
    pretraining: dict[str, Any]
    comparison: StudyComparison
    pretrain_args: list[str]
    preset: str
    preset_name: str
    size: dict[str, int]  # L, H, A and the feed-forward size of the preset
    objective: str
    corpus: str  # as --corpus gave it
    corpus_name: str  # for the model-index
    corpus_manifest: str | None  # what `bert_repro.data.travel_corpus` writes beside its corpus file
    batch: str | None
    learning_rate: str | None
    warmup: str | None  # steps
    sequences: int | None
    paper_share: str  # of the paper's pre-training sequences
    tokens: float | None  # tokens/s x seconds
    seconds: float | None  # of pre-training
    step_seconds: float | None  # of the call's whole study step
    commit: str
    last_eval: dict[str, Any]  # the one held-out evaluation, at the end of pre-training
    versions: list[str]
    usage: base.Usage

    @classmethod
    def from_study_file(cls, path: str | Path, repo_id: str) -> StudyFacts:
        """The facts of the pre-trained model of the study recorded in ``path``."""
        path = Path(path)
        results = base.read_json(path)
        if results is None:
            raise CardError(f"{path}: no such file.")
        studies = results.get("study") or {}
        name = next((n for n, s in studies.items() if any(not is_random_init(r) for r in s.get("rows") or [])), None)
        if name is None:
            raise CardError(
                f"{path}: no study with a pre-trained row (the file of `benchmarks/gpu/gpu_session.py record` is "
                "expected)."
            )
        study, run = studies[name], results.get(f"study_{name}") or {}
        row = next(r for r in study["rows"] if not is_random_init(r))
        args = shlex.split(study.get("pretrain_args") or "")
        pretraining = row.get("pretraining") or {}
        steps, batch = pretraining.get("global_step"), _flag(args, "global_batch_size")
        sequences = steps * int(batch) if steps and batch else None
        seconds = run.get("train_runtime_s") or pretraining.get("train_runtime_s")
        rate = pretraining.get("tokens_per_second")
        preset = _flag(args, "preset") or "base"
        objective = PRETRAINING_OBJECTIVES[_flag(args, "objective") or "mlm_nsp"]
        corpus = _flag(args, "corpus")
        commit = (results.get("commit") or "")[:12]
        return cls(
            repo_id=repo_id,
            source_file=path.as_posix(),
            results=results,
            study=study,
            pretraining=pretraining,
            comparison=StudyComparison.of(study, row, split_in_names=True),
            pretrain_args=args,
            preset=preset,
            preset_name=base.preset_name(preset),
            size=PRESETS[preset],
            objective=("masked language modelling" if objective.masked_lm else "left-to-right language modelling")
            + (" + next sentence prediction" if objective.next_sentence else ""),
            corpus=_shown_path(corpus) if corpus else "not recorded",
            corpus_name=_corpus_name(corpus) if corpus else "corpus",
            corpus_manifest=f"{_shown_path(str(Path(corpus).parent))}/{MANIFEST_FILE}"
            if corpus and Path(corpus).name == CORPUS_FILE
            else None,
            batch=batch,
            learning_rate=_flag(args, "learning_rate"),
            warmup=_flag(args, "warmup_steps"),
            sequences=sequences,
            paper_share=f"{100 * sequences / (PAPER_STEPS * PAPER_BATCH):.2g}%" if sequences else "not recorded",
            tokens=rate * seconds if rate and seconds else None,
            seconds=seconds,
            step_seconds=next(
                (s.get("seconds") for s in results.get("steps") or [] if s.get("name") == f"study_{name}"), None
            ),
            commit=commit or "not recorded",
            last_eval=run.get("last_eval") or {},
            # as the GPU call recorded them; bert_repro by the commit it ran
            versions=base.framework_lines(
                {**(results.get("versions") or {}), "bert_repro": f"commit {commit}" if commit else None}
            ),
            usage=base.Usage.of(repo_id),
        )

    def card_data(self) -> ModelCardData:
        held_out = base.held_out_results(
            self.pretraining, self.corpus_name, self.corpus_name, ", held-out, one evaluation"
        )
        return base.metadata(
            repo_id=self.repo_id, pipeline_tag="fill-mask", eval_results=held_out + self.comparison.eval_results
        )


def differences(text: str, expected: str) -> list[str]:
    """The lines of ``text`` that differ from ``expected``'s at the same place (a hand edit, or an older study file)."""
    have, want = text.splitlines(), expected.splitlines()
    out = [f"line {i + 1}: {a!r} (the study file gives {b!r})" for i, (a, b) in enumerate(zip(have, want)) if a != b]
    if len(have) != len(want):
        out.append(f"{len(have)} lines, the study file gives {len(want)}")
    return out


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.hub.study_card", description=__doc__.split("\n")[0])
    parser.add_argument("results", help="a study's results file (benchmarks/results/<date>-<device>-study*.json)")
    parser.add_argument("repo_id", help="the Hub repository the model is published as (owner/name)")
    parser.add_argument("--output", required=True, help="the card (README.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where the card differs")
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        text = str(StudyFacts.from_study_file(args.results, args.repo_id).to_model_card())
    except CardError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    output = Path(args.output)
    if args.check:
        found = differences(output.read_text(encoding="utf-8") if output.is_file() else "", text)
        for line in found:
            print(f"{output}: {line}", file=sys.stderr)
        return 1 if found else 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
