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

import sys

from bert_repro.training.checkpoints import interrupted
from bert_repro.training.cli import quiet_load_reports
from bert_repro.training.cluster import STOPPED_EXIT_CODE
from bert_repro.training.distributed import end_processes
from bert_repro.training.finetune import USER_ERRORS, run_finetuning
from bert_repro.training.finetune_recipe import FineTuningRecipe
from bert_repro.training.lifecycle import RunFinished

if __name__ == "__main__":
    quiet_load_reports()
    recipe = None
    try:
        recipe = FineTuningRecipe.from_args()
        result = run_finetuning(recipe)
        end_processes()  # all processes leave together (a distributed launch)
        if "stopped_by" in result:  # SIGTERM / SIGUSR1: a checkpoint was saved, the same command goes on
            sys.exit(STOPPED_EXIT_CODE)
    except KeyboardInterrupt:  # Ctrl-C: where the newest checkpoint is, and how to go on, instead of a traceback
        sys.exit(interrupted("finetune.py", recipe and recipe.training.output_dir))
    except RunFinished as done:  # a requeued job: the run is complete, and nothing in it is touched
        done.say("finetune.py")
        sys.exit(0)
    except USER_ERRORS as err:
        print(f"finetune.py: error: {err}", file=sys.stderr)
        sys.exit(2)
