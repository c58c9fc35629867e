"""``planner/`` stays pure: no Prefect, SQLAlchemy, HTTP clients, environment or clock reads.

Checked two ways for every module under planner/: statically (the AST: imports and clock/env
attribute use) and dynamically (importing them all in a fresh interpreter loads none of the
banned packages).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLANNER_FILES = sorted((ROOT / "planner").rglob("*.py"))
BANNED_MODULES = {
    "prefect",
    "prefect_aws",
    "sqlalchemy",
    "alembic",
    "psycopg",
    "redis",
    "httpx",
    "requests",
    "urllib3",
    "aiohttp",
    "openai",
    "anthropic",
    "boto3",
    "botocore",
    "starlette",
    "uvicorn",
    "time",
    "socket",
    "ledger",
    "gateway",
    "flows",
    "tasks",
    "evalfleet.settings",
}
BANNED_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter", "getenv"}


def violations(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if any(name == b or name.startswith(b + ".") for b in BANNED_MODULES):
                assert isinstance(node, (ast.Import, ast.ImportFrom))
                found.append(f"line {node.lineno}: imports {name}")
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "environb"}:
            found.append(f"line {node.lineno}: reads os.{node.attr}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in BANNED_CALLS
        ):
            found.append(f"line {node.lineno}: calls .{node.func.attr}()")
    return found


def test_the_checker_catches_what_it_bans() -> None:
    bad = "import os, time\nfrom prefect import flow\nx = os.environ['A']\nimport datetime\ny = datetime.datetime.now()\n"
    found = violations(bad)
    assert any("time" in v for v in found)
    assert any("prefect" in v for v in found)
    assert any("environ" in v for v in found)
    assert any(".now()" in v for v in found)
    ok = "import numpy as np\nfrom evalfleet.errors import ConfigError\nnow = obs.now\n"
    assert violations(ok) == []


@pytest.mark.parametrize("path", PLANNER_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_planner_module_is_pure(path: Path) -> None:
    assert violations(path.read_text(encoding="utf-8")) == []


def test_importing_planner_loads_no_io_packages() -> None:
    modules = [
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in PLANNER_FILES
    ]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = set(json.loads(out.stdout))
    banned = {
        "prefect",
        "sqlalchemy",
        "httpx",
        "requests",
        "redis",
        "psycopg",
        "openai",
        "anthropic",
        "boto3",
    }
    assert loaded.isdisjoint(banned), loaded & banned
