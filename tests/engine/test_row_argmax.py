"""row_argmax (engine/sampler.py): the greedy token of each row, taken row by row, must be
x.argmax(dim=-1) bit for bit: ties go to the first index, NaN counts as largest, rows of
-inf pick index 0, whatever the batch size or the row's place in it."""

import pytest
import torch

from engine.sampler import row_argmax, sample
from engine.sampling_params import SamplingParams


def _rows(b: int, v: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(b * 1000 + v)
    x = torch.randint(-3, 4, (b, v), generator=g).float()  # many ties within a row
    if b > 1:
        x[1, v // 2] = float("nan")
        x[1, v - 1] = float("nan")
        x[-1] = float("-inf")
    return x


@pytest.mark.parametrize("b,v", [(0, 7), (1, 7), (2, 5), (8, 49152), (17, 300)])
def test_row_argmax_equals_the_batched_argmax(b, v):
    x = _rows(b, v)
    got = row_argmax(x)
    assert got.dtype == torch.int64 and got.shape == (b,)
    assert torch.equal(got, x.argmax(dim=-1))


def test_row_argmax_of_non_contiguous_rows():
    x = _rows(6, 64)
    for view in (x[::2], x[:, 3:], x.t().contiguous().t()):
        assert torch.equal(row_argmax(view), view.argmax(dim=-1))


def test_greedy_batch_takes_each_row_argmax_with_ties_and_nan():
    x = _rows(9, 1000)
    out = sample(x, [SamplingParams(temperature=0)] * 9, [[]] * 9, [[]] * 9, [None] * 9)
    assert out.token_ids.tolist() == x.argmax(dim=-1).tolist()
    assert out.token_ids.tolist()[1] == 500  # the first NaN
