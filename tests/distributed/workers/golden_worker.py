"""msrun worker: the golden cases (or their lean-step VARIANTS) of tests/golden_cases.py on this rank's
half of every batch, under DATA_PARALLEL. usage: golden_worker.py [--lean] CASE [CASE ...]; reports every
case's weights after 20 steps. With ``--lean`` each case is trained twice, with its usual step and with
``NGDTrainOneStepCell``, and both are reported (``cases`` and ``lean``) with the lean step counts."""
import sys

from distributed import init_data_parallel, run_worker, write_result


def _weights(net):
    return {p.name: p.asnumpy().tolist() for p in net.trainable_params()}


def main(args):
    lean = args[:1] == ["--lean"]
    names = args[1:] if lean else args
    rank, world = init_data_parallel()
    import golden_cases as gc
    cases, lean_cases, lean_steps = {}, {}, {}
    for name in names:
        net, opt, step = gc.build(name)
        gc.train(step, 0, gc.STEPS, rank, world)
        cases[name] = _weights(net)
        if lean:
            import mindspore_ngd as ngd
            from mindspore import nn
            net, opt, _ = gc.build(name)
            step = ngd.NGDTrainOneStepCell(nn.WithLossCell(net, gc.CE), opt)
            step.set_train()
            gc.train(step, 0, gc.STEPS, rank, world)
            lean_cases[name] = _weights(net)
            lean_steps[name] = step.lean_steps
    write_result({"rank": rank, "cases": cases, "lean": lean_cases, "lean_steps": lean_steps})


if __name__ == "__main__":
    run_worker(main, sys.argv[1:])
