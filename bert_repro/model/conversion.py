"""Moving weights between bert_repro and the other BERT formats, so nobody is locked in.

`load_bert` reads a Hub id or directory in the Hugging Face format, a bert_repro directory, or Google's TensorFlow
checkpoint; `check_model_dir` is what every opener of a local model directory checks first. The way back is
`save_pretrained`, which writes transformers' own BERT format (`checkpoint_format.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from . import modeling_bert_repro as modeling

HEADS = {
    "base": modeling.BertReproModel,
    "pretraining": modeling.BertReproForPreTraining,
    "masked_lm": modeling.BertReproForMaskedLM,
    "next_sentence": modeling.BertReproForNextSentencePrediction,
    "sequence_classification": modeling.BertReproForSequenceClassification,
    "question_answering": modeling.BertReproForQuestionAnswering,
    "multiple_choice": modeling.BertReproForMultipleChoice,
    "token_classification": modeling.BertReproForTokenClassification,
}

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# Files that hold pickles: never opened unless the user says the file is trusted.
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt")


class CheckpointError(ValueError):
    """A model directory that cannot be opened as it is; the message names the file and the fix."""


def _is_tf_checkpoint(path: str | os.PathLike) -> bool:
    p = Path(path)
    if p.is_dir():
        return (
            any(p.glob("*.ckpt*.index")) and not any(p.glob("*.safetensors")) and not (p / "pytorch_model.bin").exists()
        )
    return Path(f"{p}.index").exists()


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory: model.safetensors, or the shards its index names."""
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return [directory / "model.safetensors"] if (directory / "model.safetensors").is_file() else []
    try:
        shards = json.loads(index.read_text())["weight_map"].values()
        return [directory / name for name in sorted(set(shards))]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(
            f"{index} is not a valid shard index ({type(err).__name__}: {err}); download or save the model again."
        ) from None


def _hub_model_problem(repo_id: str, **hub_kwargs) -> str | None:
    """Why the Hub model `repo_id` cannot be loaded, or None. Asked once, briefly: transformers' loaders retry an
    unreachable Hub for half a minute, then raise a hundred-line traceback."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    where = {k: v for k, v in hub_kwargs.items() if k in ("cache_dir", "revision") and v is not None}
    if isinstance(try_to_load_from_cache(repo_id, "config.json", **where), str):
        return None
    if constants.HF_HUB_OFFLINE:
        return "it is not in the local cache (HF_HUB_OFFLINE is set)"
    try:
        HfApi().model_info(repo_id, timeout=3)
    except RepositoryNotFoundError:
        return f"{constants.ENDPOINT} has no such model (or not one your token may read)"
    except HfHubHTTPError:
        return None  # the Hub answered: its loader says more
    except Exception as err:  # the network's own errors (no route, no name, a timeout)
        return f"it is not in the local cache and {constants.ENDPOINT} did not answer ({err})"
    return None


def check_model_dir(path: str | os.PathLike, *, trust_pickle: bool = False, **hub_kwargs) -> None:
    """Raise `CheckpointError` unless `path` can be opened: a directory with a JSON `config.json` and complete
    safetensors weights, a Hub id in the cache or on a Hub that answers, or a TensorFlow checkpoint. A directory of
    pickles only is refused (unpickling runs code), naming the command that converts it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    directory = Path(path)
    if not directory.exists() and not _is_tf_checkpoint(directory):
        try:
            validate_repo_id(str(path))
        except HFValidationError:
            raise CheckpointError(f"{path}: no such directory, and not a Hub id either.") from None
        if problem := _hub_model_problem(str(path), **hub_kwargs):
            raise CheckpointError(f"{path}: no such directory, and as a Hub id {problem}.")
    if not directory.exists() or _is_tf_checkpoint(directory):
        return
    if not directory.is_dir():
        raise CheckpointError(
            f"{path} is a file; a model is a directory holding config.json and model.safetensors, a Hub id or a "
            "TensorFlow checkpoint."
        )
    config = directory / "config.json"
    if not config.is_file():
        raise CheckpointError(f"{config}: no such file; a model directory holds config.json and model.safetensors.")
    try:
        if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
            raise ValueError("not a JSON object of config fields")
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{config} is not a valid config.json ({err}); restore it from the model's "
            "source or save the model again with save_pretrained."
        ) from None
    weights = weight_files(directory)
    pickles = sorted(p.name for pattern in PICKLE_PATTERNS for p in directory.glob(pattern))
    if not weights and pickles and not trust_pickle:
        converted = f"{directory}-safetensors"
        raise CheckpointError(
            f"{directory} holds its weights only as a pickle ({', '.join(pickles)}), which is not opened: "
            "unpickling can run any code in the file. If you trust its source, convert it to safetensors "
            f"once: python -m bert_repro.model.conversion import {directory} {converted} --trust_pickle "
            f"(then pass {converted})."
        )
    if not weights and not pickles:
        raise CheckpointError(
            f"{directory} holds no weights (model.safetensors); pass a directory written "
            "by save_pretrained or a bert_repro recipe."
        )
    for file in weights:
        try:
            with safe_open(file, framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"{file} cannot be read as safetensors ({err}): it is damaged or "
                "incomplete (an interrupted download or copy?). Download or copy it again."
            ) from None


