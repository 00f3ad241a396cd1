"""Fine-tuning as a recipe (`recipe`) checked before any work (`checks`), then its steps: one run of the grid
(`trainer`: the task's rows encoded, the model with the task's head, training, the task's own evaluation) and the
grid with its records, card and push (`run`, which runs the steps in order)."""

from .recipe import FineTuningRecipe
from .run import run_finetuning

__all__ = ["FineTuningRecipe", "run_finetuning"]
