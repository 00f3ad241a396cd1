"""What the test modules share besides fixtures (those are in tests/conftest.py), by concern:

- models: tiny configs and batches, transformers' config of the same architecture, the parity report
- damaged: model directories and checkpoints with one problem
- pretraining_runs: a tiny pre-training config and runs through the real launcher
- corpora: the fixture corpus's words, pseudo-text and a WordPiece tokenizer trained on it
- task_files: task files in their original layouts (GLUE, SQuAD, SWAG, CoNLL-2003)
- run_records: the records a pre-training or fine-tuning run leaves for its model card
- google_checkpoint: a tiny model in Google's TensorFlow layout, and what it must become
- without_package: loading in a process where bert_repro cannot be imported
- device_machine: an emulated GPU machine's environment, CUDA aside

pytest puts tests/ on sys.path when it imports tests/conftest.py (the default `prepend` import mode; tests/ has no
__init__.py), so a test in any folder imports these as `from support.models import tiny_config`. Test modules import
from here, never from one another."""

from pathlib import Path

# The repository's root, wherever the test module that asks for it lives.
ROOT = Path(__file__).resolve().parents[2]
