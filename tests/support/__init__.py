"""Helpers the test modules share besides fixtures (tests/conftest.py), one module per concern.

pytest puts tests/ on sys.path when it imports tests/conftest.py (the default `prepend` mode; tests/ has no
__init__.py), so tests import these as `from support.models import tiny_config`, never from one another."""

import hashlib
from pathlib import Path

# The repository's root, wherever the test module that asks for it lives.
ROOT = Path(__file__).resolve().parents[2]


def file_digests(directory: Path) -> dict[str, str]:
    """Every file under `directory` (hidden ones, locks and checkpoints included) -> its SHA-256."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
