"""Text to train on: the words of the shared fixture corpus (conftest.py's `corpus_and_tokenizer`), and documents of
pseudo-words with a WordPiece tokenizer trained on them."""

from __future__ import annotations

import random

# The words the fixture corpus's sentences are drawn from.
WORDS = (
    "the a cat dog sat ran on under mat house garden quickly slowly big small red blue king queen river "
    "mountain old new green tree bird sang loud quiet night day"
).split()

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SYLLABLES = "ka lo mi ren tor vel sha qui bra don ex pu nor ti gan".split()


def pseudo_text(num_docs: int, seed: int = 0, min_sentences: int = 2, max_sentences: int = 14) -> list[str]:
    """Documents of paragraphs of sentences of pseudo-words (which a small WordPiece vocabulary splits)."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(400)]
    docs = []
    for _ in range(num_docs):
        sentences = []
        for _ in range(rng.randint(min_sentences, max_sentences)):
            sentence = " ".join(rng.choice(words) for _ in range(rng.randint(3, 18)))
            sentences.append(sentence.capitalize() + rng.choice([".", ".", "!", "?"]))
        cut = len(sentences) // 2
        docs.append(" ".join(sentences[:cut]) + "\n\n" + "\n".join(sentences[cut:]))
    return docs


def word_tokenizer(words: list[str]):
    """A WordPiece tokenizer whose vocabulary holds every word whole (one token a word), and "."."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import BertTokenizer

    vocab = {t: i for i, t in enumerate(SPECIALS + [".", *dict.fromkeys(words)])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return BertTokenizer(tokenizer_object=tok)


def wordpiece_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertTokenizer

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIALS))
    return BertTokenizer(tokenizer_object=tok)
