"""Pre-training as a recipe (`recipe`), a plan (`plan`) and four steps, one module each: data (`examples`, with
`phases`), the model (`model`), training (`trainer`, with `resume`) and records (`records`); `run` runs them in order.
"""

from .recipe import Phase, PreTrainingRecipe
from .run import run_pretraining

__all__ = ["Phase", "PreTrainingRecipe", "run_pretraining"]
