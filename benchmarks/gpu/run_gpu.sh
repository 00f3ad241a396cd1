#!/usr/bin/env bash
# Everything the project checks on a CUDA GPU, in one command that cannot hang: `bash benchmarks/gpu/run_gpu.sh`.
# Made for a GPU machine lent for minutes, without network (where a connection does not fail but hangs):
# `bash benchmarks/gpu/prepare_gpu.sh`, on a machine with PyPI, first puts what it needs into .gpu/.
# Parts (PARTS, run in this order):
#   probe  nvidia-smi, the Python that imports torch (`python` may be a symlink that loses its venv), the kit's
#          wheels whose packages that Python lacks (torchao's for the FP8 processes only), its torch against the
#          kit's (.gpu/kit.txt), then versions, imports and a first CUDA matrix product
#          (benchmarks/gpu/gpu_session.py probe). Without CUDA the parts below are skipped.
#   micro  (not by default) the step's parts alone (benchmarks/gpu/gpu_micro.py: SDPA backends with and without the mask
#          and FlashAttention varlen, dropout + residual + LayerNorm compiled against our kernels; FP8 linears at
#          BERT-BASE's shapes in a process of its own): micro.json and micro_fp8.json into OUT after every stage.
#   tests  the CUDA tests (`pytest -m cuda`: bf16/fp16, SDPA/FlashAttention, compile, fused AdamW, packing).
#   bench  the pre-training throughput benchmark (benchmarks/gpu/gpu_pretrain.py), one process per setting (BASE
#          at 128 and 512, LARGE at 128): ours against transformers' best (SDPA, bf16, compiled). BASE at 128
#          runs VARIANTS_128 (the speed round: today's best, each change alone, all together, the opt-ins, the
#          diagnostics), the others VARIANTS; every variant compiles afresh (CUDA-graph and FP8 ones in their own
#          process), its first step is checked against today's best's, and one whose record of what ran disagrees
#          with its label is marked invalid, not timed.
#          The speed round in one call: PARTS="probe micro bench profile" (benchmarks/gpu/README.md).
#   profile (not by default) where a step's time goes: BASE at 128, ours and transformers' compiled variants
#          (PROFILE_VARIANTS), torch.profiler's operator and kernel table of 3 warm steps each, in RESULTS/profile/.
#   train  a short real pre-training of the `small` preset on the shipped corpus in bf16, with BERT's
#          vocabulary, then an MRPC fine-tune of it (.gpu/MRPC or MRPC=path).
#   study  (not by default; .travel/ from `bash benchmarks/corpus/travel.sh`, carried along) what a CPU
#          cannot afford: our pre-training against random initialisation on 152 MB of public-domain books
#          (`--study pretraining` by benchmarks/gpu/study_gpu.sh, sized for one call: `PARTS="probe study"`), then
#          the pre-trained model into OUT as bf16 parts (`gpu_session.py pack`: pretrained.tar.0, .1, ...).
#   table5 (not by default) Table 5 at the study's budget (`--study table5` by benchmarks/gpu/study_gpu.sh): MLM + NSP,
#          No NSP and LTR & No NSP pre-trained alike, fine-tuned on MRPC, SST-2 and the QNLI and SQuAD subsets that
#          travel (benchmarks/corpus/task_data.py), 3 seeds; on a bare machine: `PARTS="probe table5"`.
#          Both studies resume: run the part again.
#   head_init (not by default; `HEAD_INIT=1 CONLL=dir bash benchmarks/gpu/prepare_gpu.sh` puts all-MiniLM-L6-v2 in
#          float16, CoNLL-2003 and SST-2 into the kit) how a new head is drawn, at full size
#          (benchmarks/head_init.py: HEAD_INIT_PARTS, both initialisers and the transformers script, 3 seeds,
#          HEAD_INIT_JOBS runs at once): head_init.json and head_init.png into OUT.
# Nothing reaches a network: the Hub, datasets, pip (no index) and telemetry are offline. Every step,
# nvidia-smi and the first imports included, runs in its own session under `timeout -s KILL`; what it leaves
# running is killed with it. The whole keeps to BUDGET seconds: each step's limit is its weight's share of
# what is left (the time one step does not use goes to the later ones); a step whose share is too small is
# skipped.
# Results: everything in RESULTS (default runs/gpu: logs, checkpoints). In OUT (the folder a device call
# returns; default RESULTS), written as the run goes: progress.log (a line per step's start and end),
# current.log (the running step's output), results.json (every figure, rewritten after each step), logs.tgz
# (logs and small outputs), summary.txt (at the end). Afterwards, on any machine:
#     python benchmarks/gpu/gpu_session.py record path/to/results.json  # -> benchmarks/results/, LOG.md, RESULTS.md
# Exit: 0 all ran, 1 a step failed or was killed, 2 no Python imports torch, 3 no CUDA (CUDA parts skipped).
# Environment (all optional):
#   PARTS="probe tests bench train" BUDGET=540 RESULTS=runs/gpu OUT=$RESULTS KIT=.gpu EXAMPLES=$KIT
#   MRPC=$KIT/MRPC SITE=/tmp/bert_repro_site (the wheels) PYTHON (tried before python3,
#   /opt/torch/.venv/bin/python3 and python) SETTINGS=base:128,base:512,large:128 VARIANTS (the benchmark's,
#   in order) TRAIN_STEPS=1000 BF16=true TRAVEL=.travel STUDY_ENV (more VAR=value for study_gpu.sh)
#   HEAD_INIT_PARTS=conll-full,sst2-full,conll-3k HEAD_INIT_SEEDS="42 43 44" HEAD_INIT_JOBS=14
#   PROBE_LIMIT=90 and TESTS_LIMIT, BENCH_LIMIT, TRAIN_LIMIT, STUDY_LIMIT, HEAD_INIT_LIMIT: caps on a step's
#   limit (seconds). DRY_RUN=1: without CUDA, every part at tiny sizes on the CPU (checks the kit anywhere).
# With time to spare, e.g.: BUDGET=7200 PARTS=study bash benchmarks/gpu/run_gpu.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
T0=$(date +%s)
BUDGET=${BUDGET:-540}
DEADLINE=$((T0 + BUDGET))
PARTS=" ${PARTS:-probe tests bench train} "
RESULTS=${RESULTS:-runs/gpu}
KIT=${KIT:-.gpu}
EXAMPLES=${EXAMPLES:-$KIT} MRPC=${MRPC:-$KIT/MRPC}
SETTINGS=${SETTINGS:-base:128,base:512,large:128}
# transformers' best first (the ratio's denominator), ours compiled, then the others while time is left
VARIANTS=${VARIANTS:-transformers sdpa bf16 compile,ours sparse bf16 compile,ours all bf16 compile graphs,\
ours all bf16 compile,transformers sdpa bf16}
# BASE at 128, the headline, in the order a cut loses least: the same two first, then each change alone against
# today's best, the saving the profile predicts largest first (LayerNorm + dropout + residual: 10.3 of 52.6 ms a step
# against a 4.3 ms floor; idle 2.4 ms for CUDA graphs; attention and the QKV GEMMs ~1 ms; FP8 at BERT-BASE's
# 768-wide GEMMs unsure, an opt-in of other numerics), then all together, the opt-ins, packing and the diagnostics.
# Each variant compiles afresh (gpu_pretrain.py); inductor's on-disk cache makes a graph compiled before quick again.
VARIANTS_128=${VARIANTS_128:-transformers sdpa bf16 compile,ours sparse bf16 compile,ours sparse fused-ln bf16 compile,\
ours sparse bf16 compile graphs,ours sparse qkv msdpa bf16 compile,ours sparse fp8 compile,ours all bf16 compile graphs,\
ours all fp8 compile graphs,ours all bf16-residual compile graphs,ours packed sparse bf16 compile,\
ours sparse bf16 compile cdt,ours sparse bf16 compile no-dropout,ours sparse bf16 compile fallback-random,\
transformers sdpa bf16}
PROFILE_VARIANTS=${PROFILE_VARIANTS:-ours all bf16 compile,ours sparse bf16 compile,transformers sdpa bf16 compile} \
    PROFILE_SETTING=base:128
