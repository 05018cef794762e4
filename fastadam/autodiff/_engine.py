"""The backward walk: ``gradient`` (ONNX Gradient semantics) and ``Tensor.backward``.

1. Collect the nodes reachable from ``y`` with an explicit stack (no recursion), stopping at the
   tensors named in ``xs`` (an intermediate tensor in ``xs`` acts as an independent input, as in
   ONNX: nothing flows past it) and in ``zs`` (constants).
2. Sort them by tape position.  A node is *relevant* when one of its inputs is in ``xs`` or is
   the output of a relevant node; only relevant inputs get a VJP call.
3. Walk the relevant nodes in reverse tape order.  A cotangent buffer is shared (no copy) while it
   has one contribution; the second contribution makes a fresh sum, later ones add in place into
   that owned buffer (with ``create_graph=True`` every sum is a recorded ``add`` instead).
   Gather (``take``) gradients stay ``IndexedSlices`` until a dense one must be added to them.
4. Unless ``retain_graph`` (or ``create_graph``, whose result refers to the forward graph), the
   visited nodes drop their saved tensors: a second walk through them raises.
"""
import numpy as np

from ..sparse import IndexedSlices
from . import _tensor
from ._tensor import Tensor, _tape, _wrap, version_of


# read-only scalar seeds (never written: accumulation only writes buffers it allocated)
_ONES = {}
for _dt in (np.float32, np.float64):
    _one = np.ones((), dtype=_dt)
    _one.setflags(write=False)
    _ONES[np.dtype(_dt)] = _one


def _key(t):
    node = t._node
    return t if node is None else node


def _as_seed(y, grad_output):
    if grad_output is None:
        if y.data.size != 1:
            raise ValueError(
                f"grad_output: y has shape {y.data.shape}; a non-scalar y needs a grad_output seed "
                f"of the same shape (ONNX's Gradient examples seed with ones)")
        one = _ONES.get(y.data.dtype) if y.data.shape == () else None
        return _wrap(one if one is not None else np.ones_like(y.data))
    if not isinstance(grad_output, Tensor):
        grad_output = _wrap(np.asarray(grad_output, dtype=y.data.dtype))
    if grad_output.data.shape != y.data.shape:
        raise ValueError(f"grad_output: expected shape {y.data.shape} (the shape of y), "
                         f"got {grad_output.data.shape}")
    return grad_output


def _dense(g):
    return _wrap(g.to_dense()) if isinstance(g, IndexedSlices) else g


def _accumulate(grads, owned, key, g, create_graph):
    prev = grads.get(key)
    if prev is None:
        grads[key] = g
        return
    if isinstance(prev, IndexedSlices) and isinstance(g, IndexedSlices):
        grads[key] = IndexedSlices(np.concatenate([prev.values, g.values]),
                                   np.concatenate([prev.indices, g.indices]), prev.dense_shape)
        return
    if create_graph:
        from ._ops import add
        grads[key] = add(_dense(prev), _dense(g))
        return
    if key in owned:
        if isinstance(g, IndexedSlices):
            np.add.at(prev.data, g.indices, g.values)
        else:
            np.add(prev.data, g.data, out=prev.data)
        return
    if isinstance(prev, IndexedSlices):
        prev, g = g, prev
    if isinstance(g, IndexedSlices):
        total = prev.data.copy()
        np.add.at(total, g.indices, g.values)
    else:
        total = np.asarray(prev.data + g.data)
    grads[key] = _wrap(total)
    owned.add(key)


def _freed_error(node):
    return RuntimeError(
        f"trying to differentiate through the graph a second time (node '{node.prim.name}'), "
        f"but its saved tensors were freed; pass retain_graph=True to the first gradient call")


def _check_versions(node):
    versions = node.versions
    for i, t in enumerate(node.inputs):
        v = 0 if versions is None else versions[i]
        now = version_of(t)
        if now != v:
            raise RuntimeError(
                f"a tensor saved by '{node.prim.name}' (argument {i}) was modified in place "
                f"(version {now}, recorded at version {v}); its gradient would be wrong")


def _check_output_version(node, out):
    now = version_of(out)
    if now != node.out_version:
        raise RuntimeError(
            f"the output of '{node.prim.name}' was modified in place (version {now}, "
            f"recorded at version {node.out_version}); its gradient would be wrong")


def _cast(gi, dtype):
    """A cotangent in its input's dtype (NumPy promotes in the forward pass only)."""
    if gi.__class__ is IndexedSlices:
        return IndexedSlices(gi.values.astype(dtype), gi.indices, gi.dense_shape)
    if gi._node is None:
        return _wrap(gi.data.astype(dtype))
    from ._ops import astype
    return astype(gi, dtype=dtype)


