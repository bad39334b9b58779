"""msrun worker: compile the distributed K-FAC / SP-NGD training graph with the exchange's HCCL
(Ascend) collective choice, on CPU, and audit it.

MCCL (CPU) is what initialises here, but ``BACKEND_SUPPORT["mccl"]`` is replaced by HCCL's
capabilities before the optimizer is built, so the Communicator picks ReduceScatter for the factors
and a world AllGather for the preconditioned gradients, exactly as on Ascend. The front-end graph
(the saved ``validate`` IR) is complete before the back-end selects kernels; MCCL has no
ReduceScatter kernel, so the CPU back-end may then refuse the graph: that error is recorded, the
audit reads the saved IR. Writes, per rank: the primitives the optimizer adds over a distributed
momentum step, the audit verdict for Ascend and GPU, and the back-end's error (if any)."""
import argparse
import os
import shutil
import tempfile

from distributed import init_data_parallel, run_worker, write_result


def _graph(step, inputs, audit):
    path = tempfile.mkdtemp(prefix="ngd_dist_ir_")
    error = None
    try:
        audit.compiled_primitives(step, *inputs, keep=path)
    except Exception as exc:          # noqa: BLE001 - the back-end's verdict is part of the result
        lines = [line.strip() for line in str(exc).splitlines() if line.strip() and not line.strip().startswith("-")]
        error = f"{type(exc).__name__}: {' | '.join(lines[:2])[:400]}"
    try:
        return audit.ir_primitives(path), error
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="hccl", choices=["hccl", "nccl"])
    parser.add_argument("--optimizer", default="kfac", choices=["kfac", "spngd"])
    args = parser.parse_args()
    rank, world = init_data_parallel()
    from mindspore_ngd import audit
    from mindspore_ngd.parallel import comm
    device = {"hccl": "Ascend", "nccl": "GPU"}[args.backend]
    comm.BACKEND_SUPPORT["mccl"] = dict(comm.BACKEND_SUPPORT[args.backend])
    inputs = audit.audit_inputs()
    base, base_error = _graph(audit.build_train_step("momentum"), inputs, audit)
    # the device's graph: its inversion path and no host calls (host_calls="auto" on Ascend and GPU)
    step = audit.build_train_step(args.optimizer, audit.device_inverse_method(device),
                                  host_calls=audit.device_host_calls(device))
    opt = step.optimizer
    graph, error = _graph(step, inputs, audit)
    added = {name: sources for name, sources in graph.items() if name not in base}
    reports = {d: audit.audit_primitives(added, d, f"distributed {args.optimizer}") for d in ("Ascend", "GPU")}
    write_result({
        "rank": rank, "world": world, "device": device,
        "describe": opt.communicator.describe() if getattr(opt, "communicator", None) else None,
        "added": sorted(added), "baseline_collectives": sorted(n for n in base if n.startswith("All")),
        "ok": {d: r.ok for d, r in reports.items()},
        "host_nodes": {d: list(r.host_nodes) for d, r in reports.items()},
        "undocumented": {d: list(r.undocumented) for d, r in reports.items()},
        "backend_error": error, "baseline_error": base_error,
    })


if __name__ == "__main__":
    run_worker(main)
