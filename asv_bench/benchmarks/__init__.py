"""fastadam's asv benchmarks: one module per capability (bench_dense, bench_sparse,
bench_autodiff).  Baselines (NumPy always, PyTorch when importable) sit beside each benchmark."""
