"""Dataclasses from and to the acceptance record's JSON objects, field by field.

Why one helper: the record's sections are JSON objects whose keys are the fields'
names, and each used to be read with its own ``.get`` chain (a key renamed on one side
went unnoticed on the other). A dataclass names the keys once; these two functions
read it from the record (a missing key takes the field's default, None for a field
without one: "not known") and write it back. A value read from JSON writes back the
keys it was read from, in their order, so ``to_json(from_json(x)) == x`` also for a
record of an older version (a key it lacked stays absent); one built in code writes
every field in order. Keys no field names are kept in an ``extra`` field.
Standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar

from remotemac.agent.protocol import JsonObject

T = TypeVar("T")
J = TypeVar("J", bound="JsonFields")
B = TypeVar("B", bound="ObjectOrBare")
#: the name of the field that keeps the keys no other field names
EXTRA = "extra"
#: the field metadata key of a field that is no key of the JSON object
NOT_JSON = "not_json"
#: the name of the field that keeps the keys a value was read from, in order
KEYS = "json_keys"
#: the name of the field that says the value was read from a JSON null
NULL = "json_null"
#: the field metadata key naming the JSON key of a field whose key is no Python name
JSON_NAME = "json_name"


def _key(f: dataclasses.Field[Any]) -> str:
    return str(f.metadata[JSON_NAME]) if JSON_NAME in f.metadata else f.name


def json_object(data: Any) -> JsonObject:
    """``data`` when it is a JSON object, else an empty one (a record's null or junk)."""
    return data if isinstance(data, dict) else {}


def from_fields(
    cls: type[T],
    data: Any,
    parse: Mapping[str, Callable[[Any], Any]] | None = None,
    always: tuple[str, ...] = (),
) -> T:
    """``cls`` from the JSON object ``data``, each field from the key of its name.

    ``parse[name]`` turns the key's value into the field's type (it sees None for a
    missing key). A field marked ``NOT_JSON`` is neither read nor written; one with a
    ``JSON_NAME`` is read from that key (``in`` is a keyword). The keys in
    ``always`` are written back even when ``data`` lacked them (first, then its own).
    A null ``data`` reads as every field's default and writes back as null; other
    non-objects read as built in code (every field written).
    """
    obj = json_object(data)
    parse = parse or {}
    kwargs: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    names = set()  # the JSON keys the fields read
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == EXTRA or NOT_JSON in f.metadata:
            continue
        key = _key(f)
        names.add(key)
        if f.name in parse:
            kwargs[f.name] = parse[f.name](obj.get(key))
        elif key in obj:
            kwargs[f.name] = obj[key]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = None
    if EXTRA in fields:
        kwargs[EXTRA] = {k: v for k, v in obj.items() if k not in names}
    if KEYS in fields and isinstance(data, dict):
        kwargs[KEYS] = (*(k for k in always if k not in obj), *obj)
    if NULL in fields and data is None:
        kwargs[NULL] = True
    return cls(**kwargs)


def plain(value: Any) -> Any:
    """``value`` as JSON: objects with ``to_json`` through it, lists item by item."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def to_fields(obj: Any) -> JsonObject | None:
    """The JSON object of dataclass ``obj``: the keys it was read from, in their order,
    or (built in code) its fields in order; then the ``extra`` keys. One read from a
    null is null again."""
    if getattr(obj, NULL, False):
        return None
    names = {
        _key(f): f.name
        for f in dataclasses.fields(obj)
        if f.name != EXTRA and NOT_JSON not in f.metadata
    }
    extra = getattr(obj, EXTRA, None) or {}
    keys = getattr(obj, KEYS, None)
    if keys is None:
        keys = (*names, *extra)
    return {
        k: plain(getattr(obj, names[k])) if k in names else extra[k]
        for k in keys
        if k in names or k in extra
    }


def parse_list(item: Callable[[Any], T]) -> Callable[[Any], list[T]]:
    """A parser of a JSON array (null: empty) whose items ``item`` reads."""
    return lambda data: [item(x) for x in data or []]


def parse_optional(item: Callable[[Any], T]) -> Callable[[Any], T | None]:
    """A parser of a JSON object that may be absent: None for a missing, null or empty one."""
    return lambda data: item(data) if data else None


@dataclasses.dataclass
class JsonFields:
    """The base of a dataclass whose JSON keys are its fields' names: ``from_json`` and
    ``to_json``, the ``extra`` keys and the keys it was read from (both keyword-only,
    after the fields).

    ``JSON_PARSE`` names the parser of a field whose value is not plain JSON (a nested
    section, a list of them); ``JSON_ALWAYS`` the keys written back even when absent.
    """

    extra: JsonObject = dataclasses.field(default_factory=dict, repr=False, kw_only=True)
    json_keys: tuple[str, ...] | None = dataclasses.field(
        default=None, repr=False, compare=False, kw_only=True, metadata={NOT_JSON: True}
    )
    #: read from a JSON null (a section an older record left null): written as null
    json_null: bool = dataclasses.field(
        default=False, repr=False, compare=False, kw_only=True, metadata={NOT_JSON: True}
    )

    JSON_PARSE: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}
    JSON_ALWAYS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_json(cls: type[J], data: Any) -> J:
        return from_fields(cls, data, cls.JSON_PARSE, cls.JSON_ALWAYS)

    def to_json(self) -> Any:
        return to_fields(self)

    def read_empty(self) -> bool:
        """Whether it was read from an empty JSON object (``{}``: nothing said)."""
        return self.json_keys == ()


def parse_object(item: Callable[[Any], T]) -> Callable[[Any], T | None]:
    """A parser of a JSON object that may be null or absent (None then)."""
    return lambda data: item(data) if isinstance(data, dict) else None


@dataclasses.dataclass
class ObjectOrBare(JsonFields):
    """A list item that is a JSON object in this version's records and a bare value (a
    name, a sentence) in older ones: ``bare`` keeps that value, written back as it was."""

    bare: Any = dataclasses.field(default=None, kw_only=True, metadata={NOT_JSON: True})
    is_bare: bool = dataclasses.field(default=False, kw_only=True, metadata={NOT_JSON: True})

    @classmethod
    def from_json(cls: type[B], data: Any) -> B:
        if isinstance(data, dict):
            return from_fields(cls, data, cls.JSON_PARSE, cls.JSON_ALWAYS)
        return cls(bare=data, is_bare=True)

    def to_json(self) -> Any:
        return self.bare if self.is_bare else to_fields(self)
