"""The record of `python -m moebench.check --out`: one JSON object per run (replaced each run)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA = "moebench.check/1"


@dataclass
class CheckReport:
    argv: list[str]
    repro: str
    env: dict                        # provenance
    start_utc: str
    end_utc: str
    counts: dict                     # PASS / FAIL / WAIVED -> how many
    results: list[dict]              # one per check: key, status, summary, details, seconds
    schema: str = field(default=SCHEMA, init=False)

    def asdict(self) -> dict:
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}
