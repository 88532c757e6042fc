"""hlo_collectives on HLO text of both forms: synchronous (CPU) and asynchronous start/done
pairs with tuple results (GPU/TPU compilers)."""

import pathlib

import pytest

from kda_lib.lab.measure import hlo_collectives

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "data" / "fixtures"
# hand-written in the forms XLA prints: CPU's synchronous collectives, and the start/done pairs
# of GPU/TPU compilers (tuple results: operands then results, plus context scalars for permute)
SYNC = (FIXTURES / "hlo_collectives_sync.txt").read_text()
ASYNC = (FIXTURES / "hlo_collectives_async.txt").read_text()

EXPECTED = [
    dict(op="all-gather", dtype="f32", shape=(8, 4), elements=32, sent_bytes=96),
    dict(op="collective-permute", dtype="f32", shape=(2, 3), elements=6, sent_bytes=24),
    dict(op="all-reduce", dtype="f32", shape=(16,), elements=16, sent_bytes=96),
    # 8 f32 + 16 bf16 = 64 bytes gathered, 3/4 of them sent
    dict(op="all-gather", dtype="f32", shape=(8,), elements=24, sent_bytes=48),
]


@pytest.mark.parametrize("text", [SYNC, ASYNC], ids=["sync", "async"])
def test_both_forms_give_the_same_collectives(text):
    assert hlo_collectives(text, num_ranks=4) == EXPECTED


def test_done_ops_and_other_instructions_are_not_counted():
    assert hlo_collectives("%x = f32[4]{0} add(f32[4]{0} %a, f32[4]{0} %b)", 4) == []
    done_only = "%d = f32[8,4]{1,0} all-gather-done((f32[2,4]{1,0}, f32[8,4]{1,0}) %s)"
    assert hlo_collectives(done_only, 4) == []


def test_bad_rank_count_is_named():
    with pytest.raises(ValueError, match="num_ranks"):
        hlo_collectives(SYNC, 0)
