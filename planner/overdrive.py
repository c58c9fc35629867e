"""The saturation controller: the overdrive multiplier that keeps the saturating budget used.

The curve's projection is an average; this controller corrects the fleet sizing for the run at
hand from the budget's measured use. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from evalfleet.errors import ConfigError
from planner.bounds import within

__all__ = ["OverdriveConfig", "hold_overdrive"]


@dataclass(frozen=True, slots=True)
class OverdriveConfig:
    """The saturation controller's constants (see ``hold_overdrive``); each default is
    bounded (``ConfigError`` names every field out of bounds)."""

    target_utilisation: float = 0.97  # the saturating budget's use aimed at [0.5, 1]
    gain: float = 0.6  # how fast the multiplier follows the gap to the target (0, 5]
    min_factor: float = 1.0  # the multiplier's floor [0.5, 1]
    max_factor: float = 1.5  # and its ceiling [1, 4]

    def __post_init__(self) -> None:
        p: list[str] = []
        within("target_utilisation", self.target_utilisation, 0.5, 1.0, p)
        if not 0.0 < self.gain <= 5.0:
            p.append(f"gain: must be within (0, 5], got {self.gain!r}")
        within("min_factor", self.min_factor, 0.5, 1.0, p)
        within("max_factor", self.max_factor, 1.0, 4.0, p)
        if p:
            raise ConfigError("overdrive config", p)


def hold_overdrive(factor: float, utilisation: float, config: OverdriveConfig) -> float:
    """One step of the saturation controller: the overdrive multiplier for the next tick.

    The curve's projection of a fleet's demand is an average; a given run's tasks can draw
    less (or more) than it says, and a fleet sized to ``overdrive x budget`` by the curve then
    leaves the limit idle. The controller integrates the gap between the saturating budget's
    measured utilisation over the last window (the pacer's ``take_usage``) and the target:
    below the target the multiplier grows, at a fully used budget it shrinks slowly back
    toward 1 (the pacer holds the surplus, so a saturated window says the fleet is big
    enough). Feed it only windows where the sizing set the fleet (binding ``paced``, work
    queued, no cooldown): a cap, a freeze or the drain says nothing about the curve.
    """
    step = config.gain * (config.target_utilisation - min(max(utilisation, 0.0), 1.2))
    return min(config.max_factor, max(config.min_factor, factor * (1.0 + step)))
