#!/usr/bin/env bash
# Data-parallel training on DEVICE_NUM local GPUs launched by OpenMPI's mpirun (NCCL), as in
# MindSpore's models repository (msrun, scripts/run_distribute_train.sh, also works on GPU).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train_gpu.sh DEVICE_NUM CONFIG DATA_PATH [train.py options...]

  DEVICE_NUM  number of GPUs (processes) on this machine, >= 1
  CONFIG      YAML file, or a config name in model_zoo/resnet50/configs (e.g. resnet50_imagenet2012_thor_gpu_8p)
  DATA_PATH   ImageNet folder, CIFAR-10 binaries folder, or 'synthetic'
  options     passed to every train.py (after --device_target GPU)

Environment: LOG_DIR (mpirun --output-filename, default mpirun_log), MPIRUN (default mpirun),
             PYTHON (default python), DRY_RUN=1 (print the command).
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
read_device_config_and_data "$@"
shift 3
mpirun_bin="${MPIRUN:-mpirun}"
[[ "${DRY_RUN:-0}" == "1" ]] || need_command "${mpirun_bin}" "install OpenMPI, or use scripts/run_distribute_train.sh (msrun)"

run "${mpirun_bin}" -n "${device_num}" --allow-run-as-root --output-filename "${LOG_DIR:-mpirun_log}" \
    --merge-stderr-to-stdout -x PYTHONPATH \
    "${PYTHON}" "${TRAIN_SCRIPT}" --config "${config}" --data_path "${data_path}" --device_target GPU "$@"
