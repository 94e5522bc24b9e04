"""The one table of per-run hyperparameters (cudt.knobs): every row is a flag of RunConfig, the
places that once restated it read it, init puts each value where its row says, under the row's
name in the state (nuPI's gains included), and the off-setting errors are the documented ones."""

import dataclasses
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cudt
from cudt import descent
from cudt.constrained._state import _is_injected
from cudt.knobs import DUAL_FLAGS, GOES, KNOBS, knob_names
from cudt.optim import dual_optimizer, primal_optimizer
from cudt.runner.cli import config_from_args
from cudt.runner.config import RunConfig
from cudt.runner.hparams import CONSTRAINT_ONLY, SWEEPABLE
from cudt.runner.sweep import SHORT
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.video import VideoConfig

ROOT = Path(__file__).resolve().parents[1]


def test_every_row_is_a_flag_and_goes_somewhere_known():
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert len(set(knob_names())) == len(KNOBS)
    for k in KNOBS:
        assert k.name in fields, k.name
        assert k.goes in GOES, k
        assert k.needs is None or k.needs[0] in fields, k
    # the problem's knobs are exactly the keywords of descent.hparams (their one use)
    params = inspect.signature(descent.hparams).parameters
    assert set(knob_names("problem")) == {n for n in params if n != "config"}


def test_the_runner_reads_the_table():
    assert SWEEPABLE == knob_names()
    assert set(CONSTRAINT_ONLY) == {k.name for k in KNOBS if k.constrained_only}
    assert SHORT == {k.name: k.short for k in KNOBS}


