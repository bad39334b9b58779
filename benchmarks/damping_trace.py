"""One run of the time-to-accuracy suite, step by step, with the divergence stop disabled: what the
divergence rule sees.

    python -m benchmarks.damping_trace --task fmnist-2c2d-b1024 --optimizer spngd --lr 0.1 --damping 1e-3
        [--steps 100] [--seed 0]

Trains ``--task``'s network (:mod:`benchmarks.tasks`) with ``--optimizer`` as
:mod:`benchmarks.convergence` builds it, in the same batch order, for ``--steps`` steps, with
``divergence_patience`` so large that the run never stops. Each step prints the training loss of its
batch, adaptive damping's multiplier and reduction ratio, and the count of consecutive exploding steps
of the divergence rule (:mod:`mindspore_ngd.optim.divergence`): a run the rule would stop reaches a
count of ``divergence_patience`` (10 by default). The test accuracy after the last step ends the output.
Used to tell a run the rule stops from one that is about to recover (docs/algorithms.md, "Fault
handling").
"""
import argparse
import os
import sys

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

import numpy as np  # noqa: E402

import mindspore as ms  # noqa: E402
from mindspore import nn, Tensor  # noqa: E402

__all__ = ["trace", "main"]

NEVER = 10 ** 9


def trace(task, optimizer, lr, damping, steps, seed=0, stream=None):
    """Run ``steps`` steps; returns one dict per step (``loss``, ``boost``, ``rho``, ``exploding``) and
    the test accuracy (classification tasks; None otherwise). ``stream`` gets one line per step."""
    from .convergence import OPTIMIZERS, _batches
    x_train, y_train, x_test, y_test = task.load()
    ms.set_seed(seed)
    net = task.build()
    opt = OPTIMIZERS[optimizer].build(net, lr, damping, seed, divergence_patience=NEVER)
    if not getattr(opt, "adaptive_damping", False):
        raise ValueError(f"optimizer {optimizer!r} has no adaptive damping to trace")
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, task.loss()), opt)
    cell.set_train()
    rng = np.random.default_rng(seed)
    rows = []
    while len(rows) < steps:
        for batch in _batches(rng, x_train, y_train, task.batch_size):
            loss = float(cell(*batch).asnumpy())
            controller = opt.damping_controller
            den = float(controller.ratio_den.asnumpy())
            rho = float(controller.ratio_num.asnumpy()) / den if den < 0 else float("nan")
            row = {"step": len(rows), "loss": loss, "boost": float(controller.boost.asnumpy()), "rho": rho,
                   "exploding": int(opt.finite_run.asnumpy())}
            rows.append(row)
            if stream is not None:
                print(f"step {row['step']:4d}  loss {loss:10.4f}  multiplier {row['boost']:9.3g}  ratio {rho:7.3f}  "
                      f"exploding {row['exploding']}", file=stream, flush=True)
            if len(rows) == steps:
                break
    accuracy = None
    if task.kind == "classification":
        net.set_train(False)
        outputs = np.concatenate([net(Tensor(x_test[i:i + task.eval_batch])).asnumpy()
                                  for i in range(0, len(x_test), task.eval_batch)])
        accuracy = float((outputs.argmax(1) == y_test).mean())
    return rows, accuracy


def main(argv=None):
    from .convergence import OPTIMIZERS
    from .tasks import TASKS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=sorted(TASKS))
    parser.add_argument("--optimizer", required=True, choices=[name for name in OPTIMIZERS if name not in
                                                               ("momentum", "adam", "sgd", "momentum-cf", "adam-cf")])
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--damping", type=float, required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    task = TASKS[args.task]
    reason = task.unavailable_reason()
    if reason:
        parser.error(f"task {args.task}: {reason}")
    _, accuracy = trace(task, args.optimizer, args.lr, args.damping, args.steps, args.seed, stream=sys.stdout)
    if accuracy is not None:
        print(f"test accuracy after {args.steps} steps: {accuracy:.4f}")


if __name__ == "__main__":
    main()
