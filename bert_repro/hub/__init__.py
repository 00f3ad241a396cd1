"""Stage 5, publishing: pushes to the Hugging Face Hub (`push`) and model cards (`model_card`: which card a run
directory gets; `pretrained_card`, `finetuned_card`, `study_card`, with `card_common` and `study_comparison`).

`python -m bert_repro.hub RUN_DIR --repo_id ID` pushes a run directory."""
