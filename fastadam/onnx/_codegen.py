"""Generated step functions: one straight-line Python function per compiled training step.

``TrainingSession`` compiles, at the first step for a set of outputs, the nodes it runs into two
programs (``Graph.compile``: the nodes before the in-place optimizer updates, and those updates).
``generate_step`` writes those programs, and what ``TrainingSession._step_one`` does around them,
as the source of one function ``step(feeds) -> {name: ndarray}``, and ``exec``s it once:

- every tensor is a local variable named after it (``t_`` + the ONNX name with non-identifier
  characters replaced); the state Tensors and the feeds are loaded from the environment once;
- each node is one call of the callable ``Graph.compile`` resolved for it (``n3`` for node 3,
  bound in the function's globals), on a tuple of its inputs; an intermediate tensor is deleted
  after its last use, as ``run_program`` drops it (the tape alone then holds it);
- a Gradient node whose inputs are its ``xs`` then ``zs`` and whose ``y`` is computed before it
  calls ``Graph._gradient_direct`` on those locals (the forward pass is the one just run);
- the update_binding checks, the returned outputs, the in-place updates and the bindings follow,
  in ``_step_one``'s order: every check before the first in-place write.

Errors are those of the interpreted path: a node's error gets its label (``Graph.relabel``); an
input that has no value sends the step to the interpreted path, which names the node.  When a
program cannot be written this way (a Gradient node that re-evaluates its sub-graph), nothing is
generated and the session keeps interpreting.  The source is kept on the function
(``step._program_source``) for reading and for tests.
"""
import functools
import keyword
import operator
import re

from ..autodiff import is_grad_enabled, set_grad_enabled
from ._graph import LABELLED_ERRORS
from ._training_ops import OPTIMIZERS, contiguous


def _identifiers(names):
    """A distinct Python identifier per tensor name."""
    out, used = {}, set()
    for name in names:
        base = "t_" + re.sub(r"\W", "_", name)
        ident, k = base, 1
        while ident in used or keyword.iskeyword(ident):
            k += 1
            ident = f"{base}_{k}"
        used.add(ident)
        out[name] = ident
    return out


class _Writer:
    def __init__(self):
        self.lines = []
        self.depth = 1

    def __call__(self, line):
        self.lines.append("    " * self.depth + line)


def _tuple(items):
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def generate_step(session, alg, sched):
    """``step(feeds)``, the generated form of ``session._step_one(alg, feeds, wanted)`` for the
    schedule ``sched``; None when a program has a node it cannot write (see the module note)."""
    plan = alg.plan
    programs = (sched.first, sched.last)
    # the tensors the programs read that no node of theirs produces: loaded from the environment
    produced, loaded = set(), []
    for program in programs:
        for step, fun, fetch, wants_env, outs, drop in program:
            reads = list(step.inputs)
            if step.kind == "gradient":
                if step.inputs != step.xs + step.zs:
                    return None
                if step.y not in produced and step.y not in plan.known:
                    return None  # y comes later (or never): the node re-evaluates its sub-graph
                reads.append(step.y)
            for n in reads:
                if n and n not in produced and n not in loaded:
                    loaded.append(n)
            produced.update(n for n in step.outputs if n)
    names = list(loaded) + sorted(produced)
    for _, value, _ in sched.copied:
        if value not in names:
            names.append(value)
    for n in sched.wanted:
        if n not in names:
            names.append(n)
    ident = _identifiers(names)
    from . import _session as session_module  # (imported here: it imports this module)
    ns = {"_alg": alg, "_session": session, "_plan": plan, "_ERRORS": LABELLED_ERRORS,
          "_relabel": plan.relabel, "_steps": plan.steps}
    w = _Writer()
    w("checked = _alg.check_feeds(feeds)")
    w("env = _alg.base_env  # the Tensors around the state arrays (_session._state_env)")
    w("env = _session._state_env(_alg) if env is None else env.copy()")
    if plan.grad_names:
        w("if _plan.grad_names.isdisjoint(checked):")
        w("    env.update(checked)")
        w("else:  # a fed tensor that some Gradient differentiates becomes a recorded leaf")
        w("    for name, t in checked.items():")
        w("        _plan.assign(env, name, t)")
    else:
        w("env.update(checked)")
    # names that the bindings and results read but no node produces come from env as well
    extra = [n for n in names if n not in produced and n not in loaded]
    if loaded or extra:
        ns["_load"] = operator.itemgetter(*(loaded + extra))
        w("try:")
        w(f"    {_tuple([ident[n] for n in loaded + extra])} = _load(env)")
        w("except KeyError:  # an input without a value: the interpreted path names its node")
        w("    return _session._step_one(_alg, feeds, _wanted, interpreted=True)")
    ns["_wanted"] = list(sched.wanted)
    if plan.grad_names:
        ns["_set_grad_enabled"], ns["_is_grad_enabled"] = set_grad_enabled, is_grad_enabled
        w("previous = _is_grad_enabled()  # Gradient nodes need the forward pass recorded")
        w("if not previous:")
        w("    _set_grad_enabled(True)")
    w("try:")
    w.depth += 1
    # the locals read after the nodes that produce them: outputs, bound values, in-place inputs
    later = {ident[n] for n in sched.wanted} | {ident[v] for _, v, _ in sched.copied}
    later.update(ident[n] for step, *_ in sched.last for n in step.inputs if n)
    _write_program(w, ns, plan, sched.first, ident, "first", later)
    if sched.copied:
        w("# update_binding: every bound value checked before the first in-place write")
        ns["_state"] = session._state
        ns["_own"] = session_module._own
        ns["_binding_error"] = session_module.binding_error
    pending = []
    for j, (key, value, private) in enumerate(sched.copied):
        w(f"new = {ident[value]}.data")
        w(f"old{j} = _state[{key!r}]")
        w(f"if new.dtype != old{j}.dtype or new.shape != old{j}.shape:")
        w(f"    _binding_error({key!r}, {value!r}, new, old{j})")
        if private:  # a fresh output of a functional optimizer node: it takes the place
            w(f"new{j} = _own(new, True)")
            pending.append((f"_bind({key!r}, new{j}, True)"))
        else:  # a copy, taken before the in-place updates (the value may alias what they write)
            w(f"new{j} = new.copy()")
            pending.append(f"old{j}[...] = new{j}")
    w("result = {}")
    if sched.wanted:
        w("ids = _session._state_ids")
        w("if ids is None:")
        w("    ids = _session._state_array_ids()")
        for n in sched.wanted:
            if n in sched.fresh:
                continue
            w(f"a = {ident[n]}.data")
            w(f"result[{n!r}] = a.copy() if id(a) in ids else a")
    _write_program(w, ns, plan, sched.last, ident, "last (in-place updates, once nothing else "
                   "can fail)", later)
    w.depth -= 1
    if plan.grad_names:
        w("finally:")
        w("    if not previous:")
        w("        _set_grad_enabled(False)")
    else:
        w("finally:")
        w("    pass")
    if pending:
        ns["_bind"] = session._bind
        w("# the bindings (_session._bind), once nothing can fail")
    for line in pending:
        w(line)
    for n in sched.wanted:
        if n in sched.fresh:  # outputs of in-place updates: the new values
            w(f"result[{n!r}] = {ident[n]}.data.copy()")
    w("return result")
    source = "def step(feeds):\n" + "\n".join(w.lines) + "\n"
    exec(compile(source, "<fastadam.onnx generated step>", "exec"), ns)
    fun = ns["step"]
    fun._program_source = source
    return fun


