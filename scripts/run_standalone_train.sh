#!/usr/bin/env bash
# Train on one device: model_zoo/resnet50/train.py with a dataset path and a config, in the argument
# order of MindSpore's models repository (official/cv/ResNet).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_standalone_train.sh DATASET_PATH CONFIG_PATH [RESUME_CKPT] [train.py options...]
       bash scripts/run_standalone_train.sh DATASET_PATH CONFIG_PATH [RUN_EVAL EVAL_DATASET_PATH] [train.py options...]

  DATASET_PATH       ImageNet folder (train/ + val/, or the train folder), CIFAR-10 binaries folder,
                     or 'synthetic' for generated data
  CONFIG_PATH        YAML file, or a config name in model_zoo/resnet50/configs (e.g. cpu_smoke)
  RESUME_CKPT        continue from this checkpoint (train.py --resume_ckpt)
  RUN_EVAL           True or False: evaluate during training on EVAL_DATASET_PATH
  options            passed to train.py, e.g. --optimizer thor --epoch_size 2 --output_dir out
                     --set kfac.damping=0.01

Environment: PYTHON (default python), DEVICE_ID (GPU/Ascend device), DRY_RUN=1 (print the command),
             TRAIN_SCRIPT (default model_zoo/resnet50/train.py).
Example: bash scripts/run_standalone_train.sh synthetic cpu_smoke --optimizer kfac
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 2 ]] || die_usage "expected DATASET_PATH and CONFIG_PATH, got $# argument(s)"
read_data_and_config "$1" "$2"
shift 2
read_optional_positionals "$@"
shift "${consumed}"

run "${PYTHON}" "${TRAIN_SCRIPT}" --data_path "${data_path}" --config_path "${config}" \
    "${optional_args[@]+"${optional_args[@]}"}" "$@"
