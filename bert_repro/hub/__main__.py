"""`python -m bert_repro.hub RUN_DIR --repo_id ID [--checkpoints]`: push a run directory to the Hub."""

from .push import main

main()
