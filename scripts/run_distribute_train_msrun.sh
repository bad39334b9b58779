#!/usr/bin/env bash
# Data-parallel training on DEVICE_NUM local workers launched by msrun (CPU, GPU or Ascend, no rank
# table). After DEVICE_NUM the arguments are those of run_standalone_train.sh, in the same order.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train_msrun.sh DEVICE_NUM DATASET_PATH CONFIG_PATH [RESUME_CKPT] [train.py options...]
       bash scripts/run_distribute_train_msrun.sh DEVICE_NUM DATASET_PATH CONFIG_PATH [RUN_EVAL EVAL_DATASET_PATH] [options...]

  DEVICE_NUM    number of workers (processes/devices) on this machine, >= 1
  DATASET_PATH  ImageNet folder, CIFAR-10 binaries folder, or 'synthetic'
  CONFIG_PATH   YAML file, or a config name in model_zoo/resnet50/configs (e.g. cpu_smoke)
  RESUME_CKPT   continue from this checkpoint (train.py --resume_ckpt)
  RUN_EVAL      True or False: evaluate during training (on rank 0) on EVAL_DATASET_PATH
  options       passed to every worker's train.py, e.g. --optimizer kfac --output_dir out

Each worker trains on its shard of the data and writes checkpoints to OUTPUT_DIR/ckpt_RANK;
msrun writes the workers' logs to LOG_DIR/worker_RANK.log.
Environment: MASTER_PORT (default: a free port), LOG_DIR (default msrun_log), MSRUN (default msrun),
             PYTHON (default python, for the port probe), DRY_RUN=1 (print the command),
             TRAIN_SCRIPT (default model_zoo/resnet50/train.py).
Other launchers: scripts/run_distribute_train.sh (Ascend rank table), scripts/run_distribute_train_gpu.sh (mpirun).
Example: bash scripts/run_distribute_train_msrun.sh 2 synthetic cpu_smoke --optimizer kfac
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 3 ]] || die_usage "expected DEVICE_NUM, DATASET_PATH and CONFIG_PATH, got $# argument(s)"
check_count DEVICE_NUM "$1"
device_num="$1"
read_data_and_config "$2" "$3"
shift 3
read_optional_positionals "$@"
shift "${consumed}"
msrun_bin="${MSRUN:-msrun}"
[[ "${DRY_RUN:-0}" == "1" ]] || need_command "${msrun_bin}" "it comes with MindSpore >= 2.3"
port="${MASTER_PORT:-$(free_port)}"
log_dir="${LOG_DIR:-msrun_log}"

status=0
run "${msrun_bin}" --worker_num="${device_num}" --local_worker_num="${device_num}" \
    --master_port="${port}" --log_dir="${log_dir}" --join=True \
    "${TRAIN_SCRIPT}" --data_path "${data_path}" --config_path "${config}" \
    "${optional_args[@]+"${optional_args[@]}"}" "$@" || status=$?
if [[ "${status}" -ne 0 ]]; then
    echo "error: distributed training failed (exit ${status}); worker logs in ${log_dir}:" >&2
    for log in "${log_dir}"/worker_*.log; do
        [[ -f "${log}" ]] || continue
        echo "---- ${log} (last 20 lines)" >&2
        grep -v '^\[WARNING\]' "${log}" | tail -n 20 >&2 || true
    done
fi
exit "${status}"
