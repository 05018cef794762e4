"""Every error message of the optimizer objects, schedules and clipping: one test per message,
each also checking that nothing changed (parameters, state, step count)."""
import numpy as np
import pytest

import fastadam
from fastadam.optim import schedules

scipy_sparse = pytest.importorskip("scipy.sparse")

HAS_ADAGRAD = hasattr(fastadam.optim, "adagrad_step_inplace")
HAS_MOMENTUM = hasattr(fastadam.optim, "momentum_step_inplace")
Adam = fastadam.Adam


def swapped():
    return np.zeros(3, dtype=">f8")


@pytest.mark.parametrize("build, exc, pattern", [
    (lambda: Adam([[1.0, 2.0]]), TypeError,
     r"params\[0\]: expected a numpy.ndarray or a fastadam.autodiff.Tensor, got list"),
    (lambda: Adam([np.zeros(3, np.int64)]), TypeError,
     r"params\[0\]: expected float16, float32 or float64, got int64"),
    (lambda: Adam([np.zeros((4, 4))[:, 1]]), ValueError,
     r"params\[0\]: expected a C-contiguous array"),
    (lambda: Adam(swapped()), ValueError, r"params: expected an aligned array in native byte"),
    (lambda: Adam([{"params": [np.zeros(2)]}, np.zeros(2)]), TypeError,
     r"params: expected parameters or a list of dicts \(groups\), got a ndarray at position 1"),
    (lambda: Adam([{"lr": 0.1}]), ValueError, r"param_groups\[0\]: missing key 'params'"),
    (lambda: Adam([{"params": [np.zeros(2)], "lrr": 0.1}]), ValueError,
     r"param_groups\[0\]: unknown hyper-parameter 'lrr'"),
    (lambda: Adam([{"params": [np.zeros(2)]}, {"params": [np.zeros(2)], "weight_decay": -1}]),
     ValueError, r"param_groups\[1\]: weight_decay: expected a number >= 0, got -1.0"),
    (lambda: Adam([{"params": [np.zeros(2)], "amsgrad": True}]), ValueError,
     r"param_groups\[0\]: unknown hyper-parameter 'amsgrad'"),
    (lambda: Adam([np.zeros(2)], lr=-0.1), ValueError, r"lr: expected a number >= 0, got -0.1"),
    (lambda: Adam([np.zeros(2)], lr="0.1"), TypeError, r"lr: expected a real number, got str"),
    (lambda: Adam([np.zeros(2)], lr=float("nan")), ValueError,
     r"lr: expected a finite number, got nan"),
    (lambda: Adam([np.zeros(2)], weight_decay=-0.01), ValueError,
     r"weight_decay: expected a number >= 0, got -0.01"),
    (lambda: Adam([np.zeros(2)], eps=0.0), ValueError, r"eps: expected eps > 0, got 0.0"),
    (lambda: Adam([np.zeros(2)], convention="keras"), ValueError,
     r"convention: expected one of \('torch', 'tf', 'onnx'\), got 'keras'"),
    (lambda: Adam([np.zeros(2)], maximize="false"), TypeError,
     r"maximize: expected a bool, got str 'false'"),
    (lambda: Adam([np.zeros(2)], amsgrad=1), TypeError, r"amsgrad: expected a bool, got int 1"),
    (lambda: Adam([np.zeros(2)], sparse_mode="catchup"), ValueError,
     r"sparse_mode: expected one of \('lazy', 'dense'\), got 'catchup'"),
    (lambda: Adam([np.zeros(2, np.float32)], master_weights=True), ValueError,
     r"master_weights: a float32 master copy is for bfloat16 parameters; these are float32"),
    (lambda: Adam([np.zeros(2)], clip_grad_norm=0.0), ValueError,
     r"clip_grad_norm: expected a number > 0 or None, got 0.0"),
    (lambda: Adam([np.zeros(2)], num_threads="4"), TypeError,
     r"num_threads: expected None or an int, got str"),
    (lambda: Adam([np.zeros(2)]).add_param_group([np.zeros(2)]), TypeError,
     r"param_group: expected a dict, got list"),
])
def test_constructor_errors(build, exc, pattern):
    with pytest.raises(exc, match=pattern):
        build()


