"""Checkpoints of the optimizer objects: bit-exact resume, atomic save (a failed or killed save
leaves the previous file loadable), and load against hostile files (fixed schema, headers
checked before any data is read, no pickle); every failed load changes nothing."""
import io
import json
import os
import subprocess
import sys
import textwrap
import warnings
import zipfile

import numpy as np
import pytest

import fastadam
import fastadam.optim._checkpoint as checkpoint
from fastadam.optim import schedules

scipy_sparse = pytest.importorskip("scipy.sparse")


def make_params(rng):
    return [rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal(4),
            rng.standard_normal((5, 2)).astype(np.float32)]


def make_adam(params, **kw):
    groups = [{"params": params[:2]},
              {"params": params[2:], "lr": schedules.one_cycle(0.05, 30), "weight_decay": 0.1}]
    return fastadam.Adam(groups, lr=schedules.cosine(0.02, 30, warmup_steps=3), **kw)


def gradients(rng, n):
    out = []
    for _ in range(n):
        idx = rng.integers(0, 8, size=4)
        out.append([fastadam.IndexedSlices(rng.standard_normal((4, 3)).astype(np.float32), idx,
                                           (8, 3)),
                    rng.standard_normal(4),
                    scipy_sparse.random(5, 2, density=0.5, format="csr", dtype=np.float32,
                                        random_state=int(rng.integers(1 << 30)))])
    return out


def hypers(opt):
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def snapshot(opt):
    return ([p.tobytes() for p in opt._arrays],
            {k: [a.tobytes() for a in v] for k, v in opt._slots.items()},
            opt.t, json.dumps(checkpoint.metadata(opt)))


@pytest.mark.parametrize("make", [
    make_adam,
    lambda p: fastadam.AdamW(p, lr=0.03, clip_grad_norm=0.5, convention="tf"),
    lambda p: fastadam.Adagrad([{"params": p[:1]}, {"params": p[1:], "lr": 0.02}],
                               initial_accumulator_value=0.1, lr_decay=0.01),
    lambda p: fastadam.SGD(p, lr=schedules.step(0.05, 4, 0.5), momentum=0.9, nesterov=True),
])
def test_save_load_resumes_bit_exactly(tmp_path, rng, make):
    params = make_params(rng)
    grads = gradients(rng, 10)
    straight = [p.copy() for p in params]
    opt = make(straight)
    for g in grads:
        opt.step(g)

    first = [p.copy() for p in params]
    opt = make(first)
    for g in grads[:4]:
        opt.step(g)
    path = tmp_path / "ckpt.npz"
    opt.save(path)
    resumed = [np.zeros_like(p) for p in params]
    opt2 = make(resumed)
    opt2.load(str(path))
    assert opt2.t == 4
    assert hypers(opt2) == hypers(opt)
    for g in grads[4:]:
        opt2.step(g)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(straight, resumed))


def test_state_dict_round_trips_groups_and_schedules(rng):
    params = make_params(rng)
    opt = make_adam(params, clip_grad_norm=2.0)
    for g in gradients(rng, 3):
        opt.step(g)
    state = opt.state_dict()
    json.dumps({k: v for k, v in state.items() if k not in opt.slot_names})  # plain data
    other = make_adam([p.copy() for p in params])
    other.set_hyperparameters(group=1, lr=0.5, weight_decay=0.0)
    other.load_state_dict(state)
    assert snapshot(other)[1:] == snapshot(opt)[1:]
    assert other.param_groups[1]["lr"] == schedules.one_cycle(0.05, 30)
    assert other.clip_grad_norm == 2.0


def test_user_schedule_is_not_serialised(tmp_path, rng):
    params = make_params(rng)
    opt = fastadam.Adam(params, lr=lambda k: 0.01)
    opt.save(tmp_path / "c.npz")
    plain = fastadam.Adam([p.copy() for p in params], lr=0.1)
    with pytest.raises(ValueError, match=r"meta\['param_groups'\]\[0\]\['lr'\]: the state was "
                                         r"saved with a user-defined learning-rate callable"):
        plain.load(tmp_path / "c.npz")
    again = fastadam.Adam([p.copy() for p in params], lr=lambda k: 0.02)
    again.load(tmp_path / "c.npz")
    assert again.param_groups[0]["lr"](0) == 0.02  # the optimizer's own callable is kept


def test_load_without_params_keeps_the_parameters(tmp_path, rng):
    params = make_params(rng)
    opt = make_adam(params)
    opt.step(gradients(rng, 1)[0])
    opt.save(tmp_path / "c.npz")
    mine = [np.full_like(p, 7) for p in params]
    other = make_adam(mine)
    other.load(tmp_path / "c.npz", params=False)
    assert other.t == 1 and all(np.all(p == 7) for p in mine)