def _run(y, keys_x, keys_z, seed, create_graph, retain_graph):
    """The walk shared by ``gradient`` and ``backward``; returns {key: cotangent}."""
    ynode = y._node
    ykey = y if ynode is None else ynode
    grads = {ykey: seed}
    if ynode is None or ykey in keys_x or ykey in keys_z:
        return grads
    stop = keys_x.keys() | keys_z if keys_z else keys_x
    # 1. reachable nodes (explicit work list, no recursion; the list grows while it is read)
    order = [ynode]
    seen = {ynode}
    for node in order:
        inputs = node.inputs
        if inputs is None:
            raise _freed_error(node)
        for t in inputs:
            n = t._node
            if n is not None and n not in seen and n not in stop:
                seen.add(n)
                order.append(n)
    if len(order) > 1:
        order.sort(key=_node_id)
    # 2. relevance (forward sweep in tape order): which inputs of which nodes get a VJP call
    wanted = {}
    for node in order:
        idx = None
        i = 0
        for t in node.inputs:
            k = t._node
            if k is None:
                k = t
            if k in keys_x or (k in wanted and k not in keys_z):
                if idx is None:
                    idx = [i]
                else:
                    idx.append(i)
            i += 1
        if idx is not None:
            wanted[node] = idx
    # 3. reverse walk
    owned = set()
    mode = _tensor._mode  # this thread's grad mode: the walk records only under create_graph
    previous = mode.enabled
    mode.enabled = create_graph
    try:
        for node in reversed(order):
            idx = wanted.get(node)
            if idx is None:
                continue
            g = grads.pop(node, None)
            if g is None:
                continue
            inputs = node.inputs
            if node.versions is None:
                for t in inputs:
                    if t._version or t._base is not None:
                        _check_versions(node)
                        break
            else:
                _check_versions(node)
            ref = node.out_ref
            ans = ref() if ref is not None else None
            if ans is None:
                ans = node.output()
            elif ans._version or ans._base is not None:
                _check_versions(node)
                _check_output_version(node, ans)
            if g.__class__ is IndexedSlices:
                g = _wrap(g.to_dense())
            prim = node.prim
            params = node.params
            vjps = prim.vjps
            for i in idx:
                t = inputs[i]
                f = vjps.get(i) or prim.vjp(i)
                gi = f(g, ans, *inputs, **params)
                if gi is None:
                    continue
                td = t.data
                if gi.__class__ is Tensor:
                    gd = gi.data
                    if gd.shape != td.shape or gd.dtype != td.dtype:
                        gi = _conform(gi, gd.shape, gd.dtype, td, prim, i)
                else:
                    gi = _conform(gi, gi.shape, gi.dtype, td, prim, i)
                k = t._node
                if k is None:
                    k = t
                if k in grads:
                    _accumulate(grads, owned, k, gi, create_graph)
                else:
                    grads[k] = gi
    finally:
        mode.enabled = previous
    if not (retain_graph or create_graph):
        for node in order:
            node.inputs = None
            node.params = None
            node.out_data = None
    return grads


def _conform(gi, shape, dtype, td, prim, i):
    """Check a VJP's shape; cast it to its input's dtype (NumPy promotes in the forward only)."""
    if shape != td.shape:
        raise RuntimeError(f"VJP of '{prim.name}' for argument {i} returned shape {shape}, "
                           f"expected {td.shape}")
    if dtype != td.dtype and td.dtype.kind in "fc":
        return _cast(gi, td.dtype)
    return gi


def _node_id(node):
    return node.id


_run_python = _run  # the reference of the compiled walk (and the walk without a build)
if _tape is not None:
    _tape.setup_walk(IndexedSlices, _check_versions, _check_output_version, _accumulate, _conform,
                     _freed_error, _node_id)
    _run = _tape.run


def _check_x(x, what):
    if not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a Tensor or None, got {type(x).__name__}")
    if x.data.dtype.kind not in "fc":
        raise TypeError(f"{what}: integer and boolean tensors are not differentiable "
                        f"(dtype {x.data.dtype}); put them in zs or leave them out")


