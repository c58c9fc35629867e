"""Work-pool base job templates (ECS, process) and the idempotent setup behind `evalfleet deploy`."""
