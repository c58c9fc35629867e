"""The repository layout keeps Prefect's entrypoint loading safe.

Prefect loads an entrypoint such as ``flows/launch.py:launch_run`` by path: it registers the
file under its bare module name (``launch``) and puts ``flows/`` first on ``sys.path``. A flow
file named like one of the project's top-level packages (``flows/planner.py``) would then shadow
that package in the worker process, and the flow's own ``from planner... import`` would fail.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def _top_level_packages() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])


def test_no_entrypoint_file_shadows_a_top_level_package() -> None:
    packages = _top_level_packages()
    entry_dirs = {"flows", "tasks"}
    clashes = [
        str(path.relative_to(ROOT))
        for folder in entry_dirs
        for path in (ROOT / folder).glob("*.py")
        if path.stem in packages
    ]
    assert clashes == [], (
        f"rename these: they shadow top-level packages when loaded by path: {clashes}"
    )


def test_every_prefect_yaml_entrypoint_exists() -> None:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        file_part, _, flow_name = deployment["entrypoint"].partition(":")
        path = ROOT / file_part
        assert path.is_file(), f"{deployment['name']}: {file_part} does not exist"
        assert f"def {flow_name}(" in path.read_text(), f"{deployment['name']}: no {flow_name}"
