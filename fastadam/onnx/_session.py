"""``TrainingSession``: executes ``ModelProto.training_info`` as the ONNX spec defines it.

State: the initializers of the inference graph and of every ``algorithm`` graph, as NumPy arrays
owned by the session.  Each ``algorithm`` runs as the *combined graph* of the spec (the inference
graph's inputs, initializers and nodes, then the algorithm's), compiled once.  After it ran,
``update_binding`` assigns algorithm outputs to initializers.

Optimizer nodes update in place.  An Adam/Adagrad/Momentum node each of whose outputs is bound
back to the initializer it read (``X -> X_new``, ``V -> V_new``, ...), that no other node reads,
runs last, directly on the session's arrays through the fused kernels: no copies of parameters or
optimizer states per step.  Every other bound value is checked (dtype, shape) before the first
in-place write, so a step that fails leaves every initializer as it was.

The per-step path.  The first step with a given set of outputs compiles its nodes into one
``Program`` (``_graph``: a slot per tensor, callables and input getters resolved, attributes
folded, intermediates dropped after their last use); the feed check has a fast path for feeds
with the names, dtypes and shapes of the last ones that passed (anything else takes the full
check); the Tensors around the state arrays are kept between steps (bindings write into the
arrays, ``initialize()`` replaces them).  Every check a step makes is still made; only the work
of deciding again what was decided is skipped.  ``_run_schedule`` is the whole step, as plain
code: the program's operations before the in-place updates, the binding checks and the outputs,
then the in-place updates and the bindings.
"""
import functools
import itertools
import sys

import numpy as np
import onnx
from onnx import numpy_helper

from .. import MemoryPool
from .. import autodiff as ad
from ..autodiff import Tensor, no_grad
from ..io import atomic_write
from ._budget import step_scope
from ._graph import Graph, Program
from ._model import (FeedChecker, bound_initializers, check_feeds, check_tensor_types,
                     graph_known_names, initializer_arrays, load_model, opsets)
from ._training_ops import OPTIMIZERS


def _bindings(entries, where, allowed_keys, allowed_values, values_what, taken):
    out = []
    for e in entries:
        if e.key not in allowed_keys:
            raise ValueError(f"{where}: key '{e.key}' names no initializer of the inference graph "
                             f"or of this training_info's algorithm")
        if e.value not in allowed_values:
            raise ValueError(f"{where}: value '{e.value}' (bound to '{e.key}') is not an output "
                             f"of {values_what}")
        if e.key in taken:
            raise ValueError(f"{where}: initializer '{e.key}' is bound more than once")
        taken.add(e.key)
        out.append((e.key, e.value))
    return out


def _check_defined(plan, names, where):
    """Every declared output is computed by some node or is an input or initializer."""
    for name in names:
        if name not in plan.producer and name not in plan.known:
            raise ValueError(f"{where}: output '{name}' is not produced by any node and is "
                             f"not an input or initializer")


def _mark_inplace(plan, updates, state):
    """Flag the optimizer steps whose outputs all go straight back to the arrays they read."""
    bound = {value: key for key, value in updates}
    readers = {}
    for step in plan.steps:
        for n in step.inputs:
            readers.setdefault(n, []).append(step.index)
    candidates = []
    for step in plan.steps:
        if step.kind != "optimizer":
            continue
        _, _, per, written, _ = OPTIMIZERS[step.node.op_type]
        n = (len(step.inputs) - 2) // per
        names = set()
        ok = True
        for j, li in enumerate(written):
            for i in range(n):
                src, dst = step.inputs[2 + li * n + i], step.outputs[j * n + i]
                # the new value must go only back to its source; readers of the old value (the
                # forward pass, the Gradient node) all run before the deferred in-place update
                ok &= bound.get(dst) == src and src in state and not readers.get(dst)
                names.add(src)
        if ok and len(names) == n * len(written):
            candidates.append((step, names))
    written_by = {}
    for step, names in candidates:
        for name in names:
            written_by[name] = written_by.get(name, 0) + 1
    for step, names in candidates:
        others = [n for n in step.inputs if n not in names and n in written_by]
        if not others and all(written_by[n] == 1 for n in names):
            step.inplace = True


