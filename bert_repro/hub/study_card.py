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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard

from ..data.travel_corpus import CORPUS_FILE, MANIFEST_FILE
from ..model.configuration_bert_repro import PRESETS, PRETRAINING_OBJECTIVES
from . import card_common as card
from .pretrained_card import PAPER_BATCH, PAPER_STEPS, _corpus_name, _shown_path
from .study_comparison import _is_random_init, _study_verdict, fine_tuning_comparison, finetune_args_for


def _flag(args: list[str], name: str) -> str | None:
    """The value of ``--name`` in an argument list (the last one wins, as the recipes parse it)."""
    value = None
    for i, arg in enumerate(args[:-1]):
        if arg == f"--{name}":
            value = args[i + 1]
    return value


def _minutes(seconds: Any) -> str:
    return f"{seconds / 60:.1f}" if isinstance(seconds, (int, float)) else "not recorded"


def _study_of(results: Mapping[str, Any], path: Path) -> tuple[str, dict[str, Any]]:
    studies = results.get("study") or {}
    name = next((n for n, s in studies.items() if any(not _is_random_init(r) for r in s.get("rows") or [])), None)
    if name is None:
        raise card.CardError(
            f"{path}: no study with a pre-trained row (the file of `benchmarks/gpu/gpu_session.py record` is expected)."
        )
    return name, studies[name]


def _budget(results: Mapping[str, Any], study: Mapping[str, Any], name: str, row: Mapping[str, Any]) -> dict:
    """Steps, sequences, tokens and minutes, each from the file."""
    args = shlex.split(study.get("pretrain_args") or "")
    pretraining = row.get("pretraining") or {}
    run = results.get(f"study_{name}") or {}
    steps = pretraining.get("global_step")
    batch = _flag(args, "global_batch_size")
    sequences = steps * int(batch) if steps and batch else None
    seconds = run.get("train_runtime_s") or pretraining.get("train_runtime_s")
    rate = pretraining.get("tokens_per_second")
    tokens = rate * seconds if rate and seconds else None
    step_seconds = next(
        (s.get("seconds") for s in results.get("steps") or [] if s.get("name") == f"study_{name}"), None
    )
    return {
        "steps": f"{steps:,}",
        "batch": batch,
        "sequences": f"{sequences:,}" if sequences else "not recorded",
        "paper_share": f"{100 * sequences / (PAPER_STEPS * PAPER_BATCH):.2g}%" if sequences else "not recorded",
        "tokens_millions": f"{tokens / 1e6:.0f}" if tokens else "not recorded",
        "tokens_per_second": f"{rate:,.0f}" if rate else "not recorded",
        "pretraining_seconds": f"{seconds:.1f}" if seconds else "not recorded",
        "pretraining_minutes": _minutes(seconds),
        "finetuning_minutes": _minutes((study.get("run_seconds") or {}).get("finetuning")),
        "step_minutes": _minutes(step_seconds),
        "learning_rate": _flag(args, "learning_rate"),
        "warmup": _flag(args, "warmup_steps"),
    }


def _held_out(run: Mapping[str, Any]) -> list[dict[str, str]]:
    last = run.get("last_eval") or {}
    rows = []
    for key, label, scale, digits in (
        ("eval_mlm_accuracy", "MLM accuracy (%)", 100, 2),
        ("eval_nsp_accuracy", "NSP accuracy (%)", 100, 2),
        ("eval_mlm_loss", "MLM loss", 1, 4),
        ("eval_nsp_loss", "NSP loss", 1, 4),
    ):
        if isinstance(last.get(key), (int, float)):
            rows.append({"metric": label, "value": f"{scale * last[key]:.{digits}f}"})
    return rows


def _result_name(label: str, split: str, finished: int) -> str:
    return f"{label}, fine-tuned, {split}, mean of {card.plural(finished, 'seed')}"


def card_from_study_file(path: str | Path, repo_id: str, template_dir: str | Path | None = None) -> ModelCard:
    """The card of the pre-trained model of the study recorded in ``path``, rendered with `model_cards/study.md`."""
    path = Path(path)
    results = card.read_json(path)
    if results is None:
        raise card.CardError(f"{path}: no such file.")
    name, study = _study_of(results, path)
    row = next(r for r in study["rows"] if not _is_random_init(r))
    args = shlex.split(study.get("pretrain_args") or "")
    preset = _flag(args, "preset") or "base"
    objective = PRETRAINING_OBJECTIVES[_flag(args, "objective") or "mlm_nsp"]
    size = PRESETS[preset]
    eval_results, table = fine_tuning_comparison(study, row, _result_name)
    held_out = _held_out(results.get(f"study_{name}") or {})
    corpus = _flag(args, "corpus")
    commit = (results.get("commit") or "")[:12]
    recorded = {**(results.get("versions") or {}), "bert_repro": f"commit {commit}" if commit else None}
    corpus_name = _corpus_name(corpus) if corpus else "corpus"
    pretraining = row.get("pretraining") or {}
    held_out_results = [
        card.held_out_result(key, pretraining[f"eval_{key}"], corpus_name, corpus_name, ", held-out, one evaluation")
        for key in card.HELD_OUT_TASKS
        if isinstance(pretraining.get(f"eval_{key}"), (int, float))
    ]
    card_data = card.metadata(repo_id=repo_id, pipeline_tag="fill-mask", eval_results=held_out_results + eval_results)
    context = {
        "source_file": path.as_posix(),
        "device": results.get("device") or "not recorded",
        "date": results.get("date") or "not recorded",
        "commit": commit or "not recorded",
        "preset": preset,
        "preset_name": card.preset_name(preset),
        "size": size,
        "objective": ("masked language modelling" if objective.masked_lm else "left-to-right language modelling")
        + (" + next sentence prediction" if objective.next_sentence else ""),
        "corpus": _shown_path(corpus) if corpus else "not recorded",
        # a corpus file of bert_repro.data.travel_corpus has its manifest beside it (the file is all the card reads)
        "corpus_manifest": f"{_shown_path(str(Path(corpus).parent))}/{MANIFEST_FILE}"
        if corpus and Path(corpus).name == CORPUS_FILE
        else None,
        "pretrain_config": study.get("pretrain_config"),
        "pretrain_args": " ".join(args),
        "finetune_args": " ".join(shlex.split(study.get("finetune_args") or "")) or "the defaults",
        "finetune_args_for": finetune_args_for(study, str),
        "seeds": ", ".join(str(s) for s in study.get("seeds") or []),
        "n_seeds": card.plural(len(study.get("seeds") or []) or 1, "fine-tuning seed"),
        "budget": _budget(results, study, name, row),
        "held_out": held_out,
        # as the GPU call recorded them; bert_repro by the commit it ran
        "versions": card.framework_lines(recorded),
        "rows": table,
        "verdict": _study_verdict(table) if study.get("seeds") else None,
        "usage": card.usage(repo_id),
    }
    return card.render_card("study.md", card_data, context, template_dir)


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
        text = str(card_from_study_file(args.results, args.repo_id))
    except card.CardError as err:
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
