"""The run config: the public document a user writes to launch an evaluation run.

Owns the format (see docs/run-config.md), its strict validation and its *resolved* form: the
``instances`` of a validated ``RunConfig`` are always an expanded tuple of ids, even when the file
named them through ``{file: ..., start, stop, match}``. The resolved form (``to_json_dict``) is
what the launcher stores in ``runs.config``; loading it back with ``from_mapping`` gives an equal
config, and ``content_hash`` is a stable SHA-256 of it (same ids + same settings → same hash,
whichever of YAML/JSON or list/file form was used), which the launcher can use for idempotency.
An omitted ``max_attempts`` stays None here ("the deployment's default"): the model reads no
settings; the launcher fills in ``EVALFLEET_DEFAULT_MAX_ATTEMPTS`` when it writes the run.

Strict throughout: no coercion (``"12"`` is not a number), unknown keys refused at every depth
except inside an adapter's ``options`` (which must still be bounded, JSON-compatible data),
NaN/infinity refused and every number bounded. Errors are ``ConfigError`` with one
``path.of.field: message`` line per problem (see ``evalfleet.documents``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from evalfleet.documents import decode_text, load_document, read_bounded, validate
from evalfleet.errors import ConfigError

MAX_INSTANCES = 100_000
MAX_INSTANCE_ID_CHARS = 256
MAX_NAME_CHARS = 64
MAX_INSTANCES_FILE_BYTES = 16 * 1_048_576
MAX_SPEND_USD = 1_000_000.0
MAX_TASKS = 100_000
MAX_INSTANCE_S = 7 * 86_400.0
MAX_PRIORITY = 1_000.0
MAX_ATTEMPTS = 20
MAX_OPTIONS_BYTES = 65_536
MAX_OPTIONS_DEPTH = 16
MAX_JSON_INT = 2**53
MAX_FILE_PROBLEMS = 20
HASH_SCHEMA = "evalfleet.runconfig/1"

_WHITESPACE = re.compile(r"\s")
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def _short(value: str, limit: int = 60) -> str:
    """A repr of a user string safe to show in one line (truncated, escapes visible)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _name_problem(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > MAX_NAME_CHARS:
        return f"must be at most {MAX_NAME_CHARS} characters (got {len(value)})"
    for char in value:
        if char in _NAME_CHARS:
            continue
        if char in "/\\":
            return f"must not contain a path separator ({char!r})"
        if not char.isprintable():
            return f"must not contain control characters (found U+{ord(char):04X})"
        if char.isspace():
            return "must not contain whitespace"
        return f"may only contain A-Z a-z 0-9 . _ - (found {char!r})"
    if value in {".", ".."}:
        return f"must not be {value!r}"
    return None


def _check_name(value: str) -> str:
    problem = _name_problem(value)
    if problem is not None:
        raise PydanticCustomError("name", "{problem}", {"problem": problem})
    return value


def _instance_id_problem(value: str) -> str | None:
    if not value:
        return "instance id must not be empty"
    if len(value) > MAX_INSTANCE_ID_CHARS:
        return f"instance id must be at most {MAX_INSTANCE_ID_CHARS} characters (got {len(value)})"
    if _WHITESPACE.search(value):
        return f"instance id {_short(value)} must not contain whitespace"
    if not value.isprintable():
        char = next(c for c in value if not c.isprintable())
        return (
            # The value is not echoed: a line of control characters may be a file that is not
            # an id list at all (e.g. a process environment), and messages must not leak it.
            f"instance id must not contain control characters (U+{ord(char):04X})"
        )
    return None


Name = Annotated[str, AfterValidator(_check_name)]
"""1-64 of A-Z a-z 0-9 . _ - ; not '.' or '..' (used for run, harness, evaluator and alias)."""


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


def _options_problems(value: Any, loc: tuple[int | str, ...], depth: int) -> list[InitErrorDetails]:
    """Problems that make adapter options non-JSON or unbounded, each with its location."""

    def problem(message: str, where: tuple[int | str, ...] = loc) -> InitErrorDetails:
        return InitErrorDetails(
            type=PydanticCustomError("options", "{problem}", {"problem": message}),
            loc=where,
            input=None,
        )

    if depth > MAX_OPTIONS_DEPTH:
        return [problem(f"options may nest at most {MAX_OPTIONS_DEPTH} levels")]
    if value is None or isinstance(value, bool | str):
        return []
    if isinstance(value, int):
        if abs(value) > MAX_JSON_INT:
            return [problem(f"integer out of range (at most {MAX_JSON_INT} in magnitude)")]
        return []
    if isinstance(value, float):
        return [] if math.isfinite(value) else [problem("must be a finite number")]
    if isinstance(value, list):
        out: list[InitErrorDetails] = []
        for index, item in enumerate(value):
            out.extend(_options_problems(item, (*loc, index), depth + 1))
        return out
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if not isinstance(key, str):
                out.append(problem(f"key {key!r} must be a string"))
                continue
            out.extend(_options_problems(item, (*loc, key), depth + 1))
        return out
    return [problem(f"must be JSON-compatible data (got {type(value).__name__})")]


class AdapterRef(_Strict):
    """A harness or evaluator adapter by name, with options that belong to the adapter."""

    name: Name
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("options", mode="after")
    @classmethod
    def _json_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems = _options_problems(value, (), 1)
        if problems:
            raise ValidationError.from_exception_data("options", problems)
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if size > MAX_OPTIONS_BYTES:
            raise PydanticCustomError(
                "options_size",
                "{problem}",
                {
                    "problem": f"options are too large ({size:,} bytes as JSON; limit {MAX_OPTIONS_BYTES:,})"
                },
            )
        return value


class Caps(_Strict):
    """Per-run limits: spend (required) and the number of tasks live at once (optional)."""

    tasks: int | None = Field(default=None, ge=1, le=MAX_TASKS)
    spend_usd: float = Field(gt=0, le=MAX_SPEND_USD)

    @property
    def spend_micro_usd(self) -> int:
        """The spend cap in integer micro-dollars, the ledger's unit of money."""
        return round(self.spend_usd * 1_000_000)


class Timeouts(_Strict):
    """Wall-clock limits: ``instance_s`` bounds one attempt's harness stage, in seconds, from
    when it starts running (boot and evaluation are not counted); past it the attempt lands as
    ``error`` with ``error_class`` ``instance_timeout`` (``harnesses.base.Deadline``)."""

    instance_s: float = Field(default=3600.0, gt=0, le=MAX_INSTANCE_S)


class InstancesFile(_Strict):
    """``instances: {file, start, stop, match}``: ids read from a text file, one per line.

    ``file`` is relative to the config file's folder. Blank lines and lines starting with ``#``
    are ignored; duplicates are an error. ``match`` (an fnmatch glob, case-sensitive) filters
    first, then ``start``/``stop`` slice the matching ids like Python's ``ids[start:stop]``.
    """

    file: str = Field(min_length=1, max_length=4096)
    start: int = Field(default=0, ge=0, le=10_000_000)
    stop: int | None = Field(default=None, ge=0, le=10_000_000)
    match: str | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("file", "match")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise PydanticCustomError(
                "printable", "{problem}", {"problem": "must not contain control characters"}
            )
        return value

    @model_validator(mode="after")
    def _stop_after_start(self) -> Self:
        if self.stop is not None and self.stop < self.start:
            raise ValidationError.from_exception_data(
                "InstancesFile",
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "stop", "{problem}", {"problem": f"must be >= start ({self.start})"}
                        ),
                        loc=("stop",),
                        input=self.stop,
                    )
                ],
            )
        return self

    def read(self, base_dir: Path | None, *, confine: bool = False) -> tuple[str, ...]:
        """The selected ids; raises ValueError with a message naming the file and line.

        With ``confine`` (configs from an untrusted source, e.g. an S3 upload) the file must
        lie inside ``base_dir``: no absolute path, no ``..`` or symlink escaping it.
        """
        path = Path(self.file)
        if path.is_absolute() and confine:
            raise ValueError(
                f"{_short(self.file)}: must be a path relative to the config file's folder"
            )
        if not path.is_absolute():
            if base_dir is None:
                raise ValueError(
                    f"relative path {_short(self.file)} needs the config file's folder "
                    "(load the config with RunConfig.from_file or from_mapping)"
                )
            path = base_dir / path
            if confine and not path.resolve().is_relative_to(base_dir.resolve()):
                raise ValueError(f"{_short(self.file)}: must stay inside the config file's folder")
        try:
            raw = read_bounded(path, max_bytes=MAX_INSTANCES_FILE_BYTES, what="instances file")
            text = decode_text(raw, str(path))
        except ConfigError as exc:
            raise ValueError(f"{_short(self.file)} ({path}): {'; '.join(exc.problems)}") from None
        ids: list[str] = []
        first_line: dict[str, int] = {}
        problems: list[str] = []
        for number, line in enumerate(text.split("\n"), start=1):
            item = line.strip()
            if not item or item.startswith("#"):
                continue
            problem = _instance_id_problem(item)
            if problem is None and item in first_line:
                problem = f"duplicate instance id {_short(item)} (first on line {first_line[item]})"
            if problem is not None:
                problems.append(f"line {number}: {problem}")
                continue
            first_line[item] = number
            ids.append(item)
        if problems:
            shown = problems[:MAX_FILE_PROBLEMS]
            if len(problems) > len(shown):
                shown.append(f"... and {len(problems) - len(shown)} more")
            raise ValueError(f"{_short(self.file)}: " + "; ".join(shown))
        if self.match is not None:
            pattern = self.match
            ids = [item for item in ids if fnmatch.fnmatchcase(item, pattern)]
        selected = ids[self.start : self.stop]
        if not selected:
            raise ValueError(
                f"{_short(self.file)} selects no instance ids "
                f"({len(first_line)} in the file, {len(ids)} matching; start={self.start}, "
                f"stop={self.stop})"
            )
        return tuple(selected)


