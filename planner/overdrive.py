"""The saturation controller: the overdrive multiplier that keeps the saturating budget used.

The curve's projection is an average; this controller corrects the fleet sizing for the run at
hand from the budget's measured use. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OverdriveConfig", "hold_overdrive"]


@dataclass(frozen=True, slots=True)
class OverdriveConfig:
    """The saturation controller's constants (see ``hold_overdrive``)."""

    target_utilisation: float = 0.97
    gain: float = 0.6
    min_factor: float = 1.0
    max_factor: float = 1.5

    def __post_init__(self) -> None:
        if not 0.5 <= self.target_utilisation <= 1.0:
            raise ValueError("target_utilisation must be within [0.5, 1]")
        if not (0.0 < self.gain <= 5.0 and 0.5 <= self.min_factor <= 1.0 <= self.max_factor):
            raise ValueError("gain must be in (0, 5], min_factor <= 1 <= max_factor")


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
