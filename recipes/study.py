"""Run one of the paper's section-5 experiments: pre-train each variant, fine-tune it, a table beside the paper's.

    python recipes/study.py --study table5 --data_root path/to/glue --tasks mrpc sst2 \
        --pretrain_config recipes/configs/quickstart.yaml --pretrain_args "--preset mini --max_steps 2000" \
        --finetune_args "--learning_rates 5e-5" --output_dir runs/table5

Studies: table5 (pre-training tasks: MLM + NSP, No NSP, LTR & No NSP, + BiLSTM), table6 (model size), table7
(feature-based NER), table8 (masking mixes), pretraining (pre-trained against randomly initialised). Writes
study.md, study.json and study.png into --output_dir after every finished run; run the same command again to
continue an interrupted study (finished runs are kept, an interrupted one resumes from its checkpoint).
"""

import sys

from bert_repro.training.cli import parse_with_config, quiet_load_reports
from bert_repro.training.finetuning.run import USER_ERRORS
from bert_repro.training.lifecycle import main
from bert_repro.training.studies import StudyArguments, StudyError, run_study
from bert_repro.training.studies.arguments import STUDY_HELP

if __name__ == "__main__":
    quiet_load_reports()
    args = None

    def study():
        global args
        (args,) = parse_with_config((StudyArguments,), {}, None, "recipes/study.py", help_layout=STUDY_HELP)
        return run_study(args)

    try:  # a problem with what the user passed: one line, exit 2
        main("study.py", study, USER_ERRORS, lambda: args and (args.output_dir or f"runs/{args.study}"))
    except StudyError as err:  # runs that failed on their own (their logs say why); the table has the others
        print(f"study.py: {err}", file=sys.stderr)
        sys.exit(1)
