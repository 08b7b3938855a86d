"""Buckets of the total token count: the static shapes a packed batch is padded up to.

A packed batch has as many rows as the batch has real tokens, which changes from batch to
batch. Runtimes that compile for static shapes (``torch.compile(dynamic=False)``, CUDA graphs)
would compile anew for every count, so under them the packed sequence is padded up to the
smallest bucket that fits (the padding tokens form one dummy sequence that is dropped).
Between two powers of two there are :data:`STEPS_PER_OCTAVE` equal steps: a bucket is at most
1 + 1/8 times the tokens it holds (the first MiniLM measurement used 1.5x steps, and at 32 rows its
1,029 tokens went to 1,536, which cost most of the packing gain under ``torch.compile``). Only the
buckets a batch needs are ever compiled.
"""

from __future__ import annotations

#: The smallest bucket.
SMALLEST_BUCKET = 16
#: The largest bucket; longer packed sequences are padded to a multiple of it.
LARGEST_BUCKET = 1 << 16
#: Equal steps from one power of two to the next.
STEPS_PER_OCTAVE = 8


def geometric_buckets(smallest: int = SMALLEST_BUCKET, largest: int = LARGEST_BUCKET,
                      steps: int = STEPS_PER_OCTAVE) -> tuple[int, ...]:
    """Powers of two from ``smallest`` to ``largest`` and ``steps`` equal steps between each two
    (integers only: fewer steps where an octave is narrower than ``steps``), ascending."""
    if smallest < 1 or largest < smallest or steps < 1:
        raise ValueError(f"buckets need 1 <= smallest <= largest and steps >= 1, got smallest={smallest}, "
                         f"largest={largest}, steps={steps}")
    buckets: set[int] = set()
    size = smallest
    while size <= largest:
        stride = max(1, size // steps)
        buckets.update(b for b in range(size, min(2 * size, largest + 1), stride))
        size *= 2
    buckets.add(largest)
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
