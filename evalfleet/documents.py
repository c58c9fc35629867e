"""Loading and validating user-supplied YAML/JSON documents (run configs, scenarios, profiles).

Owns every check that comes before and around a pydantic model: the size limit (checked before
parsing), safe YAML without aliases, strict JSON (no NaN/Infinity, no duplicate keys), an empty
file, a top level that is not a mapping, non-string keys, excessive nesting, and turning a
pydantic ``ValidationError`` into one ``path.of.field: message`` line per problem. Every failure
is an ``evalfleet.errors.ConfigError(source, problems)``; nothing here returns half a document.

Numbers read as a person or a program writes them: YAML's exponent form without a dot (``2e6``,
``1E+6``, which YAML 1.1 reads as a string) is a float, as in YAML 1.2 and JSON; and
``WholeNumber`` fields take a float that is a whole number (``2000000.0``, what a script that
computed a limit writes), and name the field when it is not.

The API is small and generic so that any part can reuse it::

    data = load_document(path)                       # dict[str, Any], or ConfigError
    model = validate(MyModel, data, source=str(path))  # MyModel, or ConfigError with all problems
"""

from __future__ import annotations

import json
import math
import re
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from evalfleet.errors import ConfigError

MAX_DOCUMENT_BYTES = 1_048_576
"""Largest document accepted (1 MiB); checked on the bytes, before any parsing."""

MAX_NESTING = 32
"""Deepest nesting of mappings/lists accepted; deeper documents are refused (no config needs it)."""

YAML_SUFFIXES = frozenset({".yaml", ".yml"})
JSON_SUFFIXES = frozenset({".json"})

M = TypeVar("M", bound=BaseModel)


# --------------------------------------------------------------------------------------------
# Reading


def read_bounded(path: Path, *, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "file") -> bytes:
    """The bytes of a regular file no larger than ``max_bytes``, or ConfigError naming the file.

    The size is checked with ``stat`` and again while reading (the file may grow, or be a
    device), so a huge file is never read whole.
    """
    source = str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(source, [f"{what} does not exist"]) from None
    except OSError as exc:
        raise ConfigError(source, [f"cannot read {what}: {exc.strerror or exc}"]) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(source, [f"{what} is not a regular file"])
    if info.st_size > max_bytes:
        raise ConfigError(source, [_too_big(info.st_size, max_bytes)])
    try:
        with path.open("rb") as handle:
            raw = handle.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read {what}: {exc.strerror or exc}"]) from None
    if len(raw) > max_bytes:
        raise ConfigError(source, [_too_big(len(raw), max_bytes)])
    return raw


def _too_big(size: int, max_bytes: int) -> str:
    return f"file is too large ({size:,} bytes; the limit is {max_bytes:,} bytes)"


def decode_text(raw: bytes, source: str) -> str:
    """UTF-8 text (a leading BOM is allowed), or ConfigError with the offending byte offset."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, [f"not valid UTF-8 (byte {exc.start})"]) from None


def load_document(
    path: str | Path, *, max_bytes: int = MAX_DOCUMENT_BYTES, fmt: str | None = None
) -> dict[str, Any]:
    """Read a YAML (``.yaml``/``.yml``) or JSON (``.json``) file whose top level is a mapping.

    ``fmt`` ("yaml" or "json") overrides the choice by suffix. Raises ConfigError for a missing
    or oversized file, a parse error (with line and column), an empty document, a top level that
    is not a mapping, duplicate or non-string keys, YAML aliases, non-finite numbers in JSON or
    nesting deeper than ``MAX_NESTING``.
    """
    path = Path(path)
    source = str(path)
    if fmt is None:
        suffix = path.suffix.lower()
        if suffix in YAML_SUFFIXES:
            fmt = "yaml"
        elif suffix in JSON_SUFFIXES:
            fmt = "json"
        else:
            raise ConfigError(
                source, [f"unsupported file type {suffix or '(none)'!r}: use .yaml, .yml or .json"]
            )
    raw = read_bounded(path, max_bytes=max_bytes)
    return parse_document(decode_text(raw, source), source, fmt)


def parse_document(text: str, source: str, fmt: str) -> dict[str, Any]:
    """Parse YAML or JSON text into a mapping with string keys, or raise ConfigError."""
    if len(text.encode("utf-8")) > MAX_DOCUMENT_BYTES:
        raise ConfigError(source, [_too_big(len(text.encode("utf-8")), MAX_DOCUMENT_BYTES)])
    if fmt == "yaml":
        data = _parse_yaml(text, source)
    elif fmt == "json":
        data = _parse_json(text, source)
    else:
        raise ConfigError(source, [f"unknown document format {fmt!r} (yaml or json)"])
    if data is None:
        raise ConfigError(source, ["file is empty (expected a mapping of keys to values)"])
    if not isinstance(data, dict):
        raise ConfigError(
            source, [f"top level must be a mapping of keys to values, not {_kind(data)}"]
        )
    problems: list[str] = []
    _check_tree(data, "", 1, set(), problems)
    if problems:
        raise ConfigError(source, problems)
    return data


# --------------------------------------------------------------------------------------------
# YAML


class _StrictYamlLoader(yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader):  # type: ignore[misc]
    """Safe YAML loader (libyaml when available) that refuses duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise yaml.constructor.ConstructorError(
                    None, None, "YAML merge keys (<<) are not supported", key_node.start_mark
                )
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be a plain value", key_node.start_mark
                ) from None
            if duplicate:
                first = seen[key].start_mark
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first defined on line {first.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


# YAML 1.1 (PyYAML) reads a float only with a dot: `2e6` and `1E+6` would be strings. YAML 1.2
# and JSON read them as numbers, and so does a person writing a limit.
_StrictYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _parse_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictYamlLoader)  # a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(source, [f"invalid YAML: {where}{problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"invalid YAML: {_one_line(str(exc))}"]) from None
    except (RecursionError, ValueError, OverflowError) as exc:
        raise ConfigError(
            source, [f"invalid YAML: {_one_line(str(exc)) or 'too deeply nested'}"]
        ) from None