def _write_inplace(w, ns, step, args, targets):
    """An in-place optimizer node (``Graph._inplace_runner``): the update on the arrays of its
    inputs (the gradients made C-contiguous, as it does), then its outputs are its written inputs,
    which now hold the new values."""
    _, apply, per, written, _ = OPTIMIZERS[step.node.op_type]
    k = step.index
    ns[f"n{k}"] = functools.partial(apply, **step.attrs)
    ns["_contiguous"] = contiguous
    n = (len(args) - 2) // per
    lists = []
    for j in range(per):
        group = args[2 + j * n:2 + (j + 1) * n]
        wrap = "_contiguous({}.data)" if j == 1 else "{}.data"  # gradients are only read
        lists.append("[" + ", ".join(wrap.format(a) for a in group) + "]")
    kinds = {"Adam": "XGVH", "Adagrad": "XGH", "Momentum": "XGV"}.get(step.node.op_type)
    w(f"n{k}({args[0]}.data, {args[1]}.data, [  # R, T, then the lists")
    for j, text in enumerate(lists):
        end = "," if j < per - 1 else "])"
        w(f"    {text}{end}" + (f"  # {kinds[j]}" if kinds else ""))
    sources = [args[2 + j * n + i] for j in written for i in range(n)]
    pairs = [(t, a) for t, a in zip(targets, sources) if t != "_"]
    if pairs:
        w(", ".join(t for t, _ in pairs) + " = " + ", ".join(a for _, a in pairs) +
          "  # now the new values")


def _write_program(w, ns, plan, program, ident, what, later):
    """The nodes of ``program``; ``later``: the locals read after the program."""
    if not program:
        return
    produced = {n for step, *_ in program for n in step.outputs if n}
    w(f"# program: {what}")
    w("try:")
    w.depth += 1
    for step, fun, fetch, wants_env, outs, drop in program:
        k = step.index
        label = step.label if step.label.isprintable() else ascii(step.label)  # no newline
        w(f"k = {k}  # {label}")
        args = [ident[n] if n else "None" for n in step.inputs]
        targets = [ident[n] if n else "_" for n in step.outputs]
        lhs = ", ".join(targets) + ("," if len(targets) == 1 else "")
        if step.kind == "gradient":
            ns[f"n{k}"] = plan._gradient_direct(step)
            nx = len(step.xs)
            # a z loaded from the environment and differentiated by no Gradient node is a
            # Tensor that is not on the tape: stopping at it changes nothing (as _differentiate)
            zs = [a for n, a in zip(step.zs, args[nx:]) if n in produced or n in plan.grad_names]
            call = f"n{k}({_tuple(args[:nx])}, {_tuple(zs)}, {ident[step.y]})"
        elif step.inplace:
            _write_inplace(w, ns, step, args, [t if t in later else "_" for t in targets])
            continue
        else:
            ns[f"n{k}"] = fun
            # run_program hands a list when some optional input is omitted, else a tuple
            call = f"n{k}([{', '.join(args)}])" if "" in step.inputs else f"n{k}({_tuple(args)})"
        if targets:
            w(f"{lhs} = {call}")
        else:
            w(call)
        for n in step.outputs:
            if n and n in plan.grad_names:  # a tensor some Gradient differentiates: a leaf
                ns["_leaf"] = plan.leaf
                w(f"{ident[n]} = _leaf({ident[n]})")
        if drop:
            w("del " + ", ".join(ident[n] for n in drop))
    w.depth -= 1
    w("except _ERRORS as e:")
    w("    labelled = _relabel(_steps[k], e)")
    w("    if labelled is e:")
    w("        raise")
    w("    raise labelled from e")
