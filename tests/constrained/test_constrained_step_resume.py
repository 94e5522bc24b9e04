"""Constrained step: exact resume through cudt.checkpoint (indexed tables), and 4 devices = 1."""

import logging
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import forced_devices_env

import cudt
from cudt import checkpoint
from cudt.checkpoint import GroupCheckpointer


def _problem(p, b, k):
    x, ids = b
    per = x @ p["w"] - 1.0  # [B]
    return jnp.mean((x @ p["w"]) ** 2), {
        "per_sample": cudt.Constraint(-per, kind="ineq", index=ids),
        "mean": cudt.Constraint(jnp.mean(per) - 0.5, kind="eq"),
    }


def _implicit_problem(p, b, k):
    """``_problem`` with the per-sample multipliers a model of each example's features."""
    x, _ = b
    f, cons = _problem(p, b, k)
    return f, cons | {"per_sample": cons["per_sample"].replace(index=None, features=x)}


def _batches(n):
    rng = np.random.default_rng(0)
    for _ in range(n):
        yield (
            jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            jnp.asarray(rng.permutation(16)[:4], jnp.int32),
        )


@pytest.mark.parametrize("update", ["simultaneous", "alternating", "extragradient", "optimistic"])
def test_save_restore_then_continue_is_bitwise(tmp_path, update):
    """Every update scheme's state survives a checkpoint: optimistic's last updates (the
    state's ``prev``) included."""
    init, step = cudt.make_constrained_step(
        _problem, primal=optax.adam(1e-2), dual=cudt.dual_adam(1e-1), update=update
    )
    batches = list(_batches(8))
    key = jax.random.key(0)
    s = init({"w": jnp.ones(3)}, batches[0], num_indexed={"per_sample": 16})
    for b in batches[:4]:
        s, _ = step(s, b, key)
    ck = GroupCheckpointer(tmp_path / "ck", asynchronous=False)
    ck.save(4, s, {"step": 4})
    ck.wait()
    ref = s
    for b in batches[4:]:
        ref, _ = step(ref, b, key)
    restored, loop = ck.restore(s)
    ck.close()
    assert loop["step"] == 4
    for b in batches[4:]:
        restored, _ = step(restored, b, key)
    assert float(jnp.max(ref.multipliers["per_sample"])) > 0
    for a, c in zip(jax.tree.leaves(ref), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))


SCRIPT = textwrap.dedent(
    """
    import jax, jax.numpy as jnp, numpy as np, optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import sys; sys.path[:0] = [".", "tests"]  # the test module imports tests/helpers.py
    import cudt
    from tests.constrained.test_constrained_step_resume import _problem, _batches
    assert jax.device_count() == 4, jax.device_count()
    init, step = cudt.make_constrained_step(
        _problem, primal=optax.adam(1e-2), dual=cudt.dual_adam(1e-1))
    bs = [(jnp.tile(x, (2, 1)), jnp.concatenate([i, i + 16])) for x, i in _batches(5)]
    key = jax.random.key(0)
    s1 = init({"w": jnp.ones(3)}, bs[0], num_indexed={"per_sample": 32})
    s4 = jax.tree.map(jnp.copy, s1)  # the step donates its input state
    mesh = Mesh(np.array(jax.devices()), ("data",))
    shard = NamedSharding(mesh, P("data"))
    for b in bs:
        s1, _ = step(s1, b, key)
        s4, _ = step(s4, jax.device_put(b, shard), key)
    for a, c in zip(jax.tree.leaves(s1), jax.tree.leaves(s4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-6)
    print("OK", float(jnp.max(s4.multipliers["per_sample"])))
    # implicit multipliers: φ is replicated, the batch sharded; the same as one device
    from tests.constrained.test_constrained_step_resume import _implicit_problem
    model = {"per_sample": cudt.implicit_mlp(3, hidden=4, key=jax.random.key(1))}
    init, step = cudt.make_constrained_step(
        _implicit_problem, primal=optax.adam(1e-2), dual=cudt.dual_adam(1e-1), implicit=model)
    s1 = init({"w": jnp.ones(3)}, bs[0])
    s4 = jax.tree.map(jnp.copy, s1)
    for b in bs:
        s1, _ = step(s1, b, key)
        s4, _ = step(s4, jax.device_put(b, shard), key)
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.any(a != b), s1.multipliers, init({"w": jnp.ones(3)}, bs[0]).multipliers))
    assert any(bool(m) for m in moved)  # φ trained
    for a, c in zip(jax.tree.leaves(s1), jax.tree.leaves(s4)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-5, atol=1e-6)
    print("OK implicit")
    """
)