TRAIN_STEPS=${TRAIN_STEPS:-1000} BF16=${BF16:-true} TRAVEL=${TRAVEL:-.travel} STUDY_ENV=${STUDY_ENV:-}
PROBE_LIMIT=${PROBE_LIMIT:-90} TESTS_LIMIT=${TESTS_LIMIT:-3600} BENCH_LIMIT=${BENCH_LIMIT:-3600}
TRAIN_LIMIT=${TRAIN_LIMIT:-3600} STUDY_LIMIT=${STUDY_LIMIT:-36000} DRY_RUN=${DRY_RUN:-0}
HEAD_INIT_PARTS=${HEAD_INIT_PARTS:-conll-full,sst2-full,conll-3k} HEAD_INIT_JOBS=${HEAD_INIT_JOBS:-14}
HEAD_INIT_SEEDS=${HEAD_INIT_SEEDS:-42 43 44}
HEAD_INIT_LIMIT=${HEAD_INIT_LIMIT:-3600}
SITE=${SITE:-/tmp/bert_repro_site} NO_FP8=0
mkdir -p "$RESULTS" "${OUT:=$RESULTS}" || exit 2
RESULTS=$(cd "$RESULTS" && pwd) OUT=$(cd "$OUT" && pwd)
EXAMPLES=$(cd "$EXAMPLES" 2>/dev/null && pwd || echo "$EXAMPLES")
MRPC=$(cd "$MRPC" 2>/dev/null && pwd || echo "$MRPC")
# what an earlier call on a warm machine left must not pass for this call's (the study resumes: kept)
rm -rf "$RESULTS"/*.log "$RESULTS"/probe.json "$RESULTS"/bench_*.json "$RESULTS"/profile* "$RESULTS"/pretrain_small \
    "$RESULTS"/mrpc "$RESULTS"/head_init
[[ -f $KIT/commit.txt ]] && cp "$KIT/commit.txt" "$RESULTS/"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    HF_HUB_DISABLE_IMPLICIT_TOKEN=1 DO_NOT_TRACK=1 WANDB_MODE=disabled \
    PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_RETRIES=0 PIP_DEFAULT_TIMEOUT=5 \
    PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false MPLBACKEND=Agg
COMMAND="PARTS=\"${PARTS:1:-1}\" BUDGET=$BUDGET SETTINGS=$SETTINGS TRAIN_STEPS=$TRAIN_STEPS \
DRY_RUN=$DRY_RUN${STUDY_ENV:+ STUDY_ENV=\"$STUDY_ENV\"} bash benchmarks/gpu/run_gpu.sh"
status=0

log() { echo "$(date -u +%T) +$(($(date +%s) - T0)) s $*" | tee -a "$RESULTS/progress.log"; }
has() { [[ $PARTS == *" $1 "* ]]; }
kill_session() {  # every process still in session $1 (field 6 of /proc/PID/stat; builtins only: quick)
    local p stat
    for p in /proc/[0-9]*; do
        read -r stat 2>/dev/null <"$p/stat" || continue
        stat=(${stat##*) })  # after the name in parentheses: state, parent, group, session
        [[ ${stat[3]} == "$1" ]] && kill -KILL "${p#/proc/}" 2>/dev/null
    done
}
report() {  # results.json and logs.tgz into OUT after every step: a run cut short returns what it measured
    [[ -n ${PY:-} ]] && timeout -s KILL 30 "$PY" benchmarks/gpu/gpu_session.py collect --results "$RESULTS" \
        --out "$OUT/results.json" --command "$COMMAND" >/dev/null 2>>"$RESULTS/collect.log"
    [[ $OUT == "$RESULTS" ]] && return
    cp -f "$RESULTS/progress.log" "$OUT/progress.log"
    (cd "$RESULTS" && find . -maxdepth 3 -type f -size -2M \( -name '*.log' -o -name '*.json' \
        -o -name '*.md' -o -name '*.png' -o -name '*.txt' \) -not -name 'tokenizer*' -not -name vocab.txt \
        -print0 | tar czf "$OUT/logs.tgz.tmp" --null -T -) && mv -f "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"
}
# step NAME LIMIT CMD...: CMD in its own session, killed after LIMIT seconds (cut to what is left of BUDGET),
# its output live in OUT/current.log, then in RESULTS/NAME.log; a line in progress.log at its start and end.
step() {
    local name=$1 limit=$2 left start rc sid
    shift 2
    left=$((DEADLINE - $(date +%s) - 10))
    ((limit > left)) && limit=$left
    if ((limit < 5)); then
        log "skip $name: budget spent (BUDGET=$BUDGET s)"
        return 124
    fi
    log "start $name (limit $limit s)"
    start=$(date +%s)
    # in a subshell that does not exec it: bash would print "Killed" for the timeout process that KILL ends
    (timeout -s KILL "$limit" setsid bash -c 'echo $$ >"$0"; exec "$@"' "$RESULTS/$name.sid" "$@" \
        >"$OUT/current.log" 2>&1 </dev/null; exit $?) 2>/dev/null
    rc=$?
    ((rc == 137)) && echo "KILLED: still running after $limit s" >>"$OUT/current.log"
    sid=$(cat "$RESULTS/$name.sid" 2>/dev/null) && [[ -n $sid ]] && kill_session "$sid"
    rm -f "$RESULTS/$name.sid"
    mv -f "$OUT/current.log" "$RESULTS/$name.log"
    log "end $name: exit $rc after $(($(date +%s) - start)) s"
    ((rc == 0)) || status=1
    report
    return $rc
}
# The CUDA steps share what is left of the budget by weight: WEIGHTS holds the weights of the steps still to
# run, in their order, and each step takes the first.
WEIGHTS=()
share() {  # share MIN CAP: sets L to this step's limit, or to 0 (skip) when its share is under MIN seconds
    local total=0 x left
    for x in "${WEIGHTS[@]}"; do total=$((total + x)); done
    left=$((DEADLINE - $(date +%s) - 25))  # 25 s: the summary and the last results.json
    L=$((total > 0 ? left * WEIGHTS[0] / total : 0))
    WEIGHTS=("${WEIGHTS[@]:1}")
    ((L > $2)) && L=$2
    ((L >= $1)) || L=0
}

log "run_gpu.sh: parts [${PARTS:1:-1}], budget $BUDGET s, OUT $OUT, RESULTS $RESULTS"

# --- probe --------------------------------------------------------------------------------------------------
CUDA=0
nvsmi=$(command -v nvidia-smi)
if [[ -n $nvsmi ]]; then
    step nvidia_smi $((PROBE_LIMIT / 3)) "$nvsmi" \
        --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
    log "no nvidia-smi on PATH"
fi
# The Python that imports torch (`python` may be a symlink that loses its venv), and whether it sees CUDA
PY=
n=0
for cand in ${PYTHON:-} python3 /opt/torch/.venv/bin/python3 python; do
    cand=$(command -v "$cand") || continue
    log "trying $cand"
    step import_torch_$((++n)) "$PROBE_LIMIT" "$cand" -c "import sys, torch; print(sys.executable, 'torch', \
torch.__version__, flush=True); sys.exit(0 if torch.cuda.is_available() else 3)"
    case $? in 0) PY=$cand CUDA=1 && break ;; 3) PY=$cand && break ;; esac
done
if [[ -z $PY ]]; then
    log "FATAL: no Python here imports torch (PYTHON=path to choose one)"
    cp "$RESULTS/progress.log" "$OUT/summary.txt"
    exit 2
fi
log "python: $PY"
status=0  # a Python without torch, or nvidia-smi, failing before is no failure of the run
# `python` and `python3` for the steps below (a symlink to a venv's python loses the venv)
mkdir -p "$RESULTS/bin"
for n in python python3; do
    printf '#!/bin/sh\nexec %s "$@"\n' "$PY" >"$RESULTS/bin/$n" && chmod +x "$RESULTS/bin/$n"
done
export PATH=$RESULTS/bin:$PATH PYTHONPATH=$ROOT
# The kit's wheels, unpacked (no pip: a venv may lack it; nothing resolved, no index), each only where this Python
# lacks its package: .gpu/wheels (datasets and two of its dependencies) into SITE, on every step's path; .gpu/fp8
# (torchao) into FP8_PATH, on the path of the FP8 processes only (transformers imports torchao wherever it finds it:
# one that fails to load would break every step)
UNPACK="import importlib.util as u, sys, zipfile
for w in sys.argv[2:]:
    name = w.rsplit('/', 1)[-1].split('-')[0]
    if u.find_spec(name) is None:
        zipfile.ZipFile(w).extractall(sys.argv[1])
        print('unpacked', w)
    else:
        print('the image has', name, '(its own kept)')"
export FP8_PATH=${SITE}_fp8
rm -rf "$SITE" "$FP8_PATH"
if compgen -G "$KIT/wheels/*.whl" >/dev/null; then
    step wheels "$PROBE_LIMIT" "$PY" -c "$UNPACK" "$SITE" "$KIT"/wheels/*.whl && export PYTHONPATH=$SITE:$ROOT
fi
compgen -G "$KIT/fp8/*.whl" >/dev/null && step wheels_fp8 "$PROBE_LIMIT" "$PY" -c "$UNPACK" "$FP8_PATH" "$KIT"/fp8/*.whl
timeout -s KILL 30 "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('datasets') is None)" ||
    log "no datasets and no $KIT/wheels: run benchmarks/gpu/prepare_gpu.sh first and carry $KIT"
# The image's torch against the one the kit was prepared for (.gpu/kit.txt): below the project's least, stop; another
# minor version, go on without the FP8 variants (torchao's wheel is chosen for the kit's torch)
TORCH=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null)
KIT_TORCH=$(sed -n 's/^torch=//p' "$KIT/kit.txt" 2>/dev/null)
log "torch $TORCH here; the kit was prepared for torch ${KIT_TORCH:-?}"
if [[ $(printf '%s\n' 2.4 "$TORCH" | sort -V | head -1) != 2.4 ]]; then
    log "FATAL: torch $TORCH here, the project needs torch >= 2.4"
    cp "$RESULTS/progress.log" "$OUT/summary.txt"
    exit 2
fi
if [[ -n $KIT_TORCH && $(cut -d. -f1,2 <<<"$TORCH") != $(cut -d. -f1,2 <<<"$KIT_TORCH") ]]; then
    log "torch $TORCH is not the kit's $KIT_TORCH: the FP8 variants and micro's fp8 stage are left out"
    NO_FP8=1
fi
if has probe; then
    step probe "$PROBE_LIMIT" "$PY" benchmarks/gpu/gpu_session.py probe --out "$RESULTS/probe.json"
    case $? in 0) ;; 3) status=0 ;; *) log "the probe failed or hung: see probe.log; going on" ;; esac
fi
# Sizes: the real ones on CUDA; tiny ones on the CPU under DRY_RUN=1, which checks every step's command
if ((CUDA)); then
    DEVICE=(--device cuda) PRESET=small BATCH=256 PRE=(--bf16 true) FINE=(--bf16 true) BENCH=() HEAD_INIT_MORE=(--seeds $HEAD_INIT_SEEDS)
elif ((DRY_RUN)); then
    log "no CUDA: DRY_RUN=1, every part at tiny sizes on the CPU"
    SETTINGS=tiny:128 PROFILE_SETTING=tiny:128 TRAIN_STEPS=4 VARIANTS="transformers sdpa bf16,ours sdpa bf16" PRESET=tiny BATCH=8
    VARIANTS_128="transformers sdpa bf16,ours sparse bf16 compile graphs,ours all fp8 compile graphs"
    PROFILE_VARIANTS="ours all bf16 compile"
    export TRITON_INTERPRET=1  # our Triton kernels on the CPU
    DEVICE=(--device cpu) BENCH=(--batch_128 1 --steps 1 --warmup 1 --rounds 1) BF16=false
    STUDY_ENV="PRESET=tiny STEPS=4 BATCH=8 MICRO=8 CPU=1 WORKERS=1 NUM_PROC=2 SEEDS='1 2' JOBS=2 \
FINETUNE_MORE='--max_train_samples 64 --max_eval_samples 64' PRETRAIN_MORE='--max_documents 8' $STUDY_ENV"
    PRE=(--use_cpu true --corpus recipes/data/quickstart_corpus/state_union --num_proc 2 --logging_steps 1
        --eval_steps 2 --eval_max_examples 32)
    FINE=(--use_cpu true --max_train_samples 64 --max_eval_samples 64 --num_train_epochs 1)
    HEAD_INIT_MORE=(--max_rows 48 --seeds 1 2) HEAD_INIT_JOBS=2
else
    log "no CUDA: the parts tests, bench, train and study are skipped (DRY_RUN=1 runs them on the CPU)"
    PARTS=" "
fi

if ((NO_FP8)); then
    VARIANTS=$(tr , '\n' <<<"$VARIANTS" | grep -v fp8 | paste -sd,)
    VARIANTS_128=$(tr , '\n' <<<"$VARIANTS_128" | grep -v fp8 | paste -sd,)
fi

# --- the CUDA parts -----------------------------------------------------------------------------------------
# Weights: the CUDA tests 3; BASE at 128 (the headline figure) 6, another setting 4; pre-training 5, MRPC 2.
has head_init && WEIGHTS+=(7)
has micro && WEIGHTS+=(2 1)
has tests && WEIGHTS+=(3)
has bench && for s in ${SETTINGS//,/ }; do [[ $s == base:128 || $s == tiny:128 ]] && WEIGHTS+=(8) || WEIGHTS+=(3); done
has profile && WEIGHTS+=(5)
has train && WEIGHTS+=(5 2)
has study && WEIGHTS+=(20 1)
has table5 && WEIGHTS+=(10)

if has head_init; then
    share 60 "$HEAD_INIT_LIMIT"
    if [[ ! -f $KIT/minilm/model.safetensors || ! -f $KIT/head_init_data.tgz ]]; then
        log "skip head_init: no $KIT/minilm or $KIT/head_init_data.tgz (HEAD_INIT=1 CONLL=dir bash benchmarks/gpu/prepare_gpu.sh)"
        status=1
    elif ((L)); then
        mkdir -p "$RESULTS/head_init/data" && tar xzf "$KIT/head_init_data.tgz" -C "$RESULTS/head_init/data"
        hi=("$PY" benchmarks/head_init.py --source "$KIT/minilm" --conll "$RESULTS/head_init/data/conll"
            --glue "$RESULTS/head_init/data/glue" --parts "$HEAD_INIT_PARTS" --transformers --out "$RESULTS/head_init"
            "${HEAD_INIT_MORE[@]}")
        step head_init "$L" "${hi[@]}" --jobs "$HEAD_INIT_JOBS"
        # cut at its limit: the tables of the runs that finished
        (($? == 0)) || step head_init_report 60 "${hi[@]}" --report_only
        cp -f "$RESULTS"/head_init/head_init.{json,png} "$OUT/" 2>/dev/null
    else log "skip head_init: budget spent"; fi
fi
if has micro; then
    share 30 "$BENCH_LIMIT"
    if ((L)); then step micro "$L" "$PY" benchmarks/gpu/gpu_micro.py --out "$OUT/micro.json" "${DEVICE[@]}" \
        --stages layer_norm,attention
    else log "skip micro: budget spent"; fi
    share 20 "$BENCH_LIMIT"  # torchao's stage in a process of its own, torchao on its path only
    if ((L && !NO_FP8)); then step micro_fp8 "$L" env PYTHONPATH="$FP8_PATH:$PYTHONPATH" "$PY" \
        benchmarks/gpu/gpu_micro.py --out "$OUT/micro_fp8.json" "${DEVICE[@]}" --stages fp8
    else log "skip micro_fp8: budget spent or FP8 left out"; fi
fi
if has tests; then
    share 20 "$TESTS_LIMIT"
    if ((L)); then step cuda_tests "$L" "$PY" -m pytest -m cuda -v -rs -p no:cacheprovider tests/model/test_cuda.py
    else log "skip cuda_tests: budget spent"; fi
fi
if has bench; then
    for s in ${SETTINGS//,/ }; do
        share 30 "$BENCH_LIMIT"
        ((L)) || { log "skip bench_${s/:/_}: budget spent"; continue; }
        # one process per setting, its JSON rewritten after each variant: one cut short keeps what it measured
        [[ $s == *:128 && $s != large:* ]] && variants=$VARIANTS_128 || variants=$VARIANTS
        step "bench_${s/:/_}" "$L" "$PY" benchmarks/gpu/gpu_pretrain.py --examples "$EXAMPLES" --settings "$s" \
            --out "$RESULTS/bench_${s/:/_}.json" --variants "$variants" "${DEVICE[@]}" "${BENCH[@]}"
    done
fi
if has profile; then
    share 30 "$BENCH_LIMIT"
    if ((L)); then step profile_base_128 "$L" "$PY" benchmarks/gpu/gpu_pretrain.py --examples "$EXAMPLES" \
        --settings "$PROFILE_SETTING" --variants "$PROFILE_VARIANTS" --steps 6 --rounds 1 --profile "$RESULTS/profile" \
        --out "$RESULTS/profile_base_128.json" "${DEVICE[@]}" "${BENCH[@]}"
        # the split of the step's time by kind, into results.json (`record` files it)
        step profile_split 60 "$PY" benchmarks/gpu/profile_split.py "$RESULTS" --out "$RESULTS/profile_split.json"
    else log "skip profile_base_128: budget spent"; fi
fi
if has train; then
    share 60 "$TRAIN_LIMIT"
    # The quick start's corpus and schedule shape at the `small` size, the paper's batch of 256, BERT's
    # uncased vocabulary (exported with the benchmark's examples): no WordPiece training on the clock. A
    # checkpoint every quarter, so that a run stopped at its limit still leaves a model to fine-tune.
    ((L)) && step pretrain_small "$L" "$PY" recipes/pretrain.py --config recipes/configs/quickstart.yaml \
        --preset "$PRESET" --tokenizer "$EXAMPLES/tokenizer" --output_dir "$RESULTS/pretrain_small" \
        --overwrite_output_dir true --global_batch_size "$BATCH" --per_device_train_batch_size "$BATCH" \
        --learning_rate 5e-4 --warmup_steps $((TRAIN_STEPS / 10)) --max_steps "$TRAIN_STEPS" \
        --logging_steps 25 --eval_steps $((TRAIN_STEPS / 2)) --save_steps $((TRAIN_STEPS / 4)) \
        --dataloader_num_workers 4 --disable_tqdm true "${PRE[@]}"
    ((L)) || log "skip pretrain_small: budget spent"
    model=$RESULTS/pretrain_small
    [[ -f $model/model.safetensors ]] ||
        model=$(ls -d "$RESULTS"/pretrain_small/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1)
    share 30 "$TRAIN_LIMIT"
    if [[ -z $model || ! -f $model/model.safetensors ]]; then log "skip mrpc: no pre-trained model"
    elif [[ ! -f $MRPC/train.tsv ]]; then log "skip mrpc: no $MRPC/train.tsv (MRPC=path to GLUE's MRPC)"
    elif ((L)); then
        step mrpc "$L" "$PY" recipes/finetune.py --task mrpc --model "$model" --data "$MRPC" \
            --output_dir "$RESULTS/mrpc" --learning_rates 1e-4 --no_predict_test --disable_tqdm true \
            "${FINE[@]}"
    else log "skip mrpc: budget spent"; fi
fi
if (has study || has table5) && [[ ! -f $TRAVEL/books/manifest.json ]]; then
    log "skip study: needs $TRAVEL/books and $TRAVEL/glue (bash benchmarks/corpus/travel.sh, carried along)"
    status=1
    PARTS=${PARTS/ study / } PARTS=${PARTS/ table5 / }
fi
# benchmarks/gpu/study_gpu.sh: the travelling books, the full SST-2 and MRPC training sets; it resumes.
study() {  # study NAME: one study_gpu.sh run as a step
    share 60 "$STUDY_LIMIT"
    if ((L)); then
        eval "step study_$1 $L env STUDY=$1 TRAVEL=$TRAVEL RESULTS=$RESULTS PYTHON=$PY BF16=$BF16 $STUDY_ENV \
            bash benchmarks/gpu/study_gpu.sh"
    else log "skip study_$1: budget spent"; fi
}
if has study; then
    study pretraining
    model=$RESULTS/study_pretraining/pretrain/pretrained
    share 10 120
    if [[ -f $model/model.safetensors ]] && ((L)); then
        step pack_pretrained "$L" "$PY" benchmarks/gpu/gpu_session.py pack "$model" "$OUT/pretrained"
    else log "skip pack_pretrained: no pre-trained model or budget spent"; fi
fi
has table5 && study table5

# --- summary ------------------------------------------------------------------------------------------------
((CUDA || DRY_RUN)) || log "no CUDA: nothing was measured on a GPU"
log "done: $(($(date +%s) - T0)) s of $BUDGET s"
report
{
    cat "$RESULTS/progress.log"
    # a variant whose record disagreed with its label (gpu_pretrain.py): named at the top, whatever the logs' length
    grep -h "INVALID\|FAILED" "$RESULTS"/bench_*.log "$RESULTS"/profile_base_128.log 2>/dev/null
    for f in nvidia_smi probe wheels wheels_fp8 micro micro_fp8 head_init head_init_report cuda_tests bench_base_128 bench_base_512 \
        bench_large_128 profile_base_128 profile_split pretrain_small mrpc study_pretraining pack_pretrained study_table5; do
        [[ -f $RESULTS/$f.log ]] || continue
        echo "----- $f.log (end)"
        grep -v "^W[0-9]" "$RESULTS/$f.log" | tail -n 15
    done
} >"$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
((CUDA || DRY_RUN)) || exit 3
exit $status
