"""Every bad input raises a clear exception naming the argument, and changes no array."""
import itertools

import numpy as np
import pytest

import fastadam


def fresh(n=8, dtype=np.float32, count=2):
    rng = np.random.default_rng(0)
    make = lambda: [rng.standard_normal(n).astype(dtype) for _ in range(count)]  # noqa: E731
    return make(), make(), make(), make()


def snapshot(*lists):
    return [a.copy() for lst in lists for a in lst]


def assert_unchanged(before, *lists):
    after = [a for lst in lists for a in lst]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_non_array_argument():
    x, g, m, v = fresh()
    with pytest.raises(TypeError, match=r"g: expected a numpy.ndarray or a list of them, got int"):
        fastadam.step_inplace(x[0], 3, m[0], v[0], 1)
    with pytest.raises(TypeError, match=r"m\[1\]: expected a numpy.ndarray, got list"):
        fastadam.step_inplace(x, g, [m[0], [1.0]], v, 1)


def test_single_and_list_mixed():
    x, g, m, v = fresh()
    with pytest.raises(TypeError, match="pass either one ndarray each or a list"):
        fastadam.step_inplace(x[0], g, m[0], v[0], 1)


def test_length_mismatch():
    x, g, m, v = fresh()
    before = snapshot(x, m, v)
    with pytest.raises(ValueError, match=r"v: expected a list of 2 arrays like x, got 1"):
        fastadam.step_inplace(x, g, m, v[:1], 1)
    assert_unchanged(before, x, m, v)


def test_shape_mismatch_leaves_every_array_unchanged():
    x, g, m, v = fresh()
    m[1] = np.zeros(9, np.float32)
    before = snapshot(x, m, v)
    with pytest.raises(ValueError, match=r"m\[1\]: expected shape \(8,\), got \(9,\)"):
        fastadam.step_inplace(x, g, m, v, 1)
    assert_unchanged(before, x, m, v)


def test_mixed_dtypes():
    x, g, m, v = fresh()
    g[1] = g[1].astype(np.float64)
    with pytest.raises(TypeError, match=r"g\[1\]: expected dtype float32, got float64"):
        fastadam.step_inplace(x, g, m, v, 1)
    x2, g2, m2, v2 = fresh()
    x2[1] = x2[1].astype(np.float64)
    with pytest.raises(TypeError, match=r"x\[1\]: expected dtype float32, got float64"):
        fastadam.step_inplace(x2, g2, m2, v2, 1)


@pytest.mark.parametrize("dtype", [np.int32, np.complex64, np.bool_, object])
def test_unsupported_dtype(dtype):
    x = np.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=r"x: expected float16, float32 or float64, got"):
        fastadam.step_inplace(x, x.copy(), x.copy(), x.copy(), 1)


def test_byte_swapped_array():
    x = np.zeros(4, dtype=">f4")
    with pytest.raises(ValueError, match="x: expected an aligned array in native byte order"):
        fastadam.step_inplace(x, x.copy(), x.copy(), x.copy(), 1)


@pytest.mark.parametrize("name", ["x", "g", "m", "v"])
def test_non_contiguous(name):
    arrays = dict(zip("xgmv", (np.zeros(8), np.zeros(8), np.zeros(8), np.zeros(8))))
    arrays[name] = np.zeros(16)[::2]
    with pytest.raises(ValueError, match=rf"{name}: expected a C-contiguous array"):
        fastadam.step_inplace(arrays["x"], arrays["g"], arrays["m"], arrays["v"], 1)


@pytest.mark.parametrize("name", ["x", "m", "v", "v_max"])
def test_read_only_output(name):
    arrays = {k: np.ones(8) for k in ("x", "g", "m", "v", "v_max")}
    arrays[name].flags.writeable = False
    before = {k: a.copy() for k, a in arrays.items()}
    with pytest.raises(ValueError, match=rf"{name}: is read-only, but it is updated in place"):
        fastadam.step_inplace(arrays["x"], arrays["g"], arrays["m"], arrays["v"], 1,
                              amsgrad=True, v_max=arrays["v_max"])
    for k in arrays:
        np.testing.assert_array_equal(arrays[k], before[k])