class _Algorithm:
    __slots__ = ("plan", "updates", "inputs", "init_names", "outputs", "init_plan",
                 "init_bindings", "init_arrays", "init_outputs", "check_feeds", "schedules",
                 "init_set", "input_names", "base_env")


class _Schedule:
    """What a step with a given set of outputs runs, compiled at its first step: one
    ``Program`` over the nodes it needs, its operations split into ``first`` (the nodes before
    the in-place optimizer updates) and ``last`` (those updates), and, by slot of that
    program, the bindings to check and copy (``copied``: key, slot, value name, private), the
    outputs read before the updates (``results``) and after them (``fresh``); ``run(feeds)``
    is the step."""

    __slots__ = ("wanted", "program", "first", "last", "copied", "results", "fresh", "run")


def binding_error(key, value, new, old):
    raise ValueError(f"update_binding: '{value}' has dtype {new.dtype} and shape {new.shape}, "
                     f"but initializer '{key}' has {old.dtype} and {old.shape}")


def _own(a, private):
    """The array a binding stores: ``a`` itself only when it is ``private`` (a fresh output of a
    functional optimizer node); otherwise a copy, since it may alias a feed, a Constant's value
    or another initializer, and the session later updates its initializers in place."""
    if private and a.flags.writeable and a.flags.c_contiguous:
        return a
    return np.array(a, order="C")


