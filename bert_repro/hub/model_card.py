"""Model cards for what the recipes write: a pre-trained checkpoint or a fine-tuned one, ready for the Hub.

The card of a run is built from the files the run left in its output directory, never from memory or the
environment:

- pre-training (`bert_repro.training.pretrain`): `run_config.json` (every setting), `data_statistics.json`,
  `results.json`, `config.json`, and `training_curves.png` when present;
- fine-tuning (`bert_repro.training.finetune`): `results.json` (the grid, every run, the best one), `run_config.json`
  and the best model's `config.json`;
- optionally, for a pre-trained checkpoint, a benchmark directory of `bert_repro.training.reproduce` (`report.json`)
  and a study directory of `bert_repro.training.study` (`study.json`: the checkpoint fine-tuned against the same
  architecture randomly initialised).

Metadata go through huggingface_hub's `ModelCardData` / `EvalResult`, which write the `model-index` block the
Hub reads. The body is a Jinja template in `bert_repro/hub/model_cards/` (`pretrained.md`, `finetuned.md` and the
`_*.md` parts they include). Templates are rendered with our own Jinja environment rather than
`ModelCard.from_template`, for two reasons: the two cards share parts (`{% include %}` needs a loader, which
`from_template` does not give), and a misspelt variable must fail (`StrictUndefined`) instead of leaving a
blank. The contract is the one of `from_template`: the template receives `card_data` (the YAML block) and the
metadata fields, and the result is parsed by `ModelCard`.

Conventions of the cards:
- every score is in percent (our task metrics are fractions except SQuAD's, which are percent already, as in
  `bert_repro.training.reproduce.percent`), the paper's numbers as printed;
- GLUE numbers of the paper are TEST-server scores, ours are dev scores: the cards say so beside the table;
- a value the run did not record is written "not recorded", never "None";
- nothing from the environment goes in: settings that name where outputs, logs or trackers went are left out,
  local paths are reduced to their last component (the corpus's relative paths excepted: they name it as the run
  was given it), token-like fields are dropped, and a card that still contains the value of a secret environment
  variable is refused. Two looks outside the run's files: whether the corpus's folder holds a README.md or
  a manifest, which the card then names, and the framework versions installed now, for those the run did not
  record (labelled so).

Where the parts live: `card_common` (the metadata block, the rendering, how numbers, names and settings are written,
the architecture table, the secrets check), `pretrained_card` (`card_for_pretraining`), `finetuned_card`
(`card_for_finetuning`) and `study_comparison` (a study's fine-tuning table, on a pre-trained card and on a study's
own card, `study_card`), all in `bert_repro.hub`. This module picks the card a run directory needs
(`card_for_directory`) and writes it.

`python -m bert_repro.hub.model_card RUN_DIR REPO_ID` writes the card as `README.md` beside the weights, where
`python -m bert_repro.hub` publishes it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard

from ..atomic import write_text

# re-exported: this module is the cards' entry point (the parts of the cards live in the modules its docstring
# names); push.py imports `check_no_secrets` from here and the tests read `TEMPLATE_PACKAGE_DIR` here. `__all__`
# below lists its public names, wherever they are defined.
from .card_common import TEMPLATE_PACKAGE_DIR as TEMPLATE_PACKAGE_DIR
from .card_common import CardError, check_no_secrets, is_hub_id, parameter_count, read_json
from .finetuned_card import card_for_finetuning
from .pretrained_card import card_for_pretraining

# ------------------------------------------------------------------------------------------------------------
# Any run directory
# ------------------------------------------------------------------------------------------------------------


def _is_finetuning(path: Path) -> bool:
    """Whether ``path`` is a fine-tuning output directory (results.json with the task and the best run)."""
    summary = read_json(path / "results.json")
    return isinstance(summary, dict) and "task" in summary and "best" in summary


def run_kind(path: str | Path) -> str:
    """ "pretraining" or "finetuning", from the files in ``path``."""
    path = Path(path)
    if _is_finetuning(path):
        return "finetuning"
    record = read_json(path / "run_config.json")
    if isinstance(record, dict) and "data" in record and (path / "config.json").is_file():
        return "pretraining"
    raise CardError(
        f"{path} holds neither a pre-training run (run_config.json with a data section, config.json) nor a "
        "fine-tuning run (results.json with task and best)."
    )


def card_for_directory(path: str | Path, repo_id: str, **kwargs: Any) -> ModelCard:
    """The card of whatever run ``path`` holds (see `run_kind`); keyword arguments go to the card function."""
    path = Path(path)
    if _is_finetuning(path):
        return card_for_finetuning(path, repo_id, **kwargs)
    run_kind(path)  # a clear error for a directory that holds no run
    return card_for_pretraining(path, repo_id, **kwargs)


def card_path(path: str | Path) -> Path:
    """Where a run's card belongs: beside the weights that get uploaded."""
    return Path(path) / "README.md"


def main(argv: Iterable[str] | None = None) -> Path:
    """`python -m bert_repro.hub.model_card RUN_DIR REPO_ID`: write the run's card, return its path."""
    parser = argparse.ArgumentParser(
        prog="python -m bert_repro.hub.model_card", description="Write the model card (README.md) of a bert_repro run."
    )
    parser.add_argument("run_dir", help="a pre-training or fine-tuning output directory")
    parser.add_argument("repo_id", help="the Hub repository the model will be published as (owner/name)")
    parser.add_argument("--base_model", default=None, help="Hub id of the checkpoint this one started from")
    parser.add_argument(
        "--benchmark", default=None, help="pre-training: a recipes/reproduce.py output directory for this checkpoint"
    )
    parser.add_argument(
        "--output", default=None, help="where to write the card (default: README.md beside the weights)"
    )
    parser.add_argument(
        "--study",
        default=None,
        help="pre-training: a recipes/study.py output directory (study.json) of this checkpoint",
    )
    args = parser.parse_args(None if argv is None else list(argv))
    kwargs: dict[str, Any] = {"base_model": args.base_model}
    for flag, key in (("benchmark", "benchmark_dir"), ("study", "study_dir")):
        if getattr(args, flag):
            if run_kind(args.run_dir) != "pretraining":
                parser.error(f"--{flag} goes with a pre-training directory")
            kwargs[key] = getattr(args, flag)
    card = card_for_directory(args.run_dir, args.repo_id, **kwargs)
    output = Path(args.output) if args.output else card_path(args.run_dir)
    write_text(output, str(card))  # what ModelCard.save writes, whole or not at all
    print(f"wrote {output}")
    return output


__all__ = [
    "CardError",
    "card_for_directory",
    "card_for_finetuning",
    "card_for_pretraining",
    "card_path",
    "check_no_secrets",
    "is_hub_id",
    "parameter_count",
    "run_kind",
]


if __name__ == "__main__":
    main()
