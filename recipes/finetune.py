"""Fine-tune a BERT checkpoint on one of the paper's tasks, with the paper's hyper-parameters as defaults.

    python recipes/finetune.py --task mrpc --model <bert_repro dir, BERT checkpoint or Hub id> \
        [--data path/to/MRPC] --output_dir runs/mrpc [--learning_rates 2e-5 --seeds 1 2 3 ...]

Tasks: mnli qqp qnli sst2 cola stsb mrpc rte wnli squad squad_v2 swag conll2003. Without --data the task's Hub
dataset is used; with it, the files in their original layout (GLUE TSVs, SQuAD JSON, SWAG CSV, CoNLL columns) or
HF exports (parquet, csv, tsv, json). --output_dir becomes a Trainer output directory (the best model, tokenizer,
README.md card, trainer_state.json, *_results.json; results.json, results.md; each run in runs/) with, for GLUE
tasks with a test split, the leaderboard's prediction files. Several processes or machines: the same script under
`accelerate launch --config_file recipes/accelerate/<ddp|fsdp|deepspeed_zero2>.yaml`.
"""

from bert_repro.training.cli import quiet_load_reports
from bert_repro.training.finetuning import FineTuningRecipe, run_finetuning
from bert_repro.training.finetuning.run import USER_ERRORS
from bert_repro.training.lifecycle import main

if __name__ == "__main__":
    quiet_load_reports()
    recipe = None

    def finetune():
        global recipe
        recipe = FineTuningRecipe.from_args()
        return run_finetuning(recipe)

    main("finetune.py", finetune, USER_ERRORS, lambda: recipe and recipe.training.output_dir)
