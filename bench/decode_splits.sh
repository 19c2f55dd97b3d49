#!/usr/bin/env bash
# One GPU, decode: the shortest split of decode attention's context (the launch setting
# min_split, through HEARTH_DECODE_ATTENTION_CONFIG) swept on `hearth bench --compile` rows, 7B
# AWQ and bf16, 512-token prompts and 256 new tokens (positions 512-767: the 1,024 bucket; at 256
# keys a split, 3 of 4 splits busy per KV head; the default is 64 since 751e0f9). Results
# under $OUT.
#   bash bench/decode_splits.sh [min_split ...]   (default 256 64 128 32)
set -u
source bench/device_env.sh
Q=bench/qwen2.5-7b
A="--model $Q --random-weights --prompt-len 512 --new-tokens 256 --compile --no-peer"
for m in ${*:-256 64 128 32}; do
    HEARTH_DECODE_ATTENTION_CONFIG="{\"min_split\": $m}" bench 7b-awq-split$m $A --quant awq
done
for m in 256 64; do
    HEARTH_DECODE_ATTENTION_CONFIG="{\"min_split\": $m}" bench 7b-bf16-split$m $A --quant bf16
done