def test_a_knobs_flag_acts_where_its_row_says():
    """Where a knob acts is written once, in its row: its flag's ``needs`` (the one check that
    refuses a flag set where it acts on nothing, and a resume's and a re-read's idle flags) is
    that rule with the row's message."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    penalty = VideoConfig(formulation="penalty")  # its dual optimiser: nupi, the task's
    for k in KNOBS:
        needs = fields[k.name].metadata["needs"]
        # a knob with a setting it needs, and the multipliers' steps (none under penalty)
        assert (needs is None) == (k.needs is None and k.goes != "dual"), k.name
        if needs is not None:
            assert needs.ok == k.acts, k.name
            for cfg in (RunConfig(), penalty):
                if not k.acts(cfg):
                    assert needs.message(cfg, k.flag) == k.idle_message(cfg), k.name
    # the shared defaults (lagrangian, mean, adam) read none of the conditional knobs
    assert set(RunConfig.idle_flags({})) == {k.name for k in KNOBS if k.needs}
    dual = {k.name for k in KNOBS if k.goes == "dual"}
    idle = set(RunConfig.idle_flags(dataclasses.asdict(penalty)))
    assert idle == dual | {"tail_beta", *DUAL_FLAGS}
    on = dict(formulation="augmented", constraint="tail", dual_optimizer="nupi")
    assert RunConfig.idle_flags(on) == ()
    with pytest.raises(ValueError, match="^--tail-beta is the beta of --constraint tail: pass"):
        RunConfig(tail_beta=0.3)
    assert RunConfig(**on, tail_beta=0.3, penalty=2.0, nupi_kp=1.0, nupi_ema=0.5).penalty == 2.0


def test_off_messages_are_the_documented_errors():
    errors = (ROOT / "docs" / "errors.md").read_text()
    documented = [k for k in KNOBS if k.needs and f"`error: {k.flag} " in errors]
    assert {k.name for k in documented} >= {"penalty", "tail_beta", "nupi_kp"}
    for k in documented:
        assert f"`error: {k.off_message()}`" in errors, k.name


def _injected(tree) -> dict:
    found = {}

    def visit(node):
        if _is_injected(node):
            found.update(node.hyperparams)
        return node

    jax.tree.map(visit, tree, is_leaf=_is_injected)
    return found


def test_init_puts_each_value_where_its_row_says():
    def layer_losses(params, batch, key):
        return jnp.abs(batch[:, None] * params["w"][None, :])

    cfg = cudt.DescentConfig(num_layers=2, epsilon=0.1)
    init, _ = cudt.make_train_step(
        layer_losses,
        primal_optimizer(1e-3),
        dual_optimizer("nupi", 0.5),
        cfg,
        formulation=cudt.AugmentedLagrangian(penalty=1.0),
        constraint="tail",
    )
    params = {"w": jnp.ones(3)}
    values = dict(
        epsilon=0.3, epsilon_schedule=cudt.schedule("linear", 0.0, 0.0, 10), reference=0.2, lr=0.01, dual_lr=0.7, resilience=4.0, penalty=3.0,
        tail_beta=0.25, nupi_kp=2.0, nupi_ema=0.5,
    )  # fmt: skip
    assert set(values) == {k.name for k in KNOBS if k.goes != "data"}
    state = init(params, **values)
    # ε's path ends at the run's ε: a schedule from 0 to 0.3 over 10 steps
    np.testing.assert_allclose(state.hparams["epsilon"].end, [0.3, 0.3])
    np.testing.assert_allclose(state.hparams["epsilon"].start, [0.0, 0.0])
    assert float(state.hparams["epsilon"].steps) == 10
    assert float(state.hparams["reference"]) == pytest.approx(0.2)
    assert float(state.hparams["resilience"]) == 4.0
    assert float(state.hparams["tail_beta"]) == 0.25
    assert float(_injected(state.opt_state)["learning_rate"]) == pytest.approx(0.01)
    dual = _injected(state.dual_state)
    # the state spells nuPI's gains as the flag, the sweep and the results do
    assert {"learning_rate", "nupi_kp", "nupi_ema"} <= set(dual)
    assert (float(dual["learning_rate"]), float(dual["nupi_kp"]), float(dual["nupi_ema"])) == (
        pytest.approx(0.7),
        2.0,
        0.5,
    )
    assert all(float(p) == 3.0 for p in state.penalty.values())
    with pytest.raises(TypeError, match="'gamma_train'.*the per-run values are epsilon"):
        init(params, gamma_train=0.1)  # the data's knob goes to the batch, not the state


def test_a_checkpoint_of_the_old_names_is_refused_as_such(tmp_path):
    """A checkpoint written before nuPI's gains took the knobs' names (``kp`` / ``ema_nu``)
    cannot resume; restoring it names the renamed array, not a corrupt file."""
    from cudt.checkpoint import CheckpointError, GroupCheckpointer

    old = {"hyperparams": {"kp": jnp.ones(2), "ema_nu": jnp.zeros(2)}}
    saver = GroupCheckpointer(tmp_path / "ck")
    saver.save(1, old, {})
    saver.close()
    now = {"hyperparams": {"nupi_kp": jnp.ones(2), "nupi_ema": jnp.zeros(2)}}
    reader = GroupCheckpointer(tmp_path / "ck")
    try:
        with pytest.raises(CheckpointError, match="written by another version of cudt") as err:
            reader.restore(jax.eval_shape(lambda: now))
    finally:
        reader.close()
    assert "names hyperparams/ema_nu where this version has hyperparams/nupi_ema" in str(err.value)


def test_the_multipliers_steps_act_on_nothing_under_penalty_and_are_recorded_none():
    """--formulation penalty has no multipliers: the dual knobs (--dual-lr, nuPI's gains) act
    on nothing there (Knob.acts), so each run's hparams record None for them, as for a knob
    whose setting is off, and their flags set to another value are refused as such a knob's
    (the state keeps a place for them: active), a sweep of them too. Under a formulation with
    multipliers they are recorded."""
    from cudt.runner.sweep import expand_runs

    def recorded(**kw) -> dict:
        cfg = RunConfig(kinds="constrained", seeds=1, tune_epsilon=(), tune_dual_lr=(), **kw)
        (spec,) = expand_runs(cfg, ["ut"], lambda model: 1e-3, kinds=lambda model: (True,))
        return {n: spec.hp[n] for n in ("dual_lr", "nupi_kp", "nupi_ema", "penalty")}

    nupi = dict(dual_optimizer="nupi", nupi_kp=1.0, nupi_ema=0.5)
    assert recorded(formulation="penalty") == dict(
        dual_lr=None, nupi_kp=None, nupi_ema=None, penalty=1.0
    )
    for name, value in (("dual_lr", 0.01), ("nupi_kp", 1.0), ("nupi_ema", 0.5)):
        flag = "--" + name.replace("_", "-")
        with pytest.raises(ValueError) as err:  # the video task's dual optimiser is nupi
            VideoConfig(formulation="penalty", **{name: value})
        assert str(err.value) == (
            f"{flag} steps the multipliers and --formulation penalty has none (it would act on "
            f"nothing): drop {flag}, or pass --formulation lagrangian or augmented"
        )
    assert RunConfig(formulation="penalty", dual_lr=RunConfig().dual_lr).dual_lr == 0.05
    assert recorded(formulation="augmented", dual_lr=0.01, **nupi) == dict(
        dual_lr=0.01, nupi_kp=1.0, nupi_ema=0.5, penalty=1.0
    )
    assert [k.name for k in KNOBS if k.active(RunConfig()) and not k.acts(RunConfig())] == []
    with pytest.raises(ValueError, match="^dual_lr varies the multipliers' steps and --form"):
        RunConfig(formulation="penalty", sweep=("dual_lr=0.1,0.2",))


@pytest.mark.parametrize(
    "config_cls, flags",
    [
        (VideoConfig, ["--dual-optimizer", "sgd"]),
        (VideoConfig, ["--dual-optimizer", "nupi"]),  # the task's own default
        (VideoConfig, ["--dual-lr-schedule", "cosine"]),
        (VideoConfig, ["--tune-dual-lr", "0.1,1"]),
        (LLMConfig, ["--dual-lr", "0.05"]),  # RunConfig's default, the LLM task's too
        (VideoConfig, ["--nupi-kp", "0"]),
    ],
)
def test_a_flag_of_the_multipliers_steps_named_under_penalty_is_refused(config_cls, flags, capsys):
    """The penalty has no multipliers: every flag that only steps them (the dual knobs, and
    DUAL_FLAGS: the dual optimiser, its rate's schedule, the tuned dual rates) named on the
    command line is refused, whatever its value; they were accepted in silence (the three of
    DUAL_FLAGS at any value, a dual knob at its default). A config built in code at their
    defaults still passes, and they are idle (a resume and a job's reuse ignore them)."""
    flag = flags[0]
    with pytest.raises(SystemExit) as exit_:
        config_from_args(config_cls, ["--formulation", "penalty", *flags], "", "x")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {flag} steps the multipliers and --formulation penalty has none (it would act "
        f"on nothing): drop {flag}, or pass --formulation lagrangian or augmented\n"
    )
    config_from_args(config_cls, ["--formulation", "augmented", *flags], "", "x")  # acts there
    assert config_cls(formulation="penalty").formulation == "penalty"
    idle = config_cls.idle_flags({"formulation": "penalty"})
    assert {*DUAL_FLAGS, *knob_names("dual")} <= set(idle)
