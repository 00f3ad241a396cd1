"""Read Google's original TensorFlow BERT checkpoints into PyTorch.

The layout is google-research/bert's original releases (``bert_model.ckpt.*`` next to ``bert_config.json``). TF
stores dense kernels ``[in, out]``, transposed here to torch's ``[out, in]``. Google's configs say ``"gelu"`` but its
code computes the tanh approximation, so converted configs say ``"gelu_new"``. TensorFlow
(``pip install "bert-repro[tf]"``) is imported only when a checkpoint is read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

__all__ = [
    "is_skipped_variable",
    "load_tf_checkpoint",
    "read_google_bert_config",
    "resolve_checkpoint_prefix",
    "tf_name_to_hf",
]

CONFIG_FILENAME = "bert_config.json"
DEFAULT_CHECKPOINT_PREFIX = "bert_model.ckpt"

# Last path component of an optimizer slot variable, e.g. "bert/pooler/dense/kernel/adam_m".
_OPTIMIZER_SLOTS = frozenset(
    {"adam_m", "adam_v"}  # Google's AdamWeightDecayOptimizer
    # TF's stock optimizers (Adam, LAMB, momentum), as common forks of the reference code write them
    | {"Adam", "Adam_1", "AdamWeightDecayOptimizer", "AdamWeightDecayOptimizer_1", "LAMB", "LAMB_1", "Momentum"}
)
# Training bookkeeping (step counters, mixed-precision loss scaling).
_BOOKKEEPING = frozenset(
    {"global_step", "bad_steps", "good_steps", "loss_scale", "current_loss_scale", "beta1_power", "beta2_power"}
)

_EMBEDDINGS = {
    "bert/embeddings/word_embeddings": "bert.embeddings.word_embeddings.weight",
    "bert/embeddings/position_embeddings": "bert.embeddings.position_embeddings.weight",
    "bert/embeddings/token_type_embeddings": "bert.embeddings.token_type_embeddings.weight",
}
# output_weights is stored [2, hidden], not transposed; the tied MLM decoder is not stored at all.
_HEADS = {
    "cls/predictions/output_bias": "cls.predictions.bias",
    "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
    "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
}
_LAYER = r"bert/encoder/layer_\d+"
_LINEAR_RE = re.compile(
    rf"^(?P<module>{_LAYER}/attention/self/(?:query|key|value)"
    rf"|{_LAYER}/attention/output/dense"
    rf"|{_LAYER}/intermediate/dense"
    rf"|{_LAYER}/output/dense"
    r"|bert/pooler/dense"
    r"|cls/predictions/transform/dense)/(?P<param>kernel|bias)$"
)
_LAYER_NORM_RE = re.compile(
    rf"^(?P<module>bert/embeddings|{_LAYER}/attention/output|{_LAYER}/output|cls/predictions/transform)"
    r"/LayerNorm/(?P<param>gamma|beta)$"
)

# Google's activation names -> transformers' ACT2FN names.
_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh", "linear": "linear"}
_INT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)
_FLOAT_FIELDS = ("attention_probs_dropout_prob", "hidden_dropout_prob", "initializer_range")
# Google's layer norm (tf.contrib.layers.layer_norm) uses a variance epsilon of 1e-12.
_GOOGLE_LAYER_NORM_EPS = 1e-12


class _Target(NamedTuple):
    """Where one TF variable goes: its HF key, whether to transpose it, and the rank it must have."""

    key: str
    transpose: bool
    rank: int


def is_skipped_variable(tf_name: str) -> bool:
    """True for optimizer slots and training bookkeeping, which are not model weights."""
    parts = tf_name.split("/")
    return parts[-1] in _OPTIMIZER_SLOTS or parts[-1] in _BOOKKEEPING


def _module_key(tf_module: str) -> str:
    """``bert/encoder/layer_3/output/dense`` -> ``bert.encoder.layer.3.output.dense``."""
    return re.sub(r"layer_(\d+)", r"layer.\1", tf_module).replace("/", ".")


def tf_name_to_hf(tf_name: str) -> _Target:
    """Map one Google BERT variable name to its ``BertForPreTraining`` key; ValueError outside Google's layout."""
    if tf_name in _EMBEDDINGS:
        return _Target(_EMBEDDINGS[tf_name], transpose=False, rank=2)
    if tf_name in _HEADS:
        return _Target(_HEADS[tf_name], transpose=False, rank=2 if tf_name.endswith("weights") else 1)
    match = _LINEAR_RE.match(tf_name)
    if match:
        module = _module_key(match["module"])
        if match["param"] == "kernel":
            return _Target(f"{module}.weight", transpose=True, rank=2)
        return _Target(f"{module}.bias", transpose=False, rank=1)
    match = _LAYER_NORM_RE.match(tf_name)
    if match:
        param = "weight" if match["param"] == "gamma" else "bias"
        return _Target(f"{_module_key(match['module'])}.LayerNorm.{param}", transpose=False, rank=1)
    raise ValueError(
        f"Unexpected variable {tf_name!r} in the TensorFlow checkpoint: it is neither a weight of "
        "Google's BERT pre-training layout nor an optimizer slot or training counter"
    )


