"""Pre-training as a recipe (`recipe`), a plan (`plan`) and four steps (data, model, training, records), one module each: `examples` (with `phases`),
`model`, `trainer` (with `resume`) and `records`; `run` runs them in order.
"""

from .recipe import Phase, PreTrainingRecipe
from .run import run_pretraining

__all__ = ["Phase", "PreTrainingRecipe", "run_pretraining"]