def test_four_devices_equal_one():
    env = forced_devices_env(4)
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout and "OK implicit" in r.stdout


@pytest.mark.parametrize(
    "asynchronous, available, blocks",
    [
        (False, None, True),
        (None, 1 << 20, True),  # the default: a CPU state above a quarter of free memory ...
        (None, 1 << 40, False),  # ... is saved synchronously, a small one asynchronously
        (True, 1 << 20, False),
    ],
)
def test_a_large_cpu_state_is_saved_without_a_second_copy(
    tmp_path, monkeypatch, asynchronous, available, blocks
):
    """An asynchronous save holds the saved arrays until it is committed, so the next step,
    which donates them, allocates a second state: on the CPU a whole extra state of RAM (six
    SmolLM2 lanes: +9.7 GB, which killed a 24 GB run). A blocking save lets go of them first,
    and the step reuses their buffers."""
    import cudt.checkpoint as checkpoint

    monkeypatch.setattr(checkpoint, "available_memory", lambda: available)
    state = {"w": jnp.ones((512, 1024), jnp.float32), "step": jnp.zeros((), jnp.int32)}
    assert checkpoint.host_bytes(state) == 512 * 1024 * 4 + 4
    assert checkpoint.host_bytes({"w": np.ones(3, np.float64)}) == 24
    assert checkpoint.save_blocks(state, available=16 * checkpoint.host_bytes(state)) is False
    assert checkpoint.save_blocks(state, available=2 * checkpoint.host_bytes(state)) is True
    pointer = state["w"].unsafe_buffer_pointer()
    with GroupCheckpointer(tmp_path / "ck", asynchronous=asynchronous) as ck:
        waits = []
        monkeypatch.setattr(ck, "wait", lambda: waits.append(ck._manager.wait_until_finished()))
        ck.save(1, state, {})
        assert (len(waits) == 1 or asynchronous is False) is blocks
        if blocks:
            assert not ck._manager.is_saving_in_progress()
            step = jax.jit(lambda s: {"w": s["w"] * 2, "step": s["step"] + 1}, donate_argnums=0)
            assert step(state)["w"].unsafe_buffer_pointer() == pointer  # no second state
        ck._manager.wait_until_finished()
        restored, _ = ck.restore(None)
    np.testing.assert_array_equal(restored["w"], np.ones((512, 1024), np.float32))


def test_a_failed_saves_folder_that_a_late_write_recreates_is_removed_too(tmp_path):
    """tensorstore may finish a write of a failed save after orbax reported the failure,
    creating the save's temporary folder again: the cleanup waits until none comes back."""
    import threading
    import time

    with GroupCheckpointer(tmp_path / "ckpt") as checkpointer:
        tmp = checkpointer.directory / "2.orbax-checkpoint-tmp-123"
        (tmp / "state").mkdir(parents=True)

        def late_write():  # after the first removal, as a straggling writer would
            while tmp.exists():
                time.sleep(0.001)
            time.sleep(0.05)
            (tmp / "state" / "d").mkdir(parents=True)

        writer = threading.Thread(target=late_write)
        writer.start()
        checkpointer._remove_partial_saves()
        writer.join()
        assert not tmp.exists()


def test_asyncio_reports_of_orbax_reads_are_dropped_while_a_restore_runs(monkeypatch):
    """A corrupt checkpoint's reads fail as asyncio tasks; the garbage collector may report one
    ("Task exception was never retrieved") inside orbax's restore, before the failure is known.
    While a restore runs such records are dropped; other asyncio errors still print."""
    quiet = checkpoint._QUIET
    monkeypatch.setattr(quiet, "failed", False)  # sticky once any checkpoint in this process failed
    monkeypatch.setattr(quiet, "restoring", 0)

    def record(text):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, text, None, None)

    orbax = record("Task exception was never retrieved\nfuture: <Task coro=<async_deserialize() "
                   "defined at .../orbax/checkpoint/_src/serialization/serialization.py:394>")  # fmt: skip
    other = record("Task exception was never retrieved\nfuture: <Task coro=<my_job()>")
    assert quiet.filter(orbax) and quiet.filter(other)
    quiet.restoring = 1
    assert not quiet.filter(orbax) and quiet.filter(other)
    quiet.restoring = 0
    assert quiet.filter(orbax)
