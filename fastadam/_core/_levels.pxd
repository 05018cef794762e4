# The per-extension dispatch level of include/fastadam/common.h (declarations only: each
# extension with FA_DISPATCH kernels defines these functions in its C code, FA_DISPATCH_LEVEL_STATE).
cdef extern from "fastadam/common.h":
    int fa_use_level(int level) nogil
    int fa_level_in_use() nogil
    const char *fa_level_name(int level) nogil
    int fa_cpu_best_level() nogil
