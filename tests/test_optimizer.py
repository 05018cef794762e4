"""fastadam.Adam: the optimizer object, its state_dict and its .npz checkpoints."""
import numpy as np
import pytest

import fastadam
from reference import adam_reference


def make_params(rng, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in [(10, 3), (3,), (1,)]]


def test_steps_follow_reference(rng):
    params = make_params(rng, np.float64)
    state = [(p.copy(), np.zeros_like(p), np.zeros_like(p)) for p in params]
    opt = fastadam.Adam(params, lr=0.01, betas=(0.8, 0.9), eps=1e-7, nesterov=True,
                        convention="tf")  # issue 8: the default convention is now "torch"
    for t in range(1, 11):
        grads = [rng.standard_normal(p.shape) for p in params]
        assert opt.step(grads)
        state = [adam_reference(x, g, m, v, t, lr=0.01, beta1=0.8, beta2=0.9, eps=1e-7,
                                nesterov=True)[:3] for (x, m, v), g in zip(state, grads)]
    assert opt.t == 10
    for p, (x, _, _) in zip(params, state):
        np.testing.assert_allclose(p, x, rtol=1e-13)


def test_skipped_step_does_not_count(rng):
    params = make_params(rng)
    opt = fastadam.Adam(params)
    grads = [np.ones_like(p) for p in params]
    grads[2][0] = np.nan
    assert opt.step(grads, skip_nonfinite=True) is False
    assert opt.t == 0


def run(opt, grads):
    for g in grads:
        opt.step(g)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_save_load_resumes_bit_exactly(tmp_path, rng, amsgrad):
    params = make_params(rng)
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in params] for _ in range(10)]
    kwargs = dict(lr=0.05, amsgrad=amsgrad, convention="torch", weight_decay=0.01)
    straight = [p.copy() for p in params]
    run(fastadam.Adam(straight, **kwargs), grads)

    first = [p.copy() for p in params]
    opt = fastadam.Adam(first, **kwargs)
    run(opt, grads[:4])
    path = tmp_path / "ckpt.npz"
    opt.save(path)

    resumed = [np.zeros_like(p) for p in params]
    opt2 = fastadam.Adam(resumed, **kwargs)
    opt2.load(path)
    assert opt2.t == 4
    run(opt2, grads[4:])
    for a, b in zip(straight, resumed):
        assert a.tobytes() == b.tobytes()


def test_state_dict_round_trip(rng):
    params = make_params(rng)
    opt = fastadam.Adam(params, lr=0.1)
    run(opt, [[np.ones_like(p) for p in params]] * 3)
    state = opt.state_dict()
    other = fastadam.Adam([p.copy() for p in params], lr=0.5)
    other.load_state_dict(state)
    assert other.t == 3 and other.hyperparameters["lr"] == 0.1
    for a, b in zip(other.m + other.v, opt.m + opt.v):
        np.testing.assert_array_equal(a, b)
    # the state is a copy: stepping the optimizer does not change it
    run(opt, [[np.ones_like(p) for p in params]])
    np.testing.assert_array_equal(state["m"][0], other.m[0])


def test_load_state_dict_with_wrong_shape_changes_nothing(rng):
    params = make_params(rng)
    opt = fastadam.Adam(params)
    state = opt.state_dict()
    state["v"][1] = np.zeros(4, np.float32)
    state["t"] = 7
    with pytest.raises(ValueError, match=r"state\['v'\]\[1\]: expected float32 of shape \(3,\)"):
        opt.load_state_dict(state)
    assert opt.t == 0


def test_load_rejects_other_files(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, a=np.zeros(3))
    opt = fastadam.Adam([np.zeros(3)])
    with pytest.raises(ValueError, match="is not a fastadam.Adam checkpoint"):
        opt.load(path)


def test_constructor_checks():
    with pytest.raises(ValueError, match=r"params: is read-only"):
        p = np.zeros(3)
        p.flags.writeable = False
        fastadam.Adam(p)
    with pytest.raises(TypeError, match=r"betas: expected a pair"):
        fastadam.Adam([np.zeros(3)], betas=0.9)
    with pytest.raises(ValueError, match=r"beta2: expected 0 <= beta2 < 1"):
        fastadam.Adam([np.zeros(3)], betas=(0.9, 1.0))
    a = np.zeros(4)
    with pytest.raises(ValueError, match=r"params\[0\] and params\[1\] share memory"):
        fastadam.Adam([a, a])
