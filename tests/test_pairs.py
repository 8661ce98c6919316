"""Score's pair form (PROTOCOL.md): 1 x N, N x 1 or N x N zipped, for texts and, on a multimodal
model, elements; any other pair of sizes is invalid_request on text_2, naming both sizes."""

import pytest

from poolwire.models.task_heads import broadcast_pairs
from poolwire.schemas.errors import ErrorCode, PoolingError


@pytest.mark.parametrize("a, b, want", [
    (["q"], ["d1", "d2"], (["q", "q"], ["d1", "d2"])),
    (["a", "b"], ["d"], (["a", "b"], ["d", "d"])),
    (["a", "b"], ["c", "d"], (["a", "b"], ["c", "d"])),
    (["a"], ["b"], (["a"], ["b"])),
])
def test_one_side_of_one_is_repeated_and_equal_sides_are_zipped(a, b, want):
    assert broadcast_pairs(a, b) == want


def test_other_sizes_are_refused_naming_both_and_what_the_sides_hold():
    with pytest.raises(PoolingError) as caught:
        broadcast_pairs(["a", "b"], ["c", "d", "e"], "elements")
    err = caught.value
    assert err.code == ErrorCode.INVALID_REQUEST
    assert "text_1 has 2 elements and text_2 has 3" in str(err)
    assert err.extra.get("field") == "text_2"
