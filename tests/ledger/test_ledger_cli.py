"""`evalfleet db ...` and `evalfleet bench queue` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalfleet.cli import main


def test_db_upgrade_current_downgrade_on_sqlite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'new-folder' / 'ledger.sqlite3'}"
    assert main(["db", "current", "--url", url]) == 0
    assert capsys.readouterr().out.strip() == "base"
    assert main(["db", "upgrade", "--url", url]) == 0
    assert (tmp_path / "new-folder" / "ledger.sqlite3").exists()
    capsys.readouterr()
    assert main(["db", "current", "--url", url]) == 0
    head = capsys.readouterr().out.strip()
    assert head not in ("", "base")
    assert main(["db", "downgrade", "--url", url]) == 0
    assert main(["db", "current", "--url", url]) == 0
    assert capsys.readouterr().out.strip().endswith("base")


def test_db_errors_are_clear_and_hide_passwords(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    assert main(["db", "upgrade", "--url", url]) == 0
    capsys.readouterr()
    assert main(["db", "downgrade", "--url", url, "--to", "no-such-rev"]) == 2
    err = capsys.readouterr().err
    assert "no-such-rev" in err and "Traceback" not in err
    bad = "postgresql+psycopg://someone:hunter2@127.0.0.1:1/nowhere"
    assert main(["db", "upgrade", "--url", bad]) == 2
    err = capsys.readouterr().err
    assert "hunter2" not in err and "failed" in err and "Traceback" not in err
    assert main(["db", "upgrade", "--url", "mysql://x/y"]) == 2
    assert "not supported" in capsys.readouterr().err


def test_bench_queue_json_on_both_databases(
    pg_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "queue", "--json", "--jobs", "120", "--pg-url", pg_database])
    out = capsys.readouterr().out
    assert code == 0, out
    figures = json.loads(out)
    assert set(figures) == {"sqlite", "postgresql"}
    for name, result in figures.items():
        assert result["jobs"] == 120 and result["workers"] == 8
        assert result["claims_per_s"] > 0 and result["landings_per_s"] > 0
        assert result["floor_per_s"] == {"sqlite": 200.0, "postgresql": 1000.0}[name]
