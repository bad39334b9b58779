#!/usr/bin/env bash
# Training throughput per optimizer on synthetic data (images/s per device, epochs after the first,
# which includes graph compilation), one run at a time, as a Markdown table.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: bash model_zoo/resnet50/scripts/measure_throughput.sh [OUT_DIR]

Runs, for each optimizer of OPTIMIZERS (default "momentum kfac thor spngd"; one missing from this
mindspore_ngd is reported as n/a):
  cpu_smoke        the cpu_smoke config (CIFAR-style ResNet-8 width 8, 16x16, batch 8), 20 steps/epoch
  cifar_resnet32   resnet_cifar10_<optimizer> (ResNet-32, 32x32) at batch 32, 20 steps/epoch
each for EPOCHS (default 3) epochs without checkpoints or evaluation, and prints a table of the
images/s of the epochs after the first. Results: OUT_DIR (default outputs/throughput)/<case>_<optimizer>.
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[[ $# -le 1 ]] || { usage >&2; exit 2; }
here="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)"
repo="$(cd "${here}/../../.." && pwd)"
out_dir="${1:-outputs/throughput}"
epochs="${EPOCHS:-3}"
read -r -a optimizers <<< "${OPTIMIZERS:-momentum kfac thor spngd}"

measure() {   # CASE OPTIMIZER CONFIG [train.py options...]
    local case_name="$1" optimizer="$2" config="$3"
    shift 3
    local dir="${out_dir}/${case_name}_${optimizer}"
    echo "== ${case_name} ${optimizer}" >&2
    if ! bash "${repo}/scripts/run_standalone_train.sh" "${config}" synthetic --optimizer "${optimizer}" \
            --epoch_size "${epochs}" --eval_interval 0 --save_checkpoint_epochs 0 --output_dir "${dir}" "$@" \
            > "${dir}.log" 2>&1; then
        echo "   failed or unavailable: $(grep -m1 'error:' "${dir}.log" || tail -n 1 "${dir}.log")" >&2
    fi
}

mkdir -p "${out_dir}"
load_start="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
for optimizer in "${optimizers[@]}"; do
    measure cpu_smoke "${optimizer}" cpu_smoke --synthetic_size 160
    measure cifar_resnet32 "${optimizer}" "resnet_cifar10_${optimizer}" --batch_size 32 --synthetic_size 640
done

load_end="$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
"${PYTHON:-python}" - "${out_dir}" "${load_start}" "${load_end}" "${optimizers[@]}" <<'PY'
import json, os, sys
out_dir, load_start, load_end, optimizers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
print("| case | optimizer | batch | steps/epoch | first epoch s (compile) | images/s per device |")
print("|---|---|---|---|---|---|")
for case in ("cpu_smoke", "cifar_resnet32"):
    for optimizer in optimizers:
        path = os.path.join(out_dir, f"{case}_{optimizer}", "throughput_rank0.json")
        if not os.path.exists(path):
            print(f"| {case} | {optimizer} | | | | n/a |")
            continue
        data = json.load(open(path))
        print(f"| {case} | {optimizer} | {data['batch_size']} | {data['epochs'][0]['steps']} | "
              f"{data['first_epoch_seconds']:.1f} | {data['images_per_s']:.1f} |")
print(f"\nload average (1, 5, 15 min) at start: {load_start}; at end: {load_end}")
PY
