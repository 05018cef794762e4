"""An oracle of the low-precision optimizer step (issue 24's definitions), written from the
definitions with NumPy and the float32 CPU step, for the GPU kernels' tests
(test_gpu_emulation_lowp.py on the host emulation, test_gpu_lowp.py on a GPU).  The element
oracles (maps, codes, bfloat16 rounding, the rounding hash and key) are tests/lowp_reference.py's.

The low-precision step is elementwise in float32 between its conversions, so it equals: decode
the states and parameters to float32 (bf16 bits << 16; map[code] * scale), run the float32 step
of the CPU (``fastadam.optim.prepare_step``: the optimizer's formula header, the same float32
arithmetic), and encode the results: bfloat16 to nearest even or stochastically with the
lowbias32 bits; 8-bit codes by the definition (scale = max |y|, q = y * (1 / scale) in float32,
code = the number of float64 midpoints of the map below q).  Nothing here calls the code under
test.
"""
import numpy as np

import fastadam
from fastadam._core._registry import spec as registry_spec
from lowp_reference import (NONNEGATIVE, bf16_nearest, bf16_stochastic, bf16_to_f32, dequantize,
                            quant_map, quantize, sr_bits, sr_key)

F32, BF16, Q8 = 0, 1, 2
NEAREST, STOCHASTIC = 0, 1

# (optimizer, hyper-parameters): every optimizer, and the flag sets that change the slots used
CASES = [
    ("adam", dict(lr=0.01, beta1=0.9, beta2=0.99, eps=1e-6, convention="torch")),
    ("adam", dict(lr=0.01, convention="tf", amsgrad=True, weight_decay=0.1)),
    ("adam", dict(lr=0.01, convention="torch", nesterov=True, weight_decay=0.1,
                  decoupled_weight_decay=True, grad_scale=4.0)),
    ("adagrad", dict(lr=0.05, convention="keras", weight_decay=0.01)),
    ("momentum", dict(lr=0.05, momentum=0.8, nesterov=True)),
    ("rmsprop", dict(lr=0.01, momentum=0.5, centered=True)),
    ("lion", dict(lr=1e-3, weight_decay=0.1)),
]


def case_id(case):
    name, hyper = case
    opts = [k for k in ("amsgrad", "nesterov", "centered", "decoupled_weight_decay") if hyper.get(k)]
    return "-".join([name] + opts)


def qmap(kind, signed):
    return quant_map(kind, signed)


def bf16_value(bits):
    return bf16_to_f32(bits)


def stochastic(x32, key, j):
    """x32 (float32) to bfloat16 bits by stochastic rounding, element indices j."""
    return bf16_stochastic(x32, sr_bits(key, j))


def slot_names(name, coeffs):
    """The state slots the kernels use with these coefficients' flags, in slot order."""
    spec = registry_spec(name)
    return [spec.slots[i] for i in spec.slot_indices(coeffs.flags)]


def fold(name, t, hyper):
    """The coefficient object of (name, t, hyper), as the prepared step folds it."""
    x = np.zeros(1, np.float32)
    slots = {n: np.zeros(1, np.float32) for n in registry_spec(name).slots}
    return fastadam.optim.prepare_step(name, x, slots).check(t, **hyper)


