#!/usr/bin/env bash
# Recreates .travel/, what a GPU machine without a network needs besides the code for the studies:
#   bash benchmarks/corpus/travel.sh path/to/Gutenberg_Text path/to/glue [.travel]
# - books/: 152 MB of public-domain English books as one compressed Parquet file, its WordPiece vocabulary
#   and a manifest (python -m bert_repro.data.travel_corpus); path/to/Gutenberg_Text is a checkout of the
#   GitHub repository rcdm-uga/Gutenberg_Text at commit a0b16d35a9851168ce9ac649851c17b7ab08d48e
#   (benchmarks/corpus/gutenberg_books.py says which books are taken and why);
# - glue/MRPC, glue/SST-2: the training and dev files of the two tasks (path/to/glue holds MRPC/ and SST-2/ in
#   GLUE's layout; their test files are not needed: the study predicts no test set).
# - glue/QNLI, glue/SQuAD (Table 5), when TASK_MIRRORS holds the snapshots that benchmarks/corpus/task_data.json
#   pins: fixed subsets built by benchmarks/corpus/task_data.py, each file's SHA-256 checked (STUDY=1
#   benchmarks/gpu/prepare_gpu.sh builds them into .travel/glue when they are not there).
# The folder is ignored by git (never committed); it travels with the code (a device call's `carry`, rsync).
set -euo pipefail
collection=$1 glue=$2 out=${3:-.travel}
python=${PYTHON:-python}
if [[ -e "$out/books" ]]; then
    echo "error: $out/books exists: remove it first (nothing is overwritten)" >&2
    exit 2
fi
books=$(mktemp -d)
trap 'rm -rf "$books"' EXIT
"$python" benchmarks/corpus/gutenberg_books.py "$collection" "$books/books" --author_mb 3.0
"$python" -m bert_repro.data.travel_corpus "$books/books" "$out/books" --document_boundary file --provenance \
    "Project Gutenberg eBooks of 47 English-language authors who died before 1956 (public domain in \
the US, and wherever copyright lasts the author's life + 70 years or less), from the GitHub repository \
rcdm-uga/Gutenberg_Text at commit a0b16d35a9851168ce9ac649851c17b7ab08d48e, picked and stripped of \
Project Gutenberg's header, licence and footer by benchmarks/corpus/gutenberg_books.py --author_mb 3.0; \
SOURCES.tsv lists every book."
for task in MRPC SST-2; do
    mkdir -p "$out/glue/$task"
    cp "$glue/$task/train.tsv" "$glue/$task/dev.tsv" "$out/glue/$task/"
done
if [[ -n ${TASK_MIRRORS:-} ]]; then
    "$python" benchmarks/corpus/task_data.py build "$TASK_MIRRORS" "$out/glue"
fi
du -sh "$out"/* "$out"