def test_x_aliasing_m():
    x = np.ones(8)
    with pytest.raises(ValueError, match="x and m share memory"):
        fastadam.step_inplace(x, np.ones(8), x, np.zeros(8), 1)


def test_partial_overlap_through_views():
    buf = np.zeros(12)
    with pytest.raises(ValueError, match="share memory"):
        fastadam.step_inplace(buf[:8], np.ones(8), buf[4:], np.zeros(8), 1)


def test_gradient_aliasing_an_output():
    x, g, m, v = fresh()
    g[1] = v[0]
    before = snapshot(x, m, v)
    with pytest.raises(ValueError, match=r"g\[1\] and v\[0\] share memory"):
        fastadam.step_inplace(x, g, m, v, 1)
    assert_unchanged(before, x, m, v)


def test_same_parameter_twice_in_list():
    x, g, m, v = fresh()
    x[1] = x[0]
    with pytest.raises(ValueError, match=r"x\[0\] and x\[1\] share memory"):
        fastadam.step_inplace(x, g, m, v, 1)


@pytest.mark.parametrize("a,b", list(itertools.combinations("xgmv", 2)))
def test_single_arrays_sharing_one_element_are_named_and_nothing_is_written(a, b):
    # the one-array-each case is checked from the headers first (plain_single_step); an
    # overlap of a single element at either end must still reach the full check and its name
    buf = np.arange(15, dtype=np.float64)
    arrays = {k: np.full(8, 0.5) for k in "xgmv"}
    arrays[a], arrays[b] = buf[:8], buf[7:]
    before = {k: arr.copy() for k, arr in arrays.items()}
    with pytest.raises(ValueError, match=rf"({a} and {b}|{b} and {a}) share memory"):
        fastadam.step_inplace(arrays["x"], arrays["g"], arrays["m"], arrays["v"], 1)
    for k in "xgmv":
        np.testing.assert_array_equal(arrays[k], before[k])


LIST_BUFFERS = [(name, i) for name in "xgmv" for i in range(2)]


@pytest.mark.parametrize("a,b", [pair for pair in itertools.combinations(LIST_BUFFERS, 2)
                                 if pair != (("g", 0), ("g", 1))])
def test_listed_arrays_sharing_one_element_are_named_and_nothing_is_written(a, b):
    # the same for two tensors per argument (checked from the headers first when small)
    buf = np.arange(15, dtype=np.float64)
    arrays = {k: [np.full(8, 0.5), np.full(8, 0.5)] for k in "xgmv"}
    arrays[a[0]][a[1]], arrays[b[0]][b[1]] = buf[:8], buf[7:]
    before = {k: [arr.copy() for arr in lst] for k, lst in arrays.items()}
    la, lb = f"{a[0]}\\[{a[1]}\\]", f"{b[0]}\\[{b[1]}\\]"
    with pytest.raises(ValueError, match=rf"({la} and {lb}|{lb} and {la}) share memory"):
        fastadam.step_inplace(arrays["x"], arrays["g"], arrays["m"], arrays["v"], 1)
    for k in "xgmv":
        for arr, old in zip(arrays[k], before[k]):
            np.testing.assert_array_equal(arr, old)


def test_two_gradients_may_share_memory():
    # only a written array may not share: one gradient array given for two parameters is fine
    x, g, m, v = fresh()
    x2, _, m2, v2 = (snapshot(lst) for lst in (x, g, m, v))
    shared = g[0]
    assert fastadam.step_inplace(x, [shared, shared], m, v, 1)
    assert fastadam.step_inplace(x2, [shared.copy(), shared.copy()], m2, v2, 1)
    for a, b in zip(x + m + v, x2 + m2 + v2):
        assert a.tobytes() == b.tobytes()