class State:
    """One step's tensors in their formats (NumPy), built from seeded random values."""

    def __init__(self, rng, name, hyper, shapes, param_fmt, grad_fmt, state_fmt, block=64,
                 qkind=0, master=False, t=5):
        self.name, self.hyper, self.t = name, hyper, t
        self.param_fmt, self.grad_fmt, self.state_fmt = param_fmt, grad_fmt, state_fmt
        self.block, self.qkind = block, qkind
        self.coeffs = fold(name, t, hyper)
        self.slots = slot_names(name, self.coeffs)
        self.signed = tuple(s not in NONNEGATIVE[name] for s in self.slots)
        self.xs, self.gs, self.masters = [], [], []
        self.states = [[] for _ in self.slots]
        self.scales = [[] for _ in self.slots] if state_fmt == Q8 else []
        for shape in shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            g = rng.standard_normal(shape).astype(np.float32)
            self.xs.append(x if param_fmt == F32 else bf16_nearest(x))
            if master:
                self.masters.append(x.copy())
            self.gs.append(g if grad_fmt == F32 else bf16_nearest(g))
            for s, signed in enumerate(self.signed):
                # signed slots small, the others >= 0.1: RMSprop's v - a^2 stays positive
                v = rng.standard_normal(shape).astype(np.float32) * np.float32(0.05)
                v = v if signed else np.abs(v) * np.float32(2) + np.float32(0.1)
                if state_fmt == F32:
                    self.states[s].append(v)
                elif state_fmt == BF16:
                    self.states[s].append(bf16_nearest(v))
                else:
                    codes, scales = quantize(v, block, qmap(qkind, signed))
                    self.states[s].append(codes.reshape(shape))
                    self.scales[s].append(scales)

    def arrays(self):
        """Every array of the step, copied (what a device would hold)."""
        return ([a.copy() for a in self.xs], [a.copy() for a in self.gs],
                [[a.copy() for a in lst] for lst in self.states],
                [[a.copy() for a in lst] for lst in self.scales],
                [a.copy() for a in self.masters])

    def expected(self, rounding=NEAREST, seed=0):
        """The arrays after the step, by the oracle: (xs, states, scales, masters)."""
        xs32 = [m.copy() for m in self.masters] if self.masters else \
            [x.copy() if self.param_fmt == F32 else bf16_value(x).reshape(x.shape).copy()
             for x in self.xs]
        gs32 = [g if self.grad_fmt == F32 else bf16_value(g).reshape(g.shape) for g in self.gs]
        st32 = []
        for s, signed in enumerate(self.signed):
            if self.state_fmt == F32:
                st32.append([a.copy() for a in self.states[s]])
            elif self.state_fmt == BF16:
                st32.append([bf16_value(a).reshape(a.shape) for a in self.states[s]])
            else:
                st32.append([dequantize(c, sc, self.block, qmap(self.qkind, signed)).reshape(
                    c.shape) for c, sc in zip(self.states[s], self.scales[s])])
        step = fastadam.optim.prepare_step(self.name, xs32, dict(zip(self.slots, st32)))
        step.step(gs32, self.t, **self.hyper)
        states, scales = [], []
        for s, signed in enumerate(self.signed):
            if self.state_fmt == F32:
                states.append(st32[s])
            elif self.state_fmt == BF16:
                states.append([bf16_nearest(a) for a in st32[s]])
            else:
                pairs = [quantize(a, self.block, qmap(self.qkind, signed)) for a in st32[s]]
                states.append([c.reshape(a.shape) for (c, _), a in zip(pairs, st32[s])])
                scales.append([sc for _, sc in pairs])
        masters = [x.copy() for x in xs32] if self.masters else []
        self._updated32 = xs32[0] if len(xs32) == 1 else None  # for expected_rows
        if self.param_fmt == F32:
            xs = xs32
        elif self.masters or rounding == NEAREST:
            xs = [bf16_nearest(x) for x in xs32]
        else:
            xs = [stochastic(x.ravel(), sr_key(seed, self.t, i), np.arange(x.size)).reshape(
                x.shape) for i, x in enumerate(xs32)]
        return xs, states, scales, masters

    def expected_rows(self, rows, values, rounding=NEAREST, seed=0):
        """The lazy sparse step of the one (R, D) tensor: rows ``rows`` (sorted, distinct) take
        the float32 gradient rows ``values``; the others keep their bits.  Returns (x, states,
        scales, master) after the step.  Stochastic rounding: element row * D + column of tensor
        position 0."""
        (x,), D = self.xs, self.xs[0].shape[1]
        sub = State.__new__(State)
        sub.__dict__.update(self.__dict__)
        sub.grad_fmt = F32
        sub.xs = [x[rows]]
        sub.gs = [np.asarray(values, np.float32)]
        sub.masters = [m[rows] for m in self.masters]
        sub.states = [[lst[0][rows]] for lst in self.states]
        if self.state_fmt == Q8:
            per_row = D // self.block
            sub.scales = [[lst[0].reshape(-1, per_row)[rows].ravel()] for lst in self.scales]
        new_x, new_states, new_scales, new_masters = sub.expected()
        x_out = x.copy()
        if self.param_fmt == BF16 and not self.masters and rounding == STOCHASTIC:
            x32 = sub._updated32
            j = (rows[:, None] * D + np.arange(D)[None, :]).ravel()
            x_out[rows] = stochastic(x32.ravel(), sr_key(seed, self.t, 0), j).reshape(x32.shape)
        else:
            x_out[rows] = new_x[0]
        states = []
        for s, lst in enumerate(self.states):
            a = lst[0].copy()
            a[rows] = new_states[s][0]
            states.append([a])
        scales = []
        for s, lst in enumerate(self.scales):
            a = lst[0].reshape(-1, D // self.block).copy()
            a[rows] = new_scales[s][0].reshape(len(rows), -1)
            scales.append([a.ravel()])
        masters = []
        if self.masters:
            m = self.masters[0].copy()
            m[rows] = new_masters[0]
            masters = [m]
        return [x_out], states, scales, masters


def assert_same_bits(got, want, what):
    """Equal lists of arrays, compared as bytes (NaN payloads and signed zeros included)."""
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8),
                                      err_msg=f"{what}[{i}]")


def assert_same_state(xs, states, scales, masters, want):
    """A step's parameters, states, block scales and masters equal ``want`` (the same four
    lists) bit for bit."""
    wx, wstates, wscales, wmasters = want
    assert_same_bits(xs, wx, "x")
    for s, (a, b) in enumerate(zip(states, wstates)):
        assert_same_bits(a, b, f"slot {s}")
    for s, (a, b) in enumerate(zip(scales, wscales)):
        assert_same_bits(a, b, f"scales {s}")
    assert_same_bits(masters, wmasters, "master")
