"""Fine-tuning as a recipe (`recipe`) and its run (`run`)."""

from .recipe import FineTuningRecipe
from .run import run_finetuning

__all__ = ["FineTuningRecipe", "run_finetuning"]
