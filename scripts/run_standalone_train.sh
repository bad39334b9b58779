#!/usr/bin/env bash
# Train on one device: model_zoo/resnet50/train.py with a config and a dataset path.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_standalone_train.sh CONFIG DATA_PATH [train.py options...]

  CONFIG     YAML file, or a config name in model_zoo/resnet50/configs (e.g. cpu_smoke)
  DATA_PATH  ImageNet folder (train/ + val/, or the train folder), CIFAR-10 binaries folder,
             or 'synthetic' for generated data
  options    passed to train.py, e.g. --optimizer thor --epoch_size 2 --output_dir out
             --resume out/ckpt_0/resnet-1_4.ckpt --set kfac.damping=0.01

Environment: PYTHON (default python), DEVICE_ID (GPU/Ascend device), DRY_RUN=1 (print the command),
             TRAIN_SCRIPT (default model_zoo/resnet50/train.py).
Example: bash scripts/run_standalone_train.sh cpu_smoke synthetic --optimizer kfac
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 2 ]] || die_usage "expected CONFIG and DATA_PATH, got $# argument(s)"
read_config_and_data "$1" "$2"
shift 2

run "${PYTHON}" "${TRAIN_SCRIPT}" --config "${config}" --data_path "${data_path}" "$@"
