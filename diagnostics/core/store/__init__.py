"""The embedded history store's pure half: the tier policy, the per-interval aggregates and the
bytes a chunk of scrapes is written as. The SQLite adapter is :mod:`diagnostics.sources.store`."""

from diagnostics.core.store.codec import Row, decode_chunk, encode_chunk, exposition, layout_from_json, layout_to_json
from diagnostics.core.store.downsample import Downsampler, downsample, downsample_within
from diagnostics.core.store.policy import DEFAULT_POLICY, StorePolicy, Tier

__all__ = [
    "DEFAULT_POLICY",
    "Downsampler",
    "Row",
    "StorePolicy",
    "Tier",
    "decode_chunk",
    "downsample",
    "downsample_within",
    "encode_chunk",
    "exposition",
    "layout_from_json",
    "layout_to_json",
]
