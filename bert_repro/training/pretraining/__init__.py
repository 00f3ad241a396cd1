"""Pre-training as a recipe, a plan and four stages, one module each, in the order a run goes through them:

- `recipe`: `PreTrainingRecipe`, every setting by section, read at the edge and checked in one place;
- `plan`: `plan(recipe)`, what the run does with it, resolved once;
- `examples` (stage 1): corpus, tokenizer and examples, built ahead or streamed (`phases`: the two phases' sampler
  and collator);
- `model` (stage 2): the model and its config;
- `trainer` (stage 3): `PreTrainingTrainer`, the losses over the global batch and their metrics; `resume`:
  stopping, resuming and the run's clock;
- `records` (stage 4): the log's tables, warnings and curves;
- `run`: `run_pretraining(recipe)`, the stages in order.
"""

from .recipe import Phase, PreTrainingRecipe
from .run import run_pretraining

__all__ = ["Phase", "PreTrainingRecipe", "run_pretraining"]
