"""Throughput and MFU (decision 0080): `Trainer.fit(log_throughput=True)`'s rates at log steps,
the tokens they count, `mfu` against a known device's peak, the step's FLOPs against the
6·N·T estimate, and the end-of-run summary."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import dew.training._throughput as throughput
import dew.training._trainer as trainer_module
from dew import Trainer
from dew._throughput import PEAK_FLOPS, peak_flops
from dew.cli._console import end_lines
from dew.data import Dataset
from dew.nn.backbones.causal_transformer import CausalTransformer
from dew.objectives.lm import LMObjective
from dew.steps import TrainState, train_step

SEQ, ROWS, EMB, LAYERS = 16, 4, 32, 2
H100 = "NVIDIA H100 80GB HBM3"


def _objective(layers=LAYERS, **model):
    transformer = CausalTransformer(
        vocab_size=16,
        emb_features=EMB,
        num_layers=layers,
        num_heads=2,
        mlp_features=64,
        max_seq_len=SEQ,
        key=jax.random.key(0),
        **model,
    )
    return LMObjective(transformer, seq_len=SEQ)


def _data():
    rng = np.random.default_rng(0)
    # rows one token longer than the model reads, and one more past it: not counted
    batches = [rng.integers(0, 16, (ROWS, SEQ + 2)).astype(np.int32) for _ in range(8)]
    return Dataset(train=lambda partition: iter({"text": text} for text in batches))


@pytest.fixture(scope="module")
def fits():
    """One Trainer fitted twice (one compiled step): on a device kind made an H100, the
    FLOPs it counted recorded, and on the CPU it runs on."""
    counted = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(throughput, "device_kind", lambda: H100)
        original = trainer_module.step_flops
        patch.setattr(
            trainer_module,
            "step_flops",
            lambda *args: counted.append(original(*args)) or counted[-1],
        )
        # one layer: the fits' cost is the step's compilation
        trainer = Trainer(_objective(layers=1), optax.adam(1e-3), jax.random.key(1))
        faked = trainer.fit(_data(), 6, log_every=2, log_throughput=True, progress=False)
    cpu = trainer.fit(_data(), 4, log_every=2, log_throughput=True, progress=False)
    plain = trainer.fit(_data(), 4, log_every=2, progress=False)
    return faked, cpu, plain, counted


def test_the_rates_appear_at_log_steps_after_the_first(fits):
    faked, cpu, _, _ = fits
    for state, steps in ((faked, [4, 6]), (cpu, [4])):
        for metric in ("examples_per_second", "tokens_per_second"):
            series = state.metric_history[f"lm/train/{metric}"]
            assert [step for step, _ in series] == steps  # the first window compiles
            assert all(math.isfinite(value) and value > 0 for _, value in series)


def test_tokens_are_the_positions_the_model_reads(fits):
    faked, _, _, _ = fits
    history = faked.metric_history
    tokens = dict(history["lm/train/tokens_per_second"])
    examples = dict(history["lm/train/examples_per_second"])
    for step, rate in tokens.items():  # one window's time: the ratio is tokens per row
        assert rate / examples[step] == pytest.approx(SEQ, rel=1e-12)
    objective = _objective(layers=1)
    assert objective.batch_tokens({"text": np.zeros((ROWS, SEQ + 2), np.int32)}) == ROWS * SEQ


def test_mfu_is_the_step_flops_rate_over_the_peak(fits):
    faked, cpu, plain, counted = fits
    assert len(counted) == 1 and counted[0] > 0  # counted once per fit
    peak = PEAK_FLOPS[H100]["float32"]  # the params are float32
    history = faked.metric_history
    tokens = dict(history["lm/train/tokens_per_second"])
    for step, mfu in history["lm/train/mfu"]:
        steps_per_second = tokens[step] / (ROWS * SEQ)
        assert mfu == pytest.approx(counted[0] * steps_per_second / peak, rel=1e-9)
    assert "lm/train/mfu" not in cpu.metric_history  # no peak known on a CPU
    assert peak_flops(jax.devices()[0].device_kind, "float32") is None
    assert set(plain.metric_history) == {"lm/train/loss", "lm/train/token_accuracy"}


def _step_flops(objective, accumulate=1):
    optimizer = optax.sgd(1e-3)
    state = TrainState.create(objective, optimizer, key=jax.random.key(0))
    batch = {"text": jnp.zeros((ROWS, SEQ + 1), jnp.int32)}

    def step(state, batch):
        return train_step(
            objective, optimizer, state, batch, jax.random.key(1), accumulate=accumulate
        )

    return throughput.step_flops(jax.jit(step), state, batch)


def test_step_flops_against_six_n_t():
    """XLA's count of one step against Kaplan et al.'s 6·N·T (every parameter multiplies
    each token once forward, twice backward) plus PaLM's attention term 12·L·T·S·d (scores
    and their weighted sum, forward and backward; S the positions attended, d the width):
    measured 0.99x. The estimate counts the token and position embeddings (1,024 of 18,704
    parameters) as matmuls, but they are looked up (5% of 6·N·T), and XLA counts the
    element-wise work the estimate leaves out (layer norms, softmax, GELU, the update):
    within 10% below and 25% above."""
    objective = _objective()
    n = sum(leaf.size for leaf in jax.tree.leaves(objective.init_params()))
    tokens = ROWS * SEQ
    estimate = 6 * n * tokens + 12 * LAYERS * tokens * SEQ * EMB
    assert 0.9 * estimate < _step_flops(objective) < 1.25 * estimate


def test_step_flops_count_every_run_of_a_scan():
    """XLA counts a loop's body once; `step_flops` counts it as often as it runs: two
    accumulated micro-batches cost what the whole batch does, and the blocks run as a
    scan under remat cost the unrolled blocks' FLOPs plus one more forward pass (measured:
    1.02x and 1.26x; counted once, they would be about 0.5x and 0.6x)."""
    plain = _step_flops(_objective())
    assert _step_flops(_objective(), accumulate=2) == pytest.approx(plain, rel=0.02)
    remat = _step_flops(_objective(remat=True))
    assert plain < remat < 1.4 * plain


def test_the_summary_shows_the_throughput(fits):
    faked, _, _, _ = fits
    lines = end_lines(faked.metric_history, step=6, trained=6, seconds=1.0)
    (line,) = [line for line in lines if line.startswith("  throughput")]
    mfu = faked.metric_history["lm/train/mfu"][-1][1]
    assert f"lm/train/mfu {mfu:.2%} (step 6)" in line
    assert "lm/train/tokens_per_second" in line and "tokens_per_second" not in lines[0]


def test_a_bfloat16_policy_is_measured_against_the_bfloat16_peak():
    """Under `mixed_bfloat16` or `bfloat16` the params stay float32 but the matmuls run in
    bfloat16 (decision 0078): MFU reads against the device's bfloat16 peak, not its TF32
    one (which would read it about 2x high on an H100)."""
    params = {"w": jnp.zeros(3, jnp.float32), "count": jnp.zeros((), jnp.int32)}
    assert throughput.compute_dtype(params) == "float32"
    assert throughput.compute_dtype(params, "mixed_bfloat16") == "bfloat16"
    assert throughput.compute_dtype(params, "bfloat16") == "bfloat16"
    assert throughput.compute_dtype({"w": jnp.zeros(3, jnp.bfloat16)}) == "bfloat16"
    assert PEAK_FLOPS[H100]["bfloat16"] > PEAK_FLOPS[H100]["float32"]
