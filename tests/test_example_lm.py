"""docs/examples/train_lm.py in its --quick form: the loss drops below the unigram baseline, the PyTorch copy of
the model gives the same losses on the same batches, samples are printed and the PNG is written."""
import importlib.util

import numpy as np
import pytest

from scripts import load_script


@pytest.fixture(scope="module")
def example():
    return load_script("docs/examples/train_lm.py", "train_lm_example")


def test_quick_run_learns_beats_the_baseline_and_matches_torch(example, tmp_path, capsys) -> None:
    png = tmp_path / "lm.png"
    result = example.main(["--quick", "--every", "20", "--plot", str(png)])
    out = capsys.readouterr().out
    assert out.count("jitgrad step") == 3 and "jitgrad step   60/60" in out
    assert len(result.losses) == 60
    assert np.mean(result.losses[-10:]) < result.losses[0] - 1.0  # from about 4.5 nats/char
    assert result.valid_loss < result.baseline
    assert f"validation loss {result.valid_loss:.3f} nats/char; unigram baseline {result.baseline:.3f}" in out
    if importlib.util.find_spec("torch") is not None:
        assert len(result.torch_losses) == 20
        np.testing.assert_allclose(result.torch_losses, result.losses[:20], rtol=0, atol=1e-4)
        assert result.torch_ms > 0 and "eager PyTorch" in out
    assert result.jitgrad_ms > 0 and "median ms per training step: jitgrad" in out
    assert len(result.samples) == 3 and out.count("sample: ") == 3
    if importlib.util.find_spec("matplotlib") is not None:
        assert result.plotted and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not result.plotted and not png.exists() and "skipping the plot" in out


def test_the_fused_step_is_one_program(example) -> None:
    ids, chars = example.encode("abcab" * 40)
    cfg = example.Config(vocab=len(chars), context=8, width=16, heads=2, batch=2)
    params = example.init_params(cfg)
    opt = example.jg.optim.AdamW(lr=1e-2)
    step, state = example.make_step(opt, cfg.heads), opt.init(params)
    for tokens, targets in example.batches(ids, cfg, 3, seed=0):
        _, params, state = step(params, state, tokens, targets)
    assert step.cache_info()["misses"] == 1
    (plan,) = step.plans.plans.values()
    assert list(plan.executables) == ["call"]
    assert {leaf.dtype for leaf in example.jg.tree_leaves(params)} == {np.dtype(np.float32)}
