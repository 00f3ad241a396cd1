#!/usr/bin/env bash
# One study on a GPU machine without a network, in one command, from the repository root:
#   STUDY=pretraining bash benchmarks/gpu/study_gpu.sh   # our pre-training against random initialisation
#   STUDY=table5 bash benchmarks/gpu/study_gpu.sh        # Table 5: MLM + NSP, No NSP, LTR & No NSP, pre-trained alike
# Reads $TRAVEL (default .travel, made by `bash benchmarks/corpus/travel.sh`, carried with the code): books/,
# the pre-training text, verified first, and glue/MRPC, glue/SST-2 (full training sets), glue/QNLI, glue/SQuAD
# (the subsets of benchmarks/corpus/task_data.py, verified against task_data.json; table5 only).
# Writes $RESULTS/study_$STUDY/study.md, study.json and study.png after every finished run. A command cut by a
# time limit resumes when run again: finished runs are kept, an interrupted pre-training continues from its
# last checkpoint (every SAVE_STEPS steps).
# The budget (sized for one 9-minute call on one H100 or H200; benchmarks/LOG.md "The study in one GPU
# call" says how it was chosen and what it measured): PRESET=small, STEPS=6000 of BATCH=256 sequences of 128
# tokens (MICRO per device), LEARNING_RATE=5e-4 (at 1e-3 the unigram plateau took twice as long), bf16,
# RoBERTa's dynamic masking (fresh masks every batch) over DUPE=2 passes of sentence pairs
# (instead of the paper's 10 static passes: no building time for masks); fine-tuning: one learning rate per
# initialisation, fixed ahead (no grid): FINETUNE_LR=3e-4 for the pre-trained models, RANDOM_LR (default the same)
# for the randomly initialised one; SEEDS="1 2 3" each its own run, JOBS=12 runs at once on the one GPU, MRPC 3
# epochs of 32, SST-2 one epoch of 64 (its first SST2_ROWS training rows when set: the same rows for every variant).
# Table 5: TABLE5_VARIANTS (default the three pre-training tasks; ltr_bilstm adds "+ BiLSTM") each pre-trained
# with the flags above on the same examples for the same steps, fine-tuned on TABLE5_TASKS (default mrpc sst2
# qnli squad); TABLE5_REUSE=1 takes the MLM + NSP model of STUDY=pretraining (same flags) instead of training it.
# tests/e2e/test_travel.py runs this same script on the CPU at a tiny budget and fixture text (a dry run).
set -euo pipefail
STUDY=${STUDY:-pretraining} TRAVEL=${TRAVEL:-.travel} RESULTS=${RESULTS:-runs/gpu} PYTHON=${PYTHON:-python}
PRESET=${PRESET:-small} STEPS=${STEPS:-6000} BATCH=${BATCH:-256} MICRO=${MICRO:-256} BF16=${BF16:-true}
SAVE_STEPS=${SAVE_STEPS:-1000} WORKERS=${WORKERS:-8} DUPE=${DUPE:-2} LEARNING_RATE=${LEARNING_RATE:-5e-4}
FINETUNE_LR=${FINETUNE_LR:-3e-4} RANDOM_LR=${RANDOM_LR:-${FINETUNE_LR:-3e-4}} SEEDS=${SEEDS:-1 2 3} JOBS=${JOBS:-12} NUM_PROC=${NUM_PROC:-$(nproc)}
TABLE5_TASKS=${TABLE5_TASKS:-mrpc sst2 qnli squad} TABLE5_VARIANTS=${TABLE5_VARIANTS:-mlm_nsp mlm ltr}
TABLE5_REUSE=${TABLE5_REUSE:-0} SST2_ROWS=${SST2_ROWS:-} TASK_MANIFEST=${TASK_MANIFEST:-benchmarks/corpus/task_data.json}
# CPU=1: the dry run's switches (no CUDA, every run on the CPU); PRETRAIN_MORE, FINETUNE_MORE: more flags for
# every pre-training and fine-tuning run (the dry run's: a few documents, a few rows)
CPU=${CPU:-0}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
"$PYTHON" -m bert_repro.data.travel_corpus --check "$TRAVEL/books"
cpu=$([[ $CPU == 1 ]] && echo "--use_cpu true" || true)
pre="--preset $PRESET --corpus $TRAVEL/books/corpus.parquet --tokenizer $TRAVEL/books/tokenizer \
--dupe_factor $DUPE --static_masking false --bf16 $BF16 --global_batch_size $BATCH \
--per_device_train_batch_size $MICRO --max_steps $STEPS --warmup_steps $((STEPS / 10)) \
--learning_rate $LEARNING_RATE --logging_steps $(((STEPS + 99) / 100)) --eval_steps $(((STEPS + 4) / 5)) \
--save_steps $SAVE_STEPS --dataloader_num_workers $WORKERS --num_proc $NUM_PROC --disable_tqdm true $cpu \
${PRETRAIN_MORE:-}"
fine="--bf16 $BF16 --learning_rates $FINETUNE_LR --no_predict_test --disable_tqdm true $cpu ${FINETUNE_MORE:-}"
per_key=("sst2=--num_train_epochs 1 --per_device_train_batch_size 64${SST2_ROWS:+ --max_train_samples $SST2_ROWS}")
case $STUDY in
    pretraining) more=() per_key+=("random=--learning_rates $RANDOM_LR") ;;
    table5)
        if [[ " $TABLE5_TASKS " == *" qnli "* || " $TABLE5_TASKS " == *" squad "* ]]; then
            "$PYTHON" benchmarks/corpus/task_data.py check "$TRAVEL/glue" --manifest "$TASK_MANIFEST"
        fi
        # shellcheck disable=SC2206  # one argument each
        more=(--tasks $TABLE5_TASKS --variants $TABLE5_VARIANTS)
        model=$RESULTS/study_pretraining/pretrain/pretrained
        if [[ $TABLE5_REUSE == 1 ]]; then
            if [[ ! -f $model/model.safetensors ]]; then
                echo "error: TABLE5_REUSE=1: run STUDY=pretraining first ($model)" >&2
                exit 2
            fi
            more+=(--reuse "mlm_nsp=$model")
        fi ;;
    *) echo "error: STUDY=$STUDY: pretraining or table5" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # SEEDS: one argument each
exec "$PYTHON" recipes/study.py --study "$STUDY" --data_root "$TRAVEL/glue" \
    --output_dir "$RESULTS/study_$STUDY" --pretrain_config recipes/configs/quickstart.yaml \
    --pretrain_args "$pre" --finetune_args "$fine" \
    --finetune_args_for "${per_key[@]}" \
    --seeds $SEEDS --jobs "$JOBS" "${more[@]}"
