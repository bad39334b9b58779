"""BlockLayout (curvature/blocks.py): how a factor of side ``dim`` is cut into THOR-style diagonal blocks
of ``split`` (block size, count, zero padding of the last block), and its validation. Pure
arithmetic; the inverses built on it are tests/numerics/test_blocks.py."""
import pytest

from mindspore_ngd.curvature.blocks import BlockLayout


@pytest.mark.parametrize("dim, split, size, count, padded, pad", [
    (10, 4, 4, 3, 12, 2),
    (12, 4, 4, 3, 12, 0),
    (5, None, 5, 1, 5, 0),
    (5, 8, 5, 1, 5, 0),
    (5, 5, 5, 1, 5, 0),
    (1, None, 1, 1, 1, 0),
    (4608, 128, 128, 36, 4608, 0),
    (4609, 128, 128, 37, 4736, 127),
    (3, 1, 1, 3, 3, 0),
])
def test_layout_arithmetic(dim, split, size, count, padded, pad):
    lay = BlockLayout.of(dim, split)
    assert (lay.dim, lay.size, lay.count, lay.padded, lay.pad) == (dim, size, count, padded, pad)


def test_layout_is_frozen_and_validated():
    lay = BlockLayout.of(10, 4)
    with pytest.raises(Exception):
        lay.size = 5
    assert lay == BlockLayout.of(10, 4) and hash(lay) == hash(BlockLayout.of(10, 4))
    for dim, split in ((0, None), (5, 0), (5, -2)):
        with pytest.raises(ValueError):
            BlockLayout.of(dim, split)
