"""Model cards for what the recipes write: a pre-trained checkpoint or a fine-tuned one, ready for the Hub.

A card is built from the files the run left in its output directory. Metadata go through huggingface_hub's
`ModelCardData` / `EvalResult`; the body is a Jinja template in `card_templates/`, rendered from one facts object per
kind of card (`PreTrainedFacts`, `FineTunedFacts`, `study_card.StudyFacts`) with our own environment rather than
`ModelCard.from_template` because the cards share parts (`{% include %}` needs a loader) and a misspelt variable must
fail (`StrictUndefined`), not leave a blank.

Conventions: the tables' scores are in percent, the paper's as printed (its GLUE numbers are test-server scores, and
the cards say so); the model-index (and a fine-tuned run's `.eval_results/`) gives each metric in its own scale, as
`evaluate` does; an unrecorded value reads "not recorded"; nothing private goes in (the cards drop output,
tracker and token settings, reduce local paths, and refuse a card holding a secret: `secrets`).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..atomic import write_text

# Re-exported: this module is the cards' entry point (`__all__` below).
from .card_base import TEMPLATE_PACKAGE_DIR as TEMPLATE_PACKAGE_DIR
from .card_base import parameter_count, read_json
from .finetuned_card import FineTunedFacts, card_for_finetuning, write_eval_results
from .pretrained_card import PreTrainedFacts
from .secrets import CardError, check_no_secrets, is_hub_id

# Any run directory


def run_kind(path: str | Path) -> str:
    """ "pretraining" or "finetuning", from the files in ``path``."""
    path = Path(path)
    if not path.is_dir():
        raise CardError(f"{path}: no such directory.")
    summary = read_json(path / "results.json")
    if isinstance(summary, dict) and "task" in summary and "best" in summary:
        return "finetuning"
    record = read_json(path / "run_config.json")
    if isinstance(record, dict) and "data" in record and (path / "config.json").is_file():
        return "pretraining"
    raise CardError(
        f"{path} holds neither a pre-training run (run_config.json with a data section, config.json) nor a "
        "fine-tuning run (results.json with task and best)."
    )


def card_for_directory(path: str | Path, repo_id: str, **kwargs: Any) -> ModelCard:
    """The card of whatever run ``path`` holds (see `run_kind`); keyword arguments go to its facts' `from_run`."""
    if run_kind(path) == "finetuning":
        return card_for_finetuning(path, repo_id, **kwargs)
    return PreTrainedFacts.from_run(path, repo_id, **kwargs).to_model_card()


def card_path(path: str | Path) -> Path:
    """Where a run's card belongs: beside the weights that get uploaded."""
    return Path(path) / "README.md"


def main(argv: Iterable[str] | None = None) -> Path:
    """`python -m bert_repro.hub.model_card RUN_DIR REPO_ID`: write the run's card (and a fine-tuned run's
    `.eval_results/`) and return its path; bad input is one line and exit code 2."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_repro.hub.model_card", description="Write the model card (README.md) of a bert_repro run."
    )
    parser.add_argument("run_dir", help="a pre-training or fine-tuning output directory")
    parser.add_argument("repo_id", help="the Hub repository the model will be published as (owner/name)")
    parser.add_argument("--base_model", help="Hub id of the checkpoint this one started from")
    parser.add_argument("--benchmark", help="pre-training: a recipes/reproduce.py output directory for this checkpoint")
    parser.add_argument(
        "--output",
        help="where to write the card (default: README.md beside the weights); a fine-tuned run's .eval_results/ "
        "goes beside it",
    )
    parser.add_argument(
        "--study", help="pre-training: a recipes/study.py output directory (study.json) of this checkpoint"
    )
    args = parser.parse_args(None if argv is None else list(argv))
    try:
        validate_repo_id(args.repo_id)
        made_by = run_kind(args.run_dir)
        kwargs: dict[str, Any] = {"base_model": args.base_model}
        for flag, key in (("benchmark", "benchmark_dir"), ("study", "study_dir")):
            if getattr(args, flag):
                if made_by != "pretraining":
                    parser.error(f"--{flag} goes with a pre-training directory")
                kwargs[key] = getattr(args, flag)
        card = card_for_directory(args.run_dir, args.repo_id, **kwargs)
        output = Path(args.output) if args.output else card_path(args.run_dir)
        output.parent.mkdir(parents=True, exist_ok=True)
        write_text(output, str(card))  # what ModelCard.save writes, whole or not at all
        if made_by == "finetuning":
            write_eval_results(output.parent, read_json(Path(args.run_dir) / "results.json"))
    except (CardError, HFValidationError, OSError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(f"wrote {output}")
    return output


__all__ = ["CardError", "FineTunedFacts", "PreTrainedFacts", "card_for_directory", "card_for_finetuning", "card_path"]
__all__ += ["check_no_secrets", "is_hub_id", "parameter_count", "run_kind"]


if __name__ == "__main__":
    main()
