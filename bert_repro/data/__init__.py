"""Stage 2, the data: corpora (`corpus`, `sentences`), WordPiece vocabularies (`wordpiece`), the pre-training
examples of Google's reference builder (`pretraining_examples`) and the fine-tuning tasks' files (`task_files`)."""
