#!/usr/bin/env bash
# One study on a GPU machine without a network, in one command, from the repository root:
#   STUDY=pretraining bash benchmarks/study_gpu.sh   # our pre-training against random initialisation
#   STUDY=table5 bash benchmarks/study_gpu.sh        # then Table 5, its MLM + NSP model taken from the first
# Reads $TRAVEL (default .travel, made by `bash benchmarks/corpus/travel.sh`, carried with the code): books/,
# the pre-training text, verified first, and glue/MRPC, glue/SST-2, fine-tuned on their full training sets.
# Writes $RESULTS/study_$STUDY/study.md, study.json and study.png. A command cut by a time limit resumes when
# run again: finished runs are kept, an interrupted pre-training continues from its last checkpoint (every
# SAVE_STEPS steps). The budget, GPU defaults: PRESET=mini STEPS=10000 of BATCH=256 sequences of 128 tokens
# (MICRO per device), bf16; fine-tuning grid LEARNING_RATES="1e-4 3e-4 1e-3" (fewer rates: less time,
# benchmarks/README.md "GPU"). tests/test_travel.py runs this same script on the CPU at a tiny budget and
# fixture text (a dry run).
set -euo pipefail
STUDY=${STUDY:-pretraining} TRAVEL=${TRAVEL:-.travel} RESULTS=${RESULTS:-runs/gpu} PYTHON=${PYTHON:-python}
PRESET=${PRESET:-mini} STEPS=${STEPS:-10000} BATCH=${BATCH:-256} MICRO=${MICRO:-256} BF16=${BF16:-true}
SAVE_STEPS=${SAVE_STEPS:-1000} WORKERS=${WORKERS:-4} LEARNING_RATES=${LEARNING_RATES:-1e-4 3e-4 1e-3}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PYTHON" -m bert_repro.data.travel_corpus --check "$TRAVEL/books"
# The paper's masking passes (dupe_factor 10): 10,000 steps of 256 then show each example about once. The
# learning rate and fine-tuning grid suit both small pre-trained and random weights (measured on the CPU,
# README.md).
pre="--preset $PRESET --corpus $TRAVEL/books/corpus.parquet --tokenizer $TRAVEL/books/tokenizer \
--dupe_factor 10 --bf16 $BF16 --global_batch_size $BATCH --per_device_train_batch_size $MICRO \
--max_steps $STEPS --warmup_steps $((STEPS / 20)) --learning_rate 1e-3 --logging_steps 100 --eval_steps 1000 \
--save_steps $SAVE_STEPS --dataloader_num_workers $WORKERS --disable_tqdm true"
fine="--bf16 $BF16 --learning_rates $LEARNING_RATES --no_predict_test --disable_tqdm true"
case $STUDY in
    pretraining) more=() ;;
    table5)
        model=$RESULTS/study_pretraining/pretrain/pretrained
        if [[ ! -f $model/model.safetensors ]]; then
            echo "error: run STUDY=pretraining first ($model)" >&2
            exit 2
        fi
        more=(--tasks mrpc sst2 --reuse "mlm_nsp=$model") ;;
    *) echo "error: STUDY=$STUDY: pretraining or table5" >&2; exit 2 ;;
esac
exec "$PYTHON" recipes/study.py --study "$STUDY" --data_root "$TRAVEL/glue" \
    --output_dir "$RESULTS/study_$STUDY" --pretrain_config recipes/configs/quickstart.yaml \
    --pretrain_args "$pre" --finetune_args "$fine" "${more[@]}"
