"""What a pre-training run reports: log tables, warnings when it repeats its data more than the paper did, curves."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...atomic import atomic_path
from ...model.configuration_bert_repro import PreTrainingObjective

if TYPE_CHECKING:
    from ...data.pretraining_examples import PreTrainingDataConfig

logger = logging.getLogger(__name__)


def log_table(title: str, values: dict[str, Any]) -> None:
    width = max(len(k) for k in values)
    lines = [f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}" for k, v in values.items()]
    logger.info("%s\n%s", title, "\n".join(lines))


# The paper's repetition: 40 epochs over its text, built with dupe_factor 10 (the reference code's default), so each
# statically masked example is seen about 4 times (section A.2, create_pretraining_data.py).
PAPER_TEXT_PASSES, PAPER_EXAMPLE_REPEATS = 40, 4


def repetition_warnings(
    statistics: dict[str, dict], steps: list[int], global_batch_size: int, phase_cfgs: list[PreTrainingDataConfig]
) -> list[str]:
    """What a run repeats more than the paper does, per phase: the same masked examples (static masks), or its text.
    A small corpus trained for many steps is memorised (docs/studies.md, "Where this size spends its budget")."""
    warnings = []
    for i, (n, cfg) in enumerate(zip(steps, phase_cfgs)):
        examples = statistics.get(f"phase{i + 1}", {}).get("examples")
        if not examples or not n:
            continue
        showings = n * global_batch_size / examples  # how often each built example is drawn
        text_passes = showings * cfg.dupe_factor
        if cfg.stores_masks and showings > PAPER_EXAMPLE_REPEATS:
            warnings.append(
                f"phase{i + 1}: {n:,} steps of {global_batch_size} show each of its {examples:,} examples "
                f"{showings:.1f} times with the same masks (the paper: about {PAPER_EXAMPLE_REPEATS}); the model will "
                "learn them by heart. Give it more text (--corpus), more maskings (--dupe_factor) or fresh masks per "
                "batch (--static_masking false)."
            )
        elif text_passes > PAPER_TEXT_PASSES:
            warnings.append(
                f"phase{i + 1}: {n:,} steps of {global_batch_size} pass over its text about {text_passes:.0f} times "
                f"(the paper: {PAPER_TEXT_PASSES}); on this little text the model will learn it by heart. Give it "
                "more text (--corpus) or fewer steps."
            )
    return warnings


# Fewer held-out examples than this score NSP too coarsely to compare runs (50: one example is 2 points).
FEW_HELD_OUT_EXAMPLES = 50


def held_out_warning(statistics: dict[str, dict]) -> str | None:
    examples = statistics.get("held_out", {}).get("examples")
    if examples is None or examples >= FEW_HELD_OUT_EXAMPLES:
        return None
    return (
        f"the held-out split holds {examples} examples: each is {100 / max(1, examples):.0f} points of held-out NSP "
        "accuracy. Hold out more documents (--eval_fraction) or give more text (--corpus)."
    )


def log_statistics(statistics: dict[str, dict]) -> None:
    for name, stats in statistics.items():
        log_table(f"pre-training data, {name}", {k: v for k, v in stats.items() if not isinstance(v, (dict, list))})


def plot_curves(log_history: list[dict], path: Path, objective: PreTrainingObjective) -> None:
    """Training and held-out curves of the pre-training metrics, one panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = objective.token_task
    panels = [f"{task}_loss", "nsp_loss", f"{task}_accuracy", "nsp_accuracy"]
    if not objective.next_sentence:
        panels = [f"{task}_loss", f"{task}_accuracy"]
    fig, axes = plt.subplots(len(panels) // 2, 2, figsize=(10, 3.5 * (len(panels) // 2)), squeeze=False)
    for ax, key in zip(axes.flat, panels):
        for prefix, style in (("", "-"), ("eval_", "o-")):
            points = [(e["step"], e[prefix + key]) for e in log_history if prefix + key in e]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, style, label="held-out" if prefix else "training", markersize=3)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as temporary:
        fig.savefig(temporary, dpi=110, format=Path(path).suffix[1:] or None)
    plt.close(fig)
