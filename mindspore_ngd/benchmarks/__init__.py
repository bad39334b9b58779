"""Models, data sets and benchmark scripts (``python -m mindspore_ngd.benchmarks.<name>``)."""
