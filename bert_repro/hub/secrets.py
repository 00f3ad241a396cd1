"""What a card must not show: credentials, and the settings and local paths that say where a run's outputs, logs and
trackers went. The settings tables leave those out (`dropped`, `public_value`); a rendered card holding a token or
a secret environment variable's value is refused (`check_no_secrets`)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


class CardError(ValueError):
    """A directory that holds no run a card can be made of, or a card that would leak a secret (defined in this, the
    lowest of the card modules, so that the secrets check can raise it)."""


# Settings of outputs, logs, trackers or credentials: not hyper-parameters, and possibly private.
_DROPPED_KEYS = {"output_dir", "logging_dir", "run_name", "project", "local_rank", "resume_from_checkpoint"}
_DROPPED_PREFIXES = ("hub_", "push_to_hub", "trackio_", "logging_")
_DROPPED_SUFFIXES = ("_token", "_api_key", "_secret", "_password")
# Settings that name files or directories (local paths are reduced to their last component).
_PATH_KEYS = {"corpus", "tokenizer", "init_from", "model", "data", "deepspeed", "fsdp_config"}
# Credentials a training machine commonly holds: the Hub's, the trackers' and others'.
SECRET_ENV_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_API_TOKEN", "WANDB_API_KEY", "COMET_API_KEY")
SECRET_ENV_VARS += ("NEPTUNE_API_TOKEN", "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN")
_TOKEN_PATTERN = re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_FILE_SUFFIXES = (".txt", ".text", ".md", ".json", ".jsonl", ".parquet", ".csv", ".tsv", ".yaml", ".yml")


def dropped(key: str) -> bool:
    return key in _DROPPED_KEYS or key.startswith(_DROPPED_PREFIXES) or key.endswith(_DROPPED_SUFFIXES)


def is_hub_id(value: Any) -> bool:
    """Whether ``value`` names a Hub repository ("owner/name") rather than a local file or directory."""
    if not isinstance(value, str) or value.startswith((".", "/", "~")) or not _HUB_ID.fullmatch(value):
        return False
    return not value.lower().endswith(_FILE_SUFFIXES) and not Path(value).exists()


def last_component(path: str) -> str:
    return Path(str(path).rstrip("/\\")).name or str(path)


def public_name(value: str) -> str:
    """A source as a card may name it: a Hub id as it is, a local path by its last component only."""
    return value if is_hub_id(value) else f"{last_component(value)} (local)"


def public_value(key: str, value: Any) -> Any:
    if key in _PATH_KEYS and isinstance(value, str):
        return public_name(value)
    if key in _PATH_KEYS and isinstance(value, list):
        return [public_name(v) if isinstance(v, str) else v for v in value]
    if isinstance(value, str) and (value.startswith(("/", "~")) or re.match(r"[A-Za-z]:\\", value)):
        return public_name(value)  # an absolute path under any name
    return value


def check_no_secrets(text: str) -> None:
    """Refuse a card that contains an access token or the value of a secret environment variable."""
    for name in SECRET_ENV_VARS:
        value = os.environ.get(name, "")
        if len(value) >= 8 and value in text:
            raise CardError(f"The card contains the value of ${name}; it is not written.")
    if _TOKEN_PATTERN.search(text):
        raise CardError("The card contains what looks like a Hugging Face access token; it is not written.")
