"""harnesses."""