# ---- atomic save -------------------------------------------------------------------------------
def saved_twice(tmp_path, rng):
    """An optimizer saved once at t=1, stepped again, and the old file's snapshot."""
    params = make_params(rng)
    opt = make_adam(params)
    opt.step(gradients(rng, 1)[0])
    path = tmp_path / "ckpt.npz"
    opt.save(path)
    old = snapshot(opt)
    opt.step(gradients(rng, 1)[0])
    return opt, path, old


def load_snapshot(path, rng):
    fresh = make_adam(make_params(rng))
    fresh.load(path)
    return snapshot(fresh)


def test_failed_write_midway_keeps_the_old_file(tmp_path, rng, monkeypatch):
    opt, path, old = saved_twice(tmp_path, rng)
    real = checkpoint.npy_format.write_array
    written = []

    def failing(fp, array, **kw):
        if len(written) == 3:
            fp.write(b"\0" * 10)
            raise OSError(28, "No space left on device")
        written.append(1)
        return real(fp, array, **kw)

    monkeypatch.setattr(checkpoint.npy_format, "write_array", failing)
    with pytest.raises(OSError, match="No space left"):
        opt.save(path)
    monkeypatch.undo()
    assert load_snapshot(path, rng) == old
    assert os.listdir(tmp_path) == ["ckpt.npz"]  # the temporary file is gone


def test_full_disk_at_fsync_keeps_the_old_file(tmp_path, rng, monkeypatch):
    opt, path, old = saved_twice(tmp_path, rng)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        opt.save(path)
    monkeypatch.undo()
    assert load_snapshot(path, rng) == old
    assert os.listdir(tmp_path) == ["ckpt.npz"]


KILLED_SAVE = """
import os, signal, sys
import numpy as np
import fastadam
import fastadam.optim._checkpoint as checkpoint

params = [np.arange(50000, dtype=np.float64), np.ones(3)]
opt = fastadam.Adam(params, lr=0.1)
opt.step([np.ones(50000), np.ones(3)])
opt.save(sys.argv[1])
opt.step([np.ones(50000), np.ones(3)])
real = checkpoint.npy_format.write_array
count = []

def write_then_die(fp, array, **kw):
    count.append(1)
    if len(count) == 3:
        fp.write(array.tobytes()[:1000])
        fp.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fp, array, **kw)

checkpoint.npy_format.write_array = write_then_die
opt.save(sys.argv[1])
"""


def test_process_killed_mid_save_keeps_the_old_file(tmp_path):
    path = tmp_path / "ckpt.npz"
    root = os.path.dirname(os.path.dirname(fastadam.__file__))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_SAVE), str(path)],
                          env=env, cwd=root, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    params = [np.zeros(50000), np.zeros(3)]
    opt = fastadam.Adam(params, lr=0.1)
    opt.load(path)
    assert opt.t == 1  # the first save, whole
    expected = np.arange(50000.0) - 0.1 / (1 + 1e-8)  # one Adam step, gradient of ones
    np.testing.assert_allclose(params[0], expected, rtol=1e-12, atol=1e-12)
    leftovers = [name for name in os.listdir(tmp_path) if name != "ckpt.npz"]
    assert all(name.startswith(".ckpt.npz.") and name.endswith(".tmp") for name in leftovers)


# ---- hostile files ---------------------------------------------------------------------------
def entries_of(path):
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def npy_bytes(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=True)
    return buf.getvalue()


def meta_of(entries):
    return json.loads(np.load(io.BytesIO(entries["meta.npy"])).tobytes())


def with_meta(entries, meta):
    return {**entries, "meta.npy": npy_bytes(np.frombuffer(json.dumps(meta).encode(), np.uint8))}


def write_zip(path, entries, compression=zipfile.ZIP_STORED):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are written on purpose below
        with zipfile.ZipFile(path, "w", compression) as zf:
            for name, data in (entries.items() if isinstance(entries, dict) else entries):
                zf.writestr(name, data)


@pytest.fixture
def victim(tmp_path, rng):
    """(optimizer at t=2, path of a valid checkpoint of it at t=1, snapshot of the optimizer)."""
    params = make_params(rng)
    opt = make_adam(params, amsgrad=False)
    opt.step(gradients(rng, 1)[0])
    path = tmp_path / "good.npz"
    opt.save(path)
    opt.step(gradients(rng, 1)[0])
    return opt, path, snapshot(opt)


def edit_meta(change):
    def edit(entries):
        meta = meta_of(entries)
        change(meta)
        return with_meta(entries, meta)
    return edit


def add(name, data):
    return lambda entries: {**entries, name: data}


def drop(name):
    return lambda entries: {k: v for k, v in entries.items() if k != name}