class TrainingSession:
    """Train a ``ModelProto`` that carries ``training_info`` (for example one built by
    ``make_training_model``).

    ``initialize()`` runs the ``initialization`` graphs and their bindings; ``step(feeds)`` runs
    every ``algorithm`` graph once and applies ``update_binding``; ``run(feeds)`` evaluates the
    inference graph with the current initializers; ``model()`` / ``save(path)`` give the trained
    model (initializers updated, ``training_info`` kept); ``fit(batches)`` loops ``step``.

    ``memory_pool``: the :class:`fastadam.MemoryPool` that ``step`` and ``run`` allocate their
    arrays from (``True``, the default: a pool of the session's own, with the default cap;
    ``False``: NumPy's allocator as it is).  A step frees the same large arrays every time;
    from the pool the next step gets them back without page-faulting them in from the OS.  The
    pool keeps up to its ``max_cached_bytes`` of freed arrays between steps
    (``session.memory_pool.release()`` frees them).  A copied or unpickled session gets a new
    pool.

    ``model``: an ``onnx.ModelProto`` or a path.  ``base_dir``: the folder holding the external
    data of a ModelProto that has some (refused without it); a model given by path reads its
    external data from its own folder.  The session holds every tensor's bytes: ``save``
    writes them into one self-contained file.
    """

    def __init__(self, model, *, memory_pool=True, base_dir=None):
        if memory_pool is True:
            memory_pool = MemoryPool()
        elif memory_pool is False or memory_pool is None:
            memory_pool = None
        elif not isinstance(memory_pool, MemoryPool):
            raise TypeError(f"memory_pool: expected True, False or a fastadam.MemoryPool, got "
                            f"{type(memory_pool).__name__}")
        self._pool = memory_pool
        model = load_model(model, base_dir)
        self._proto = model
        graph = model.graph
        ops = opsets(model)
        check_tensor_types(graph, *(info.algorithm for info in model.training_info))
        self._state = initializer_arrays(graph)
        main_inits = set(self._state)
        bound = bound_initializers(model)  # the others are constants to a Gradient node
        self._inference = Graph(graph.node, ops, graph_known_names(graph), main_inits - bound)
        self._graph_outputs = [o.name for o in graph.output]
        self._algorithms = []
        taken_update, taken_init = set(), set()
        for k, info in enumerate(model.training_info):
            alg = _Algorithm()
            where = f"training_info[{k}]"
            own = initializer_arrays(info.algorithm)
            clash = sorted(set(own) & set(self._state))
            if clash:
                raise ValueError(f"{where}.algorithm: initializers {clash} are already defined")
            self._state.update(own)
            alg.init_names = sorted(main_inits | set(own))
            alg.plan = Graph(list(graph.node) + list(info.algorithm.node), ops,
                             graph_known_names(graph, info.algorithm),
                             (main_inits | set(own)) - bound)
            alg.inputs = list(graph.input) + list(info.algorithm.input)
            alg.outputs = [o.name for o in info.algorithm.output]
            _check_defined(alg.plan, alg.outputs + self._graph_outputs, f"{where}.algorithm")
            alg.updates = _bindings(info.update_binding, f"{where}.update_binding",
                                    main_inits | set(own),
                                    set(alg.outputs) | set(self._graph_outputs),
                                    "the algorithm graph or the inference graph", taken_update)
            _mark_inplace(alg.plan, alg.updates, self._state)
            alg.check_feeds = FeedChecker(alg.inputs, alg.init_names)
            alg.init_set = set(alg.init_names)
            alg.input_names = {vi.name for vi in alg.inputs}
            alg.schedules = {}
            alg.base_env = None
            init = info.initialization
            alg.init_plan = Graph(init.node, ops, graph_known_names(init),
                                  {t.name for t in init.initializer})
            alg.init_arrays = initializer_arrays(init)
            alg.init_outputs = [o.name for o in init.output]
            _check_defined(alg.init_plan, alg.init_outputs, f"{where}.initialization")
            alg.init_bindings = _bindings(info.initialization_binding,
                                          f"{where}.initialization_binding",
                                          main_inits | set(own), set(alg.init_outputs),
                                          "the initialization graph", taken_init)
            self._algorithms.append(alg)
        self._default_outputs = self.default_outputs()
        self._tensors = {}
        self._declared_inputs = {vi.name for alg in self._algorithms for vi in alg.inputs}
        self._feed_split = ((), None)  # (feed names in order, the names per algorithm)
        self._state_ids = None  # {id(array) of every initializer}; initialize() resets it
        # (feed names, schedule's run) of the last step with the default outputs and one
        # algorithm fed as it is: the next such step goes straight to that schedule
        self._fast_step = (None, None)

    @property
    def memory_pool(self):
        """The :class:`fastadam.MemoryPool` of ``step`` and ``run``, or None (see the class
        note)."""
        return self._pool

    # -- state ---------------------------------------------------------------------------------

    @property
    def initializers(self):
        """The current initializers, ``{name: read-only view}`` (inference and algorithm)."""
        out = {}
        for name, a in self._state.items():
            v = a.view()
            v.flags.writeable = False
            out[name] = v
        return out

    def _env(self, plan, names):
        """Tensors around the state arrays (no copies); a tensor some Gradient differentiates
        is a leaf that requires gradients.  The Tensors are cached while their array stays the
        same object (in-place updates and bindings write into it; initialize() replaces it)."""
        state, leaves = self._state, plan.grad_names
        cache = self._tensors.setdefault(id(plan), {})
        env = {}
        for n in names:
            a = state[n]
            t = cache.get(n)
            if t is None or t.data is not a or t.grad is not None:
                t = cache[n] = Tensor(a, requires_grad=n in leaves and a.dtype.kind == "f")
            env[n] = t
        return env

    def _result(self, env, names):
        state_ids = {id(a) for a in self._state.values()}
        return {n: (env[n].data.copy() if id(env[n].data) in state_ids else env[n].data)
                for n in names}

    # -- the training_info graphs --------------------------------------------------------------

    def initialize(self):
        """Run each ``initialization`` graph; assign its outputs per ``initialization_binding``."""
        for alg in self._algorithms:
            if not alg.init_bindings:
                continue
            env = {n: Tensor(a) for n, a in alg.init_arrays.items()}
            with no_grad():
                alg.init_plan.execute(env, alg.init_plan.needed([v for _, v in alg.init_bindings]))
            for key, value in alg.init_bindings:
                self._state[key] = _own(env[value].data, False)
        for alg in self._algorithms:  # arrays were replaced: the step state Tensors are stale
            alg.base_env = None
        self._state_ids = None

    def default_outputs(self):
        """The tensors that ``step`` returns by default: the algorithm outputs bound to no
        initializer, then the loss (the ``y`` of each Gradient node) where it is not one of
        them -- a loss that is an output of the inference graph, say."""
        out = []
        for alg in self._algorithms:
            bound = {v for _, v in alg.updates}
            out += [n for n in alg.outputs if n not in bound and n not in out]
        for alg in self._algorithms:
            for step in alg.plan.steps:
                if step.kind == "gradient" and step.y not in out:
                    out.append(step.y)
        return out

    def step(self, feeds, output_names=None):
        """One training step: every ``algorithm`` graph in order, each followed by its
        ``update_binding``.  Returns ``{name: ndarray}`` for ``output_names`` (default:
        ``default_outputs()``, the loss among them, also when it is a model output).  A node
        that would allocate more than ``fastadam.onnx.memory_budget()`` allows raises
        ``MemoryBudgetError`` naming it, before allocating and before any initializer
        changes."""
        pool = self._pool
        with step_scope():
            if pool is None:
                return self._step(feeds, output_names)
            with pool:
                return self._step(feeds, output_names)

    def _step(self, feeds, output_names=None):
        if output_names is None and feeds.__class__ is dict:
            names, run = self._fast_step  # the step below decided once for these feed names
            if names == tuple(feeds):
                return run(feeds)
        if not self._algorithms:
            raise ValueError("model: it has no training_info, so there is nothing to step")
        if not isinstance(feeds, dict):
            raise TypeError(f"feeds: expected a dict of input name -> array, got "
                            f"{type(feeds).__name__}")
        wanted = self._default_outputs if output_names is None else list(output_names)
        names = tuple(feeds)
        known, split = self._feed_split
        if names != known:
            declared = self._declared_inputs
            for name in feeds:
                if name not in declared:
                    raise ValueError(f"feeds: {sorted(set(feeds) - declared)} are inputs of no "
                                     f"algorithm graph")
            split = [None if alg.input_names.issuperset(names) else
                     [n for n in names if n in alg.input_names] for alg in self._algorithms]
            self._feed_split = (names, split)
        if len(split) == 1 and split[0] is None:  # one algorithm, fed as it is
            alg = self._algorithms[0]
            sched = alg.schedules.get(tuple(wanted))
            if sched is None:
                sched = self._schedule(alg, wanted)
            results = sched.run(feeds)
            if output_names is None and len(sched.wanted) == len(wanted):
                self._fast_step = (names, sched.run)
        else:
            results = {}
            for alg, mine in zip(self._algorithms, split):
                results.update(self._step_one(
                    alg, feeds if mine is None else {n: feeds[n] for n in mine}, wanted))
        if len(results) != len(wanted):
            missing = [n for n in wanted if n not in results]
            raise ValueError(f"output_names: {missing} are not tensors of the training graphs")
        return results

    def _schedule(self, alg, wanted):
        """What a step with these outputs runs, compiled once per set of outputs."""
        key = tuple(wanted)
        sched = alg.schedules.get(key)
        if sched is None:
            plan = alg.plan
            wanted = [n for n in wanted if n in plan.producer or n in alg.init_set]
            order = plan.needed([v for _, v in alg.updates] + list(wanted))

            def by_inplace(name):
                k = plan.producer.get(name)
                return k is not None and plan.steps[k].inplace

            def private(name):
                k = plan.producer.get(name)
                return k is not None and plan.steps[k].kind == "optimizer"

            sched = _Schedule()
            sched.wanted = wanted
            first = [k for k in order if not plan.steps[k].inplace]
            last = [k for k in order if plan.steps[k].inplace]
            copied = [(k, v, private(v)) for k, v in alg.updates if not by_inplace(v)]
            # read after the program: the wanted outputs and the bound values
            keep = set(wanted) | {v for _, v, _ in copied}
            program = sched.program = Program(plan, first + last, keep)
            # (the program may run some nodes as one operation: _fusion)
            sched.first = [op for op in program.ops if not op[0].inplace]
            sched.last = [op for op in program.ops if op[0].inplace]
            slot = program.slot
            sched.copied = [(k, slot[v], v, p) for k, v, p in copied]
            sched.results = [(n, slot[n]) for n in wanted if not by_inplace(n)]
            sched.fresh = [(n, slot[n]) for n in wanted if by_inplace(n)]
            sched.run = functools.partial(self._run_schedule, alg, sched)
            alg.schedules[key] = sched
        return sched

    def _state_env(self, alg):
        """A fresh environment holding a Tensor around every state array of ``alg``.

        The Tensors are kept between steps (``alg.base_env``): in-place updates and most bindings
        write into their arrays, a binding of a fresh array replaces its entry (``_bind``),
        ``initialize()`` replaces the arrays and drops them all."""
        base = alg.base_env
        if base is None:
            state, leaves = self._state, alg.plan.grad_names
            base = alg.base_env = {
                n: Tensor(state[n], requires_grad=n in leaves and state[n].dtype.kind == "f")
                for n in alg.init_names}
        return dict(base)

    def _bind(self, key, array, private=False):
        """``initializer[key] = array`` (an update_binding, whose dtype and shape were checked).

        A copy is written into the initializer's own array, so every Tensor around it stays
        valid.  A ``private`` array (a fresh output of a functional optimizer node, owned by
        nobody else) takes the initializer's place instead of being copied; every algorithm's
        Tensor of it and the set of state ids follow."""
        if not private:
            self._state[key][...] = array
            return
        ids = self._state_ids
        if ids is not None:
            ids.discard(id(self._state[key]))
            ids.add(id(array))
        self._state[key] = array
        for alg in self._algorithms:
            base = alg.base_env
            if base is not None and key in base:
                base[key] = Tensor(array, requires_grad=key in alg.plan.grad_names
                                   and array.dtype.kind == "f")

    def _state_array_ids(self):
        """``{id(array)}`` of every initializer (to copy outputs that alias one)."""
        ids = self._state_ids
        if ids is None:
            ids = self._state_ids = {id(a) for a in self._state.values()}
        return ids

    def _step_one(self, alg, feeds, wanted):
        """One algorithm's step, with the schedule of these outputs."""
        sched = alg.schedules.get(tuple(wanted))
        if sched is None:
            sched = self._schedule(alg, wanted)
        return sched.run(feeds)

    def _run_schedule(self, alg, sched, feeds):
        """One step of ``alg`` by its schedule ``sched``: every check (feeds, bound values)
        before the first in-place write, so a step that fails leaves every initializer as it
        was."""
        plan = alg.plan
        checked = alg.check_feeds(feeds)
        base = alg.base_env
        env = self._state_env(alg) if base is None else base.copy()
        if plan.grad_names.isdisjoint(checked):
            env.update(checked)
        else:  # a fed tensor that some Gradient differentiates becomes a recorded leaf
            for name, t in checked.items():
                plan.assign(env, name, t)
        program = sched.program
        slots = program.load(env)
        previous = True
        if plan.grad_names:  # the forward pass is recorded, even inside autodiff.no_grad()
            previous = ad.is_grad_enabled()
            if not previous:
                ad.set_grad_enabled(True)
        try:
            program.run(slots, sched.first)
            pending = []
            state = self._state
            for key, i, value, is_private in sched.copied:
                new = slots[i].data
                old = state[key]
                if new.dtype != old.dtype or new.shape != old.shape:
                    binding_error(key, value, new, old)
                # a copy, taken before the in-place updates (the value may alias what they
                # write), unless it is a fresh output of a functional optimizer node
                pending.append((key, _own(new, True) if is_private else new.copy(), is_private))
            result = {}
            if sched.results:
                state_ids = self._state_array_ids()
                for n, i in sched.results:
                    a = slots[i].data
                    result[n] = a.copy() if id(a) in state_ids else a
            program.run(slots, sched.last)  # the in-place optimizer updates, once nothing
            #                                 else can fail
        finally:
            if not previous:
                ad.set_grad_enabled(False)
        for key, new, is_private in pending:
            if is_private:
                self._bind(key, new, True)
            else:  # written into the initializer's own array (``_bind``)
                state[key][...] = new
        for n, i in sched.fresh:  # outputs of in-place updates: report the new values
            result[n] = slots[i].data.copy()
        return result

    def run(self, feeds, output_names=None):
        """Evaluate the inference graph with the current initializers."""
        pool = self._pool
        if pool is None:
            return self._run(feeds, output_names)
        with pool:
            return self._run(feeds, output_names)

    def _run(self, feeds, output_names):
        plan = self._inference
        inits = [t.name for t in self._proto.graph.initializer]
        env = self._env(plan, inits)
        for name, t in check_feeds(self._proto.graph.input, feeds, optional=inits).items():
            plan.assign(env, name, t)
        names = self._graph_outputs if output_names is None else list(output_names)
        for n in names:
            if n not in plan.producer and n not in env:
                raise ValueError(f"output_names: '{n}' is not a tensor of the inference graph")
        with no_grad():
            plan.execute(env, plan.needed(names))
        return self._result(env, names)

    def fit(self, batches, steps=None, progress=True, keep=None):
        """Call ``step`` on each feed dict of ``batches`` (at most ``steps`` of them).

        Returns ``{name: stacked values per step}`` for the outputs in ``keep`` (default: those
        ``step`` returns by default).  ``progress`` shows a bar (tqdm when installed, else a
        line on stderr).
        """
        keep = self.default_outputs() if keep is None else list(keep)
        total = steps
        if total is None and hasattr(batches, "__len__"):
            total = len(batches)
        it = iter(batches) if steps is None else itertools.islice(batches, steps)
        bar = None
        if progress:
            try:
                from tqdm.auto import tqdm
                bar = tqdm(total=total, desc="fit")
            except ImportError:
                bar = _LineProgress(total)
        kept = {n: [] for n in keep}
        try:
            for feeds in it:
                out = self.step(feeds, keep)
                for n in keep:
                    kept[n].append(out[n])
                if bar is not None:
                    # the postfix first: update() may redraw, and must show this step's value
                    if keep and np.size(out[keep[0]]) == 1:
                        bar.set_postfix({keep[0]: float(np.asarray(out[keep[0]]).reshape(()))},
                                        refresh=False)
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return {n: np.stack(v) if v else np.empty(0) for n, v in kept.items()}

    # -- the model -----------------------------------------------------------------------------

    def model(self):
        """A copy of the model with the current initializers (``training_info`` kept)."""
        out = onnx.ModelProto()
        out.CopyFrom(self._proto)
        graphs = [out.graph] + [info.algorithm for info in out.training_info]
        for g in graphs:
            for t in g.initializer:
                t.CopyFrom(numpy_helper.from_array(self._state[t.name], t.name))
        return out

    def save(self, path):
        """Write ``model()`` to ``path``, atomically (:func:`fastadam.io.atomic_write`): the
        model is serialised first, then written to a temporary file beside ``path``, fsynced
        and renamed over it, so a crash, a full disk or a file-size limit leaves the previous
        file whole."""
        data = self.model().SerializeToString()
        with atomic_write(path) as f:
            f.write(data)


class _LineProgress:
    """A minimal progress line on stderr when tqdm is not installed."""

    def __init__(self, total):
        self.total, self.n, self.post = total, 0, ""

    def _show(self):
        of = f"/{self.total}" if self.total else ""
        sys.stderr.write(f"\rfit: step {self.n}{of} {self.post}")
        sys.stderr.flush()

    def update(self, k):
        self.n += k
        if self.n == 1 or self.n % 10 == 0:
            self._show()

    def set_postfix(self, values, refresh=True):
        self.post = " ".join(f"{k}={v:.4g}" for k, v in values.items())

    def close(self):
        self._show()
        sys.stderr.write("\n")
