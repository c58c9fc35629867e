"""docs/aliases.md: its example is a valid aliases file as written, and the errors it promises
name the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from evalfleet.errors import ConfigError
from gateway.aliases import load_aliases

DOC = Path(__file__).resolve().parents[1] / "docs" / "aliases.md"


def _example() -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1, "docs/aliases.md should hold exactly one yaml example"
    return str(blocks[0])


def test_the_documented_example_loads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(_example(), encoding="utf-8")
    aliases = load_aliases(path, provider_sim_url="http://127.0.0.1:9")
    alias = aliases.get("claude-sonnet")
    assert alias.flavour == "anthropic"
    assert alias.key_minter == "prefect_secret" and alias.static_key_block == "anthropic-key"
    assert alias.pacer.output_tokens_per_s == 8000
    assert alias.prices.cost_micro_usd(1_000_000, 0, 0) == 3_000_000


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("pacer", "tokens_per_s"), -1, "aliases[0].pacer.tokens_per_s"),
        (("pacer", "burst_s"), 601, "aliases[0].pacer.burst_s"),
        (("flavour",), "gemini", "aliases[0].flavour"),
        (("pacer", "tokens_per_minute"), 5, "aliases[0].pacer.tokens_per_minute"),
    ],
)
def test_a_bad_value_in_the_example_is_an_error_naming_its_field(
    tmp_path: Path, path: tuple[str, ...], value: object, field: str
) -> None:
    doc = yaml.safe_load(_example())
    node = doc["aliases"][0]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    bad = tmp_path / "aliases.yaml"
    bad.write_text(yaml.safe_dump(doc), encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_aliases(bad, provider_sim_url="http://127.0.0.1:9")
    assert field in str(err.value)
