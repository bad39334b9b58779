#!/usr/bin/env bash
# Data-parallel training on DEVICE_NUM local workers launched by msrun (CPU, GPU or Ascend).
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train.sh DEVICE_NUM CONFIG DATA_PATH [train.py options...]

  DEVICE_NUM  number of workers (processes/devices) on this machine, >= 1
  CONFIG      YAML file, or a config name in model_zoo/resnet50/configs (e.g. cpu_smoke)
  DATA_PATH   ImageNet folder, CIFAR-10 binaries folder, or 'synthetic'
  options     passed to every worker's train.py, e.g. --optimizer kfac --output_dir out

Each worker trains on its shard of the data and writes checkpoints to OUTPUT_DIR/ckpt_RANK;
msrun writes the workers' logs to LOG_DIR/worker_RANK.log.
Environment: MASTER_PORT (default: a free port), LOG_DIR (default msrun_log), MSRUN (default msrun),
             PYTHON (default python, for the port probe), DRY_RUN=1 (print the command),
             TRAIN_SCRIPT (default model_zoo/resnet50/train.py).
Other launchers: scripts/run_distribute_train_ascend.sh (rank table), scripts/run_distribute_train_gpu.sh (mpirun).
Example: bash scripts/run_distribute_train.sh 2 cpu_smoke synthetic --optimizer kfac
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
read_device_config_and_data "$@"
shift 3
msrun_bin="${MSRUN:-msrun}"
[[ "${DRY_RUN:-0}" == "1" ]] || need_command "${msrun_bin}" "it comes with MindSpore >= 2.3"
port="${MASTER_PORT:-$(free_port)}"
log_dir="${LOG_DIR:-msrun_log}"

status=0
run "${msrun_bin}" --worker_num="${device_num}" --local_worker_num="${device_num}" \
    --master_port="${port}" --log_dir="${log_dir}" --join=True \
    "${TRAIN_SCRIPT}" --config "${config}" --data_path "${data_path}" "$@" || status=$?
if [[ "${status}" -ne 0 ]]; then
    echo "error: distributed training failed (exit ${status}); worker logs in ${log_dir}:" >&2
    for log in "${log_dir}"/worker_*.log; do
        [[ -f "${log}" ]] || continue
        echo "---- ${log} (last 20 lines)" >&2
        grep -v '^\[WARNING\]' "${log}" | tail -n 20 >&2 || true
    done
fi
exit "${status}"