# --------------------------------------------------------------------------------------------
# JSON


class _JsonProblem(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _JsonProblem(f"{name} is not a valid JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _JsonProblem(f"number {text[:40]} is out of range")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonProblem(f"duplicate key {key!r}")
        out[key] = value
    return out


def _parse_json(text: str, source: str) -> Any:
    if not text.strip():
        return None
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
        )
    except json.JSONDecodeError as exc:
        raise ConfigError(
            source, [f"invalid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"]
        ) from None
    except _JsonProblem as exc:
        raise ConfigError(source, [f"invalid JSON: {exc}"]) from None
    except RecursionError:
        raise ConfigError(source, ["invalid JSON: too deeply nested"]) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ConfigError(source, [f"invalid JSON: {_one_line(str(exc))}"]) from None


# --------------------------------------------------------------------------------------------
# Whole numbers


def _whole(value: Any) -> Any:
    """A float that is a whole number as that int; anything else unchanged, for the strict
    int check after it to refuse (a fraction is refused here, naming the value)."""
    if isinstance(value, float) and math.isfinite(value):
        if not value.is_integer():
            raise ValueError(f"must be a whole number (got {value!r})")
        return int(value)
    return value


WholeNumber = Annotated[int, BeforeValidator(_whole)]
"""An int field of a user document that also takes a float with no fraction (``4000.0``)."""


# --------------------------------------------------------------------------------------------
# Shape checks shared by both formats


def _check_tree(value: Any, path: str, depth: int, seen: set[int], problems: list[str]) -> None:
    """Refuse non-string keys, shared (aliased) containers and nesting beyond MAX_NESTING."""
    if not isinstance(value, dict | list):
        return
    where = path or "(top level)"
    if depth > MAX_NESTING:
        problems.append(f"{where}: nested more than {MAX_NESTING} levels deep")
        return
    if id(value) in seen:
        problems.append(f"{where}: YAML aliases (*name) are not supported; write the value out")
        return
    seen.add(id(value))
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(
                    f"{where}: key {key!r} must be a string (quote it), not {_kind(key)}"
                )
                continue
            _check_tree(item, f"{path}.{key}" if path else key, depth + 1, seen, problems)
    else:
        for index, item in enumerate(value):
            _check_tree(item, f"{path}[{index}]", depth + 1, seen, problems)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    return f"a {type(value).__name__}"


def _one_line(text: str) -> str:
    return " ".join(text.split())[:300]


# --------------------------------------------------------------------------------------------
# Validation


def validate(
    model_cls: type[M],
    data: Mapping[str, Any],
    source: str,
    *,
    context: Mapping[str, Any] | None = None,
) -> M:
    """Validate ``data`` with ``model_cls``; on failure raise ConfigError listing every problem."""
    try:
        return model_cls.model_validate(data, context=dict(context) if context else None)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None


def format_validation_error(exc: ValidationError) -> list[str]:
    """One ``path.of.field: message`` line per error (``instances[3]`` for list items)."""
    lines: list[str] = []
    for err in exc.errors(include_url=False):
        line = f"{format_loc(err['loc'])}: {_message(err)}"
        if line not in lines:
            lines.append(line)
    return lines


def format_loc(loc: tuple[int | str, ...]) -> str:
    """``('caps', 'spend_usd')`` → ``caps.spend_usd``; ``('instances', 3)`` → ``instances[3]``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


_PREFIXES = (
    ("Value error, ", ""),
    ("Assertion failed, ", ""),
    ("Input should be ", "must be "),
    ("Input should have ", "must have "),
)


def _message(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown key (not allowed here)"
    message = str(err["msg"])
    for prefix, replacement in _PREFIXES:
        if message.startswith(prefix):
            message = replacement + message[len(prefix) :]
            break
    value = err.get("input")
    if kind in {"model_type", "dict_type", "model_attributes_type"}:
        return f"must be a mapping of keys to values (got {_kind(value)})"
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        return "number is too large"
    if kind.endswith("_type") or kind in {"is_instance_of", "model_type", "dataclass_type"}:
        message += f" (got {_kind(value)})"
    if kind == "finite_number":
        message = "must be a finite number (not NaN or infinity)"
    return message
