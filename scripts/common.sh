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

# DATASET_PATH CONFIG_PATH (the models repository's order) -> the variables data_path and config
read_data_and_config() {
    # shellcheck disable=SC2034
    data_path="$(resolve_data_path "$1")"
    # shellcheck disable=SC2034
    config="$(resolve_config "$2")"
}

# The optional positional arguments after CONFIG_PATH, as in the models repository: RESUME_CKPT, or
# RUN_EVAL (True/False) and EVAL_DATASET_PATH. Sets optional_args (train.py options) and consumed (how
# many arguments they took); an argument that starts with '-' is a train.py option, not one of these.
read_optional_positionals() {
    optional_args=()
    consumed=0
    [[ $# -ge 1 && "$1" != -* ]] || return 0
    case "${1,,}" in
        true|false)
            [[ $# -ge 2 && "$2" != -* ]] || die_usage "RUN_EVAL '$1' must be followed by EVAL_DATASET_PATH"
            local eval_path
            eval_path="$(resolve_data_path "$2")"
            optional_args=(--run_eval "$1" --eval_dataset_path "${eval_path}")
            consumed=2
            ;;
        *)
            [[ -f "$1" ]] || die_usage "RESUME_CKPT '$1' is not a file"
            optional_args=(--resume_ckpt "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")")
            consumed=1
            ;;
    esac
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
