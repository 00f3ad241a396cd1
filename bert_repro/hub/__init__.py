"""Stage 5, publishing: pushes to the Hugging Face Hub (`push`) and model cards (`model_card`).

`python -m bert_repro.hub RUN_DIR --repo_id ID` pushes a run directory."""