def test_add_param_group_with_a_parameter_already_there_changes_nothing():
    a = np.zeros(4)
    opt = Adam([a])
    with pytest.raises(ValueError, match=r"params\[0\] and params\[1\] share memory"):
        opt.add_param_group({"params": [a[:2]]})
    assert len(opt.param_groups) == 1 and len(opt.params) == 1 and len(opt.m) == 1


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(lrr=0.1), ValueError, r"lrr: unknown hyper-parameter"),
    (dict(amsgrad=True), ValueError, r"amsgrad: fixed when the optimizer is built"),
    (dict(group=3, lr=0.1), IndexError,
     r"group: expected a group index in \[0, 1\) or None, got 3"),
    (dict(betas=(0.9, 1.5)), ValueError, r"beta2: expected 0 <= beta2 < 1, got 1.5"),
])
def test_set_hyperparameters_errors(kwargs, exc, pattern):
    opt = Adam([np.zeros(2)], lr=0.5)
    with pytest.raises(exc, match=pattern):
        opt.set_hyperparameters(**kwargs)
    assert opt.param_groups[0]["lr"] == 0.5 and opt.param_groups[0]["betas"] == (0.9, 0.999)


def test_clip_grad_norm_setter_checks():
    opt = Adam([np.zeros(2)], clip_grad_norm=1.0)
    with pytest.raises(ValueError, match=r"clip_grad_norm: expected a finite number, got inf"):
        opt.clip_grad_norm = float("inf")
    assert opt.clip_grad_norm == 1.0


def test_schedule_returning_a_negative_rate():
    x = np.ones(2)
    opt = Adam([x], lr=lambda k: -1.0)
    with pytest.raises(ValueError, match=r"lr: the schedule of group 0 returned -1.0 at step 0; "
                                         r"expected a finite number >= 0"):
        opt.step([np.ones(2)])
    assert opt.t == 0 and np.all(x == 1)


def params3():
    return [np.ones((20, 4), np.float32), np.ones(3, np.float32), np.ones((6, 5), np.float32)]


def good_grads():
    return [np.ones((20, 4), np.float32), np.ones(3, np.float32), np.ones((6, 5), np.float32)]


def csr(shape=(6, 5), dtype=np.float32):
    return scipy_sparse.csr_matrix(np.eye(*shape, dtype=dtype))


def slices(indices, values_dtype=np.float32, shape=(20, 4)):
    indices = np.asarray(indices)
    return fastadam.IndexedSlices(np.ones((len(indices),) + shape[1:], values_dtype), indices,
                                  shape)


def replace(i, g):
    grads = good_grads()
    grads[i] = g
    return grads