def test_adjacent_single_arrays_do_not_overlap():
    # one buffer cut into four touching pieces steps like four separate arrays
    rng = np.random.default_rng(3)
    start = rng.standard_normal((4, 8)).astype(np.float32)
    start[2:] = np.abs(start[2:])
    buf = start.copy().ravel()
    views = [buf[i * 8:(i + 1) * 8] for i in range(4)]
    separate = [row.copy() for row in start]
    for t in (1, 2):
        assert fastadam.step_inplace(*views, t, convention="torch")
        assert fastadam.step_inplace(*separate, t, convention="torch")
    for view, arr in zip(views, separate):
        assert view.tobytes() == arr.tobytes()


def test_an_ndarray_subclass_is_still_accepted():
    class Sub(np.ndarray):
        pass

    x, g, m, v = (np.ones(8, np.float32).view(Sub) for _ in range(4))
    plain = [np.ones(8, np.float32) for _ in range(4)]
    assert fastadam.step_inplace(x, g, m, v, 1)
    assert fastadam.step_inplace(*plain, 1)
    assert np.asarray(x).tobytes() == plain[0].tobytes()


def test_empty_arrays_never_overlap():
    buf = np.zeros(0)
    assert fastadam.step_inplace(buf, buf, buf, buf, 1)


@pytest.mark.parametrize("kwargs,exc,pattern", [
    ({"beta1": 1.0}, ValueError, r"beta1: expected 0 <= beta1 < 1, got 1.0"),
    ({"beta1": -0.1}, ValueError, r"beta1: expected 0 <= beta1 < 1, got -0.1"),
    ({"beta2": 1.5}, ValueError, r"beta2: expected 0 <= beta2 < 1, got 1.5"),
    ({"eps": 0.0}, ValueError, r"eps: expected eps > 0, got 0.0"),
    ({"eps": -1e-8}, ValueError, r"eps: expected eps > 0"),
    ({"eps": float("inf")}, ValueError, r"eps: expected a finite number, got inf"),
    ({"lr": float("nan")}, ValueError, r"lr: expected a finite number, got nan"),
    ({"lr": "0.1"}, TypeError, r"lr: expected a real number, got str"),
    ({"weight_decay": float("inf")}, ValueError, r"weight_decay: expected a finite number"),
    ({"post_decay": None}, TypeError, r"post_decay: expected a real number, got NoneType"),
    ({"grad_scale": 0.0}, ValueError, r"grad_scale: expected a non-zero number"),
    ({"grad_scale": float("nan")}, ValueError, r"grad_scale: expected a finite number"),
    ({"convention": "keras"}, ValueError, r"convention: expected one of \('tf', 'torch', 'onnx'\)"),
    ({"amsgrad": True}, ValueError, r"v_max: amsgrad=True needs v_max"),
    ({"num_threads": 0}, ValueError, r"num_threads: expected a non-zero int"),
    ({"num_threads": 1.5}, TypeError, r"num_threads: expected None or an int, got float"),
])
def test_invalid_hyperparameters(kwargs, exc, pattern):
    x, g, m, v = fresh()
    before = snapshot(x, m, v)
    with pytest.raises(exc, match=pattern):
        fastadam.step_inplace(x, g, m, v, 1, **kwargs)
    assert_unchanged(before, x, m, v)


@pytest.mark.parametrize("convention", ["tf", "torch"])
@pytest.mark.parametrize("t", [0, -3])
def test_step_number_below_one(convention, t):
    x, g, m, v = fresh()
    with pytest.raises(ValueError, match=rf"t: expected a step number >= 1 for convention "
                                         rf"'{convention}', got {t}"):
        fastadam.step_inplace(x, g, m, v, t, convention=convention)


@pytest.mark.parametrize("t", [1.0, True, "1", None])
def test_step_number_type(t):
    x, g, m, v = fresh()
    with pytest.raises(TypeError, match="t: expected an int step number"):
        fastadam.step_inplace(x, g, m, v, t)


def test_numpy_integer_step_number_is_accepted():
    x, g, m, v = fresh()
    assert fastadam.step_inplace(x, g, m, v, np.int64(2**40))
