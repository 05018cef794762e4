"""fastadam.bench's one timer reads the clock it is given (asv_bench/torch_report.py --clock
cpu passes time.thread_time)."""
import itertools

from fastadam.bench import sample_seconds_interleaved


def test_interleaved_samples_read_the_given_clock():
    ticks = itertools.count()  # each read of the clock advances it by one "second"
    calls = []
    samples = sample_seconds_interleaved({"a": lambda: calls.append("a"),
                                          "b": lambda: calls.append("b")},
                                         repeats=3, inner=4, warmup=1,
                                         clock=lambda: float(next(ticks)))
    # one start and one end read per round and contender: 1 tick over 4 calls
    assert {k: v.tolist() for k, v in samples.items()} == {"a": [0.25] * 3, "b": [0.25] * 3}
    assert calls == ["a", "b"] + ["a"] * 4 + ["b"] * 4 + ["a"] * 4 + ["b"] * 4 + ["a"] * 4 \
        + ["b"] * 4
