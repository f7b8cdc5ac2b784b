"""Linear-time checks with no wall-clock bound: a function is timed on an input and on one ten times
larger in the same run (best of several, the two interleaved), so a machine whose cores are busy with
other jobs slows both alike and only the growth is judged. A linear reader grows about 10x, a
quadratic one about 100x."""
from __future__ import annotations

import time
from collections.abc import Callable

FACTOR = 10  # the large input is this many times the small one
LIMIT = 40  # growth above this is superlinear: 4x a linear reader's, 0.4x a quadratic one's
# Below this a large input's time says nothing: a millisecond's noise (the scheduler, the caches) on
# the small one can make any ratio, and the quadratic readers these tests caught took seconds to
# minutes on the large inputs. Only ever a reason to pass, never to fail.
FLOOR_S = 0.5
# A small input this slow has already failed: the large one (~100x that, if quadratic) is not run.
GIVE_UP_S = 2.0


def growth(fn: Callable[[str], object], small: str, large: str, repeat: int = 5) -> tuple[float, float | None]:
    """(best time on `small`, best time on `large`, or None where `small` alone took GIVE_UP_S)."""
    best_small = best_large = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn(small)
        best_small = min(best_small, time.perf_counter() - start)
        if best_small > GIVE_UP_S:
            return best_small, None
        start = time.perf_counter()
        fn(large)
        best_large = min(best_large, time.perf_counter() - start)
    return best_small, best_large


def superlinear(small_s: float, large_s: float | None) -> bool:
    """Whether the times of `growth` (or a child process's own) show more than linear growth."""
    if large_s is None:
        return True
    return large_s > FLOOR_S and large_s > LIMIT * small_s
