#!/usr/bin/env bash
# Everything the project checks on a CUDA GPU, in one command, from the repository root:
#   1. the CUDA tests (`pytest -m cuda`: bf16/fp16, SDPA/FlashAttention, whole-model compile, fused AdamW, packing);
#   2. the pre-training throughput benchmark, ours vs transformers' best, BASE at 128 and 512, LARGE at 128;
#   3. a short real pre-training of the `small` preset on the shipped corpus in bf16, then a fine-tune of the
#      result on MRPC: proof that the GPU path trains, not only that it runs.
# Results go to $RESULTS (default runs/gpu): logs, gpu_pretrain.json, the pre-training run with its
# training_curves.png, the fine-tune's results.md. About 25 minutes on one H100 (not yet measured); each part
# can be skipped:
#   PARTS="tests bench train" RESULTS=runs/gpu MRPC=path/to/glue/MRPC TRAIN_STEPS=3000 bash benchmarks/run_gpu.sh
# The benchmark reads real examples exported beforehand on any machine (the GPU machine needs no corpus):
#   (cd benchmarks && python gpu_pretrain.py --export ../.gpu)
set -uo pipefail
RESULTS=${RESULTS:-runs/gpu}
PARTS=${PARTS:-tests bench train}
EXAMPLES=${EXAMPLES:-.gpu}
MRPC=${MRPC:-}
TRAIN_STEPS=${TRAIN_STEPS:-3000}
SETTINGS=${SETTINGS:-base:128,base:512,large:128}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd) EXAMPLES=$(cd "$EXAMPLES" && pwd)  # absolute: the benchmark runs in benchmarks/
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(), torch.__version__)" \
    || { echo "error: no CUDA device visible to torch" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$RESULTS/device.txt"
status=0

if [[ " $PARTS " == *" tests "* ]]; then
    python -m pytest -m cuda -q -rs tests/test_cuda.py 2>&1 | tee "$RESULTS/cuda_tests.log" || status=1
fi

if [[ " $PARTS " == *" bench "* ]]; then
    (cd benchmarks && python gpu_pretrain.py --examples "$EXAMPLES" --out "$RESULTS/gpu_pretrain.json" --settings "$SETTINGS") \
        2>&1 | tee "$RESULTS/gpu_pretrain.log" || status=1
fi

if [[ " $PARTS " == *" train "* ]]; then
    # The quick start's corpus and schedule shape, at the `small` size and the paper's batch of 256.
    python recipes/pretrain.py --config recipes/configs/quickstart.yaml --preset small --vocab_size 30522 \
        --output_dir "$RESULTS/pretrain_small" --overwrite_output_dir true --bf16 true \
        --global_batch_size 256 --per_device_train_batch_size 256 --learning_rate 5e-4 --warmup_steps 300 \
        --max_steps "$TRAIN_STEPS" --logging_steps 50 --eval_steps 500 --save_steps 1000 \
        --dataloader_num_workers 4 2>&1 | tee "$RESULTS/pretrain_small.log" || status=1
    if [[ -n "$MRPC" && -f "$RESULTS/pretrain_small/model.safetensors" ]]; then
        python recipes/finetune.py --task mrpc --model "$RESULTS/pretrain_small" --data "$MRPC" \
            --output_dir "$RESULTS/mrpc" --bf16 true --learning_rates 5e-5 3e-5 2>&1 | tee "$RESULTS/mrpc.log" || status=1
    fi
fi
exit $status
