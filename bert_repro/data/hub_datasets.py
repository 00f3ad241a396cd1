"""Loading a dataset from the Hub (a pre-training corpus, a task's data) without the wait of an unreachable Hub.

With no network and `HF_HUB_OFFLINE` unset, `datasets.load_dataset` retries for ~23 s and prints a dozen warnings
before its error. Here one short request asks the Hub first; without an answer the local cache is read as with
`HF_HUB_OFFLINE=1`, with one warning.
"""

from __future__ import annotations

import logging
import urllib.error
import urllib.request
from unittest.mock import patch

import datasets
from huggingface_hub import constants

logger = logging.getLogger(__name__)

PROBE_SECONDS = 3.0


class HubUnreachable(ConnectionError):
    """The Hub did not answer and the local cache has no copy; the message says which endpoint and why."""


def hub_answers(repo_id: str, timeout: float = PROBE_SECONDS) -> str | None:
    """None when the Hub answers about `repo_id` (any HTTP status: a gated repository answers 401), else why not."""
    url = f"{constants.ENDPOINT}/api/datasets/{repo_id}"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout)
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as err:
        return f"{constants.ENDPOINT} did not answer within {timeout:g} s: {getattr(err, 'reason', err)}"
    return None


def load_hub_dataset(repo_id: str, *args, **kwargs):
    """`datasets.load_dataset`, asking the Hub once first; `HubUnreachable` when it is silent and nothing cached."""
    offline = constants.HF_HUB_OFFLINE or datasets.config.HF_HUB_OFFLINE
    if offline or (problem := hub_answers(repo_id)) is None:
        return datasets.load_dataset(repo_id, *args, **kwargs)
    try:  # HF_HUB_OFFLINE=1 (datasets and huggingface_hub read the variable at import time: their copies)
        with patch.object(datasets.config, "HF_HUB_OFFLINE", True), patch.object(constants, "HF_HUB_OFFLINE", True):
            loaded = datasets.load_dataset(repo_id, *args, **kwargs)
    except Exception as err:  # not in the cache (datasets raises ConnectionError, FileNotFoundError, ...)
        raise HubUnreachable(f"{problem}, and the local cache holds no copy of {repo_id}") from err
    logger.warning("%s: read %s from the local cache", problem, repo_id)
    return loaded
