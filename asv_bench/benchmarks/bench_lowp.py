"""Low-precision optimizer states (issue 24): each format's Adam step against the float32 step
and against the stream loop that moves its bytes, 1e7 elements, float32 gradients.

The report script asv_bench/lowp_report.py prints the same ratios side by side, with the byte
limits (28 bytes per parameter over each format's bytes) beside them.  A fastadam without
``state_dtype`` (or without ml_dtypes, for the bfloat16 parameters) skips these (``n/a``).
"""
import numpy as np

import fastadam

try:
    from . import _api
except ImportError:  # imported as a top-level module (tests put benchmarks/ on sys.path)
    import _api

SIZE = 10**7
BLOCK = 256
# format: (Adam keywords, parameter/gradient dtype, state bytes)
FORMATS = {
    "bfloat16": ({"state_dtype": "bfloat16"}, "float32", 2),
    "int8": ({"state_dtype": "int8", "block_size": BLOCK}, "float32", 1),
    "int8-bf16-sr": ({"state_dtype": "int8", "block_size": BLOCK,
                      "param_rounding": "stochastic", "seed": 1}, "bfloat16", 1),
}


def _arrays(dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SIZE, dtype=np.float32)
    g = rng.standard_normal(SIZE, dtype=np.float32)
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise NotImplementedError("ml_dtypes is not installed") from None
        x, g = x.astype(ml_dtypes.bfloat16), g.astype(ml_dtypes.bfloat16)
    return x, g


def _adam_step(keywords, dtype, threads, seed=0):
    x, g = _arrays(dtype, seed)
    try:
        opt = fastadam.Adam([x], lr=1e-3, num_threads=threads, **keywords)
        opt.step([g])
    except TypeError as exc:  # a fastadam before issue 24: no state_dtype
        raise NotImplementedError(f"this fastadam has no low-precision states: {exc}") from None
    return lambda: opt.step([g])


def _stream(dtype, state_bytes, threads):
    format_stream = _api.bench_attr("format_stream")
    return format_stream(2 if dtype == "bfloat16" else 4, state_bytes, SIZE, BLOCK, threads)


class LowPrecisionRatios:
    """The ratios issue 24 sets, measured in one process (interleaved rounds, medians): the
    float32 step's time over each format's (goals 1.3x bfloat16, 1.6x int8, 2.5x int8 with
    bfloat16 parameters and gradients; byte limits 1.4x, 1.74x, 2.78x), and the format's
    stream loop time over its step time (goal >= 0.9)."""

    params = (list(FORMATS), [1, 2])
    param_names = ["format", "threads"]
    timeout = 240

    def setup_cache(self):
        # every combination measured once, in one process, for both track methods (asv runs
        # setup_cache once per class); a format this fastadam lacks is stored as its reason
        median_seconds_interleaved = _api.timer()
        out = {}
        for fmt, (keywords, dtype, state_bytes) in FORMATS.items():
            for threads in self.params[1]:
                try:
                    fmt_step = _adam_step(keywords, dtype, threads)
                    stream = _stream(dtype, state_bytes, threads)
                except NotImplementedError as exc:
                    out[fmt, threads] = str(exc)
                    continue
                f32_step = _adam_step({}, "float32", threads, seed=1)
                seconds = median_seconds_interleaved(
                    {"float32": f32_step, "format": fmt_step, "stream": stream},
                    repeats=5, min_time=0.02)
                out[fmt, threads] = (seconds["float32"] / seconds["format"],
                                     seconds["stream"] / seconds["format"])
                del fmt_step, stream, f32_step
        return out

    def setup(self, cache, fmt, threads):
        if isinstance(cache[fmt, threads], str):
            raise NotImplementedError(cache[fmt, threads])

    def track_speedup_vs_float32_states(self, cache, fmt, threads):
        return cache[fmt, threads][0]

    track_speedup_vs_float32_states.unit = ("x (float32-state step time / this format's), "
                                            "higher is better")

    def track_bandwidth_fraction(self, cache, fmt, threads):
        return cache[fmt, threads][1]

    track_bandwidth_fraction.unit = ("fraction of stream_rw_bits bandwidth (same bytes), "
                                     "higher is better")
