"""evalfleet."""
