"""WordPiece tokenization for BERT (paper §3, Wu et al. 2016 §4.1): train a vocabulary, save it, load it back.

google-research/bert's ``tokenization.py`` in the Rust ``tokenizers`` library: its ``BasicTokenizer`` is
``BertNormalizer`` + ``BertPreTokenizer``, its ``WordpieceTokenizer`` (greedy longest match) the ``WordPiece`` model.

Departures:
- Google did not release its vocabulary builder; ``WordPieceTrainer`` grows the vocabulary by BPE-style merges, not
  Wu et al.'s likelihood procedure, with ties broken in hash-map order (two trainings can differ in a few pieces).
- A trained vocabulary holds the special tokens at ids 0-4; Google's has ``[UNK]`` at 100, ``[CLS]`` at 101, ...
  Loaded vocabularies keep their ids, so read special ids from the tokenizer.
- A word over 100 characters becomes ``[UNK]`` (the ``tokenizers`` default); Google allows 200.

transformers 5.x's ``save_pretrained`` writes no ``vocab.txt``, which original-BERT tools need, and ``AutoTokenizer``
cannot load a bare ``vocab.txt`` nor read ``token_type_ids`` from a bare ``tokenizer.json``: this module covers both.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from tokenizers.trainers import WordPieceTrainer
from transformers import AutoTokenizer, BertTokenizer, PreTrainedTokenizerBase

from ..atomic import STAGING, move_into, process_alive, write_text

__all__ = [
    "BERT_SPECIAL_TOKENS",
    "DEFAULT_MODEL_MAX_LENGTH",
    "DEFAULT_VOCAB_SIZE",
    "load_tokenizer",
    "save_tokenizer",
    "train_wordpiece",
    "write_vocab_txt",
]

logger = logging.getLogger(__name__)

#: BERT's special tokens. A vocabulary trained by ``train_wordpiece`` holds them at ids 0..4, in this order.
BERT_SPECIAL_TOKENS: list[str] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN = BERT_SPECIAL_TOKENS

#: Size of the released uncased English BERT vocabulary.
DEFAULT_VOCAB_SIZE = 30522
#: Longest input BERT's learned position embeddings cover.
DEFAULT_MODEL_MAX_LENGTH = 512
#: Prefix of word-internal WordPiece pieces.
CONTINUING_SUBWORD_PREFIX = "##"

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: What ``from_pretrained`` records about the load itself (offline, from a folder): it goes into every
#: ``tokenizer_config.json`` saved afterwards, where it would describe this machine, not the tokenizer.
LOAD_TIME_KEYS = ("local_files_only", "is_local")

# transformers' stand-in for "no limit" (int(1e30)); anything this large means "not configured".
_UNSET_MAX_LENGTH_THRESHOLD = int(1e29)


def train_wordpiece(
    files: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
    *,
    iterator: Iterable[str] | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    lowercase: bool = True,
    strip_accents: bool | None = None,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    show_progress: bool = True,
) -> BertTokenizer:
    """Train a WordPiece vocabulary on ``files`` (text, line by line) or ``iterator`` (strings), not both.

    ``vocab_size`` counts the special tokens and alphabet (fewer, with a warning, when the corpus lacks pieces);
    ``strip_accents=None`` follows ``lowercase``, the BERT convention.
    """
    if vocab_size <= len(BERT_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed the {len(BERT_SPECIAL_TOKENS)} special tokens, got {vocab_size}")
    tokenizer = _new_wordpiece_tokenizer(None, lowercase=lowercase, strip_accents=strip_accents)
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=show_progress,
        special_tokens=list(BERT_SPECIAL_TOKENS),
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX,
    )
    if files is not None and iterator is not None:
        raise ValueError("give either files or iterator, not both")
    if files is not None:
        tokenizer.train(_check_training_files(files), trainer=trainer)
    elif iterator is not None:
        tokenizer.train_from_iterator(iterator, trainer=trainer)
    else:
        raise ValueError("give the training text: files=[paths of text files] or iterator=<iterable of str>")

    _check_special_ids(tokenizer)
    trained_size = tokenizer.get_vocab_size(with_added_tokens=True)
    if trained_size != vocab_size:
        logger.warning(
            "trained vocabulary has %d entries, not the requested %d (the corpus has too few distinct "
            "pieces with frequency >= %d)",
            trained_size,
            vocab_size,
            min_frequency,
        )
    tokenizer.post_processor = _bert_post_processor(tokenizer)
    return _wrap(tokenizer, do_lower_case=lowercase, strip_accents=strip_accents)


def _check_training_files(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    paths = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    if not paths:
        raise ValueError("files is an empty list: give at least one text file to train on")
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"training file not found: {os.fspath(path)!r}")
    return [os.fspath(path) for path in paths]


def _new_wordpiece_tokenizer(vocab: dict[str, int] | None, *, lowercase: bool, strip_accents: bool | None) -> Tokenizer:
    """BERT's ``BasicTokenizer`` (``BertNormalizer``: ``strip_accents=None`` follows ``lowercase``) and WordPiece."""
    tokenizer = Tokenizer(WordPiece(vocab, unk_token=UNK_TOKEN, continuing_subword_prefix=CONTINUING_SUBWORD_PREFIX))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix=CONTINUING_SUBWORD_PREFIX)
    return tokenizer


