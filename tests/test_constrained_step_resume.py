"""Constrained step: exact resume through cudt.checkpoint (indexed tables), and 4 devices = 1."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cudt
from cudt.checkpoint import GroupCheckpointer


def _problem(p, b, k):
    x, ids = b
    per = x @ p["w"] - 1.0  # [B]
    return jnp.mean((x @ p["w"]) ** 2), {
        "per_sample": cudt.Constraint(-per, kind="ineq", index=ids),
        "mean": cudt.Constraint(jnp.mean(per) - 0.5, kind="eq"),
    }


def _batches(n):
    rng = np.random.default_rng(0)
    for _ in range(n):
        yield (
            jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
            jnp.asarray(rng.permutation(16)[:4], jnp.int32),
        )


@pytest.mark.parametrize("update", ["simultaneous", "extragradient"])
def test_save_restore_then_continue_is_bitwise(tmp_path, update):
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
    import sys; sys.path.insert(0, ".")
    import cudt
    from tests.test_constrained_step_resume import _problem, _batches
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
    """
)


def test_four_devices_equal_one():
    env = dict(
        os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu"
    )
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK" in r.stdout
