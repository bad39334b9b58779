"""Record the golden behaviour of the engine (run once, before a restructuring).

usage (from the repository root): ONEDNN_MAX_CPU_ISA=AVX2 python tests/golden/record_golden.py [--two-ranks]

Writes ``tests/golden/single.npz`` (weights and optimizer state after 20 steps of every case in
``tests/golden_cases.py``; ``cpu`` names the processor), ``tests/golden/checkpoints/<case>_step10.ckpt.gz``
(the optimizer and network checkpoint after 10 steps, as ``ms.save_checkpoint`` wrote it, gzipped)
and, with ``--two-ranks``, ``tests/golden/two_ranks.npz`` from an msrun launch of 2 CPU ranks.
"""
import gzip
import os
import platform
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(TESTS, "distributed"), TESTS]


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def record_single():
    import numpy as np
    import mindspore as ms
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    import golden_cases as gc
    arrays = {"cpu": np.array(cpu_name())}
    os.makedirs(os.path.join(HERE, "checkpoints"), exist_ok=True)
    for name in gc.CASES:
        net, opt, step = gc.build(name)
        gc.train(step, 0, gc.CHECKPOINT_STEP)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "state.ckpt")
            ms.save_checkpoint([{"name": p.name, "data": p} for p in step.get_parameters()], path)
            target = os.path.join(HERE, "checkpoints", f"{name}_step10.ckpt.gz")
            with open(path, "rb") as src, open(target, "wb") as raw, \
                    gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        gc.train(step, gc.CHECKPOINT_STEP, gc.STEPS)
        weights, optimizer = gc.state(net, opt)
        for key, value in weights.items():
            arrays[f"{name}/weights/{key}"] = value
        for key, value in optimizer.items():
            arrays[f"{name}/optimizer/{key}"] = value
        print(name, "recorded", flush=True)
    np.savez_compressed(os.path.join(HERE, "single.npz"), **arrays)


def record_two_ranks():
    import numpy as np
    from distributed import run_msrun
    import golden_cases as gc
    run = run_msrun("tests/distributed/workers/golden_worker.py", gc.DISTRIBUTED, workers=2, timeout=600)
    arrays = {"cpu": np.array(cpu_name())}
    for rank, result in run.results.items():
        for name, weights in result["cases"].items():
            for key, value in weights.items():
                arrays[f"rank{rank}/{name}/{key}"] = np.asarray(value, np.float32)
    np.savez_compressed(os.path.join(HERE, "two_ranks.npz"), **arrays)
    print("two ranks recorded in", run.elapsed, "s")


if __name__ == "__main__":
    if "--two-ranks" in sys.argv:
        record_two_ranks()
    else:
        record_single()