@pytest.mark.parametrize("grads, exc, pattern", [
    (good_grads()[:2], ValueError, r"grads: expected 3 gradients \(one per parameter\), got 2"),
    (np.ones(3, np.float32), TypeError,
     r"grads: expected a list of 3 gradients \(one per parameter\), got a single ndarray"),
    ({"a": 1}, TypeError, r"grads: expected a list of gradients, got dict"),
    (replace(1, np.ones(3)), TypeError,
     r"grads\[1\]: expected dtype float32 \(the dtype of params\[1\]\), got float64"),
    (replace(1, np.ones(4, np.float32)), ValueError,
     r"grads\[1\]: expected shape \(3,\) \(the shape of params\[1\]\), got \(4,\)"),
    (replace(2, [1.0]), TypeError, r"grads\[2\]: expected a numpy.ndarray, a "
                                   r"fastadam.autodiff.Tensor, an IndexedSlices or a SciPy CSR"),
    (replace(0, slices([1], shape=(21, 4))), ValueError,
     r"grads\[0\]: dense_shape \(21, 4\) does not match the shape \(20, 4\) of params\[0\]"),
    (replace(0, slices([1], np.float64)), TypeError,
     r"grads\[0\]: expected values of dtype float32 \(the dtype of params\[0\]\), got float64"),
    (replace(0, slices(np.array([1], np.uint32))), TypeError,
     r"grads\[0\]: expected int32 or int64 indices, got uint32"),
    (replace(0, slices([3, 20])), IndexError,
     r"grads\[0\]: index 20 is out of range for the 20 rows of params\[0\]"),
    (replace(0, slices([-1, 2])), IndexError,
     r"grads\[0\]: index -1 is out of range for the 20 rows of params\[0\]"),
    (replace(2, scipy_sparse.coo_matrix(np.eye(6, 5, dtype=np.float32))), TypeError,
     r"grads\[2\]: expected a SciPy CSR matrix or array, got format 'coo'"),
    (replace(2, csr((5, 5))), ValueError,
     r"grads\[2\]: CSR shape \(5, 5\) does not match the shape \(6, 5\) of params\[2\]"),
    (replace(2, csr(dtype=np.float64)), TypeError,
     r"grads\[2\]: expected data of dtype float32 \(the dtype of params\[2\]\), got float64"),
    (replace(2, scipy_sparse.csr_matrix((np.ones(1, np.float32), np.array([7]),
                                         np.array([0, 1, 1, 1, 1, 1, 1])), shape=(6, 5))),
     ValueError, r"grads\[2\]: invalid CSR matrix"),
])
def test_step_gradient_errors_change_nothing(grads, exc, pattern):
    params = params3()
    opt = Adam(params, lr=0.1)
    with pytest.raises(exc, match=pattern):
        opt.step(grads)
    assert opt.t == 0 and all(np.all(p == 1) for p in params)
    assert not any(m.any() for m in opt.m)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(amsgrad=True), r"grads\[0\]: a sparse gradient cannot be used with amsgrad=True"),
    (dict(nesterov=True), r"grads\[0\]: a sparse gradient cannot be used with nesterov=True"),
    (dict(post_decay=0.1), r"grads\[0\]: a sparse gradient cannot be used with post_decay"),
])
def test_sparse_gradient_with_an_unsupported_option(kwargs, pattern):
    params = params3()
    opt = Adam(params, **kwargs)
    with pytest.raises(ValueError, match=pattern):
        opt.step(replace(0, slices([1, 2])))
    assert opt.t == 0 and all(np.all(p == 1) for p in params)


def test_sparse_gradient_of_a_float16_parameter():
    opt = Adam([np.ones((4, 2), np.float16)])
    with pytest.raises(TypeError, match=r"grads\[0\]: sparse gradients need a float32 or "
                                        r"float64 parameter, params\[0\] is float16"):
        opt.step(fastadam.IndexedSlices(np.ones((1, 2), np.float16), np.array([1]), (4, 2)))


def test_step_without_grads_needs_tensors():
    opt = Adam([np.ones(2)])
    with pytest.raises(TypeError, match=r"grads: required when a parameter is a plain ndarray "
                                        r"\(params\[0\]\)"):
        opt.step()


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(grad_scale=0.0), ValueError, r"grad_scale: expected a non-zero number, got 0.0"),
    (dict(grad_scale=float("nan")), ValueError, r"grad_scale: expected a finite number, got nan"),
    (dict(skip_nonfinite="yes"), TypeError, r"skip_nonfinite: expected a bool, got str 'yes'"),
])
def test_step_option_errors(kwargs, exc, pattern):
    x = np.ones(2)
    opt = Adam([x])
    with pytest.raises(exc, match=pattern):
        opt.step([np.ones(2)], **kwargs)
    assert opt.t == 0 and np.all(x == 1)


def test_state_of_an_unknown_parameter():
    with pytest.raises(IndexError, match=r"param: .* is not a parameter of this optimizer"):
        Adam([np.ones(2)]).state(np.ones(2))


