"""Stage 5, publishing: pushes to the Hugging Face Hub (`push`, `python -m bert_repro.hub RUN_DIR --repo_id ID`) and
model cards (`model_card` picks a run directory's: `pretrained_card`, `finetuned_card`; and `study_card`)."""
