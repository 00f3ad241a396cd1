#!/usr/bin/env bash
# One study on a GPU machine without a network, in one command, from the repository root:
#   STUDY=pretraining bash benchmarks/study_gpu.sh   # our pre-training against random initialisation
#   STUDY=table5 bash benchmarks/study_gpu.sh        # then Table 5, its MLM + NSP model taken from the first
# Reads $TRAVEL (default .travel, made by `bash benchmarks/corpus/travel.sh`, carried with the code): books/,
# the pre-training text, verified first, and glue/MRPC, glue/SST-2, fine-tuned on their full training sets.
# Writes $RESULTS/study_$STUDY/study.md, study.json and study.png after every finished run. A command cut by a
# time limit resumes when run again: finished runs are kept, an interrupted pre-training continues from its
# last checkpoint (every SAVE_STEPS steps).
# The budget (sized for one 9-minute call on one H100 or H200; benchmarks/README.md "The study in one GPU
# call" says how it was chosen and what it measured): PRESET=small, STEPS=6000 of BATCH=256 sequences of 128
# tokens (MICRO per device), LEARNING_RATE=5e-4 (at 1e-3 the unigram plateau took twice as long), bf16,
# RoBERTa's dynamic masking (fresh masks every batch) over DUPE=2 passes of sentence pairs
# (instead of the paper's 10 static passes: no building time for masks); fine-tuning: one learning rate per
# initialisation, fixed ahead (no grid): FINETUNE_LR=3e-4 for the pre-trained models, RANDOM_LR (default the same)
# for the randomly initialised one; SEEDS="1 2 3" each its own run, JOBS=12 runs at once on the one GPU, MRPC 3
# epochs of 32, SST-2 one epoch of 64.
# tests/test_travel.py runs this same script on the CPU at a tiny budget and fixture text (a dry run).
set -euo pipefail
STUDY=${STUDY:-pretraining} TRAVEL=${TRAVEL:-.travel} RESULTS=${RESULTS:-runs/gpu} PYTHON=${PYTHON:-python}
PRESET=${PRESET:-small} STEPS=${STEPS:-6000} BATCH=${BATCH:-256} MICRO=${MICRO:-256} BF16=${BF16:-true}
SAVE_STEPS=${SAVE_STEPS:-1000} WORKERS=${WORKERS:-8} DUPE=${DUPE:-2} LEARNING_RATE=${LEARNING_RATE:-5e-4}
FINETUNE_LR=${FINETUNE_LR:-3e-4} RANDOM_LR=${RANDOM_LR:-${FINETUNE_LR:-3e-4}} SEEDS=${SEEDS:-1 2 3} JOBS=${JOBS:-12} NUM_PROC=${NUM_PROC:-$(nproc)}
# CPU=1: the dry run's switches (no CUDA, every run on the CPU)
CPU=${CPU:-0}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PYTHON" -m bert_repro.data.travel_corpus --check "$TRAVEL/books"
cpu=$([[ $CPU == 1 ]] && echo "--use_cpu true" || true)
pre="--preset $PRESET --corpus $TRAVEL/books/corpus.parquet --tokenizer $TRAVEL/books/tokenizer \
--dupe_factor $DUPE --static_masking false --bf16 $BF16 --global_batch_size $BATCH \
--per_device_train_batch_size $MICRO --max_steps $STEPS --warmup_steps $((STEPS / 10)) \
--learning_rate $LEARNING_RATE --logging_steps $(((STEPS + 99) / 100)) --eval_steps $(((STEPS + 4) / 5)) \
--save_steps $SAVE_STEPS --dataloader_num_workers $WORKERS --num_proc $NUM_PROC --disable_tqdm true $cpu"
fine="--bf16 $BF16 --learning_rates $FINETUNE_LR --no_predict_test --disable_tqdm true $cpu ${FINETUNE_MORE:-}"
per_key=("sst2=--num_train_epochs 1 --per_device_train_batch_size 64")
case $STUDY in
    pretraining) more=() per_key+=("random=--learning_rates $RANDOM_LR") ;;
    table5)
        model=$RESULTS/study_pretraining/pretrain/pretrained
        if [[ ! -f $model/model.safetensors ]]; then
            echo "error: run STUDY=pretraining first ($model)" >&2
            exit 2
        fi
        more=(--tasks mrpc sst2 --reuse "mlm_nsp=$model") ;;
    *) echo "error: STUDY=$STUDY: pretraining or table5" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # SEEDS: one argument each
exec "$PYTHON" recipes/study.py --study "$STUDY" --data_root "$TRAVEL/glue" \
    --output_dir "$RESULTS/study_$STUDY" --pretrain_config recipes/configs/quickstart.yaml \
    --pretrain_args "$pre" --finetune_args "$fine" \
    --finetune_args_for "${per_key[@]}" \
    --seeds $SEEDS --jobs "$JOBS" "${more[@]}"