def resolve_checkpoint_prefix(path: str | Path) -> Path:
    """The checkpoint prefix (``.../bert_model.ckpt``) of a prefix, an ``.index`` or ``.data-*`` file, or a
    directory holding ``bert_model.ckpt.index`` or exactly one ``*.index`` file."""
    path = Path(path)
    if path.is_dir():
        return _prefix_in_directory(path)
    if path.name.endswith(".index"):
        path = path.with_name(path.name[: -len(".index")])
    elif ".data-" in path.name:
        path = path.with_name(path.name.split(".data-")[0])
    if not path.with_name(path.name + ".index").is_file():
        raise FileNotFoundError(
            f"No TensorFlow checkpoint at {str(path)!r}: expected {path}.index "
            "(pass the checkpoint prefix such as .../bert_model.ckpt, or its directory)"
        )
    return path


def _prefix_in_directory(directory: Path) -> Path:
    if (directory / f"{DEFAULT_CHECKPOINT_PREFIX}.index").is_file():
        return directory / DEFAULT_CHECKPOINT_PREFIX
    indexes = sorted(directory.glob("*.index"))
    if len(indexes) == 1:
        return indexes[0].with_name(indexes[0].name[: -len(".index")])
    if not indexes:
        raise FileNotFoundError(f"No TensorFlow checkpoint (*.index file) in directory {str(directory)!r}")
    names = ", ".join(p.name for p in indexes)
    raise ValueError(
        f"Several TensorFlow checkpoints in {str(directory)!r} ({names}): pass the prefix of the one to read"
    )


def _to_torch(value: np.ndarray, tf_name: str, target: _Target) -> torch.Tensor:
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.floating) or array.dtype.name == "bfloat16"):
        raise ValueError(f"Variable {tf_name!r} has dtype {array.dtype}, expected a floating-point weight")
    if array.ndim != target.rank:
        raise ValueError(
            f"Variable {tf_name!r} has shape {list(array.shape)}, expected rank {target.rank} for {target.key!r}"
        )
    tensor = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
    return (tensor.t() if target.transpose else tensor).contiguous()


def load_tf_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A ``BertForPreTraining`` state dict of float32 tensors and the sorted TF names skipped (optimizer state).

    An unknown variable, or a weight of the wrong rank or dtype, raises ValueError.
    """
    prefix = resolve_checkpoint_prefix(path)
    try:
        import tensorflow as tf
    except ImportError as err:
        raise ImportError(
            f"Reading the TensorFlow checkpoint {str(prefix)!r} needs TensorFlow, which is not "
            'installed. Install it with: pip install "bert-repro[tf]"'
        ) from err
    reader = tf.train.load_checkpoint(str(prefix))
    names = sorted(reader.get_variable_to_shape_map())

    skipped = [name for name in names if is_skipped_variable(name)]
    targets = {name: tf_name_to_hf(name) for name in names if not is_skipped_variable(name)}
    state_dict = {target.key: _to_torch(reader.get_tensor(name), name, target) for name, target in targets.items()}
    return state_dict, skipped


def read_google_bert_config(path: str | Path) -> dict[str, Any]:
    """Google's ``bert_config.json`` (or its directory) as a BertConfig dict: ``"gelu"`` becomes ``"gelu_new"``,
    ``layer_norm_eps`` Google's 1e-12, and other fields (``directionality``, ``pooler_*``) are dropped."""
    path = Path(path)
    config_file = path / CONFIG_FILENAME if path.is_dir() else path
    raw = _read_json_object(config_file)
    missing = [f for f in (*_INT_FIELDS, *_FLOAT_FIELDS, "hidden_act") if f not in raw]
    if missing:
        raise ValueError(f"{str(config_file)!r} is missing required field(s): {', '.join(missing)}")

    config = {field: _positive_int(raw[field], field, config_file) for field in _INT_FIELDS}
    config.update({field: _number(raw[field], field, config_file) for field in _FLOAT_FIELDS})
    config.update(hidden_act=_activation(raw["hidden_act"], config_file), layer_norm_eps=_GOOGLE_LAYER_NORM_EPS)
    return dict(sorted(config.items()))


def _read_json_object(config_file: Path) -> dict[str, Any]:
    if not config_file.is_file():
        raise FileNotFoundError(f"BERT config file not found: {str(config_file)!r}")
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(config_file)!r} is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{str(config_file)!r} must hold a JSON object, got {type(data).__name__}")
    return data


def _positive_int(value: Any, field: str, config_file: Path) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{str(config_file)!r}: field {field!r} must be a positive integer, got {value!r}")
    return value


def _number(value: Any, field: str, config_file: Path) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{str(config_file)!r}: field {field!r} must be a non-negative number, got {value!r}")
    return float(value)


def _activation(value: Any, config_file: Path) -> str:
    if not isinstance(value, str) or value not in _ACTIVATIONS:
        raise ValueError(
            f"{str(config_file)!r}: hidden_act {value!r} is not one of Google's activations "
            f"({', '.join(sorted(_ACTIVATIONS))})"
        )
    return _ACTIVATIONS[value]