def huge_header(entries):
    # a 100-byte entry whose header claims 2**40 float32 elements
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2 ** 40,)})
    return {**entries, "m_0.npy": header.getvalue() + b"\0" * 100}


def pickled(entries):
    return {**entries, "v_1.npy": npy_bytes(np.array([{"a": 1}] * 4, dtype=object))}


def longer_than_header(entries):
    return {**entries, "v_1.npy": entries["v_1.npy"] + b"\0" * 64}


def truncated_data(entries):
    return {**entries, "v_1.npy": entries["v_1.npy"][:-8]}


def fortran(entries):
    return {**entries, "m_0.npy": npy_bytes(np.asfortranarray(np.zeros((8, 3), np.float32)))}


def set_group(gi, key, value):
    return edit_meta(lambda m: m["param_groups"][gi].__setitem__(key, value))


HOSTILE = [
    ("unknown key", edit_meta(lambda m: m.__setitem__("extra", 1)), ValueError,
     r"meta: unknown key 'extra'"),
    ("missing key", edit_meta(lambda m: m.pop("options")), ValueError,
     r"meta: missing key 'options'"),
    ("string flag", set_group(0, "maximize", "false"), TypeError,
     r"meta\['param_groups'\]\[0\]: maximize: expected a bool, got str 'false'"),
    ("float t", edit_meta(lambda m: m.__setitem__("t", 1.5)), ValueError,
     r"meta\['t'\]: expected an int step count in \[0, 2\*\*63\), got 1.5"),
    ("string t", edit_meta(lambda m: m.__setitem__("t", "1")), ValueError,
     r"meta\['t'\]: expected an int step count in \[0, 2\*\*63\), got '1'"),
    ("bool t", edit_meta(lambda m: m.__setitem__("t", True)), ValueError,
     r"meta\['t'\]: expected an int step count in \[0, 2\*\*63\), got True"),
    ("negative t", edit_meta(lambda m: m.__setitem__("t", -3)), ValueError,
     r"meta\['t'\]: expected an int step count in \[0, 2\*\*63\), got -3"),
    ("t past int64", edit_meta(lambda m: m.__setitem__("t", 2 ** 63)), ValueError,
     r"meta\['t'\]: expected an int step count in \[0, 2\*\*63\), got 9223372036854775808"),
    ("other format", edit_meta(lambda m: m.__setitem__("format", "fastadam.optim/99")),
     ValueError, r"meta\['format'\]: expected 'fastadam.optim/1'"),
    ("other optimizer", edit_meta(lambda m: m.__setitem__("optimizer", "SGD")), ValueError,
     r"meta\['optimizer'\]: this state belongs to 'SGD', not to 'Adam'"),
    ("more groups", edit_meta(lambda m: m["param_groups"].append(m["param_groups"][0])),
     ValueError, r"meta\['param_groups'\]: expected 2 groups, got 3"),
    ("more parameters", set_group(1, "params", [2, 3]), ValueError,
     r"meta\['param_groups'\]\[1\]\['params'\]: expected the parameter indices \[2\]"),
    ("fewer parameters", set_group(0, "params", [0]), ValueError,
     r"meta\['param_groups'\]\[0\]\['params'\]: expected the parameter indices \[0, 1\]"),
    ("unknown group key", set_group(0, "momentum", 0.9), ValueError,
     r"meta\['param_groups'\]\[0\]: unknown key 'momentum'"),
    ("negative lr", set_group(0, "lr", -1), ValueError,
     r"meta\['param_groups'\]\[0\]: lr: expected a number >= 0, got -1.0"),
    ("bad schedule", set_group(1, "lr", {"schedule": "one_cycle", "max_lr": 0.1}), ValueError,
     r"meta\['param_groups'\]\[1\]\['lr'\]: schedule 'one_cycle': .*total_steps"),
    ("string option", edit_meta(lambda m: m["options"].__setitem__("amsgrad", "false")),
     TypeError, r"meta\['options'\]: amsgrad: expected a bool, got str 'false'"),
    ("other amsgrad", edit_meta(lambda m: m["options"].__setitem__("amsgrad", True)),
     ValueError, r"meta\['options'\]: amsgrad: the state has amsgrad=True"),
    ("extra parameter entry", add("param_3.npy", npy_bytes(np.zeros(3))), ValueError,
     r"path: unknown entry 'param_3.npy' \(this optimizer has 3 parameters"),
    ("missing slot entry", drop("v_2.npy"), ValueError, r"path: missing entry 'v_2.npy'"),
    ("huge header", huge_header, ValueError,
     r"m_0.npy: expected float32 of shape \(8, 3\), got float32 of shape \(1099511627776,\)"),
    ("pickled objects", pickled, ValueError, r"v_1.npy: expected float64 of shape \(4,\), got "
                                             r"object"),
    ("data past the header's size", longer_than_header, ValueError,
     r"v_1.npy: the entry holds 96 bytes of data, its header says 32"),
    ("truncated data", truncated_data, ValueError,
     r"v_1.npy: the entry holds 24 bytes of data, its header says 32"),
    ("fortran order", fortran, ValueError, r"m_0.npy: expected a C-order array"),
    ("not a npy entry", add("m_1.npy", b"not an array at all"), ValueError,
     r"m_1.npy: not a valid .npy entry"),
    ("meta not JSON", add("meta.npy", npy_bytes(np.frombuffer(b"{nope", np.uint8))), ValueError,
     r"is not a fastadam.Adam checkpoint \(meta.npy is not JSON"),
    ("meta of another dtype", add("meta.npy", npy_bytes(np.zeros(3))), ValueError,
     r"meta.npy: expected uint8"),
    ("no meta", drop("meta.npy"), ValueError,
     r"is not a fastadam.Adam checkpoint \(no meta.npy entry\)"),
]


