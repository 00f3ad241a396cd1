"""Fine-tuning as a recipe (`recipe`) checked first (`checks`), then its steps: one run of the grid (`trainer`: data,
model, training, the task's evaluation) and the grid with its records, card and push (`run` runs them in order)."""

from .recipe import FineTuningRecipe
from .run import run_finetuning

__all__ = ["FineTuningRecipe", "run_finetuning"]
