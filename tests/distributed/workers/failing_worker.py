"""msrun worker that fails on rank 1 before init(): run_msrun must stop the job and show the error."""
from distributed import run_worker, worker_rank


def main():
    if worker_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    from mindspore.communication import init
    init()      # never completes: rank 1 is gone


if __name__ == "__main__":
    run_worker(main)
