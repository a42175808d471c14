"""load_model with a file where a folder belongs: models_dir, or the model's own folder. Each is said as such
in one line (a command names its flag: report.command_error_line), not errno 20 or "no such folder"."""
import pytest

from gpt2np import load_model
from gpt2np.report import command_error_line


def test_a_file_as_models_dir_is_not_a_folder(tmp_path):
    (tmp_path / "file").write_text("")
    for models_dir, says in ((tmp_path / "file", ""), (tmp_path / "file" / "x", f" ({tmp_path / 'file'} is a file)")):
        with pytest.raises(NotADirectoryError) as refused:
            load_model("124M", models_dir, base_url="http://127.0.0.1:9")  # nothing is fetched
        assert str(refused.value) == f"models_dir {models_dir} is not a folder{says}"
        assert command_error_line(refused.value) == f"--models_dir {models_dir} is not a folder{says}"
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_a_file_named_as_the_model_is_a_file_not_a_model_folder(tmp_path):
    (tmp_path / "hparams.json").write_text("{}")
    with pytest.raises(NotADirectoryError, match="hparams.json is a file, not a model folder"):
        load_model(str(tmp_path / "hparams.json"))
