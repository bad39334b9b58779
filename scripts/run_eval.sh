#!/usr/bin/env bash
# Top-1 / top-5 accuracy of a checkpoint: model_zoo/resnet50/eval.py, in the argument order of
# MindSpore's models repository (official/cv/ResNet).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_eval.sh DATASET_PATH CHECKPOINT_PATH CONFIG_PATH [eval.py options...]

  DATASET_PATH     ImageNet folder (train/ + val/, or give --eval_dataset_path), CIFAR-10 binaries
                   folder, or 'synthetic'
  CHECKPOINT_PATH  a .ckpt written by train.py (or a network-only checkpoint)
  CONFIG_PATH      YAML file, or a config name in model_zoo/resnet50/configs (the one used for training)
  options          passed to eval.py, e.g. --eval_batch_size 64 --result_json result.json

Environment: PYTHON (default python), DRY_RUN=1 (print the command).
Example: bash scripts/run_eval.sh synthetic outputs/cpu_smoke/ckpt_0/resnet-2_4.ckpt cpu_smoke
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 3 ]] || die_usage "expected DATASET_PATH, CHECKPOINT_PATH and CONFIG_PATH, got $# argument(s)"
[[ -f "$2" ]] || die_usage "CHECKPOINT_PATH '$2' is not a file"
read_data_and_config "$1" "$3"
checkpoint="$2"
shift 3

run "${PYTHON}" "${EVAL_SCRIPT}" --data_path "${data_path}" --checkpoint_file_path "${checkpoint}" \
    --config_path "${config}" "$@"
