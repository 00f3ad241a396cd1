#!/usr/bin/env bash
# Everything the project checks on a CUDA GPU, in one command, from the repository root:
#   0. probe: how long nvidia-smi, `import torch`, a first CUDA matmul and the imports of transformers / datasets
#      take on this machine (each under its own time limit: a machine where one of them hangs is found in minutes,
#      not after the whole budget);
#   1. the CUDA tests (`pytest -m cuda`: bf16/fp16, SDPA/FlashAttention, whole-model compile, fused AdamW, packing);
#   2. the pre-training throughput benchmark, ours vs transformers' best, BASE at 128 and 512, LARGE at 128;
#   3. a short real pre-training of the `small` preset on the shipped corpus in bf16, then a fine-tune of the
#      result on MRPC: proof that the GPU path trains, not only that it runs;
#   4. the studies that a CPU cannot afford (part `study`, `benchmarks/study_gpu.sh`, reads .travel/ made by
#      `bash benchmarks/corpus/travel.sh`: 152 MB of public-domain books and GLUE's MRPC and SST-2): does our
#      pre-training beat random initialisation at a GPU budget (`--study pretraining`), then Table 5 at that
#      budget, its MLM + NSP model reused (`--study table5`). Both resume: run the part again to continue.
# Results go to $RESULTS (default runs/gpu): progress.log (one line per step: start, seconds, exit code), each
# step's log, gpu_pretrain.json, the pre-training run with its training_curves.png, the fine-tune's results.md.
# Every step runs under a time limit (seconds, killed when it runs over; the next step still runs), and each part
# can be skipped:
#   PARTS="probe tests bench train study" RESULTS=runs/gpu MRPC=path/to/glue/MRPC TRAIN_STEPS=3000 \
#   BF16=true STUDY_PRESET=mini STUDY_STEPS=10000 \
#   PROBE_LIMIT=300 TESTS_LIMIT=600 BENCH_LIMIT=1800 TRAIN_LIMIT=1800 STUDY_LIMIT=1500 bash benchmarks/run_gpu.sh
# The benchmark reads real examples exported beforehand on any machine (the GPU machine needs no corpus):
#   (cd benchmarks && python gpu_pretrain.py --export ../.gpu)
set -uo pipefail
RESULTS=${RESULTS:-runs/gpu}
PARTS=${PARTS:-probe tests bench train}
EXAMPLES=${EXAMPLES:-.gpu}
MRPC=${MRPC:-}
TRAIN_STEPS=${TRAIN_STEPS:-3000}
SETTINGS=${SETTINGS:-base:128,base:512,large:128}
PROBE_LIMIT=${PROBE_LIMIT:-300} TESTS_LIMIT=${TESTS_LIMIT:-600} BENCH_LIMIT=${BENCH_LIMIT:-1800}
TRAIN_LIMIT=${TRAIN_LIMIT:-1800} STUDY_LIMIT=${STUDY_LIMIT:-1500}
BF16=${BF16:-true} STUDY_PRESET=${STUDY_PRESET:-mini} STUDY_STEPS=${STUDY_STEPS:-10000}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd) EXAMPLES=$(cd "$EXAMPLES" && pwd)  # absolute: the benchmark runs in benchmarks/
status=0

# step NAME LIMIT COMMAND...: run COMMAND with its output in $RESULTS/NAME.log, killed after LIMIT seconds;
# one line in progress.log when it starts and one when it ends, so a run cut short still says where it was.
step() {
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "$(date -u +%FT%TZ) start $name (limit ${limit}s)" | tee -a "$RESULTS/progress.log"
    timeout -s KILL "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    rc=$?
    [[ $rc -eq 137 ]] && echo "killed after ${limit}s" >>"$RESULTS/$name.log"
    echo "$(date -u +%FT%TZ) end   $name: exit $rc after $(($(date +%s) - start)) s" | tee -a "$RESULTS/progress.log"
    [[ $rc -eq 0 ]] || status=1
    return $rc
}

if [[ " $PARTS " == *" probe "* ]]; then
    step nvidia_smi 60 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    cat "$RESULTS/nvidia_smi.log"
    step import_torch "$PROBE_LIMIT" python -c "import torch; print(torch.__version__)" || exit 2
    step cuda_matmul "$PROBE_LIMIT" python -c "
import torch, time
assert torch.cuda.is_available(), 'no CUDA device'
x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16); torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): y = x @ x
torch.cuda.synchronize(); print(torch.cuda.get_device_name(), f'{20 * 2 * 4096**3 / (time.perf_counter() - t) / 1e12:.0f} TFLOP/s')" \
        || { echo "error: no working CUDA device (see $RESULTS/cuda_matmul.log)" >&2; exit 2; }
    cat "$RESULTS/cuda_matmul.log"
    step import_libraries "$PROBE_LIMIT" python -c "
import transformers, datasets, accelerate, bert_repro
print('transformers', transformers.__version__, 'datasets', datasets.__version__, 'accelerate', accelerate.__version__)"
    cat "$RESULTS/import_libraries.log"
fi

if [[ " $PARTS " == *" tests "* ]]; then
    step cuda_tests "$TESTS_LIMIT" python -m pytest -m cuda -q -rs -p no:cacheprovider tests/test_cuda.py
    tail -5 "$RESULTS/cuda_tests.log"
fi

if [[ " $PARTS " == *" bench "* ]]; then
    pushd benchmarks >/dev/null  # gpu_pretrain.py imports its neighbour common.py
    step gpu_pretrain "$BENCH_LIMIT" python gpu_pretrain.py --examples "$EXAMPLES" --out "$RESULTS/gpu_pretrain.json" \
        --settings "$SETTINGS"
    popd >/dev/null
    grep -v '^W[0-9]' "$RESULTS/gpu_pretrain.log" | tail -30
fi

if [[ " $PARTS " == *" train "* ]]; then
    # The quick start's corpus and schedule shape, at the `small` size and the paper's batch of 256.
    step pretrain_small "$TRAIN_LIMIT" python recipes/pretrain.py --config recipes/configs/quickstart.yaml \
        --preset small --vocab_size 30522 --output_dir "$RESULTS/pretrain_small" --overwrite_output_dir true \
        --bf16 true --global_batch_size 256 --per_device_train_batch_size 256 --learning_rate 5e-4 \
        --warmup_steps 300 --max_steps "$TRAIN_STEPS" --logging_steps 50 --eval_steps 500 --save_steps 1000 \
        --dataloader_num_workers 4 --disable_tqdm true
    tail -15 "$RESULTS/pretrain_small.log"
    if [[ -n "$MRPC" && -f "$RESULTS/pretrain_small/model.safetensors" ]]; then
        step mrpc "$TRAIN_LIMIT" python recipes/finetune.py --task mrpc --model "$RESULTS/pretrain_small" \
            --data "$MRPC" --output_dir "$RESULTS/mrpc" --bf16 true --learning_rates 5e-5 3e-5 --disable_tqdm true
        tail -15 "$RESULTS/mrpc.log"
    fi
fi
if [[ " $PARTS " == *" study "* ]]; then
    for study in pretraining table5; do
        step "study_$study" "$STUDY_LIMIT" env STUDY=$study RESULTS="$RESULTS" PRESET="$STUDY_PRESET" \
            STEPS="$STUDY_STEPS" BF16="$BF16" bash benchmarks/study_gpu.sh
        cat "$RESULTS/study_$study/study.md" 2>/dev/null
    done
fi
exit $status
