"""The notebooks run headless (nbclient) against a ledger filled by a simulated run.

Each notebook's ``parameters`` cell is followed by an injected cell pointing it at the test
ledger and a temp output folder; a cell that raises fails the test (``CellExecutionError``). The
kernel is this interpreter (a kernelspec written to a temp JUPYTER_PATH). Committed notebooks
must carry no outputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.image
import nbformat
import pytest
from nbclient import NotebookClient

from analysis.timeline import png_size
from ledger.curves import list_versions
from ledger.db import make_engine
from tests.analysis_fixtures import sim_ledger, sim_run  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
KERNEL = "evalfleet-test"
CELL_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "evalfleet (test)",
                "language": "python",
            }
        )
    )
    return root


def run_notebook(
    name: str, parameters: dict[str, Any], kernel_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> nbformat.NotebookNode:
    nb: nbformat.NotebookNode = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    index = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    source = "\n".join(f"{k} = {v!r}" for k, v in parameters.items())
    injected = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected"]})  # type: ignore[no-untyped-call]
    nb.cells.insert(index + 1, injected)
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    client = NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        startup_timeout=60,
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()
    return nb


@pytest.mark.parametrize("name", ["refit_curves.ipynb", "run_timeline.ipynb"])
def test_committed_notebooks_are_stripped_and_parameterised(name: str) -> None:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)  # type: ignore[no-untyped-call]
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    assert all(len(c.source.splitlines()) <= 30 for c in code)  # logic lives in analysis/


def test_timeline_notebook_saves_its_figures(
    sim_ledger: tuple[str, str],  # noqa: F811
    kernel_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, run_id = sim_ledger
    out = tmp_path / "timeline"
    nb = run_notebook(
        "run_timeline.ipynb",
        {"LEDGER_URL": url, "RUN_ID": run_id, "OUTPUT_DIR": str(out)},
        kernel_dir,
        monkeypatch,
    )
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"run {run_id} (closed)" in printed
    manifest = json.loads((out / "figures.json").read_text())
    by_name = {m["name"]: m for m in manifest}
    assert set(by_name) == {"fleet", "rates", "throttles", "instances"}
    fleet = by_name["fleet"]
    assert fleet["axes"][0]["xlabel"] == "minutes since run start"
    assert fleet["axes"][0]["ylabel"] == "tasks"
    assert [a["ylabel"] for a in by_name["rates"]["axes"]] == ["calls/s", "tokens/s"]
    path = out / fleet["file"]
    assert png_size(path) == (fleet["width"], fleet["height"])
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[:2] == (fleet["height"], fleet["width"])
    assert float(pixels[..., :3].std()) > 0.05
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(images) == 4


def test_refit_notebook_writes_the_next_version_when_asked(
    sim_ledger: tuple[str, str],  # noqa: F811
    kernel_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _ = sim_ledger
    engine = make_engine(url)
    before = [v.version for v in list_versions(engine, "mini-swe-agent")]
    nb = run_notebook(
        "refit_curves.ipynb",
        {
            "LEDGER_URL": url,
            "HARNESS": "mini-swe-agent",
            "WRITE": True,
            "OUTPUT_DIR": str(tmp_path / "refit"),
        },
        kernel_dir,
        monkeypatch,
    )
    after = list_versions(engine, "mini-swe-agent")
    engine.dispose()
    assert [v.version for v in after] == [*before, (before[-1] if before else 0) + 1]
    assert after[-1].fit_quality["instances"] == 80
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert f"wrote mini-swe-agent curve version {after[-1].version}" in printed
    assert png_size(tmp_path / "refit" / "refit.png")[0] > 400