@pytest.mark.parametrize("build, exc, pattern", [
    (lambda: schedules.step(0.1, 0), ValueError, r"step_size: expected an int >= 1, got 0"),
    (lambda: schedules.step(0.1, 2.5), TypeError, r"step_size: expected an int, got float"),
    (lambda: schedules.exponential(0.1, -0.5), ValueError,
     r"gamma: expected a finite number >= 0.0, got -0.5"),
    (lambda: schedules.constant("a"), TypeError, r"lr: expected a real number, got str"),
    (lambda: schedules.cosine(0.1, 10, warmup_steps=10), ValueError,
     r"warmup_steps: expected fewer than total_steps=10, got 10"),
    (lambda: schedules.one_cycle(0.1, 10, anneal="exp"), ValueError,
     r"anneal: expected 'cos' or 'linear', got 'exp'"),
    (lambda: schedules.one_cycle(0.1, 10, three_phase="no"), TypeError,
     r"three_phase: expected a bool, got str"),
    (lambda: schedules.cosine(0.1, 10, periodic=1), TypeError,
     r"periodic: expected a bool, got int"),
    (lambda: schedules.one_cycle(0.1, 10, pct_start=0.01), ValueError,
     r"pct_start: 0.01 leaves an empty phase for total_steps=10"),
    (lambda: schedules.one_cycle(0.1, 10, pct_start=0.0), ValueError,
     r"pct_start: expected a finite number > 0.0 and <= 1.0, got 0.0"),
    (lambda: schedules.from_dict({"schedule": "warp"}), ValueError,
     r"schedule: unknown schedule 'warp'"),
    (lambda: schedules.from_dict({"schedule": "step", "lr": 0.1}), ValueError,
     r"schedule 'step': .*step_size"),
    (lambda: schedules.from_dict([1]), TypeError, r"schedule: expected a dict, got list"),
])
def test_schedule_errors(build, exc, pattern):
    with pytest.raises(exc, match=pattern):
        build()


def test_clip_grad_norm_errors():
    g = np.ones(3)
    with pytest.raises(ValueError, match=r"max_norm: expected a finite number > 0, got -1.0"):
        fastadam.clip_grad_norm([g], -1.0)
    ro = np.ones(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"grads\[1\]: clip_grad_norm scales gradients in "
                                         r"place; expected a writable array"):
        fastadam.clip_grad_norm([g, ro], 0.1)
    assert np.all(g == 1)


@pytest.mark.skipif(not HAS_MOMENTUM, reason="needs fastadam.optim.momentum_step_inplace")
@pytest.mark.parametrize("kwargs", [dict(nesterov=True), dict(nesterov=True, momentum=0.9,
                                                              dampening=0.1)])
def test_sgd_nesterov_rule(kwargs):
    with pytest.raises(ValueError, match=r"nesterov: Nesterov momentum needs momentum > 0 and "
                                         r"dampening = 0"):
        fastadam.SGD([np.zeros(2)], **kwargs)


@pytest.mark.skipif(not HAS_MOMENTUM, reason="needs fastadam.optim.momentum_step_inplace")
def test_sgd_negative_momentum():
    with pytest.raises(ValueError, match=r"momentum: expected momentum >= 0, got -0.9"):
        fastadam.SGD([np.zeros(2)], momentum=-0.9)


@pytest.mark.skipif(not HAS_ADAGRAD, reason="needs fastadam.optim.adagrad_step_inplace")
def test_adagrad_convention():
    with pytest.raises(ValueError, match=r"convention: expected one of \('torch', 'onnx', "
                                         r"'keras'\), got 'tf'"):
        fastadam.Adagrad([np.zeros(2)], convention="tf")


@pytest.mark.skipif(not HAS_ADAGRAD, reason="needs fastadam.optim.adagrad_step_inplace")
def test_adagrad_negative_lr_decay():
    with pytest.raises(ValueError, match=r"lr_decay: expected lr_decay >= 0, got -0.1"):
        fastadam.Adagrad([np.zeros(2)], lr_decay=-0.1)