@pytest.mark.parametrize("name, mutate, exc, pattern", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_file_is_rejected_and_changes_nothing(victim, tmp_path, name, mutate, exc,
                                                      pattern):
    opt, good, before = victim
    bad = tmp_path / "bad.npz"
    write_zip(bad, mutate(entries_of(good)))
    with pytest.raises(exc, match=pattern):
        opt.load(bad)
    assert snapshot(opt) == before


def test_duplicate_entry_names(victim, tmp_path):
    opt, good, before = victim
    entries = list(entries_of(good).items())
    write_zip(tmp_path / "bad.npz", entries + [entries[1]])
    with pytest.raises(ValueError, match=r"an entry name appears twice"):
        opt.load(tmp_path / "bad.npz")
    assert snapshot(opt) == before


def test_compressed_entry_cannot_inflate_past_its_header(victim, tmp_path):
    # 16 MB of zeros deflate to a few kB: the entry size is checked before it is inflated
    opt, good, before = victim
    entries = entries_of(good)
    entries["v_1.npy"] = entries["v_1.npy"] + bytes(16 << 20)
    write_zip(tmp_path / "bomb.npz", entries, zipfile.ZIP_DEFLATED)
    assert os.path.getsize(tmp_path / "bomb.npz") < 1 << 20
    with pytest.raises(ValueError, match=r"v_1.npy: the entry holds 16777248 bytes of data"):
        opt.load(tmp_path / "bomb.npz")
    assert snapshot(opt) == before


def test_corrupted_data_fails_its_crc(victim, tmp_path):
    opt, good, before = victim
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("param_0.npy")
    raw[info.header_offset + 30 + len(info.filename) + 200] ^= 0xFF  # inside the data
    (tmp_path / "bad.npz").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"path: corrupted entry"):
        opt.load(tmp_path / "bad.npz")
    assert snapshot(opt) == before


def test_not_a_zip_and_truncated_files(victim, tmp_path):
    opt, good, before = victim
    (tmp_path / "text.npz").write_text("hello")
    (tmp_path / "half.npz").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    for name in ("text.npz", "half.npz"):
        with pytest.raises(ValueError, match=r"is not a fastadam.Adam checkpoint \(not a zip"):
            opt.load(tmp_path / name)
    assert snapshot(opt) == before


@pytest.mark.parametrize("change, exc, pattern", [
    (lambda s: s.__setitem__("m", s["m"][:2]), ValueError,
     r"state\['m'\]: expected 3 arrays \(one per parameter\), got 2"),
    (lambda s: s["v"].__setitem__(0, [[0.0] * 3] * 8), TypeError,
     r"state\['v'\]\[0\]: expected a numpy.ndarray, got list"),
    (lambda s: s.pop("v"), ValueError, r"state: missing key 'v'"),
    (lambda s: s.__setitem__("v_max", []), ValueError, r"state: unknown key 'v_max'"),
    (lambda s: s["options"].__setitem__("clip_grad_norm", -1.0), ValueError,
     r"state\['options'\]: clip_grad_norm: expected a number >= 0, got -1.0"),
])
def test_load_state_dict_errors_change_nothing(victim, change, exc, pattern):
    opt, _, before = victim
    state = opt.state_dict()
    state["t"] = 50
    change(state)
    with pytest.raises(exc, match=pattern):
        opt.load_state_dict(state)
    assert snapshot(opt) == before


def test_save_writes_no_pickle(victim):
    _, good, _ = victim
    with zipfile.ZipFile(good) as zf:
        for name in zf.namelist():
            np.load(io.BytesIO(zf.read(name)), allow_pickle=False)  # raises on object arrays
