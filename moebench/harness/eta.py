"""How long the rest of a sweep will take, by work: the progress line's "~N min left"."""
from __future__ import annotations

from ..core.workload import Workload


def case_work(w: Workload) -> int:
    """What a case's time grows with: tokens x hidden x top-k per rank (the rows each rank moves and checks)."""
    return w.num_tokens * w.hidden * w.topk


def plan_works(knobs: dict, wls: list[Workload], names: list[str], knob_sweep: bool) -> list[int]:
    """The work of every case, in the order sweep.walk() visits them (knobs: the sweep's [knobs.BACKEND])."""
    per = [sum(len(v) for v in knobs[n].values()) if knob_sweep and knobs.get(n) else 1 for n in names]
    return [case_work(w) for w in wls for _ in range(sum(per))]


def time_left(history: list[tuple[int, float]], works: list[int]) -> float | None:
    """Seconds the cases of `works` will take, from the (work, seconds) of the cases run so far: a
    least-squares line seconds = a + b x work (a: the launch, b: the part that grows with the work);
    while every case run so far had the same work, in proportion to the work. None before any case."""
    if not history:
        return None
    xs, ys = [x for x, _ in history], [y for _, y in history]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    if b <= 0:
        return sum(ys) / sum(xs) * sum(works)
    a = max(0.0, my - b * mx)
    return sum(a + b * x for x in works)
