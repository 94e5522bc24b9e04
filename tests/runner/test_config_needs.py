"""``flag(..., needs=...)``: a flag declares where it acts, and one check refuses it set (to other
than its default) where nothing reads it, for every task's config and a job's own options."""

import dataclasses

import pytest

from cudt.errors import UsageError
from cudt.runner.config import Needs, RunConfig, field_defaults, flag, unmet_needs
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.text import TextConfig
from cudt.tasks.video import VideoConfig
from experiments.paper.job import check_needs

_FAST = Needs(lambda c: c.mode == "fast", "--level is read in --mode fast only: drop it")


@dataclasses.dataclass(frozen=True)
class _Toy(RunConfig):
    mode: str = flag("slow", "slow or fast")
    level: int = flag(1, "how fast", needs=_FAST)
    label: str | None = flag(
        None,
        "a name",
        needs=Needs(lambda c: c.mode == "fast", lambda c, name: f"{name} {c.label}: {c.mode}"),
    )


def test_a_flag_is_refused_set_where_its_needs_are_false_and_kept_at_its_default():
    assert _Toy().level == 1 and _Toy(level=1).level == 1  # the default acts on nothing: kept
    assert _Toy(mode="fast", level=3, label="x").level == 3  # where it acts: any value
    with pytest.raises(ValueError, match="^--level is read in --mode fast only: drop it$"):
        _Toy(level=3)
    with pytest.raises(ValueError, match="^--label x: slow$"):  # the message of the values
        _Toy(label="x")
    assert unmet_needs(_Toy(mode="fast", level=2)) is None


def test_a_jobs_own_options_share_the_check_with_their_defaults():
    @dataclasses.dataclass(frozen=True)
    class Options:  # no RunConfig: a job calls the check itself
        mode: str = flag("slow", "slow or fast")
        level: int = flag(1, "how fast", needs=_FAST)

    assert field_defaults(Options) == {"mode": "slow", "level": 1}
    check_needs(Options(mode="fast", level=2))
    check_needs(Options(level=1))
    with pytest.raises(UsageError, match="^--level is read in --mode fast only"):
        check_needs(Options(level=2))


# Another value of each UT and DUST flag: a new one fails here until it declares where it acts.
_VIDEO_VALUES = {
    "ut": dict(
        ut_a=0.5, ut_b=0.5, ut_tying="all", ut_skip=False, ut_ffn_init=1.0, ut_clip=0.5,
        ut_reinject=0.1, ut_attention="dot",
    ),
    "dust": dict(
        dust_atoms=16, dust_dictionary="shared", dust_spread=0.1, dust_threshold=0.02,
        dust_initial_code="zero",
    ),
}  # fmt: skip


def test_every_video_model_flag_acts_on_its_model_alone():
    named = {f.name for f in dataclasses.fields(VideoConfig) if f.name.startswith(("ut_", "dust_"))}
    # --no-dust-control asks for nothing, and its default trains the control where dust is
    assert named - {"dust_control"} == {*_VIDEO_VALUES["ut"], *_VIDEO_VALUES["dust"]}
    for model, other in (("ut", "dust"), ("dust", "ut")):
        for name, value in _VIDEO_VALUES[model].items():
            if name != "dust_spread":  # one-per-layer dictionaries: not with "shared"
                VideoConfig(models=(model,), **{name: value})
            flag_name = "--" + name.replace("_", "-")
            with pytest.raises(ValueError, match=f"^{flag_name} applies to --models ...,{model}"):
                VideoConfig(models=(other,), **{name: value})


def test_every_text_ut_flag_acts_with_the_ut_alone():
    values = dict(ut_a=2.0, ut_b=0.3, ut_tying="none", ut_skip=True, ut_positions=True, layers=3)
    named = {f.name for f in dataclasses.fields(TextConfig) if f.name.startswith("ut_")}
    assert named | {"layers"} == set(values)
    for name, value in values.items():
        TextConfig(model="ut", **{name: value})
        flag_name = "--" + name.replace("_", "-")
        with pytest.raises(ValueError, match=f"^{flag_name} applies to --model ut only"):
            TextConfig(model="minilm", **{name: value})


