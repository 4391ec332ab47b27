"""docs/examples/train_mlp.py trains to its stated accuracy, its loss curve equals PyTorch's (without torch it
trains with jitgrad alone), and it writes the PNG when matplotlib is installed (and skips it cleanly when not)."""
import importlib.util
import sys

import numpy as np
import pytest

from scripts import load_script


@pytest.fixture(scope="module")
def example():
    return load_script("docs/examples/train_mlp.py", "train_mlp_example")


def test_example_trains_to_its_stated_accuracy_with_torch_equal_curves(example, tmp_path, capsys) -> None:
    png = tmp_path / "loss.png"
    result = example.main(["--plot", str(png)])
    out = capsys.readouterr().out
    assert out.count("jitgrad step") == 5 and "jitgrad step  500/500" in out  # progress while training
    assert len(result.jitgrad_losses) == len(result.torch_losses) == 500
    np.testing.assert_allclose(result.jitgrad_losses, result.torch_losses, rtol=0, atol=1e-4)
    assert result.jitgrad_losses[-1] < 0.25 * result.jitgrad_losses[0]
    assert result.accuracy >= example.STATED_ACCURACY
    assert f"training accuracy {result.accuracy:.3f} (stated: >= {example.STATED_ACCURACY})" in out
    if importlib.util.find_spec("matplotlib") is not None:
        assert result.plotted and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not result.plotted and not png.exists() and "skipping the plot" in out


def test_plot_is_skipped_with_a_message_without_matplotlib(example, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    png = tmp_path / "loss.png"
    assert example.plot_losses([1.0, 0.5], [1.0, 0.5], str(png)) is False
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not png.exists()


def test_without_torch_it_trains_with_jitgrad_only(example, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    result = example.main(["--steps", "20", "--every", "20", "--plot", str(tmp_path / "loss.png")])
    out = capsys.readouterr().out
    assert "torch is not installed: skipping the PyTorch comparison" in out and "jitgrad step   20/20" in out
    assert result.torch_losses == [] and len(result.jitgrad_losses) == 20
