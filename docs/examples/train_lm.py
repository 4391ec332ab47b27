"""Train a small character-level transformer language model with jitgrad and `jg.optim.AdamW`, and time the
same model in PyTorch side by side.

The text is Python's own documentation of its keywords and statements, which ships with the standard library
(`pydoc_data.topics`, about 460 thousand characters): nothing is downloaded. The model: token embeddings and
learned positions, two pre-LN transformer blocks (causal multi-head self-attention, a GELU MLP), a final
LayerNorm and an output layer tied to the token embeddings. Its parameters are one pytree (a dict of dicts
and a list of blocks); one `@jg.trace`d training step computes the loss, its gradient and the AdamW update
of every parameter as a single compiled program. Run it from a checkout:

    python docs/examples/train_lm.py                  # 600 steps: about 40 s on 2 quiet cores with a warm
                                                      # kernel cache; minutes on a cold cache or a busy machine
                                                      # (docs/examples/README.md)
    python docs/examples/train_lm.py --quick          # 60 steps, seconds (what the test runs)
    python docs/examples/train_lm.py --steps 2000 --plot lm.png

The plot needs matplotlib (`python -m pip install -e ".[plot]"`); without it the plot is skipped. The
PyTorch timing needs torch; without it that part is skipped. The PNG goes to the current directory unless
--plot names another path.
"""
from __future__ import annotations

import argparse
import math
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import jitgrad as jg

DEFAULT_STEPS = 600
STATED_LOSS = 2.0  # validation cross-entropy (nats/char) DEFAULT_STEPS steps reach (they give 1.804)
LN_EPS = 1e-5


@dataclass(frozen=True)
class Config:
    """The model's and the run's sizes."""

    vocab: int
    context: int = 64
    width: int = 64
    heads: int = 4
    blocks: int = 2
    batch: int = 16


def load_text() -> str:
    """The standard library's pydoc topics (Python's reference on statements and keywords), in printable ASCII."""
    from pydoc_data.topics import topics

    allowed = set(string.printable) - set("\r\x0b\x0c")
    return "".join(ch for key in sorted(topics) for ch in topics[key] if ch in allowed)


def encode(text: str) -> tuple[np.ndarray, list[str]]:
    """The text as int64 character ids, and the characters in id order."""
    chars = sorted(set(text))
    index = {ch: i for i, ch in enumerate(chars)}
    return np.array([index[ch] for ch in text], np.int64), chars


def unigram_loss(train: np.ndarray, valid: np.ndarray, vocab: int) -> float:
    """Cross-entropy on `valid` of the character frequencies of `train` (add-one smoothed): the baseline."""
    counts = np.bincount(train, minlength=vocab) + 1.0
    return float(-np.mean(np.log(counts / counts.sum())[valid]))


def init_params(cfg: Config, seed: int = 0) -> dict[str, Any]:
    """The parameter pytree: GPT-2's initialisation (normal 0.02, zero biases, unit LayerNorm gains)."""
    rng = np.random.default_rng(seed)
    d = cfg.width

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm() -> dict[str, np.ndarray]:
        return {"gain": np.ones(d, np.float32), "bias": np.zeros(d, np.float32)}

    proj_std = 0.02 / math.sqrt(2 * cfg.blocks)  # residual projections scaled down, as GPT-2 does
    blocks = [{"ln1": norm(),
               "attn": {"w_qkv": normal(d, 3 * d), "b_qkv": np.zeros(3 * d, np.float32),
                        "w_out": normal(d, d, std=proj_std), "b_out": np.zeros(d, np.float32)},
               "ln2": norm(),
               "mlp": {"w_in": normal(d, 4 * d), "b_in": np.zeros(4 * d, np.float32),
                       "w_out": normal(4 * d, d, std=proj_std), "b_out": np.zeros(d, np.float32)}}
              for _ in range(cfg.blocks)]
    return {"tokens": normal(cfg.vocab, d), "positions": normal(cfg.context, d), "blocks": blocks, "ln_f": norm()}


