"""Buckets of the total token count: the static shapes a packed batch is padded up to.

A packed batch has as many rows as the batch has real tokens, which changes from batch to
batch. Runtimes that compile for static shapes (``torch.compile(dynamic=False)``, CUDA graphs)
would compile anew for every count, so under them the packed sequence is padded up to the
smallest bucket that fits (the padding tokens form one dummy sequence that is dropped).
The buckets are powers of two and 1.5 times powers of two: at most a third of a bucket is
padding (about a sixth on average), and a few dozen shapes cover every batch.
"""

from __future__ import annotations

#: The smallest bucket.
SMALLEST_BUCKET = 16
#: The largest bucket; longer packed sequences are padded to a multiple of it.
LARGEST_BUCKET = 1 << 16


def geometric_buckets(smallest: int = SMALLEST_BUCKET, largest: int = LARGEST_BUCKET) -> tuple[int, ...]:
    """Powers of two from ``smallest`` to ``largest`` and the 1.5x steps between them, ascending."""
    if smallest < 1 or largest < smallest:
        raise ValueError(f"buckets need 1 <= smallest <= largest, got smallest={smallest}, largest={largest}")
    buckets: set[int] = set()
    size = smallest
    while size <= largest:
        buckets.add(size)
        if size * 3 // 2 <= largest and size % 2 == 0:
            buckets.add(size * 3 // 2)
        size *= 2
    return tuple(sorted(buckets))


#: The default total-token buckets.
TOKEN_BUCKETS: tuple[int, ...] = geometric_buckets()


def smallest_bucket(tokens: int, buckets: tuple[int, ...] = TOKEN_BUCKETS) -> int:
    """The smallest of ``buckets`` that holds ``tokens`` tokens; beyond the largest, the next
    multiple of the largest (still a static shape per size range). ``buckets`` must be ascending."""
    if tokens < 0:
        raise ValueError(f"a token count cannot be negative, got {tokens}")
    if not buckets:
        raise ValueError("no buckets given")
    for bucket in buckets:
        if bucket >= tokens:
            return bucket
    largest = buckets[-1]
    return -(-tokens // largest) * largest
