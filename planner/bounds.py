"""Bounds of the planner's tuning constants (controller, sizing, overdrive).

Each config checks every field and raises one ``ConfigError`` that names all the fields out of
bounds, with the bound and the value; this is the shared check. Pure.
"""

from __future__ import annotations

__all__ = ["within"]


def within(name: str, value: float, lo: float, hi: float, problems: list[str]) -> None:
    """Append ``name``'s problem to ``problems`` unless ``lo <= value <= hi``."""
    if not (lo <= value <= hi):
        problems.append(f"{name}: must be within [{lo}, {hi}], got {value!r}")
