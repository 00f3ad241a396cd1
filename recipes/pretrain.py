"""Pre-train BERT from raw text: corpus -> WordPiece vocabulary -> NSP/MLM examples -> Trainer -> checkpoint.

    python recipes/pretrain.py --config recipes/configs/quickstart.yaml [--field value ...]

Every field of the YAML file can be overridden on the command line (`--max_steps 500`); `--help` lists them all.
One CPU, several GPUs or several nodes: choose with `accelerate config` or `accelerate launch --config_file
recipes/accelerate/<ddp|fsdp|deepspeed_zero2>.yaml`; the script does not change.
"""

import sys

from bert_repro.data.corpus import CorpusError
from bert_repro.hub.push import HubPushError
from bert_repro.model.conversion import CheckpointError
from bert_repro.training.checkpoints import interrupted
from bert_repro.training.cli import ConfigurationError, quiet_load_reports
from bert_repro.training.cluster import STOPPED_EXIT_CODE
from bert_repro.training.distributed import end_processes
from bert_repro.training.lifecycle import RunFinished
from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

if __name__ == "__main__":
    quiet_load_reports()
    recipe = None
    try:
        recipe = PreTrainingRecipe.from_args()
        result = run_pretraining(recipe)
        end_processes()  # all processes leave together (a distributed launch)
        if "stopped_by" in result:  # SIGTERM / SIGUSR1: a checkpoint was saved, the run goes on when resumed
            sys.exit(STOPPED_EXIT_CODE)
    except KeyboardInterrupt:  # Ctrl-C: where the newest checkpoint is, and how to go on, instead of a traceback
        sys.exit(interrupted("pretrain.py", recipe and recipe.training.output_dir))
    except RunFinished as done:  # a requeued job: the run is complete, and nothing in it is touched
        done.say("pretrain.py")
        sys.exit(0)
    except (ConfigurationError, CheckpointError, CorpusError, HubPushError, FileExistsError, FileNotFoundError) as err:
        # A problem the user can fix (what they passed, a token, the network): say it plainly, without a traceback.
        print(f"pretrain.py: error: {err}", file=sys.stderr)
        sys.exit(2)
