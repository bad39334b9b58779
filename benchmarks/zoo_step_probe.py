"""Per-step probe of a model-zoo run: after every step of ``model_zoo/resnet50/train.py``, the loss, the
update norm (all, convolutions, BatchNorm, classifier), each parameter's update, the step's time and, for
a natural-gradient optimizer, its counters (``state_counters()``: SP-NGD's count each statistic's
refreshes).

    python -m benchmarks.zoo_step_probe OUT.json [--factors] [--skip LAYER,...] -- TRAIN.PY ARGUMENTS

Runs ``train.py`` in this process with every argument after ``--`` and one more callback, which
copies the trainable parameters before and after each step (host copies: about 0.1 s a step for
ResNet-50; the step's time leaves them out). ``--factors`` also records, after steps 0, 1 and 4, the
trace of every stored A and G of a natural-gradient optimizer and the layers whose G is exactly zero.
``--skip`` leaves the named Dense/Conv2d cells un-preconditioned (``skip_layers`` of
:class:`mindspore_ngd.NGDOptimizer`, which the zoo's ``thor`` section does not expose), for diagnosis
only. Used for issue 32's first-epoch measurements (docs/performance.md, "THOR's ImageNet recipes at
small scale") and issue 36's SP-NGD steps on real images.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "model_zoo", "resnet50")


def _group(name):
    if name.endswith(("gamma", "beta")):
        return "bn"
    return "fc" if name.startswith(("fc.", "end_point.")) else "conv"


def make_probe(optimizer, out_path, factors):
    from mindspore.train import Callback

    import mindspore_ngd as ngd

    class StepProbe(Callback):
        def __init__(self):
            super().__init__()
            self.params = [p for p in optimizer.parameters if p.requires_grad]
            self.rows, self.before = [], None

        def on_train_step_begin(self, run_context):
            self.before = [p.asnumpy().copy() for p in self.params]
            self.start = time.perf_counter()

        def on_train_step_end(self, run_context):
            seconds = time.perf_counter() - self.start        # the step alone: the copies are outside
            output = run_context.original_args().net_outputs
            loss = float((output[0] if isinstance(output, (tuple, list)) else output).asnumpy())
            per, groups = {}, {}
            for p, b in zip(self.params, self.before):
                d2 = float(((p.asnumpy() - b) ** 2).sum())
                per[p.name] = d2 ** 0.5
                groups[_group(p.name)] = groups.get(_group(p.name), 0.0) + d2
            step = len(self.rows)
            row = {"step": step, "loss": loss, "seconds": seconds, "update_norm": sum(groups.values()) ** 0.5,
                   "update_norms": {k: v ** 0.5 for k, v in groups.items()}, "per_parameter": per}
            if isinstance(optimizer, ngd.NGDOptimizer):     # refresh counts so far (SP-NGD: per statistic)
                row["counters"] = optimizer.state_counters()
            if factors and step in (0, 1, 4):
                traces = {}
                for block in getattr(optimizer, "blocks", ()):
                    for tag, param in (("A", block.a_factor), ("G", block.g_factor)):
                        traces[f"{block.spec.name}.{tag}"] = float(np.trace(param.asnumpy()))
                row["traces"] = traces
                row["zero_G"] = [n for n, t in traces.items() if n.endswith(".G") and t == 0.0]
            shown = {k: v for k, v in row.items() if k not in ("per_parameter", "traces", "counters")}
            print("probe", json.dumps(shown), flush=True)
            self.rows.append(row)
            with open(out_path, "w", encoding="utf-8") as handle:
                json.dump(self.rows, handle)

    return StepProbe()


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m benchmarks.zoo_step_probe OUT.json [--factors] [--skip L,...] -- ARGS")
    cut = argv.index("--")
    parser = argparse.ArgumentParser(prog="benchmarks.zoo_step_probe")
    parser.add_argument("out")
    parser.add_argument("--factors", action="store_true")
    parser.add_argument("--skip", default="")
    args = parser.parse_args(argv[:cut])
    out_path = os.path.abspath(args.out)

    import mindspore_ngd as ngd
    from mindspore_ngd.optim import engine

    if args.skip:
        init = engine.NGDOptimizer.__init__

        def init_skipping(self, *a, **k):
            k["skip_layers"] = tuple(args.skip.split(","))
            return init(self, *a, **k)
        engine.NGDOptimizer.__init__ = init_skipping

    stops = ngd.train.with_divergence_stops

    def with_probe(callbacks, optimizer, *a, **k):
        return stops(callbacks, optimizer, *a, **k) + [make_probe(optimizer, out_path, args.factors)]
    ngd.train.with_divergence_stops = with_probe        # train.py looks it up at call time
    sys.path.insert(0, ZOO)
    os.chdir(ZOO)
    import train                                        # pylint: disable=import-outside-toplevel
    return train.main(argv[cut + 1:])


if __name__ == "__main__":
    main()
