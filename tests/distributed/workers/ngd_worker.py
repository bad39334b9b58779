"""msrun worker: distributed K-FAC / SP-NGD / THOR cases of tests/distributed/dist_cases.py, plus a checkpoint
round trip. usage: ngd_worker.py CASE [CASE ...] [--checkpoint DIR]

Every rank trains on its slice of the global batches under DATA_PARALLEL and reports weights,
counters and its parallel state; launched by tests/distributed/test_distributed_training.py through run_msrun.
"""
import os
import sys
import time

from distributed import init_data_parallel, run_worker, write_result


def checkpoint_round_trip(name, opt, directory, rank):
    """Save this rank's optimizer state, load it into a fresh optimizer after check_checkpoint, and
    record check_checkpoint's message for a file of another world size."""
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor
    from mindspore_ngd.parallel import check_checkpoint
    import dist_cases
    path = os.path.join(directory, f"{name}_rank{rank}.ckpt")
    ms.save_checkpoint(opt, path)
    saved = ms.load_checkpoint(path)
    _, fresh, _ = dist_cases.build(name, seed=1)
    check_checkpoint(fresh, saved)
    not_loaded, _ = ms.load_param_into_net(fresh, saved)
    same = all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(opt.get_parameters(), fresh.get_parameters()))
    wrong = dict(saved)
    prefix = opt.policy.name
    wrong[f"{prefix}.parallel.world_size"] = ms.Parameter(Tensor(np.int32(4)), name=f"{prefix}.parallel.world_size")
    try:
        check_checkpoint(fresh, wrong)
        mismatch = None
    except ValueError as exc:
        mismatch = str(exc)
    return {"keys": sorted(k for k in saved if ".parallel." in k), "not_loaded": not_loaded,
            "state_equal": same, "world_size_mismatch": mismatch,
            "inversions_key": f"{prefix}.parallel.inversions" in saved}


def main(argv):
    rank, world = init_data_parallel()
    import dist_cases
    directory = None
    if "--checkpoint" in argv:
        i = argv.index("--checkpoint")
        directory = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    results = {"rank": rank, "world": world, "cases": {}, "seconds": {}}
    for name in argv:
        start = time.time()
        out, _, opt = dist_cases.run_case(name, rank, world)
        if directory is not None and name == "kfac":
            out["checkpoint"] = checkpoint_round_trip(name, opt, directory, rank)
        results["cases"][name] = out
        results["seconds"][name] = round(time.time() - start, 2)
    write_result(results)


if __name__ == "__main__":
    run_worker(main, sys.argv[1:])