def load_bert(
    path_or_id: str | os.PathLike,
    model_class: type[modeling.BertReproPreTrainedModel] | str = modeling.BertReproForPreTraining,
    *,
    trust_pickle: bool = False,
    **kwargs,
) -> modeling.BertReproPreTrainedModel:
    """Load a BERT checkpoint of any public format into `model_class` (a class or a key of `HEADS`); kwargs go to
    `from_pretrained`. Pickled weights are read only with `trust_pickle=True`, and then with weights_only=True."""
    if isinstance(model_class, str):
        if model_class not in HEADS:
            raise ValueError(f"Unknown head {model_class!r}; choose one of: {', '.join(HEADS)}.")
        model_class = HEADS[model_class]
    if _is_tf_checkpoint(path_or_id):
        return load_tf_bert(path_or_id, model_class, **kwargs)
    check_model_dir(path_or_id, trust_pickle=trust_pickle, **kwargs)
    if not trust_pickle:
        return model_class.from_pretrained(path_or_id, **kwargs)
    try:
        return model_class.from_pretrained(path_or_id, use_safetensors=False, **kwargs)
    except pickle.UnpicklingError as err:  # torch's weights_only loader refused something other than tensors
        lines = [line.strip() for line in str(err).splitlines() if "WeightsUnpickler" in line]
        reason = lines[0] if lines else str(err)
        raise CheckpointError(
            f"{path_or_id}: the pickle holds more than tensors, so it was not read ({reason})."
        ) from None


def load_tf_bert(
    path: str | os.PathLike, model_class: type[modeling.BertReproPreTrainedModel], **config_overrides
) -> modeling.BertReproPreTrainedModel:
    """Google's TensorFlow checkpoint (prefix or directory, `bert_config.json` beside it) -> `model_class`."""
    from .tf_checkpoint import load_tf_checkpoint, read_google_bert_config, resolve_checkpoint_prefix

    prefix = resolve_checkpoint_prefix(path)
    # The head's own config class: the BiLSTM heads add their fields to BertReproConfig's.
    config = model_class.config_class(**{**read_google_bert_config(prefix.parent), **config_overrides})
    state_dict, _ = load_tf_checkpoint(prefix)
    model = model_class(config)
    load_state_dict_checked(model, state_dict, source=str(prefix))
    return model.eval()


def load_state_dict_checked(
    model: modeling.BertReproPreTrainedModel, state_dict: dict[str, torch.Tensor], source: str
) -> None:
    """Copy `state_dict` (HF `BertForPreTraining` keys) into `model`, ignoring heads it lacks; raise when a shape
    differs or an encoder weight is missing."""
    prefix = model.base_model_prefix + "."
    is_base = isinstance(model, modeling.BertReproModel)
    if is_base:  # the bare encoder's keys have no `bert.` prefix
        state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    own = model.state_dict()
    mismatched = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
        for k, v in state_dict.items()
        if k in own and own[k].shape != v.shape
    ]
    if mismatched:
        raise ValueError(f"{source}: weights of another shape than the config describes: " + "; ".join(mismatched))
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing_encoder = [k for k in own if k not in state_dict and k not in tied and (is_base or k.startswith(prefix))]
    if missing_encoder:
        raise ValueError(f"{source} lacks encoder weights: {', '.join(sorted(missing_encoder))}")
    model.load_state_dict(state_dict, strict=False)
    model.tie_weights()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bert_repro.model.conversion", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="a public BERT checkpoint (HF format, Hub id, or TF) -> bert_repro directory")
    imp.add_argument("source")
    imp.add_argument("output_dir")
    imp.add_argument("--head", default="pretraining", choices=sorted(HEADS))
    imp.add_argument("--overwrite", action="store_true")
    imp.add_argument(
        "--trust_pickle",
        action="store_true",
        help="read pickled weights (pytorch_model.bin), "
        "with torch.load(weights_only=True): only for a file from a source you trust",
    )
    args = parser.parse_args(argv)

    out = Path(args.output_dir)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        parser.error(f"{out} is not empty; pass --overwrite to write into it anyway.")
    try:
        load_bert(args.source, args.head, trust_pickle=args.trust_pickle).save_pretrained(out)
        src = Path(args.source)
        for name in TOKENIZER_FILES:
            if src.is_dir() and (src / name).exists():
                shutil.copy2(src / name, out / name)
    except CheckpointError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