def gradient(y, xs, zs=(), *, grad_output=None, create_graph=False, retain_graph=False,
             allow_unused=False):
    """Gradients of ``y`` with respect to each tensor of ``xs`` (ONNX ``Gradient`` semantics).

    Parameters
    ----------
    y : Tensor
        The target.  A non-scalar ``y`` needs ``grad_output``.
    xs : sequence of Tensor or None
        Differentiable inputs: leaves or intermediate tensors.  An intermediate tensor acts as an
        independent input (no gradient flows past it).  ``None`` skips that output.  A tensor must
        have been recorded (some input of the operations using it required gradients).
    zs : sequence of Tensor
        Non-differentiable inputs: treated as constants (nothing flows through them).
    grad_output : Tensor or array_like, optional
        The seed (the cotangent of ``y``), same shape as ``y``; ones for a scalar ``y``.
    create_graph : bool
        Record the backward pass, so the returned gradients can be differentiated again
        (second and third derivatives).  Implies ``retain_graph``.
    retain_graph : bool
        Keep the graph's saved tensors, so it can be walked again.
    allow_unused : bool
        Return ``None`` for a tensor of ``xs`` that ``y`` does not depend on, instead of raising.

    Returns
    -------
    list of Tensor, IndexedSlices or None
        ``d y / d xs[i]`` (the VJP with the seed) for each ``xs[i]``; an ``IndexedSlices`` for an
        embedding table reached only through ``take`` (first order).
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"y: expected a Tensor, got {type(y).__name__}")
    if isinstance(xs, Tensor):
        raise TypeError("xs: expected a sequence of Tensors (wrap a single tensor in a list)")
    xs = list(xs)
    keys_x = {}
    i = 0
    for x in xs:
        if x is not None:
            if x.__class__ is not Tensor or x.data.dtype.kind not in "fc":
                _check_x(x, f"xs[{i}]")
            n = x._node
            keys_x[x if n is None else n] = i
        i += 1
    keys_z = set()
    if zs:
        for i, z in enumerate(zs):
            if not isinstance(z, Tensor):
                raise TypeError(f"zs[{i}]: expected a Tensor, got {type(z).__name__}")
            keys_z.add(_key(z))
    seed = _as_seed(y, grad_output)
    grads = _run(y, keys_x, keys_z, seed, create_graph, retain_graph)
    out = []
    for i, x in enumerate(xs):
        if x is None:
            out.append(None)
            continue
        n = x._node
        g = grads.get(x if n is None else n)
        if g.__class__ is Tensor and g._node is None and not g.data.flags.writeable:
            g = _wrap(np.array(g.data))  # a broadcast view or a read-only seed: materialize
        if g is None and not allow_unused:
            raise ValueError(f"xs[{i}] is not used to compute y (no recorded path from it to y; "
                             f"did some input require gradients when y was computed?); "
                             f"pass allow_unused=True to get None for it")
        out.append(g)
    return out


def backward(y, grad_output=None, retain_graph=False, create_graph=False):
    """Accumulate ``d y / d leaf`` into ``leaf.grad`` for every leaf that requires gradients.

    ``leaf.grad`` is a Tensor, or an ``IndexedSlices`` for an embedding table reached only
    through ``take`` (until a dense gradient is added to it).  Every call adds to ``.grad``;
    reset it with ``leaf.grad = None`` (or ``leaf.zero_grad()``) between steps.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"y: expected a Tensor, got {type(y).__name__}")
    if y._node is None and not y.requires_grad:
        raise RuntimeError("backward: y does not require gradients (no input of the operations "
                           "that computed it had requires_grad=True)")
    leaves = {}
    if y._node is None:
        leaves[y] = 0
    else:
        seen = {y._node}
        stack = [y._node]
        while stack:
            node = stack.pop()
            if node.inputs is None:
                raise _freed_error(node)
            for t in node.inputs:
                n = t._node
                if n is None:
                    if t.requires_grad:
                        leaves[t] = 0
                elif n not in seen:
                    seen.add(n)
                    stack.append(n)
    seed = _as_seed(y, grad_output)
    grads = _run(y, leaves, set(), seed, create_graph, retain_graph)
    given = set()
    for leaf in leaves:
        g = grads.get(leaf)
        if g is None:
            continue
        if isinstance(g, IndexedSlices):
            # an embedding table's gradient stays sparse until a dense one is added to it
            prev = leaf.grad
            if prev is None:
                leaf.grad = g
            elif isinstance(prev, IndexedSlices):
                leaf.grad = IndexedSlices(np.concatenate([prev.values, g.values]),
                                          np.concatenate([prev.indices, g.indices]),
                                          prev.dense_shape)
            else:
                total = prev.data.copy()
                np.add.at(total, g.indices, g.values)
                leaf.grad = _wrap(total)
            continue
        if id(g.data) in given or g is seed or (g._node is None and not g.data.flags.writeable):
            g = _wrap(g.data.copy())
        given.add(id(g.data))
        prev = leaf.grad
        if prev is None:
            leaf.grad = g
        elif isinstance(prev, IndexedSlices):
            total = g.data.copy()
            np.add.at(total, prev.indices, prev.values)
            leaf.grad = _wrap(total)
        else:
            from ._ops import add
            leaf.grad = add(prev, g) if create_graph else _wrap(np.asarray(prev.data + g.data))
