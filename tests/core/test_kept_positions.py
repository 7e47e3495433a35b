"""The kept positions a token map draws, as ``kvlab serve`` sends them: one bitmap per layer and KV head."""

from __future__ import annotations

import base64

import pytest

from kvlab.core.results import KeptPositions


def test_bitmaps_round_trip_and_count_what_each_head_kept():
    kept = (((0, 1, 9), (2, 3, 4, 5, 6, 7, 8, 9)), ((), tuple(range(10))))
    positions = KeptPositions(10, kept)
    data = positions.to_dict()
    assert data["encoding"] == "bitmap-lsb-base64" and len(data["layers"]) == 2
    assert base64.b64decode(data["layers"][0][0]) == bytes([0b11, 0b10])  # positions 0, 1 and 9 (byte 1, bit 1)
    assert KeptPositions.from_dict(data) == positions
    assert positions.share() == [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.75]
    assert KeptPositions(0, ()).share() == []


def test_another_encoding_or_a_bitmap_of_the_wrong_size_is_refused():
    data = KeptPositions(10, (((0,),),)).to_dict()
    with pytest.raises(ValueError, match="not 'bitmap-lsb-base64'"):
        KeptPositions.from_dict(data | {"encoding": "runs"})
    with pytest.raises(ValueError, match="3 bytes for 10 positions"):
        KeptPositions.from_dict(data | {"layers": [[base64.b64encode(b"abc").decode()]]})
