"""``fastadam.Adam``: an optimizer object that owns the moments and step count of a parameter
list and updates it with one fused ``step_inplace`` call per step."""
import json

import numpy as np

from .optim._coefficients import check_adam_hyperparameters as check_hyperparameters
from .optim._functional import step_inplace
from ._validation import check_parameter_list

_FORMAT = "fastadam.Adam/1"


class Adam:
    """Adam over a list of NumPy parameter arrays, updated in place.

    Parameters
    ----------
    params : ndarray or list of ndarray
        C-contiguous, writable float arrays of one dtype; the optimizer keeps references and
        updates them in place.
    lr, betas, eps, convention, weight_decay, decoupled_weight_decay, post_decay, amsgrad,
    nesterov, maximize, num_threads
        As in :func:`fastadam.step_inplace` (``betas = (beta1, beta2)``).

    Attributes
    ----------
    t : int
        Steps applied so far (a step skipped by ``skip_nonfinite`` does not count).
    m, v, v_max : list of ndarray
        The moments (``v_max`` only with ``amsgrad``), zeros at the start.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, convention="tf",
                 weight_decay=0.0, decoupled_weight_decay=False, post_decay=0.0, amsgrad=False,
                 nesterov=False, maximize=False, num_threads=None):
        self.params = check_parameter_list(params)
        try:
            beta1, beta2 = betas
        except (TypeError, ValueError):
            raise TypeError(f"betas: expected a pair (beta1, beta2), got {betas!r}") from None
        check_hyperparameters(lr, beta1, beta2, eps, convention, weight_decay, post_decay)
        self.hyperparameters = dict(
            lr=float(lr), beta1=float(beta1), beta2=float(beta2), eps=float(eps),
            convention=convention, weight_decay=float(weight_decay),
            decoupled_weight_decay=bool(decoupled_weight_decay), post_decay=float(post_decay),
            amsgrad=bool(amsgrad), nesterov=bool(nesterov), maximize=bool(maximize))
        self.num_threads = num_threads
        self.t = 0
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]
        self.v_max = [np.zeros_like(p) for p in self.params] if amsgrad else None

    def step(self, grads, *, grad_scale=None, skip_nonfinite=False):
        """Apply one step with ``grads`` (an array or a list like ``params``).  Returns False,
        and changes nothing, if ``skip_nonfinite`` found a non-finite gradient."""
        if isinstance(grads, np.ndarray):
            grads = [grads]
        applied = step_inplace(self.params, grads, self.m, self.v, self.t + 1,
                               v_max=self.v_max, grad_scale=grad_scale,
                               skip_nonfinite=skip_nonfinite, num_threads=self.num_threads,
                               **self.hyperparameters)
        if applied:
            self.t += 1
        return applied

    def state_dict(self):
        """A copy of the optimizer state: step count, moments and hyper-parameters."""
        state = {"t": self.t, "m": [a.copy() for a in self.m], "v": [a.copy() for a in self.v],
                 "hyperparameters": dict(self.hyperparameters)}
        if self.v_max is not None:
            state["v_max"] = [a.copy() for a in self.v_max]
        return state

    def load_state_dict(self, state):
        """Restore a ``state_dict()``; moments are copied into the existing buffers, after every
        check has passed (a failed load changes nothing)."""
        t = state["t"]
        if isinstance(t, np.ndarray):
            t = t.item()
        if not isinstance(t, (int, np.integer)) or t < 0:
            raise ValueError(f"state['t']: expected a step count >= 0, got {t!r}")
        hyper = dict(state["hyperparameters"])
        if hyper.get("amsgrad", False) != self.hyperparameters["amsgrad"]:
            raise ValueError("state['hyperparameters']: amsgrad differs from this optimizer's")
        names = ["m", "v"] + (["v_max"] if self.v_max is not None else [])
        for name in names:
            src, dst = state[name], getattr(self, name)
            if len(src) != len(dst):
                raise ValueError(f"state['{name}']: expected {len(dst)} arrays, got {len(src)}")
            for i, (a, b) in enumerate(zip(src, dst)):
                a = np.asarray(a)
                if a.shape != b.shape or a.dtype != b.dtype:
                    raise ValueError(f"state['{name}'][{i}]: expected {b.dtype} of shape "
                                     f"{b.shape}, got {a.dtype} of shape {a.shape}")
        check_hyperparameters(hyper["lr"], hyper["beta1"], hyper["beta2"], hyper["eps"],
                              hyper["convention"], hyper["weight_decay"], hyper["post_decay"])
        for name in names:
            for a, b in zip(state[name], getattr(self, name)):
                np.copyto(b, a)
        self.hyperparameters = hyper
        self.t = int(t)

    def save(self, path):
        """Write parameters and optimizer state to a ``.npz``; :meth:`load` resumes bit-exactly."""
        state = self.state_dict()
        arrays = {"t": np.int64(self.t),
                  "hyperparameters": np.array(json.dumps(state["hyperparameters"])),
                  "format": np.array(_FORMAT)}
        for i, p in enumerate(self.params):
            arrays[f"param_{i}"] = p
        for name in ("m", "v", "v_max"):
            for i, a in enumerate(state.get(name) or []):
                arrays[f"{name}_{i}"] = a
        np.savez(path, **arrays)

    def load(self, path, *, params=True):
        """Read a file written by :meth:`save`; with ``params=True`` the saved parameter values
        are copied into this optimizer's parameter arrays too."""
        with np.load(path, allow_pickle=False) as data:
            if str(data.get("format", "")) != _FORMAT:
                raise ValueError(f"path: {path!r} is not a fastadam.Adam checkpoint")
            n = len(self.params)
            state = {"t": int(data["t"]),
                     "hyperparameters": json.loads(str(data["hyperparameters"]))}
            for name in ("m", "v", "v_max"):
                if f"{name}_0" in data or (name != "v_max" and n == 0):
                    state[name] = [data[f"{name}_{i}"] for i in range(n)]
            saved = [data[f"param_{i}"] for i in range(n)] if params else None
        if params:
            for i, (a, b) in enumerate(zip(saved, self.params)):
                if a.shape != b.shape or a.dtype != b.dtype:
                    raise ValueError(f"path: saved param_{i} is {a.dtype} {a.shape}, "
                                     f"expected {b.dtype} {b.shape}")
        self.load_state_dict(state)
        if params:
            for a, b in zip(saved, self.params):
                np.copyto(b, a)
