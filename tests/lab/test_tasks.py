"""kda_lib.lab.tasks: ground truth on tiny cases, determinism by key, shapes, jit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kda_lib.lab.tasks import (
    TASKS,
    TaskBatch,
    beyond_reach_mask,
    chance_loss,
    delayed_copy,
    mqar,
    palindrome,
    stack,
    stack_answer_positions,
)


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


# ---------------------------------------------------------------- helpers for the new tasks
# Compilation dominates the run time, so the tests below reuse a few (shape, options) configs:
# eager JAX caches each compiled op by shape, so a repeated config costs next to nothing.


def _np(batch: TaskBatch, *, zero_outside_mask: bool = True):
    inputs, targets, mask = (np.asarray(a) for a in batch)
    assert inputs.dtype == targets.dtype == np.int32 and mask.dtype == bool
    assert inputs.shape == targets.shape == mask.shape
    if zero_outside_mask:  # unscored targets are the placeholder 0 (stack defines them all)
        assert (targets[~mask] == 0).all()
    return inputs, targets, mask


def _assert_jit_and_key(task, batch, seq_len):
    """Same key -> same batch, eager or under jit; another key -> another batch."""
    a = task(jax.random.key(11), batch, seq_len)
    b = jax.jit(task, static_argnums=(1, 2))(jax.random.key(11), batch, seq_len)
    again = task(jax.random.key(11), batch, seq_len)
    for x, y, z in zip(a, b, again, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    c = task(jax.random.key(12), batch, seq_len)
    assert not np.array_equal(a.inputs, c.inputs)
    return a


# --------------------------------------------------------------------------------- MQAR


def _mqar_reference(inputs, num_pairs):
    """Re-derive targets and mask from the inputs alone, in plain Python."""
    targets, mask = np.zeros_like(inputs), np.zeros(inputs.shape, bool)
    for r, row in enumerate(inputs.tolist()):
        table = dict(zip(row[0 : 2 * num_pairs : 2], row[1 : 2 * num_pairs : 2], strict=True))
        for t in range(2 * num_pairs, len(row)):
            if row[t] != 0:
                targets[r, t], mask[r, t] = table[row[t]], True
    return targets, mask


def test_mqar_tiny_case_by_hand():
    b = mqar(jax.random.key(3), 1, 8, vocab_size=9, num_pairs=2)
    x = [int(t) for t in b.inputs[0]]
    k1, v1, k2, v2 = x[:4]
    # keys 1..4, values 5..8 (n_keys = (9 - 1) // 2 = 4)
    assert {k1, k2} <= {1, 2, 3, 4} and k1 != k2 and {v1, v2} <= {5, 6, 7, 8}
    region = x[4:]
    assert sorted(region) == sorted([0, 0, k1, k2])
    expected_targets = [0, 0, 0, 0] + [{k1: v1, k2: v2}.get(q, 0) for q in region]
    expected_mask = [False] * 4 + [q != 0 for q in region]
    assert [int(t) for t in b.targets[0]] == expected_targets
    assert [bool(m) for m in b.mask[0]] == expected_mask


# (batch, seq_len, vocab_size, num_pairs); the first is at both bounds: 9 = 2 * 4 + 1, 12 = 3 * 4
MQAR_CONFIGS = [(6, 12, 9, 4), (64, 30, 21, 5)]


@pytest.mark.parametrize(("batch", "seq_len", "vocab_size", "num_pairs"), MQAR_CONFIGS)
def test_mqar_relation(batch, seq_len, vocab_size, num_pairs):
    n_keys = (vocab_size - 1) // 2
    b = mqar(jax.random.key(num_pairs), batch, seq_len, vocab_size=vocab_size, num_pairs=num_pairs)
    inputs, targets, mask = _np(b)
    assert inputs.shape == (batch, seq_len)
    assert inputs.min() >= 0 and inputs.max() < vocab_size
    keys, values = inputs[:, 0 : 2 * num_pairs : 2], inputs[:, 1 : 2 * num_pairs : 2]
    assert ((keys >= 1) & (keys < 1 + n_keys)).all()
    assert ((values >= 1 + n_keys) & (values < vocab_size)).all()
    region = inputs[:, 2 * num_pairs :]
    for r in range(batch):
        assert len(set(keys[r].tolist())) == num_pairs  # distinct keys
        queries = region[r][region[r] != 0]
        assert sorted(queries.tolist()) == sorted(keys[r].tolist())  # each key queried once
    assert mask.sum(axis=1).tolist() == [num_pairs] * batch
    ref_targets, ref_mask = _mqar_reference(inputs, num_pairs)
    np.testing.assert_array_equal(targets, ref_targets)
    np.testing.assert_array_equal(mask, ref_mask)


def test_mqar_is_random_enough():
    inputs, _, mask = _np(mqar(jax.random.key(5), 64, 30, vocab_size=21, num_pairs=5))
    # queries land all over the region, in no fixed order, and every key/value token is used
    assert mask[:, 10:].any(axis=0).all()
    assert set(np.unique(inputs[:, 0:10:2])) == set(range(1, 11))
    assert set(np.unique(inputs[:, 1:10:2])) == set(range(11, 21))
    first_query = inputs[np.arange(64), 10 + mask[:, 10:].argmax(axis=1)]
    assert (first_query != inputs[:, 0]).any() and (first_query == inputs[:, 0]).any()


def test_mqar_jit_and_errors():
    _assert_jit_and_key(functools.partial(mqar, vocab_size=9, num_pairs=4), 6, 12)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="num_pairs"):
        mqar(key, 1, 12, vocab_size=9, num_pairs=0)
    with pytest.raises(ValueError, match=r"vocab_size must be >= 9"):
        mqar(key, 1, 12, vocab_size=8, num_pairs=4)
    with pytest.raises(ValueError, match=r"seq_len must be >= 3 \* num_pairs = 12"):
        mqar(key, 1, 11, vocab_size=9, num_pairs=4)
    with pytest.raises(ValueError, match="batch"):
        mqar(key, 0, 12, vocab_size=9, num_pairs=4)


# ---------------------------------------------------------------------------- palindrome


def test_palindrome_tiny_case_by_hand():
    b = palindrome(jax.random.key(0), 1, 7, vocab_size=10)
    x = [int(t) for t in b.inputs[0]]
    # n = (7 - 1) // 2 = 3 content tokens, separator at 3, then filler; reversed from 3 on
    assert x[3:] == [1, 0, 0, 0] and all(2 <= t < 10 for t in x[:3])
    assert [int(t) for t in b.targets[0]] == [0, 0, 0, x[2], x[1], x[0], 0]
    assert [bool(m) for m in b.mask[0]] == [False, False, False, True, True, True, False]


@pytest.mark.parametrize("seq_len", [3, 4, 10])  # odd and even lengths (7 is above)
def test_palindrome_relation(seq_len):
    inputs, targets, mask = _np(palindrome(jax.random.key(seq_len), 5, seq_len, vocab_size=6))
    assert inputs.shape == (5, seq_len)
    n = (seq_len - 1) // 2
    assert ((inputs[:, :n] >= 2) & (inputs[:, :n] < 6)).all()
    assert (inputs[:, n] == 1).all() and (inputs[:, n + 1 :] == 0).all()
    for r in range(5):
        row = inputs[r].tolist()
        content = row[: row.index(1)]  # parse: everything before the separator
        expected = [0] * len(row)
        expected[n : n + len(content)] = content[::-1]
        assert targets[r].tolist() == expected
        assert mask[r].tolist() == [n <= t < 2 * n for t in range(seq_len)]


def test_palindrome_jit_and_errors():
    b = _assert_jit_and_key(functools.partial(palindrome, vocab_size=7), 8, 41)
    assert set(np.unique(b.inputs)) == set(range(7))  # every content token shows up
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="seq_len"):
        palindrome(key, 1, 2, vocab_size=5)
    with pytest.raises(ValueError, match="vocab_size"):
        palindrome(key, 1, 5, vocab_size=2)


# --------------------------------------------------------------------------------- stack


def _stack_reference(inputs):
    """Simulate the stack from the input tokens; also check no POP hits an empty stack."""
    targets, mask = np.zeros_like(inputs), np.zeros(inputs.shape, bool)
    for r, row in enumerate(inputs.tolist()):
        stack_ = []
        for t, token in enumerate(row):
            if token == 1:
                assert stack_, f"POP on an empty stack at row {r}, position {t}"
                stack_.pop()
                mask[r, t] = bool(stack_)
            else:
                assert token >= 2
                stack_.append(token)
            targets[r, t] = stack_[-1] if stack_ else 0
    return targets, mask


def test_stack_tiny_case_by_hand():
    b = stack(jax.random.key(0), 1, 8, vocab_size=6, pop_probability=0.5)
    x = [int(t) for t in b.inputs[0]]
    assert x == [2, 5, 1, 4, 1, 1, 2, 4]  # pinned draw (what the hand-worked answer is for)
    # push 2 | push 5 | pop -> [2] | push 4 | pop -> [2] | pop -> [] | push 2 | push 4
    assert [int(t) for t in b.targets[0]] == [2, 5, 2, 4, 2, 0, 2, 4]
    assert [bool(m) for m in b.mask[0]] == [False, False, True, False, True, False, False, False]


def _stack_batch(vocab_size, pop_probability):
    b = stack(jax.random.key(1), 64, 128, vocab_size=vocab_size, pop_probability=pop_probability)
    return _np(b, zero_outside_mask=False)


@pytest.mark.parametrize(("vocab_size", "pop_probability"), [(3, 0.7), (10, 0.4)])
def test_stack_relation(vocab_size, pop_probability):
    inputs, targets, mask = _stack_batch(vocab_size, pop_probability)
    assert inputs.shape == (64, 128)
    assert inputs.min() >= 1 and inputs.max() < vocab_size
    assert set(np.unique(inputs)) == set(range(1, vocab_size))
    assert (inputs[:, 0] != 1).all()  # the stack starts empty: the first token is a push
    ref_targets, ref_mask = _stack_reference(inputs)
    np.testing.assert_array_equal(targets, ref_targets)
    np.testing.assert_array_equal(mask, ref_mask)


def test_stack_statistics():
    inputs, _, mask = _stack_batch(10, 0.4)
    pops = inputs == 1
    # with p = 0.4 the stack is rarely empty: ~40% POPs, nearly all of them scored
    assert 0.3 < pops.mean() < 0.45
    assert 0.25 < mask.mean() < 0.45 and mask.mean() > 0.8 * pops.mean()
    # a higher pop probability empties the stack more often, and scores a smaller share of POPs
    inputs_hi, _, mask_hi = _stack_batch(3, 0.7)
    pops_hi = inputs_hi == 1
    assert pops_hi.mean() > pops.mean()
    assert mask_hi.sum() / pops_hi.sum() < mask.sum() / pops.sum()


def test_stack_jit_and_errors():
    # the default pop_probability (0.4), at the shape of the batches above
    _assert_jit_and_key(functools.partial(stack, vocab_size=10), 64, 128)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="vocab_size"):
        stack(key, 1, 5, vocab_size=2)
    for bad in (0, 0.0, 1, 1.0, -0.2, 1.5, "0.5", True):
        with pytest.raises(ValueError, match="pop_probability"):
            stack(key, 1, 5, vocab_size=5, pop_probability=bad)
    with pytest.raises(ValueError, match="seq_len"):
        stack(key, 1, 0, vocab_size=5)


def test_registry_has_new_tasks():
    assert TASKS["mqar"] is mqar
    assert TASKS["palindrome"] is palindrome
    assert TASKS["stack"] is stack


def test_chance_accuracy_counts_the_possible_answers():
    from kda_lib.lab.tasks import chance_accuracy

    assert chance_accuracy("delayed_copy", vocab_size=16, delay=3) == 1 / 16
    assert chance_accuracy("mqar", vocab_size=9, num_pairs=2) == 1 / 4  # values 5..8
    assert chance_accuracy("palindrome", vocab_size=10) == 1 / 8
    assert chance_accuracy("stack", vocab_size=10, pop_probability=0.3) == 1 / 8
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        chance_accuracy("nope", vocab_size=4)
    with pytest.raises(ValueError, match="needs the task's vocab_size"):
        chance_accuracy("mqar", num_pairs=2)


def test_stack_answer_positions_and_beyond_reach_on_a_hand_made_example():
    """inputs 5 7 1 3 1 1 6: the pop at t=2 answers 5 (pushed at 0, 2 back), the pop at t=4
    answers 5 again (4 back), the pop at t=5 empties the stack (unscored)."""
    inputs = jnp.array([[5, 7, 1, 3, 1, 1, 6]], jnp.int32)
    targets = jnp.array([[5, 7, 5, 3, 5, 0, 6]], jnp.int32)
    mask = jnp.array([[0, 0, 1, 0, 1, 0, 0]], bool)
    batch = TaskBatch(inputs, targets, mask)
    positions = stack_answer_positions(inputs)
    assert positions.tolist() == [[0, 1, 0, 3, 0, -1, 6]]
    # the source's token is the target wherever there is one
    assert (inputs[0, positions[0, :5]] == targets[0, :5]).all()
    assert beyond_reach_mask("stack", batch, 3).tolist() == [[0, 0, 0, 0, 1, 0, 0]]
    assert beyond_reach_mask("stack", batch, 1).tolist() == [[0, 0, 1, 0, 1, 0, 0]]
    assert not beyond_reach_mask("stack", batch, 4).any()
    with pytest.raises(ValueError, match="task 'mqar' has no answer positions"):
        beyond_reach_mask("mqar", batch, 3)
    with pytest.raises(ValueError, match="reach must be an int >= 0"):
        beyond_reach_mask("stack", batch, -1)


def test_stack_answer_positions_point_at_the_target_in_generated_batches():
    batch = stack(jax.random.key(3), 4, 40, vocab_size=9)
    positions = np.asarray(stack_answer_positions(batch.inputs))
    inputs, targets = np.asarray(batch.inputs), np.asarray(batch.targets)
    rows, cols = np.nonzero(positions >= 0)
    assert (inputs[rows, positions[rows, cols]] == targets[rows, cols]).all()
    assert (targets[positions < 0] == 0).all() and (positions <= np.arange(40)).all()
