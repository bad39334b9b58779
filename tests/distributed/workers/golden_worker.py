"""msrun worker: the golden cases of tests/golden_cases.py on this rank's half of every batch, under
DATA_PARALLEL. usage: golden_worker.py CASE [CASE ...]; reports every case's weights after 20 steps."""
import sys

from distributed import init_data_parallel, run_worker, write_result


def main(names):
    rank, world = init_data_parallel()
    import golden_cases as gc
    cases = {}
    for name in names:
        net, opt, step = gc.build(name)
        gc.train(step, 0, gc.STEPS, rank, world)
        cases[name] = {p.name: p.asnumpy().tolist() for p in net.trainable_params()}
    write_result({"rank": rank, "cases": cases})


if __name__ == "__main__":
    run_worker(main, sys.argv[1:])
