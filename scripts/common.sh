# shellcheck shell=bash
# Sourced by the launch scripts of this folder: repository paths, argument checks, dry runs.
# Each script defines usage() before sourcing this file.

REPO_ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
ZOO_DIR="${REPO_ROOT}/model_zoo/resnet50"
TRAIN_SCRIPT="${TRAIN_SCRIPT:-${ZOO_DIR}/train.py}"
EVAL_SCRIPT="${EVAL_SCRIPT:-${ZOO_DIR}/eval.py}"
PYTHON="${PYTHON:-python}"
# the repository's mindspore_ngd first, whether or not the package is installed
export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"

die_usage() {
    echo "error: $1" >&2
    echo >&2
    usage >&2
    exit 2
}

wants_help() {
    case "${1:-}" in -h|--help|help) usage; exit 0 ;; esac
}

# CONFIG: a YAML file or the name of one in model_zoo/resnet50/configs; prints the absolute path
resolve_config() {
    local config="$1"
    if [[ -f "${config}" ]]; then
        echo "$(cd "$(dirname "${config}")" && pwd)/$(basename "${config}")"
    elif [[ -f "${ZOO_DIR}/configs/${config%.yaml}.yaml" ]]; then
        echo "${ZOO_DIR}/configs/${config%.yaml}.yaml"
    else
        local names=() file
        for file in "${ZOO_DIR}"/configs/*.yaml; do names+=("$(basename "${file}" .yaml)"); done
        die_usage "CONFIG '${config}' is neither a file nor a name in ${ZOO_DIR}/configs (${names[*]})"
    fi
}

# DATA_PATH: 'synthetic' or an existing path; prints it (absolute for a path)
resolve_data_path() {
    local data="$1"
    if [[ "${data}" == "synthetic" ]]; then
        echo synthetic
    elif [[ -e "${data}" ]]; then
        echo "$(cd "$(dirname "${data}")" && pwd)/$(basename "${data}")"
    else
        die_usage "DATA_PATH '${data}' does not exist (give a dataset folder, or 'synthetic')"
    fi
}

# CONFIG DATA_PATH -> the variables config and data_path (for the caller)
read_config_and_data() {
    # shellcheck disable=SC2034
    config="$(resolve_config "$1")"
    # shellcheck disable=SC2034
    data_path="$(resolve_data_path "$2")"
}

# DEVICE_NUM CONFIG DATA_PATH (at least) -> device_num, config, data_path
read_device_config_and_data() {
    [[ $# -ge 3 ]] || die_usage "expected DEVICE_NUM, CONFIG and DATA_PATH, got $# argument(s)"
    check_count DEVICE_NUM "$1"
    # shellcheck disable=SC2034
    device_num="$1"
    read_config_and_data "$2" "$3"
}

check_count() {   # NAME VALUE: a positive integer
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || die_usage "$1 must be a positive integer, got '$2'"
}

need_command() {
    command -v "$1" >/dev/null 2>&1 || { echo "error: '$1' not found on PATH ($2)" >&2; exit 127; }
}

# run a command, or with DRY_RUN=1 print it (shell-quoted) instead
run() {
    if [[ "${DRY_RUN:-0}" == "1" ]]; then
        printf '%q ' "$@"
        echo
    else
        "$@"
    fi
}

free_port() {
    "${PYTHON}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
