"""fastadam._core: the compiled drivers (private; the public API is fastadam.optim, .sparse, ...).

- ``_coeffs.pyx`` / ``_coeffs.pxd``: the coefficient objects each optimizer's kernels read;
- ``_registry.py``: the Python side of the optimizer registration list
  (include/fastadam/optimizers.def): one spec per optimizer;
- ``_dense.pyx``: one multi-tensor driver for every dense optimizer (kernels:
  include/fastadam/dense.c);
- ``_sparse.pyx``: the sparse driver: radix sort, segment tables, segment sum, row walks
  (include/fastadam/sparse.c);
- ``_validation.pyx``: every array check, all done before any write;
- ``_config.pyx``: build facts (the CPU's SIMD level, OpenMP, float16) for
  ``fastadam.show_config()``;
- ``_cpu_level.py``: the CPU level the kernels run, the CPU's best capped by
  ``FASTADAM_CPU_LEVEL`` (read once; each compiled module sets its kernels' level from it);
- ``_autodiff_kernels.pyx``: the gradient engine's array kernels
  (include/fastadam/autodiff_kernels.c);
- ``_threads.py``: thread counts and the measured thread choice of every driver;
- ``_mempool.pyx``: ``fastadam.MemoryPool``, a caching pool for NumPy array data installed per
  context (NumPy's data-allocator handler; the pool: include/fastadam/mempool.c).

Each extension is listed by name with its sources in setup.py.  The front-ends' own compiled
modules (fastadam/sklearn/_kernels.pyx, fastadam/sparse/_csr.pyx, fastadam/autodiff/_tape.pyx,
fastadam/bench/_yardstick.pyx, and fastadam/optim/_step_path.pyx, the compiled every-step path of
the optimizer objects, the prepared and the functional steps) stay with their packages.  Nothing here imports a package above
it (tests/test_layering.py).
"""