def _error(kind: str, message: str, loc: tuple[int | str, ...], value: Any) -> InitErrorDetails:
    return InitErrorDetails(
        type=PydanticCustomError(kind, "{problem}", {"problem": message}), loc=loc, input=value
    )


#: keys added after ``HASH_SCHEMA`` was pinned, with their defaults (``canonical_json``)
_LATER_KEYS: dict[str, Any] = {"launch_order": "short_last"}


class RunConfig(_Strict):
    """A validated, resolved run config. Build it with ``from_file`` or ``from_mapping``."""

    name: Name
    harness: AdapterRef
    evaluator: AdapterRef | None = None
    alias: Name
    instances: tuple[str, ...]  # checked (ids, uniqueness, count) by _resolve_instances
    caps: Caps
    timeouts: Timeouts = Field(default_factory=Timeouts)
    # None: the deployment's default (EVALFLEET_DEFAULT_MAX_ATTEMPTS), filled in by the launcher
    max_attempts: int | None = Field(default=None, ge=1, le=MAX_ATTEMPTS)
    priority: float = Field(default=1.0, gt=0, le=MAX_PRIORITY)
    # planner.launch_order.LaunchOrder's values: which queued instance is claimed first
    launch_order: Literal["listed", "short_last"] = "short_last"

    @field_validator("instances", mode="before")
    @classmethod
    def _resolve_instances(cls, value: Any, info: ValidationInfo) -> tuple[str, ...]:
        ids: tuple[Any, ...]
        if isinstance(value, dict):
            spec = InstancesFile.model_validate(value, strict=True)
            context = info.context or {}
            base_dir = context.get("base_dir")
            try:
                ids = spec.read(
                    Path(base_dir) if base_dir is not None else None,
                    confine=bool(context.get("confine", False)),
                )
            except ValueError as exc:
                raise ValidationError.from_exception_data(
                    "instances", [_error("instances_file", str(exc), ("file",), spec.file)]
                ) from None
        elif isinstance(value, list | tuple):
            if len(value) > MAX_INSTANCES:
                raise PydanticCustomError(
                    "instances_count",
                    "{problem}",
                    {"problem": f"at most {MAX_INSTANCES:,} instance ids (got {len(value):,})"},
                )
            ids = tuple(value)
        else:
            raise PydanticCustomError(
                "instances_type",
                "{problem}",
                {
                    "problem": "must be a list of instance ids or a mapping "
                    "{file, start, stop, match}"
                },
            )
        first: dict[str, int] = {}
        problems: list[InitErrorDetails] = []
        for index, item in enumerate(ids):
            if not isinstance(item, str):
                problems.append(_error("string_type", "must be a string", (index,), item))
                continue
            problem = _instance_id_problem(item)
            if problem is None and item in first:
                problem = (
                    f"duplicate instance id {_short(item)} (first at instances[{first[item]}])"
                )
            if problem is not None:
                problems.append(_error("instance_id", problem, (index,), item))
            else:
                first[item] = index
        if problems:
            raise ValidationError.from_exception_data("instances", problems)
        if not 1 <= len(ids) <= MAX_INSTANCES:
            raise PydanticCustomError(
                "instances_count",
                "{problem}",
                {"problem": f"must list 1 to {MAX_INSTANCES:,} instance ids (got {len(ids):,})"},
            )
        return tuple(ids)

    # ---------------------------------------------------------------------------------------
    # Construction

    @classmethod
    def from_mapping(
        cls,
        data: Any,
        base_dir: str | Path | None,
        *,
        source: str = "config",
        confine: bool = False,
    ) -> Self:
        """Validate a parsed document; an instances file is resolved relative to ``base_dir``.

        ``confine=True`` (for configs from an untrusted source) keeps an instances file inside
        ``base_dir``.
        """
        if not isinstance(data, dict):
            raise ConfigError(source, ["top level must be a mapping of keys to values"])
        return validate(cls, data, source, context={"base_dir": base_dir, "confine": confine})

    @classmethod
    def from_file(cls, path: str | Path, *, confine: bool = False) -> Self:
        """Load and validate a YAML or JSON run config file (instances files relative to it)."""
        path = Path(path)
        data = load_document(path)
        return cls.from_mapping(data, path.resolve().parent, source=str(path), confine=confine)

    # ---------------------------------------------------------------------------------------
    # Resolved form

    def to_json_dict(self) -> dict[str, Any]:
        """The resolved config as JSON-compatible data (instances expanded to a list)."""
        return self.model_dump(mode="json")

    def canonical_json(self) -> str:
        """Key-sorted compact JSON of the resolved form: the input of ``content_hash``. A key
        added since the hash was pinned (``_LATER_KEYS``) is left out at its default, so a
        config written before it hashes as it did (its runs stay idempotent)."""
        form = self.to_json_dict()
        for key, default in _LATER_KEYS.items():
            if form.get(key) == default:
                del form[key]
        return json.dumps(
            {"schema": HASH_SCHEMA, "config": form},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )

    @property
    def content_hash(self) -> str:
        """``sha256:<hex>`` of the canonical resolved form; equal configs hash equal."""
        return "sha256:" + hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def summary(self) -> str:
        """One line for humans: name, harness, evaluator, alias, instance count and caps."""
        evaluator = self.evaluator.name if self.evaluator is not None else "none"
        count = len(self.instances)
        tasks = "no task cap" if self.caps.tasks is None else f"tasks {self.caps.tasks}"
        return (
            f"{self.name}: harness {self.harness.name}, evaluator {evaluator}, "
            f"alias {self.alias}, {count} instance{'' if count == 1 else 's'}, "
            f"caps: spend ${self.caps.spend_usd:,.2f}, {tasks}; "
            f"max_attempts {self.max_attempts or 'default'}, priority {self.priority:g}, "
            f"instance timeout {self.timeouts.instance_s:g}s"
        )
