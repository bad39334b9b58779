#!/usr/bin/env bash
# Data-parallel training on the local GPUs launched by OpenMPI's mpirun (NCCL), with the arguments and
# their order of MindSpore's models repository (official/cv/ResNet); scripts/run_distribute_train_msrun.sh
# (msrun) also works on GPU.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train_gpu.sh DATASET_PATH CONFIG_PATH [RESUME_CKPT] [train.py options...]
       bash scripts/run_distribute_train_gpu.sh DATASET_PATH CONFIG_PATH [RUN_EVAL EVAL_DATASET_PATH] [options...]

  DATASET_PATH  ImageNet folder, CIFAR-10 binaries folder, or 'synthetic'
  CONFIG_PATH   YAML file, or a config name in model_zoo/resnet50/configs (e.g. resnet50_imagenet2012_thor_gpu_8p)
  RESUME_CKPT   continue from this checkpoint (train.py --resume_ckpt)
  RUN_EVAL      True or False: evaluate during training (on rank 0) on EVAL_DATASET_PATH
  options       passed to every train.py (after --device_target GPU)

Environment: RANK_SIZE (number of GPUs, default 8, as in the models repository), LOG_DIR (mpirun
             --output-filename, default mpirun_log), MPIRUN (default mpirun), PYTHON (default python),
             DRY_RUN=1 (print the command).
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 2 ]] || die_usage "expected DATASET_PATH and CONFIG_PATH, got $# argument(s)"
device_num="${RANK_SIZE:-8}"
check_count RANK_SIZE "${device_num}"
read_data_and_config "$1" "$2"
shift 2
read_optional_positionals "$@"
shift "${consumed}"
mpirun_bin="${MPIRUN:-mpirun}"
[[ "${DRY_RUN:-0}" == "1" ]] || need_command "${mpirun_bin}" "install OpenMPI, or use scripts/run_distribute_train.sh (msrun)"

run "${mpirun_bin}" -n "${device_num}" --allow-run-as-root --output-filename "${LOG_DIR:-mpirun_log}" \
    --merge-stderr-to-stdout -x PYTHONPATH \
    "${PYTHON}" "${TRAIN_SCRIPT}" --data_path "${data_path}" --config_path "${config}" \
    "${optional_args[@]+"${optional_args[@]}"}" --device_target GPU "$@"
