"""Pick public-domain English books from a checkout of a Project Gutenberg collection, boilerplate removed.

    python benchmarks/corpus/gutenberg_books.py path/to/Gutenberg_Text path/to/books --author_mb 3.0

The collection read is one folder per author ("Austen, Jane/Emma.txt"), as in the GitHub repository
rcdm-uga/Gutenberg_Text (Project Gutenberg's 100 most read authors of one day, English texts only; README.md
of this project, "A corpus that travels", names the commit). Only works written in English by the authors of
`AUTHORS` are taken: all of them died before 1956, so their works are in the public domain in the US (Project
Gutenberg's own test) and wherever copyright lasts the author's life + 70 years or less; translations are left
out (a translator's copyright is a second one to check). Each author gives books in the order of their names
until `--author_mb` of text, so that no author dominates. From each book the Project Gutenberg header, licence
and footer are removed (only the text between its START and END lines is kept; a file without them is
skipped), and a book already taken (the same text) is not taken twice. Writes one .txt per book and
SOURCES.tsv (author, died, file, source path, bytes, sha256 of the text kept).
"""

import argparse
import hashlib
import re
import sys
from pathlib import Path

# Folder name in the collection -> year of death. English-language authors only.
AUTHORS = {
    "Alcott, Louisa May": 1888,
    "Alger, Horatio, Jr.": 1899,
    "Austen, Jane": 1817,
    "Barrie, J. M. (James Matthew)": 1937,
    "Baum, L. Frank (Lyman Frank)": 1919,
    "Blackwood, Algernon": 1951,
    "Brontë, Charlotte": 1855,
    "Burnett, Frances Hodgson": 1924,
    "Burroughs, Edgar Rice": 1950,
    "Burton, Richard Francis, Sir": 1890,
    "Carroll, Lewis": 1898,
    "Chesterton, G. K. (Gilbert Keith)": 1936,
    "Collins, Wilkie": 1889,
    "Conrad, Joseph": 1924,
    "Darwin, Charles": 1882,
    "Defoe, Daniel": 1731,
    "Dickens, Charles": 1870,
    "Doyle, Arthur Conan": 1930,
    "Franklin, Benjamin": 1790,
    "Gibbon, Edward": 1794,
    "Hardy, Thomas": 1928,
    "Hawthorne, Nathaniel": 1864,
    "Henty, G. A. (George Alfred)": 1902,
    "Irving, Washington": 1859,
    "James, Henry": 1916,
    "Joyce, James": 1941,
    "Kipling, Rudyard": 1936,
    "Lang, Andrew": 1912,
    "London, Jack": 1916,
    "Melville, Herman": 1891,
    "Milton, John": 1674,
    "Montgomery, L. M. (Lucy Maud)": 1942,
    "Nesbit, E. (Edith)": 1924,
    "Poe, Edgar Allan": 1849,
    "Pope, Alexander": 1744,
    "Scott, Walter": 1832,
    "Shakespeare, William": 1616,
    "Shelley, Mary Wollstonecraft": 1851,
    "Stevenson, Robert Louis": 1894,
    "Stoker, Bram": 1912,
    "Swift, Jonathan": 1745,
    "Thoreau, Henry David": 1862,
    "Trollope, Anthony": 1882,
    "Twain, Mark": 1910,
    "Wells, H. G. (Herbert George)": 1946,
    "Wharton, Edith": 1937,
    "Wilde, Oscar": 1900,
}
START = re.compile(r"^\*\*\* ?START OF (THIS|THE) PROJECT GUTENBERG", re.IGNORECASE | re.MULTILINE)
END = re.compile(
    r"^\*\*\* ?END OF (THIS|THE) PROJECT GUTENBERG|^End of (the )?Project Gutenberg", re.IGNORECASE | re.MULTILINE
)


def book_text(raw: str) -> str | None:
    """The text between Project Gutenberg's START and END lines, or None when the file has no such lines."""
    start, end = START.search(raw), END.search(raw)
    if start is None or end is None or end.start() < start.end():
        return None
    text = raw[raw.index("\n", start.end()) + 1 : end.start()]
    return text.strip() + "\n" if text.strip() else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("collection", type=Path, help="a checkout of the collection (one folder per author)")
    parser.add_argument("output", type=Path, help="where the books go (a new or empty folder)")
    parser.add_argument("--author_mb", type=float, default=3.0, help="text taken from each author, in MB")
    args = parser.parse_args()
    missing = [a for a in AUTHORS if not (args.collection / a).is_dir()]
    if missing:
        print(
            f"error: {args.collection} has no folder {missing[0]!r} (and {len(missing) - 1} more missing): "
            "pass a checkout of the collection",
            file=sys.stderr,
        )
        return 2
    if args.output.exists() and any(args.output.iterdir()):
        print(f"error: {args.output} is not empty: pass a new folder", file=sys.stderr)
        return 2
    args.output.mkdir(parents=True, exist_ok=True)
    seen, rows, skipped = set(), [], 0
    for author, died in AUTHORS.items():
        taken = 0
        for path in sorted((args.collection / author).glob("*.txt")):
            if taken >= args.author_mb * 1e6:
                break
            text = book_text(path.read_text(encoding="utf-8", errors="replace"))
            digest = hashlib.sha256((text or "").encode()).hexdigest()
            if text is None or digest in seen:
                skipped += 1
                continue
            seen.add(digest)
            name = f"{len(rows):04d}-{re.sub(r'[^A-Za-z0-9]+', '-', path.stem)[:60].strip('-')}.txt"
            (args.output / name).write_text(text, encoding="utf-8")
            taken += len(text.encode())
            source = path.relative_to(args.collection)
            rows.append(f"{author}\t{died}\t{name}\t{source}\t{len(text.encode())}\t{digest}")
    header = "author\tdied\tfile\tsource\tbytes\tsha256\n"
    (args.output / "SOURCES.tsv").write_text(header + "\n".join(rows) + "\n")
    total = sum(int(r.split("\t")[4]) for r in rows)
    print(
        f"{len(rows)} books from {len(AUTHORS)} authors, {total / 1e6:.1f} MB, in {args.output} "
        f"({skipped} files skipped: no Project Gutenberg START/END lines, or a text already taken)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
