"""Reading the YAML files operators hand nodeward (config, policies, routes, scenarios,
directories), with one error line that names the file and what is wrong."""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def first_error(exc: ValidationError) -> str:
    """`loc: message` of the first validation error."""
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {msg}" if loc else msg


def parse_yaml(text: str, *, where: str, error: type[ValueError], empty: Any = None) -> Any:
    """The document in `text`; `empty` for an empty one. `where` names it in the error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML: {str(exc).splitlines()[0]}") from None
    return empty if data is None else data


def read_yaml(path: Path, *, what: str, error: type[ValueError], empty: Any = None) -> Any:
    """The document in the file at `path` (a `what`: "config", "scenario", ...)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    return parse_yaml(text, where=f"{what} {path}", error=error, empty=empty)


def load_model(
    model: type[M],
    path: Path | None,
    *,
    shipped: Traversable,
    what: str,
    error: type[ValueError],
) -> M:
    """`model` from the YAML file at `path`, or from the `shipped` default without one."""
    if path is None:
        where = f"{what} {shipped.name} (shipped)"
        data = parse_yaml(shipped.read_text(), where=where, error=error, empty={})
    else:
        where = f"{what} {path}"
        data = read_yaml(path, what=what, error=error, empty={})
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"invalid {where}: {first_error(exc)}") from None
