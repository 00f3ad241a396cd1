"""A pre-training corpus that travels: a folder of text files -> one compressed Parquet file, its WordPiece
vocabulary and a manifest, small enough to go with the code to a machine without a network.

    python -m bert_repro.data.travel_corpus path/to/books .travel/books --document_boundary file \
        --provenance "where the text comes from, its licence"
    python -m bert_repro.data.travel_corpus --check .travel/books
    python recipes/pretrain.py --corpus .travel/books/corpus.parquet --tokenizer .travel/books/tokenizer ...

`corpus.parquet` holds each document's text unchanged, which leaves sentence splitting, NSP and masking to the
recipe's options and, compressed, is smaller than raw 16-bit ids (benchmarks/LOG.md, "The travelling corpus and the
GPU study's budget"). `manifest.json` records the sources' and the corpus' sha256, which `--check` verifies.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub.utils.sha import sha_fileobj

from ..atomic import write_text
from .corpus import CorpusError, load_corpus
from .wordpiece import save_tokenizer, train_wordpiece

CORPUS_FILE = "corpus.parquet"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "manifest.json"
SOURCES_FILE = "SOURCES.tsv"
COMPRESSION_LEVEL = 19  # zstd: on English books near xz and far ahead of level 9 (benchmarks/LOG.md, travelling corpus)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return sha_fileobj(f).hex()


def count_tokens(tokenizer, texts, batch: int = 16) -> int:
    """WordPiece tokens of `texts`, special tokens not counted."""
    backend = tokenizer.backend_tokenizer
    return sum(
        len(encoding.ids)
        for start in range(0, len(texts), batch)
        for encoding in backend.encode_batch(texts[start : start + batch], add_special_tokens=False)
    )


def build(
    source: Path,
    output: Path,
    *,
    document_boundary: str = "file",
    vocab_size: int = 30522,
    lowercase: bool = True,
    provenance: str = "",
    command: list[str] | None = None,
) -> dict:
    """Write corpus.parquet, tokenizer/ and manifest.json into `output` from the *.txt files below `source`."""
    files = sorted(p for p in source.rglob("*.txt") if p.is_file()) if source.is_dir() else []
    if not files:
        raise CorpusError(f"{source}: no .txt files below it (pass the folder that holds the text files).")
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise CorpusError(f"{output} exists and is not an empty folder: pass a new one (nothing is overwritten).")
    documents = load_corpus([str(f) for f in files], document_boundary=document_boundary).flatten_indices()
    texts = documents["text"]
    output.mkdir(parents=True, exist_ok=True)
    tokenizer = train_wordpiece(iterator=texts, vocab_size=vocab_size, lowercase=lowercase, show_progress=False)
    save_tokenizer(tokenizer, output / TOKENIZER_DIR)
    pq.write_table(
        pa.table({"text": texts}),
        output / CORPUS_FILE,
        compression="zstd",
        compression_level=COMPRESSION_LEVEL,
        use_dictionary=False,
    )
    if (source / SOURCES_FILE).is_file():
        shutil.copyfile(source / SOURCES_FILE, output / SOURCES_FILE)
    manifest = {
        "command": command or [],
        "provenance": provenance,
        "document_boundary": document_boundary,
        "documents": len(texts),
        "text_bytes": sum(len(t.encode()) for t in texts),
        "tokens": count_tokens(tokenizer, texts),
        "vocab_size": len(tokenizer),
        "lowercase": lowercase,
        "corpus": {
            "file": CORPUS_FILE,
            "bytes": (output / CORPUS_FILE).stat().st_size,
            "sha256": sha256(output / CORPUS_FILE),
        },
        "sources": [
            {"file": str(f.relative_to(source)), "bytes": f.stat().st_size, "sha256": sha256(f)} for f in files
        ],
    }
    write_text(output / MANIFEST_FILE, json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest


def check(folder: Path) -> dict:
    """The manifest of a travelled corpus whose files arrived whole; CorpusError naming what is wrong otherwise."""
    manifest_path = folder / MANIFEST_FILE
    if not manifest_path.is_file():
        raise CorpusError(
            f"{folder} holds no {MANIFEST_FILE}: not a corpus built by python -m "
            "bert_repro.data.travel_corpus (or the copy is incomplete)."
        )
    manifest = json.loads(manifest_path.read_text())
    corpus = folder / manifest["corpus"]["file"]
    if not corpus.is_file() or sha256(corpus) != manifest["corpus"]["sha256"]:
        size = corpus.stat().st_size if corpus.is_file() else 0
        expected = manifest["corpus"]["bytes"]
        raise CorpusError(
            f"{corpus}: missing or not the file built ({size} bytes, {expected} expected, "
            "sha256 differs): copy it again."
        )
    if not (folder / TOKENIZER_DIR / "tokenizer.json").is_file():
        raise CorpusError(f"{folder / TOKENIZER_DIR} holds no tokenizer.json: copy the folder again.")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bert_repro.data.travel_corpus", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("source", type=Path, nargs="?", help="a folder of .txt files")
    parser.add_argument("output", type=Path, nargs="?", help="the folder to write (new or empty)")
    parser.add_argument("--check", type=Path, metavar="FOLDER", help="verify a built folder instead of building")
    parser.add_argument(
        "--document_boundary",
        default="file",
        choices=["file", "blank_line"],
        help="one document per file (books), or a blank line between documents",
    )
    parser.add_argument("--vocab_size", type=int, default=30522, help="WordPiece vocabulary size")
    parser.add_argument("--cased", action="store_true", help="a cased vocabulary (default: uncased)")
    parser.add_argument("--provenance", default="", help="where the text comes from and its licence")
    args = parser.parse_args(argv)
    try:
        if args.check:
            manifest = check(args.check)
            print(
                f"{args.check}: {manifest['documents']} documents, {manifest['tokens']:,} tokens, "
                f"{manifest['corpus']['bytes'] / 1e6:.1f} MB, sha256 verified"
            )
            return 0
        if args.source is None or args.output is None:
            parser.error("pass SOURCE and OUTPUT folders, or --check FOLDER")
        manifest = build(
            args.source,
            args.output,
            document_boundary=args.document_boundary,
            vocab_size=args.vocab_size,
            lowercase=not args.cased,
            provenance=args.provenance,
            command=["python", "-m", "bert_repro.data.travel_corpus", *(argv or sys.argv[1:])],
        )
    except CorpusError as err:
        print(f"travel_corpus: error: {err}", file=sys.stderr)
        return 2
    print(
        f"{args.output}: {manifest['documents']} documents, {manifest['text_bytes'] / 1e6:.1f} MB of text, "
        f"{manifest['tokens']:,} tokens, {CORPUS_FILE} {manifest['corpus']['bytes'] / 1e6:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
