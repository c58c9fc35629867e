"""Analysis behind the notebooks: refit harness curves from the ledger, draw a run's timeline.

Importable, typed and tested; the notebooks under ``notebooks/`` only call these functions.
"""
