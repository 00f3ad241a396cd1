"""Pre-train BERT from raw text: corpus -> WordPiece vocabulary -> NSP/MLM examples -> Trainer -> checkpoint.

    python recipes/pretrain.py --config recipes/configs/quickstart.yaml [--field value ...]

Every field of the YAML file can be overridden on the command line (`--max_steps 500`); `--help` lists them all.
One CPU, several GPUs or several nodes: choose with `accelerate config` or `accelerate launch --config_file
recipes/accelerate/<ddp|fsdp|deepspeed_zero2>.yaml`; the script does not change.
"""

from bert_repro.data.corpus import CorpusError
from bert_repro.hub.push import HubPushError
from bert_repro.model.conversion import CheckpointError
from bert_repro.training.cli import ConfigurationError, quiet_load_reports
from bert_repro.training.lifecycle import main
from bert_repro.training.pretraining import PreTrainingRecipe, run_pretraining

if __name__ == "__main__":
    quiet_load_reports()
    recipe = None

    def pretrain():
        global recipe
        recipe = PreTrainingRecipe.from_args()
        return run_pretraining(recipe)

    # A problem the user can fix (what they passed, a token, the network): one line, no traceback.
    errors = (ConfigurationError, CheckpointError, CorpusError, HubPushError, FileExistsError, FileNotFoundError)
    main("pretrain.py", pretrain, errors, lambda: recipe and recipe.training.output_dir)
