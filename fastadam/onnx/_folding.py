"""Shape computations a ``Program`` evaluates once, then reuses while its inputs keep their
shapes.

Exported models compute many small tensors from shapes: ``Shape`` of an activation, then
``Slice``, ``Concat``, ``Squeeze`` into a ``Reshape`` target, or ``Range``, ``Expand``,
``Trilu``, ``Equal``, ``Where`` into a causal mask.  Their values depend only on the shapes
and dtypes of the program's inputs and on initializers nothing updates, so a step repeats
them unchanged.

A node is *folded* when it is a core operator, none of its outputs is read after the program
(``keep``) or differentiated by a Gradient node, and either it is ``Shape`` or each of its
inputs is an initializer nothing updates (``Graph.constants``, outside every Gradient's ``xs``)
or the output of a folded node.  At each run, the first folded node compares the program's
*signature* with the last one: the shape and dtype of every tensor the program loads, and the
values of the initializers folded nodes read.  Equal: every folded node's outputs are the
values kept from the run that computed them (its slots cleared after their last use as
before).  Different (or an earlier run failed part way): the folded nodes run and their
outputs are kept.  An initializer of more than ``SMALL`` elements read by a folded node turns
folding off for the program (its values would cost more to compare than to use).
"""
SMALL = 4096


class _State:
    __slots__ = ("signature", "values", "complete", "enabled", "constants")

    def __init__(self, constants):
        self.signature = None
        self.values = {}
        self.complete = False
        self.enabled = True
        self.constants = constants  # slots of the initializers the folded nodes read


def fold(program, steps, ops, layout, keep, graph):
    """``ops`` with the operations of the folded nodes (see the module note) wrapped; the
    others unchanged.  ``program.folded``: the indices of the folded nodes' operations."""
    constants = graph.constants - graph.grad_names
    loaded = set(program.loaded)
    foldable, folded, read = set(), [], set()
    for k, s in enumerate(steps):
        if s.kind != "core" or any(n in keep or n in graph.grad_names for n in s.outputs if n):
            continue
        if s.node.op_type != "Shape":
            sources = [n for n in s.inputs if n]
            if not all(n in foldable or (n in constants and n in loaded) for n in sources):
                continue
            read.update(n for n in sources if n not in foldable)
        foldable.update(n for n in s.outputs if n)
        folded.append(k)
    program.folded = frozenset(folded)
    if not folded:
        return ops
    slot = program.slot
    state = _State(tuple(slot[n] for n in sorted(read)))
    first, last = folded[0], folded[-1]
    out = list(ops)
    for k in folded:
        step, op = ops[k]
        outs, drop = layout[k]
        out[k] = (step, _folded_operation(program, state, op, outs, drop, k == first,
                                          k == last))
    return out


def _signature(program, slots, state):
    """The shapes and dtypes of the loaded tensors, and the bytes of the initializers the
    folded nodes read; None (folding off) when one of those is too large to compare."""
    n = len(program.loaded)
    shapes = [(t.data.shape, t.data.dtype) for t in slots[2:2 + n]]
    for i in state.constants:
        a = slots[i].data
        if a.size > SMALL:
            return None
        shapes.append((a.shape, a.dtype, a.tobytes()))
    return shapes


def _folded_operation(program, state, op, outs, drop, first, last):
    def folded_op(slots):
        if first:
            if state.enabled:
                signature = _signature(program, slots, state)
                if signature is None:
                    state.enabled = False
                elif not (state.complete and signature == state.signature):
                    state.signature = signature
                    state.values = {}
                    state.complete = False
        if not state.enabled:
            op(slots)
            return
        if state.complete:
            values = state.values
            for i in outs:
                slots[i] = values[i]
            for i in drop:
                slots[i] = None
            return
        op(slots)
        for i in outs:
            state.values[i] = slots[i]
        if last:
            state.complete = True
    return folded_op
