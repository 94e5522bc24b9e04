"""Reading a Hugging Face folder's files (cudt.models.hf): what safetensors writes is read,
whatever its header's length; malformed files are one ModelFolderError naming them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy

from cudt.models.hf import ModelFolderError, load_tensors, read_json, read_safetensors


def _header_length(path) -> int:
    return int.from_bytes(path.read_bytes()[:8], "little")


@pytest.mark.parametrize("length", [640, 896, 1152, 1408])
def test_a_safetensors_file_whose_length_bytes_look_like_a_pickle_is_read(tmp_path, length):
    """A header of 640 bytes starts the file with 0x80 0x02, a pickle's protocol-2 opening
    (896, 1152, 1408: protocols 3-5): such files, safetensors' own, were refused as pickles."""
    for pad in range(length):  # a metadata value that pads the header to ``length`` bytes
        path = tmp_path / f"m{pad}.safetensors"
        tensors = {"w": np.arange(3, dtype=np.float32)}
        safetensors.numpy.save_file(tensors, str(path), metadata={"p": "x" * pad})
        if _header_length(path) == length:
            break
        path.unlink()
    assert path.read_bytes()[:2] == bytes([0x80, length >> 8 & 0xFF])
    np.testing.assert_array_equal(read_safetensors(path)["w"], [0.0, 1.0, 2.0])


@pytest.mark.parametrize(
    "index", ["[]", '"x"', '{"weight_map": {"a": 3}}', '{"weight_map": {"a": ["x"]}}']
)
def test_a_malformed_shard_index_is_one_error_naming_it(tmp_path, index):
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(ModelFolderError, match="index.json is malformed .*re-export the model"):
        load_tensors(tmp_path)


def test_a_config_that_is_not_utf8_is_one_error_naming_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "bert"}), encoding="utf-16")
    with pytest.raises(ModelFolderError, match="config.json is not valid JSON"):
        read_json(path)


def test_a_shard_index_naming_a_file_outside_the_folder_is_refused_unread(tmp_path):
    """A shard named by an absolute path (or ``..``) is a file the model folder does not
    hold: refused, not read; the same index naming the shard by its file name loads."""
    folder = tmp_path / "model"
    folder.mkdir()
    safetensors.numpy.save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "w.safetensors"))
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": str(tmp_path / "w.safetensors")}}))
    with pytest.raises(ModelFolderError, match="lists shard '/.*', outside .*: re-export"):
        load_tensors(folder)
    (tmp_path / "w.safetensors").rename(folder / "w.safetensors")
    index.write_text(json.dumps({"weight_map": {"w": "w.safetensors"}}))
    np.testing.assert_array_equal(load_tensors(folder)[0]["w"], [1.0, 1.0])