def _bert_post_processor(tokenizer: Tokenizer) -> processors.TemplateProcessing:
    """``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` with token type ids 0 for A's part, 1 for B's."""
    return processors.TemplateProcessing(
        single=f"{CLS_TOKEN}:0 $A:0 {SEP_TOKEN}:0",
        pair=f"{CLS_TOKEN}:0 $A:0 {SEP_TOKEN}:0 $B:1 {SEP_TOKEN}:1",
        special_tokens=[(token, tokenizer.token_to_id(token)) for token in (CLS_TOKEN, SEP_TOKEN)],
    )


def _check_special_ids(tokenizer: Tokenizer) -> None:
    ids = [tokenizer.token_to_id(token) for token in BERT_SPECIAL_TOKENS]
    if ids != list(range(len(BERT_SPECIAL_TOKENS))):
        raise RuntimeError(f"special tokens got ids {ids}, expected 0..{len(BERT_SPECIAL_TOKENS) - 1}")


def _wrap(
    tokenizer: Tokenizer,
    *,
    do_lower_case: bool,
    strip_accents: bool | None,
    tokenize_chinese_chars: bool = True,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
) -> BertTokenizer:
    """The casing flags must describe the backend's normalizer: ``from_pretrained`` rebuilds it from them."""
    return BertTokenizer(
        tokenizer_object=tokenizer,
        do_lower_case=do_lower_case,
        strip_accents=strip_accents,
        tokenize_chinese_chars=tokenize_chinese_chars,
        unk_token=UNK_TOKEN,
        sep_token=SEP_TOKEN,
        pad_token=PAD_TOKEN,
        cls_token=CLS_TOKEN,
        mask_token=MASK_TOKEN,
        model_max_length=model_max_length,
    )


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, output_dir: str | os.PathLike) -> list[str]:
    """``save_pretrained`` plus the ``vocab.txt`` original-BERT tools read; returns the paths.

    Files are staged and moved in whole, ``tokenizer.json`` last: after a kill, a folder with it has the rest too.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # One staging folder per process: the ranks of a multi-process run may save the same tokenizer at once.
    for stale in output_dir.glob(f"{STAGING}-tokenizer-*"):  # what a killed save left
        writer = stale.name.rsplit("-", 1)[1]
        if not (writer.isdigit() and process_alive(int(writer))):
            shutil.rmtree(stale, ignore_errors=True)
    staging = output_dir / f"{STAGING}-tokenizer-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        tokenizer.save_pretrained(staging)
        write_vocab_txt(tokenizer, staging / VOCAB_FILE)
        moved = move_into(staging, output_dir, last=("tokenizer.json",))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return [os.fspath(path) for path in moved]


def write_vocab_txt(tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike) -> str:
    """One token per line in id order (added tokens included); ValueError where line number and id would differ."""
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    ids = [vocab[token] for token in tokens]
    if ids != list(range(len(tokens))):
        raise ValueError("vocabulary ids are not contiguous from 0: cannot write a line-per-id vocab.txt")
    bad = [token for token in tokens if "\n" in token or "\r" in token]
    if bad:
        raise ValueError(f"tokens containing line breaks cannot be written to vocab.txt: {bad[:5]!r}")
    write_text(path, "".join(f"{token}\n" for token in tokens))
    return os.fspath(path)


def load_tokenizer(
    path_or_id: str | os.PathLike, *, do_lower_case: bool | None = None, **hub_kwargs: Any
) -> PreTrainedTokenizerBase:
    """A fast BERT tokenizer that returns ``token_type_ids``, from a folder, a ``tokenizer.json``, a ``vocab.txt``
    (Google's layout included) or a Hub id.

    ``do_lower_case`` overrides the saved casing; a bare ``vocab.txt`` is taken as uncased, so Google's cased
    vocabularies need ``do_lower_case=False``. ``model_max_length`` is 512 unless saved otherwise.
    """
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        tokenizer = _load_directory(path, do_lower_case=do_lower_case)
    elif path.is_file():
        load = _load_tokenizer_json if path.suffix.lower() == ".json" else _load_vocab_txt
        tokenizer = load(path, do_lower_case=do_lower_case)
    elif _looks_like_local_path(os.fspath(path_or_id)):
        raise FileNotFoundError(
            f"{os.fspath(path_or_id)!r} does not exist: expected a directory, a vocab.txt or "
            "tokenizer.json file, or a Hub id"
        )
    else:
        tokenizer = _load_from_hub(os.fspath(path_or_id), do_lower_case=do_lower_case, **hub_kwargs)
    for key in LOAD_TIME_KEYS:
        tokenizer.init_kwargs.pop(key, None)
    return _check_bert_like(_default_max_length(tokenizer), source=os.fspath(path_or_id))


def _load_directory(path: Path, *, do_lower_case: bool | None) -> PreTrainedTokenizerBase:
    if (path / TOKENIZER_CONFIG_FILE).is_file():
        return AutoTokenizer.from_pretrained(os.fspath(path), **_casing_kwargs(do_lower_case))
    if (path / TOKENIZER_FILE).is_file():
        return _load_tokenizer_json(path / TOKENIZER_FILE, do_lower_case=do_lower_case)
    if (path / VOCAB_FILE).is_file():
        return _load_vocab_txt(path / VOCAB_FILE, do_lower_case=do_lower_case)
    raise FileNotFoundError(
        f"directory {os.fspath(path)!r} has neither {TOKENIZER_FILE} nor {VOCAB_FILE} "
        f"(nor {TOKENIZER_CONFIG_FILE}): expected a saved BERT tokenizer"
    )


def _load_vocab_txt(path: Path, *, do_lower_case: bool | None) -> BertTokenizer:
    try:
        vocab = WordPiece.read_file(os.fspath(path))
    except Exception as error:  # the Rust side raises a bare Exception (e.g. bytes that are not UTF-8)
        raise ValueError(f"cannot read {os.fspath(path)!r} as a vocab.txt (one token per line): {error}") from error
    missing = [token for token in BERT_SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise ValueError(f"vocabulary file {os.fspath(path)!r} lacks the special tokens {missing}")
    lowercase = True if do_lower_case is None else do_lower_case
    tokenizer = _new_wordpiece_tokenizer(vocab, lowercase=lowercase, strip_accents=None)
    tokenizer.post_processor = _bert_post_processor(tokenizer)
    return _wrap(tokenizer, do_lower_case=lowercase, strip_accents=None)


def _load_tokenizer_json(path: Path, *, do_lower_case: bool | None) -> BertTokenizer:
    """The file's normalizer is kept (and its casing recorded) unless ``do_lower_case`` overrides it."""
    try:
        tokenizer = Tokenizer.from_file(os.fspath(path))
    except Exception as error:  # the Rust side raises a bare Exception on malformed files
        raise ValueError(f"cannot read {os.fspath(path)!r} as a tokenizers tokenizer.json: {error}") from error
    if not isinstance(tokenizer.model, WordPiece):
        name = type(tokenizer.model).__name__
        raise ValueError(f"{os.fspath(path)!r} holds a {name} model, expected a WordPiece (BERT) one")

    casing = _normalizer_casing(tokenizer.normalizer)
    if do_lower_case is not None:
        casing = {**casing, "lowercase": do_lower_case, "strip_accents": None}
        tokenizer.normalizer = normalizers.BertNormalizer(**casing)
    if tokenizer.post_processor is None:
        tokenizer.post_processor = _bert_post_processor(tokenizer)
    return _wrap(
        tokenizer,
        do_lower_case=casing["lowercase"],
        strip_accents=casing["strip_accents"],
        tokenize_chinese_chars=casing["handle_chinese_chars"],
    )


def _normalizer_casing(normalizer: normalizers.Normalizer | None) -> dict[str, Any]:
    """The BERT casing flags a backend normalizer implements (uncased defaults when it is not BERT's)."""
    if isinstance(normalizer, normalizers.BertNormalizer):
        return {
            "lowercase": normalizer.lowercase,
            "strip_accents": normalizer.strip_accents,
            "handle_chinese_chars": normalizer.handle_chinese_chars,
        }
    logger.warning(
        "tokenizer.json has no BertNormalizer (%s): recording it as uncased in the configuration",
        type(normalizer).__name__,
    )
    return {"lowercase": True, "strip_accents": None, "handle_chinese_chars": True}


def _load_from_hub(repo_id: str, *, do_lower_case: bool | None, **hub_kwargs: Any) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(repo_id, **_casing_kwargs(do_lower_case), **hub_kwargs)
    except OSError as error:
        raise OSError(
            f"cannot load a tokenizer for {repo_id!r}: it is not a local path, and as a Hub id it is not "
            f"reachable or not in the local cache ({error})"
        ) from error


def _casing_kwargs(do_lower_case: bool | None) -> dict[str, Any]:
    """``from_pretrained`` overrides for an explicit ``do_lower_case`` (accent stripping follows it)."""
    if do_lower_case is None:
        return {}
    return {"do_lower_case": do_lower_case, "strip_accents": None}


def _looks_like_local_path(name: str) -> bool:
    """Whether a missing ``name`` is meant as a local path rather than a Hub id (``name`` or ``org/name``)."""
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
        or name.lower().endswith((".txt", ".json"))
    )


def _default_max_length(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """512 when nothing configured it (transformers' default is 1e30)."""
    if tokenizer.model_max_length is None or tokenizer.model_max_length > _UNSET_MAX_LENGTH_THRESHOLD:
        tokenizer.model_max_length = DEFAULT_MODEL_MAX_LENGTH
    return tokenizer


def _check_bert_like(tokenizer: PreTrainedTokenizerBase, *, source: str) -> PreTrainedTokenizerBase:
    if not tokenizer.is_fast:
        raise ValueError(f"{source!r} gave a slow {type(tokenizer).__name__}, expected a fast tokenizer")
    if "token_type_ids" not in tokenizer.model_input_names:
        raise ValueError(
            f"{source!r} gave a {type(tokenizer).__name__} that does not return token_type_ids: "
            "expected a BERT (WordPiece) tokenizer"
        )
    return tokenizer
