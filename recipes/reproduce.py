"""Run the paper's benchmark for one checkpoint and write one report beside the paper's numbers.

    python recipes/reproduce.py --model runs/base --data_root path/to/glue_data --output_dir runs/reproduce \
        [--tasks mrpc rte ...] [-- --seeds 1 2 3 --learning_rates 2e-5 ...]

Arguments after `--` go to every task's fine-tuning (`recipes/finetune.py --help`). Tasks that finished are not run
again: run the same command to resume an interrupted benchmark.
"""

import sys

from bert_repro.training.cli import parse_with_config, quiet_load_reports
from bert_repro.training.finetuning.run import USER_ERRORS
from bert_repro.training.lifecycle import main
from bert_repro.training.studies import ReproduceArguments, run_reproduce
from bert_repro.training.studies.arguments import REPRODUCE_HELP

if __name__ == "__main__":
    quiet_load_reports()
    argv = sys.argv[1:]
    finetune_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    args = None

    def reproduce():
        global args
        (args,) = parse_with_config((ReproduceArguments,), {}, own, "recipes/reproduce.py", help_layout=REPRODUCE_HELP)
        return run_reproduce(args, finetune_args)

    main("reproduce.py", reproduce, USER_ERRORS, lambda: args and args.output_dir)
