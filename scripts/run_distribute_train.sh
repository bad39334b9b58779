#!/usr/bin/env bash
# Data-parallel training on Ascend with an HCCL rank table: one train.py per device, in the background,
# with the arguments and their order of MindSpore's models repository (official/cv/ResNet).
# scripts/run_distribute_train_msrun.sh (msrun, no rank table) also works on Ascend, and on CPU and GPU.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash scripts/run_distribute_train.sh RANK_TABLE_FILE DATASET_PATH CONFIG_PATH [RESUME_CKPT] [train.py options...]
       bash scripts/run_distribute_train.sh RANK_TABLE_FILE DATASET_PATH CONFIG_PATH [RUN_EVAL EVAL_DATASET_PATH] [options...]

  RANK_TABLE_FILE  HCCL rank table (JSON; e.g. made with the models repository's utils/hccl_tools)
  DATASET_PATH     ImageNet folder, CIFAR-10 binaries folder, or 'synthetic'
  CONFIG_PATH      YAML file, or a config name in model_zoo/resnet50/configs
  RESUME_CKPT      continue from this checkpoint (train.py --resume_ckpt)
  RUN_EVAL         True or False: evaluate during training (on rank 0) on EVAL_DATASET_PATH
  options          passed to every train.py (after --device_target Ascend)

One process per device of the rank table (RANK_SIZE of them), RANK_ID = DEVICE_ID = 0..RANK_SIZE-1
(+ DEVICE_START); logs in LOG_DIR/train_parallel<RANK>/log.
Environment: DEVICE_START (default 0), LOG_DIR (default .), PYTHON (default python), DRY_RUN=1 (print).
USAGE
}

# shellcheck source=scripts/common.sh
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"
wants_help "${1:-}"
[[ $# -ge 3 ]] || die_usage "expected RANK_TABLE_FILE, DATASET_PATH and CONFIG_PATH, got $# argument(s)"
[[ -f "$1" ]] || die_usage "RANK_TABLE_FILE '$1' is not a file"
rank_table="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
read_data_and_config "$2" "$3"
shift 3
read_optional_positionals "$@"
shift "${consumed}"
device_num="$("${PYTHON}" -c 'import json, sys
table = json.load(open(sys.argv[1]))
print(sum(len(server.get("device", [])) for server in table.get("server_list", [])))' "${rank_table}" 2>/dev/null)" \
    || die_usage "RANK_TABLE_FILE '${rank_table}' is not a JSON rank table"
check_count "the number of devices in RANK_TABLE_FILE" "${device_num}"
device_start="${DEVICE_START:-0}"
log_root="${LOG_DIR:-.}"

export RANK_TABLE_FILE="${rank_table}" RANK_SIZE="${device_num}"
pids=()
for ((rank = 0; rank < device_num; rank++)); do
    command=(env DEVICE_ID="$((device_start + rank))" RANK_ID="${rank}" RANK_SIZE="${device_num}"
             RANK_TABLE_FILE="${rank_table}" "${PYTHON}" "${TRAIN_SCRIPT}" --data_path "${data_path}"
             --config_path "${config}" "${optional_args[@]+"${optional_args[@]}"}" --device_target Ascend "$@")
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        run "${command[@]}"
        continue
    fi
    mkdir -p "${log_root}/train_parallel${rank}"
    "${command[@]}" > "${log_root}/train_parallel${rank}/log" 2>&1 &
    pids+=("$!")
    echo "rank ${rank}: device $((device_start + rank)), pid $!, log ${log_root}/train_parallel${rank}/log"
done
status=0
for pid in "${pids[@]+"${pids[@]}"}"; do
    wait "${pid}" || status=$?
done
[[ "${status}" -eq 0 ]] || echo "error: a rank failed (exit ${status}); see ${log_root}/train_parallel*/log" >&2
exit "${status}"