def test_each_lora_flag_without_a_rank_is_named_alone():
    """It named both --lora-alpha and --lora-targets whichever was set."""
    for name, value in (("lora_alpha", 4.0), ("lora_targets", ("q", "v"))):
        flag_name = "--" + name.replace("_", "-")
        with pytest.raises(
            ValueError, match=f"^{flag_name} shapes LoRA adapters: pass --lora-rank R too"
        ):
            LLMConfig(**{name: value})
    LLMConfig(checkpoint="smollm2", lora_rank=8, lora_alpha=4.0, lora_targets=("q", "v"))


def test_a_data_folder_is_read_by_a_real_dataset_alone_in_video_and_text():
    """One declaration (read_by_real_data) for both tasks; the fix names each task's own data."""
    for config, real in ((VideoConfig, "ucsd|frames"), (TextConfig, "imdb|mnli|aclimdb")):
        with pytest.raises(ValueError, match=f"^--data-dir d is read only by a real .* {real}"):
            config(dataset="synthetic", data_dir="d")
    assert "data_dir" in VideoConfig.idle_flags({"dataset": "synthetic"})
    assert "data_dir" not in TextConfig.idle_flags({"dataset": "imdb"})


def test_a_shared_flag_at_either_default_is_not_given():
    """The video task's default is nupi with K_P = 5: with sgd, K_P at 5 (the task's default)
    or at 0 (every other task's, which the dual study pins) acts on nothing and is accepted;
    another value is refused with the knob's own message."""
    VideoConfig(dual_optimizer="sgd")
    VideoConfig(dual_optimizer="sgd", nupi_kp=0.0)
    with pytest.raises(ValueError, match="^--nupi-kp is a gain of --dual-optimizer nupi: pass"):
        VideoConfig(dual_optimizer="sgd", nupi_kp=2.0)


def test_the_embeddings_and_the_head_are_trained_by_full_fine_tuning_alone():
    """--train-embeddings and --untie-head act where the whole model trains (their needs, once
    a hand-written check): refused with LoRA adapters, and idle there for a resume."""
    for name in ("train_embeddings", "untie_head"):
        flag_name = "--" + name.replace("_", "-")
        with pytest.raises(
            ValueError,
            match=f"^--lora-rank trains adapters only, the base frozen: drop {flag_name}$",
        ):
            LLMConfig(checkpoint="smollm2", lora_rank=8, **{name: True})
        LLMConfig(checkpoint="smollm2", **{name: True})
    idle = LLMConfig.idle_flags({"checkpoint": "smollm2", "lora_rank": 8})
    assert {"train_embeddings", "untie_head"} <= set(idle)


def test_the_text_tables_checkpoint_flags_declare_where_they_are_read():
    """Each --checkpoint-... is read where a sub-run loads that folder: its needs (once a
    hand-written check after the others), naming every unread one together."""
    from experiments.paper.text_table.config import Table4Config

    declared = {f.name for f in dataclasses.fields(Table4Config) if f.metadata.get("needs")}
    assert {"checkpoint_distilbert", "checkpoint_roberta", "checkpoint_minilm"} <= declared
    with pytest.raises(UsageError, match="^--checkpoint-distilbert, --checkpoint-roberta would"):
        Table4Config(models=("minilm",), checkpoint_distilbert="a", checkpoint_roberta="b")


def test_a_dust_spread_acts_on_one_per_layer_dictionaries_alone():
    """--dust-spread needs DUST and a dictionary per layer (its needs, once a hand-written
    check in validate): refused with --dust-dictionary shared in the same words, idle there."""
    dust = dict(models=("dust",))
    VideoConfig(**dust, dust_dictionary="per-layer", dust_spread=0.1)
    with pytest.raises(ValueError, match="^--dust-spread holds one-per-layer dictionaries near"):
        VideoConfig(**dust, dust_dictionary="shared", dust_spread=0.1)
    with pytest.raises(ValueError, match="^--dust-spread applies to --models ...,dust only"):
        VideoConfig(models=("ut",), dust_spread=0.1)
    assert "dust_spread" in VideoConfig.idle_flags({**dust, "dust_dictionary": "shared"})
    assert "dust_spread" not in VideoConfig.idle_flags(dust)
