"""fastadam.torch under torch's distributed wrappers, on two gloo processes: FSDP2's
``fully_shard`` (DTensor parameters stepped on their local shards, with and without
``CPUOffloadPolicy``), ``torch.distributed.checkpoint`` of the optimizer state, DDP and
``ZeroRedundancyOptimizer``; each against torch.optim on the same model and data.

The processes run tests/torch_dist_scenarios.py once for the whole module (under a timeout, so
a hung rank fails the tests); each test reads the results of its scenarios.
"""
import os
import pickle
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

import fastadam  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_dist_scenarios as sc  # noqa: E402

TIMEOUT_S = 240
WORLD = 2
#: float32 parameters after sc.STEPS steps: fastadam against torch.optim
ATOL = 1e-6


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Every scenario run once on two gloo processes; {name: what rank 0 pickled}."""
    outdir = tmp_path_factory.mktemp("torch_dist")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(fastadam.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1", SCENARIO_DIR=str(outdir),
               PYTHONPATH=os.pathsep.join([package_root] + [p for p in
                                           [os.environ.get("PYTHONPATH")] if p]))
    port = _free_port()
    names = list(sc.SCENARIOS)
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "torch_dist_scenarios.py"),
                               str(rank), str(WORLD), str(port), str(outdir), *names],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in range(WORLD)]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the gloo processes ran past {TIMEOUT_S} s:\n"
                    + "\n".join(p.communicate()[0][-3000:] for p in procs))
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out[-6000:]}"
    found = {}
    for name in names:  # rank 0's results, or the first traceback of any rank
        paths = [outdir / f"{name}.pkl"] + [outdir / f"{name}.rank{r}.pkl"
                                             for r in range(1, WORLD)]
        loaded = []
        for path in paths:
            if path.exists():
                with open(path, "rb") as f:
                    loaded.append(pickle.load(f))
        errors = [r for r in loaded if "error" in r]
        found[name] = errors[0] if errors else loaded[0]
    return found


def scenario(results, name):
    r = results[name]
    if "error" in r:
        pytest.fail(f"scenario {name} raised:\n{r['error']}")
    return r


def assert_params_close(got, expected, what, atol=ATOL):
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape, (what, i)
        err = np.abs(a - b).max(initial=0.0)
        assert err <= atol, f"{what}: parameter {i} differs by {err} (> {atol})"


def assert_trained(r):
    """The comparison means something: the parameters moved well past the tolerance."""
    moved = max(np.abs(a - b).max() for a, b in zip(r["torch"], r["initial"]))
    assert moved > 1e3 * ATOL


# ---- FSDP2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(sc.OPTIMIZERS))
def test_fully_shard_steps_like_torch_optim(results, name):
    """DTensor parameters (uneven shards, one of them empty on rank 1): fastadam.torch equals
    torch.optim within 1e-6, and keeps its state as torch.optim does (DTensors sharded like
    the parameter, ``step`` a plain tensor)."""
    r = scenario(results, f"fsdp_{name}")
    assert_trained(r)
    assert_params_close(r["fastadam"], r["torch"], name)
    assert r["fastadam_layout"] == r["torch_layout"]
    types = {t for _, t, *_ in r["fastadam_layout"]}
    assert types == {"sgd": set(), "sgd_momentum": {"DTensor"}}.get(name, {"DTensor", "Tensor"})


@pytest.mark.parametrize("name", ["adam", "sgd_momentum"])
def test_fully_shard_with_cpu_offload_steps_like_torch_optim(results, name):
    """CPUOffloadPolicy(pin_memory=False): the sharded parameters, gradients and optimizer
    state live on the CPU, where fastadam steps them."""
    r = scenario(results, f"fsdp_offload_{name}")
    assert_trained(r)
    assert_params_close(r["fastadam"], r["torch"], name)
    assert r["fastadam_layout"] == r["torch_layout"]


def test_state_not_sharded_like_its_parameter_is_refused_before_any_write(results):
    r = scenario(results, "fsdp_refusals")
    assert r["plain"] is not None and "expected a DTensor like the parameter, got a plain " \
        "tensor" in r["plain"]
    assert r["replicated"] is not None and "expected a DTensor with the parameter's mesh and " \
        "placements (Shard(dim=0),), got (Replicate(),)" in r["replicated"]
    assert r["plain_unchanged"] and r["replicated_unchanged"]


def test_int8_states_and_master_weights_are_refused_for_dtensor_parameters(results):
    r = scenario(results, "fsdp_refusals")
    for case, option in (("int8", "state_dtype='int8'"), ("master", "master_weights=True")):
        assert r[case] is not None and r[case].startswith("param_groups[0]['params'][0]: ") \
            and f"{option} is not supported for DTensor parameters" in r[case], r[case]
        assert r[case + "_unchanged"] and r[case + "_no_state"], case


def test_bfloat16_states_on_dtensor_parameters_step_like_ddp(results):
    """state_dtype="bfloat16" steps each local shard as the replicated (DDP) run steps the
    whole parameter; the states are bfloat16 DTensors sharded like their parameter."""
    r = scenario(results, "fsdp_bfloat16_states")
    assert_params_close(r["fsdp"], r["ddp"], "fsdp_bfloat16_states")
    moved = max(np.abs(a - b).max() for a, b in zip(r["ddp"], r["initial"]))
    assert moved > 1e3 * ATOL
    slots = [e for e in r["fsdp_layout"] if e[0] != "step"]
    assert slots and all(e[1] == "DTensor" and e[2] == "(Shard(dim=0),)"
                         and e[4] == "torch.bfloat16" for e in slots), slots


# ---- torch.distributed.checkpoint ------------------------------------------------------------
def test_dcp_round_trip_resumes_identically(results):
    """3 steps, dcp.save of model and optimizer (get_optimizer_state_dict), a new model and
    optimizer loaded with dcp.load and set_optimizer_state_dict, 3 more steps: the same
    parameters, bit for bit, as 6 steps without the checkpoint."""
    r = scenario(results, "fsdp_dcp")
    assert r["fastadam_from_fastadam_loaded_step"] == [3.0] * len(r["fastadam_straight"])
    assert_params_close(r["fastadam_from_fastadam"], r["fastadam_straight"], "resumed", atol=0)
    assert {t for _, t, *_ in r["fastadam_from_fastadam_layout"]} == {"DTensor", "Tensor"}
    assert r["state_dict_types"] == ["DTensor", "Tensor"]


def test_dcp_checkpoints_move_between_torch_optim_and_fastadam(results):
    r = scenario(results, "fsdp_dcp")
    assert_params_close(r["torch_straight"], r["fastadam_straight"], "straight runs")
    # torch.optim's checkpoint resumed by fastadam follows torch.optim's run, and back
    assert_params_close(r["fastadam_from_torch"], r["torch_straight"], "fastadam from torch")
    assert_params_close(r["torch_from_fastadam"], r["fastadam_straight"], "torch from fastadam")
    assert r["fastadam_from_torch_layout"] == r["torch_from_fastadam_layout"]


# ---- DDP and ZeroRedundancyOptimizer ---------------------------------------------------------
def test_ddp_steps_like_torch_optim(results):
    r = scenario(results, "ddp_adam")
    assert_trained(r)
    assert_params_close(r["fastadam"], r["torch"], "ddp adam")


def test_zero_redundancy_optimizer_steps_like_torch_optim(results):
    """ZeroRedundancyOptimizer(optimizer_class=fastadam.torch.AdamW): each rank steps its
    partition with fastadam; the consolidated state has torch.optim's layout."""
    r = scenario(results, "zero_adamw")
    assert_trained(r)
    assert_params_close(r["fastadam"], r["torch"], "zero adamw")
    assert r["fastadam_layout"] == r["torch_layout"] and r["torch_layout"]
