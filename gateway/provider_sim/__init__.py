"""The simulated LLM provider: an OpenAI- and Anthropic-compatible HTTP server with the real
rate-limit protocol (limit model: ``sim.limits``), deterministic fake completions and an admin
API that mints spend-capped keys. ``evalfleet provider-sim serve`` runs it."""
