"""Stage 4, training: pre-training (`pretrain` and its parts `pretrain_*`), fine-tuning (`finetune`), the paper's
benchmark in one command (`reproduce`), optimizers (`optim`) and the recipes' command line (`cli`)."""
