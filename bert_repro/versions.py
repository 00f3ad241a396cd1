"""The software a run trained with: the packages Trainer's cards list under "Framework versions"
(transformers.modelcard), then ours. Training records them and hub shows them."""

from __future__ import annotations

import importlib.metadata

# {name a card shows: package}
FRAMEWORKS = {
    "Transformers": "transformers",
    "Pytorch": "torch",
    "Datasets": "datasets",
    "Tokenizers": "tokenizers",
    "bert_repro": "bert_repro",
}


def framework_versions() -> dict[str, str | None]:
    """{package: installed version} of `FRAMEWORKS` (None where one is not installed)."""
    return {package: installed_version(package) for package in FRAMEWORKS.values()}


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
