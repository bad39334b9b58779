"""The distributed benchmark (benchmarks/distributed.py) without launching it: its Markdown table of
one-process and per-rank rows."""
from benchmarks.distributed import markdown


def test_distributed_benchmark_table_formats_one_process_and_rank_rows():
    base = dict(rank=0, owned=10, owned_cost_share=1.0, inversion_ms=40.0, quiet_ms=50.0, refresh_ms=90.0,
                amortised_ms=60.0, factor_bytes=1.2e6, factor_bytes_reduce_scatter=0.7e6,
                full_factor_allreduce_bytes=2.3e6, gather_bytes=0.16e6, dp_gradient_allreduce_bytes=0.3e6)
    rows = [dict(base, run="1 process", world=1), dict(base, run="2 ranks", world=2, owned=1, owned_cost_share=0.77)]
    table = markdown(rows, {"batch": 64, "period": 5, "rounds": 4, "repeats": 10, "data": "digits"}).splitlines()
    assert table[4] == "| 1 process | 0 | 10 (100%) | 40.0 | 50.0 | 90.0 | 60.0 | - | - | - | - |"
    assert table[5] == "| 2 ranks | 0 | 1 (77%) | 40.0 | 50.0 | 90.0 | 60.0 | 1.200 (0.700) | 2.300 | 0.160 | 0.300 |"