def layer_norm(x: Any, p: dict[str, Any]) -> Any:
    """LayerNorm over the last axis (biased variance, eps 1e-5, as torch.nn.LayerNorm)."""
    mean = np.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + LN_EPS) * p["gain"] + p["bias"]


def attention(x: Any, p: dict[str, Any], heads: int) -> Any:
    """Causal multi-head self-attention of x (batch, time, width)."""
    b, t, d = x.shape
    qkv = x @ p["w_qkv"] + p["b_qkv"]
    q, k, v = (np.transpose(np.reshape(qkv[..., i * d:(i + 1) * d], (b, t, heads, d // heads)), (0, 2, 1, 3))
               for i in range(3))
    scores = (q @ np.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(d // heads))
    causal = np.tril(np.ones((t, t), bool))
    weights = jg.softmax(np.where(causal, scores, -1e9), axis=-1)
    mixed = np.reshape(np.transpose(weights @ v, (0, 2, 1, 3)), (b, t, d))
    return mixed @ p["w_out"] + p["b_out"]


def mlp(x: Any, p: dict[str, Any]) -> Any:
    """The block's GELU MLP (width 4x)."""
    return jg.gelu(x @ p["w_in"] + p["b_in"]) @ p["w_out"] + p["b_out"]


def logits(params: dict[str, Any], tokens: Any, heads: int) -> Any:
    """Next-character logits (batch, time, vocab) for int tokens (batch, time); the output layer is tied."""
    x = params["tokens"][tokens] + params["positions"][:tokens.shape[1]]
    for block in params["blocks"]:
        x = x + attention(layer_norm(x, block["ln1"]), block["attn"], heads)
        x = x + mlp(layer_norm(x, block["ln2"]), block["mlp"])
    return layer_norm(x, params["ln_f"]) @ params["tokens"].T


def cross_entropy(params: dict[str, Any], tokens: Any, targets: Any, heads: int) -> Any:
    """Mean next-character cross-entropy in nats."""
    logp = jg.log_softmax(logits(params, tokens, heads), axis=-1)
    return -np.mean(np.take_along_axis(logp, targets[..., None], axis=-1))


def make_step(opt: jg.optim.AdamW, heads: int) -> jg.Traced:
    """The training step as one traced program: loss, gradient pytree and the AdamW update of every leaf."""
    def loss_fn(params: dict[str, Any], tokens: Any, targets: Any) -> Any:
        return cross_entropy(params, tokens, targets, heads)

    def train_step(params: dict[str, Any], state: Any, tokens: Any, targets: Any) -> tuple[Any, Any, Any]:
        loss, grads = jg.value_and_grad(loss_fn)(params, tokens, targets)
        params, state = opt.update(params, grads, state)
        return loss, params, state

    return jg.trace(train_step)


def batches(data: np.ndarray, cfg: Config, steps: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`steps` batches of random windows: inputs and the next characters."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(steps):
        starts = rng.integers(0, len(data) - cfg.context - 1, cfg.batch)
        window = np.stack([data[s:s + cfg.context + 1] for s in starts])
        found.append((window[:, :-1], window[:, 1:]))
    return found


def evaluate(params: dict[str, Any], data: np.ndarray, cfg: Config, windows: int = 32) -> float:
    """Mean cross-entropy over `windows` evenly spaced windows of `data` (a traced, compiled forward)."""
    starts = np.linspace(0, len(data) - cfg.context - 1, windows).astype(np.int64)
    window = np.stack([data[s:s + cfg.context + 1] for s in starts])
    return float(jg.trace(cross_entropy, static_argnums=3)(params, window[:, :-1], window[:, 1:], cfg.heads))


def sample(params: dict[str, Any], prompt: np.ndarray, chars: Sequence[str], cfg: Config, length: int,
           seed: int) -> str:
    """`length` characters drawn from the model after `prompt` (temperature 0.8), run eagerly on numpy."""
    rng = np.random.default_rng(seed)
    tokens = list(prompt)
    for _ in range(length):
        context = np.array(tokens[-cfg.context:])[None, :]
        last = logits(params, context, cfg.heads)[0, -1] / 0.8
        probs = np.exp(last - last.max())
        tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
    return "".join(chars[t] for t in tokens[len(prompt):])


def train_jitgrad(params: dict[str, Any], data_batches: list[tuple[np.ndarray, np.ndarray]], cfg: Config, lr: float,
                  every: int) -> tuple[Any, list[float], list[float]]:
    """AdamW with the fused step; returns the trained parameters, the loss before each step and each step's ms."""
    opt = jg.optim.AdamW(lr=lr, weight_decay=0.01)
    step = make_step(opt, cfg.heads)
    state = opt.init(params)
    losses, times = [], []
    for i, (tokens, targets) in enumerate(data_batches):
        start = time.perf_counter()
        loss, params, state = step(params, state, tokens, targets)
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(float(loss))
        if every and (i + 1) % every == 0:
            print(f"  jitgrad step {i + 1:4d}/{len(data_batches)}  loss {loss:.4f}  ({times[-1]:.1f} ms)", flush=True)
    return params, losses, times


def torch_model(params: dict[str, Any], cfg: Config) -> Any:
    """The same transformer as a torch.nn.Module holding a copy of `params`."""
    import torch
    from torch import nn

    def linear(w: np.ndarray, b: np.ndarray) -> nn.Linear:
        layer = nn.Linear(*w.shape)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(w.T))
            layer.bias.copy_(torch.from_numpy(b))
        return layer

    def norm(p: dict[str, np.ndarray]) -> nn.LayerNorm:
        layer = nn.LayerNorm(cfg.width, eps=LN_EPS)
        with torch.no_grad():
            layer.weight.copy_(torch.from_numpy(p["gain"]))
            layer.bias.copy_(torch.from_numpy(p["bias"]))
        return layer

    class Block(nn.Module):
        def __init__(self, p: dict[str, Any]):
            super().__init__()
            self.ln1, self.ln2 = norm(p["ln1"]), norm(p["ln2"])
            self.qkv, self.out = linear(p["attn"]["w_qkv"], p["attn"]["b_qkv"]), linear(p["attn"]["w_out"],
                                                                                          p["attn"]["b_out"])
            self.fc_in, self.fc_out = linear(p["mlp"]["w_in"], p["mlp"]["b_in"]), linear(p["mlp"]["w_out"],
                                                                                          p["mlp"]["b_out"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = (h.view(b, t, cfg.heads, d // cfg.heads).transpose(1, 2)
                       for h in self.qkv(self.ln1(x)).split(d, dim=-1))
            mixed = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(mixed.transpose(1, 2).reshape(b, t, d))
            return x + self.fc_out(nn.functional.gelu(self.fc_in(self.ln2(x)), approximate="tanh"))

    class LanguageModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Parameter(torch.from_numpy(params["tokens"].copy()))
            self.positions = nn.Parameter(torch.from_numpy(params["positions"].copy()))
            self.blocks = nn.ModuleList(Block(p) for p in params["blocks"])
            self.ln_f = norm(params["ln_f"])

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.tokens[tokens] + self.positions[:tokens.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.ln_f(x) @ self.tokens.T

    return LanguageModel()


def train_torch(params: dict[str, Any], data_batches: list[tuple[np.ndarray, np.ndarray]], cfg: Config,
                lr: float) -> tuple[list[float], list[float]]:
    """The same model, batches and AdamW in eager PyTorch; the loss before each step and each step's ms."""
    import torch

    model = torch_model(params, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses, times = [], []
    for tokens, targets in data_batches:
        start = time.perf_counter()
        opt.zero_grad()
        out = model(torch.from_numpy(tokens))
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, cfg.vocab), torch.from_numpy(targets).reshape(-1))
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - start) * 1e3)
        losses.append(loss.item())
    return losses, times


def plot_losses(losses: Sequence[float], baseline: float, path: str) -> bool:
    """Save the training loss curve (and the unigram baseline) as a PNG; without matplotlib, say so."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (python -m pip install -e \".[plot]\"): skipping the plot")
        return False
    matplotlib.use("Agg")
    from matplotlib import pyplot

    fig, ax = pyplot.subplots(figsize=(6, 4))
    ax.plot(losses, label="jitgrad, training batches", linewidth=1)
    ax.axhline(baseline, color="gray", linestyle="--", label=f"unigram baseline ({baseline:.2f})")
    ax.set(xlabel="AdamW step", ylabel="cross-entropy (nats per character)",
           title="character-level transformer on pydoc_data.topics")
    ax.legend()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    pyplot.close(fig)
    print(f"wrote {path}")
    return True


@dataclass
class Result:
    """One run's numbers: losses, the baseline, per-step times (ms), samples, whether the PNG was written."""

    losses: list[float]
    valid_loss: float
    baseline: float
    jitgrad_ms: float
    torch_ms: float | None
    torch_losses: list[float]
    samples: list[str]
    plotted: bool


def main(argv: Sequence[str] | None = None) -> Result:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--quick", action="store_true", help="60 steps, 20 timed in PyTorch: seconds")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--torch-steps", type=int, default=30, help="PyTorch steps timed (0: skip PyTorch)")
    parser.add_argument("--every", type=int, default=100, help="print progress every this many steps")
    parser.add_argument("--plot", default="train_lm_loss.png", help="PNG of the loss curve")
    args = parser.parse_args(argv)
    steps, torch_steps = (60, min(args.torch_steps, 20)) if args.quick else (args.steps, args.torch_steps)

    ids, chars = encode(load_text())
    split = int(0.9 * len(ids))
    train, valid = ids[:split], ids[split:]
    cfg = Config(vocab=len(chars))
    baseline = unigram_loss(train, valid, cfg.vocab)
    params = init_params(cfg)
    n_params = sum(p.size for p in jg.tree_leaves(params))
    print(f"{len(ids)} characters of pydoc_data.topics ({cfg.vocab} distinct); a {cfg.blocks}-block transformer, "
          f"width {cfg.width}, {cfg.heads} heads, context {cfg.context}, {n_params} parameters; "
          f"{steps} AdamW steps of {cfg.batch} windows, lr {args.lr}")
    data_batches = batches(train, cfg, steps, seed=1)
    trained, losses, times = train_jitgrad(params, data_batches, cfg, args.lr, args.every)
    valid_loss = evaluate(trained, valid, cfg)
    print(f"validation loss {valid_loss:.3f} nats/char; unigram baseline {baseline:.3f} "
          f"({baseline - valid_loss:.3f} below it)")
    if steps >= DEFAULT_STEPS:
        verdict = "reached" if valid_loss <= STATED_LOSS else "NOT reached"
        print(f"stated: validation loss <= {STATED_LOSS} after {DEFAULT_STEPS} steps or more: {verdict}")
    jitgrad_ms = float(np.median(times[1:]))
    torch_ms, torch_losses = None, []
    if torch_steps:
        try:
            torch_losses, torch_times = train_torch(params, data_batches[:torch_steps], cfg, args.lr)
        except ImportError:
            print("torch is not installed: skipping the PyTorch timing")
        else:
            torch_ms = float(np.median(torch_times[1:]))
            gap = float(np.max(np.abs(np.subtract(torch_losses, losses[:torch_steps]))))
            print(f"PyTorch, same model, weights and batches: largest loss difference over {torch_steps} steps "
                  f"{gap:.1e}")
    print(f"median ms per training step: jitgrad {jitgrad_ms:.1f} (first step, compiling: {times[0] / 1e3:.1f} s)"
          + ("" if torch_ms is None else f", eager PyTorch {torch_ms:.1f}"))
    index = {ch: i for i, ch in enumerate(chars)}
    samples = [prompt + sample(trained, np.array([index[c] for c in prompt]), chars, cfg, 70, seed=i)
               for i, prompt in enumerate(["def ", "The ", "for "])]
    for text in samples:
        print("  sample: " + text.replace("\n", "\\n"))
    plotted = plot_losses(losses, baseline, args.plot)
    return Result(losses, valid_loss, baseline, jitgrad_ms, torch_ms, torch_losses, samples, plotted)


if __name__ == "__main__":
    main()
