"""kda_lib.tasks: ground truth on tiny cases, determinism by key, shapes, jit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib.tasks import TASKS, TaskBatch, chance_loss, delayed_copy


def test_delayed_copy_tiny_case_by_hand():
    batch = delayed_copy(jax.random.key(0), 1, 6, vocab_size=10, delay=2)
    x = [int(t) for t in batch.inputs[0]]
    # written out by hand: position t repeats the token from t - 2, scored from t = 2 on
    assert [int(t) for t in batch.targets[0]] == [0, 0, x[0], x[1], x[2], x[3]]
    assert [bool(m) for m in batch.mask[0]] == [False, False, True, True, True, True]


@pytest.mark.parametrize("delay", [1, 3, 7])
def test_delayed_copy_relation(delay):
    b = delayed_copy(jax.random.key(delay), 3, 20, vocab_size=5, delay=delay)
    assert isinstance(b, TaskBatch)
    inputs, targets, mask = (np.asarray(a) for a in b)
    assert inputs.shape == targets.shape == mask.shape == (3, 20)
    assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == bool
    assert inputs.min() >= 0 and inputs.max() < 5
    np.testing.assert_array_equal(targets[:, delay:], inputs[:, :-delay])
    np.testing.assert_array_equal(mask, np.broadcast_to(np.arange(20) >= delay, (3, 20)))
    assert (targets[:, :delay] == 0).all()


def test_delay_at_least_length_scores_nothing():
    for seq_len in (3, 4):
        b = delayed_copy(jax.random.key(0), 2, seq_len, vocab_size=4, delay=4)
        assert not np.asarray(b.mask).any() and b.targets.shape == (2, seq_len)


def test_deterministic_by_key_and_jittable():
    task = functools.partial(delayed_copy, vocab_size=8, delay=3)
    a = task(jax.random.key(7), 4, 16)
    b = jax.jit(task, static_argnums=(1, 2))(jax.random.key(7), 4, 16)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    c = task(jax.random.key(8), 4, 16)
    assert not np.array_equal(a.inputs, c.inputs)
    # every token value shows up in a big enough batch (uniform over the vocabulary)
    assert set(np.unique(task(jax.random.key(0), 8, 64).inputs)) == set(range(8))


def test_errors_and_registry():
    with pytest.raises(ValueError, match="vocab_size"):
        delayed_copy(jax.random.key(0), 1, 4, vocab_size=1, delay=1)
    with pytest.raises(ValueError, match="delay"):
        delayed_copy(jax.random.key(0), 1, 4, vocab_size=4, delay=0)
    with pytest.raises(ValueError, match="seq_len"):
        delayed_copy(jax.random.key(0), 1, 0, vocab_size=4, delay=1)
    assert TASKS["delayed_copy"] is delayed_copy
    assert chance_loss(16) == pytest.approx(float(jnp.log(16.0)))
