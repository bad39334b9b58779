#!/usr/bin/env bash
# Top-1 / top-5 accuracy of a checkpoint: model_zoo/resnet50/eval.py.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_eval.sh CONFIG DATA_PATH CHECKPOINT [eval.py options...]

  CONFIG      YAML file, or a config name in model_zoo/resnet50/configs (the one used for training)
  DATA_PATH   ImageNet folder (train/ + val/, or give --eval_data_path), CIFAR-10 binaries folder,
              or 'synthetic'
  CHECKPOINT  a .ckpt written by train.py (or a network-only checkpoint)
  options     passed to eval.py, e.g. --eval_batch_size 64 --result_json result.json

Environment: PYTHON (default python), DRY_RUN=1 (print the command).
Example: bash scripts/run_eval.sh cpu_smoke synthetic outputs/cpu_smoke/ckpt_0/resnet-2_4.ckpt
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 3 ]] || die_usage "expected CONFIG, DATA_PATH and CHECKPOINT, got $# argument(s)"
read_config_and_data "$1" "$2"
[[ -f "$3" ]] || die_usage "CHECKPOINT '$3' is not a file"
checkpoint="$3"
shift 3

run "${PYTHON}" "${EVAL_SCRIPT}" --config "${config}" --data_path "${data_path}" --checkpoint_path "${checkpoint}" "$@"
