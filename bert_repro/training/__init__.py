"""The training stage, after the tasks: `pretraining/`, `finetuning/` and the paper's experiments (`studies/`),
each a recipe and its steps, with the life every run shares (`lifecycle`). A run is a recipe and one call:

    from bert_repro.training import PreTrainingRecipe, run_pretraining
    run_pretraining(PreTrainingRecipe.from_yaml("recipes/configs/quickstart.yaml").replace(max_steps=500))
"""

from ..exports import lazy_exports

# Read on first use (PEP 562): importing `cli` does not build the whole training stack.
_PUBLIC = {
    "Phase": "pretraining",
    "PhaseCollator": "pretraining.phases",
    "convert_to_fp8": "fp8",
    "FINE_TUNING_DEFAULTS": "finetuning.recipe",
    "data_source": "finetuning.recipe",
    "PreTrainingRecipe": "pretraining",
    "run_pretraining": "pretraining",
    "FineTuningRecipe": "finetuning",
    "run_finetuning": "finetuning",
    "ReproduceArguments": "studies",
    "run_reproduce": "studies",
    "StudyArguments": "studies",
    "run_study": "studies",
}
__all__ = sorted(_PUBLIC)
__getattr__ = lazy_exports(__name__, _PUBLIC)
