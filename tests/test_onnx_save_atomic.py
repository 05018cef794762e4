"""TrainingSession.save is atomic (fastadam.io.atomic_write): a write that fails midway, a
process killed with SIGKILL at three points of the save, and a 1 MiB file-size limit
(RLIMIT_FSIZE) all leave the previously saved model byte-identical and loadable."""
import contextlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
import fastadam.io  # noqa: E402
import fastadam.onnx as fo  # noqa: E402
from fastadam.onnx import _session  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from wide_onnx_model import feeds, training_session  # noqa: E402

HEADER = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})  # this tests/ folder
from wide_onnx_model import feeds, training_session
"""


def saved_then_stepped(tmp_path):
    session = training_session()
    session.step(feeds(1))
    path = tmp_path / "model.onnx"
    session.save(path)
    old = path.read_bytes()
    session.step(feeds(2))
    assert session.model().SerializeToString() != old
    return session, path, old


def assert_intact(path, old):
    assert path.read_bytes() == old
    fo.TrainingSession(onnx.load(str(path)))  # still a valid training model


def test_save_round_trips(tmp_path):
    session, path, _ = saved_then_stepped(tmp_path)
    session.save(path)
    reloaded = fo.TrainingSession(onnx.load(str(path)))
    for name, value in session.initializers.items():
        np.testing.assert_array_equal(reloaded.initializers[name], value)
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_failed_write_midway_keeps_the_old_model(tmp_path, monkeypatch):
    session, path, old = saved_then_stepped(tmp_path)
    real = _session.atomic_write

    class HalfThenFull:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data)[: len(data) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

    @contextlib.contextmanager
    def failing(target):
        with real(target) as f:
            yield HalfThenFull(f)

    monkeypatch.setattr(_session, "atomic_write", failing)
    with pytest.raises(OSError, match="No space left"):
        session.save(path)
    monkeypatch.undo()
    assert_intact(path, old)
    assert os.listdir(tmp_path) == ["model.onnx"]  # the temporary file is gone


def test_failed_fsync_keeps_the_old_model(tmp_path, monkeypatch):
    session, path, old = saved_then_stepped(tmp_path)

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fastadam.io.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        session.save(path)
    monkeypatch.undo()
    assert_intact(path, old)
    assert os.listdir(tmp_path) == ["model.onnx"]


KILLED_SAVE = HEADER + """
import os, signal, sys
import fastadam.io
path, reference, where = sys.argv[1], sys.argv[2], sys.argv[3]
session = training_session()
session.step(feeds(1))
session.save(path)
with open(reference, "wb") as f:
    f.write(open(path, "rb").read())
session.step(feeds(2))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if where == "write":  # a third of the bytes on disk, then killed
    real = fastadam.io.atomic_write
    import contextlib

    class Dying:
        def __init__(self, f):
            self.f = f
        def write(self, data):
            self.f.write(bytes(data)[: len(data) // 3])
            self.f.flush()
            os.fsync(self.f.fileno())
            die()

    @contextlib.contextmanager
    def dying(target):
        with real(target) as f:
            yield Dying(f)

    import fastadam.onnx._session as s
    s.atomic_write = dying
elif where == "fsync":  # everything written, killed before it is synced
    fastadam.io.os.fsync = die
else:  # synced, killed just before the rename
    fastadam.io.os.replace = die
session.save(path)
"""

FILE_SIZE_LIMIT = HEADER + """
import resource, signal, sys
path, reference, action = sys.argv[1], sys.argv[2], sys.argv[3]
session = training_session()
session.step(feeds(1))
session.save(path)
with open(reference, "wb") as f:
    f.write(open(path, "rb").read())
session.step(feeds(2))
if action == "kill":  # Python ignores SIGXFSZ (write() fails with EFBIG); SIG_DFL ends it
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    session.save(path)
except OSError as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def run_script(source, *args):
    root = os.path.dirname(os.path.dirname(fastadam.__file__))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(source), *map(str, args)],
                          env=env, cwd=root, capture_output=True, timeout=180)


@pytest.mark.parametrize("where", ["write", "fsync", "replace"])
def test_process_killed_mid_save_keeps_the_old_model(tmp_path, where):
    path, reference = tmp_path / "model.onnx", tmp_path / "reference.bin"
    proc = run_script(KILLED_SAVE, path, reference, where)
    assert proc.returncode == -9, proc.stderr.decode()
    assert_intact(path, reference.read_bytes())
    leftovers = set(os.listdir(tmp_path)) - {"model.onnx", "reference.bin"}
    assert all(n.startswith(".model.onnx.") and n.endswith(".tmp") for n in leftovers)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin",
                    reason="RLIMIT_FSIZE as Linux applies it")
@pytest.mark.parametrize("action", ["ignore", "kill"])
def test_file_size_limit_keeps_the_old_model(tmp_path, action):
    path, reference = tmp_path / "model.onnx", tmp_path / "reference.bin"
    proc = run_script(FILE_SIZE_LIMIT, path, reference, action)
    if action == "ignore":
        assert proc.returncode == 3 and b"refused:" in proc.stdout, proc.stderr.decode()
    else:
        assert proc.returncode == -25, proc.stderr.decode()  # SIGXFSZ
    assert os.path.getsize(reference) > 1 << 20
    assert_intact(path, reference.read_bytes())
