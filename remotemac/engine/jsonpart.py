"""Dataclasses for the JSON objects the laptop reads and writes back unchanged.

Why its own module: phase results (engine/phaseresults.py), the agent's answers kept
in them, the drift log, the cleanup's plan and the record's inputs are all JSON objects
read field by field. Each becomes a :class:`JsonPart`: named, typed fields that a
checker sees, and a ``from_json``/``to_json`` pair at the edge that keeps the object's
keys (in order, a ``null`` as written, an unknown key in ``extra``), so what was read
is written back byte for byte and an older or newer writer's object still reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from remotemac.agent.protocol import JsonObject


def plain(value: Any) -> Any:
    """The JSON form of a field's value: parts as their ``to_json``, lists and dicts of
    parts likewise (a plain value is returned as it is)."""
    if isinstance(value, JsonPart):
        return value.to_json()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict) and any(isinstance(v, JsonPart) for v in value.values()):
        return {k: plain(v) for k, v in value.items()}
    return value


def read_parts(obj: Any) -> None:
    """Turn the JSON objects of ``obj``'s part fields into their dataclasses, in place.

    ``PARTS`` names a field whose value is one part (or a list of them), ``PART_MAPS``
    one whose value maps names to parts. A value already typed, or not an object (a
    ``null``, or a row of a version that wrote something else there), is left as it is."""
    for name, cls in obj.PARTS.items():
        value = getattr(obj, name)
        if isinstance(value, dict):
            setattr(obj, name, cls.from_json(value))
        elif isinstance(value, list):
            setattr(obj, name, [cls.from_json(v) if isinstance(v, dict) else v for v in value])
    for name, cls in obj.PART_MAPS.items():
        value = getattr(obj, name)
        if isinstance(value, dict):
            setattr(
                obj,
                name,
                {k: cls.from_json(v) if isinstance(v, dict) else v for k, v in value.items()},
            )


@dataclass(kw_only=True)
class JsonPart:
    """A part of a phase result (or of an agent's answer kept in one), with its JSON
    form key for key.

    Why the key list: such an object had only the keys its code path wrote (a sync
    without data has five, a row of an older version or a test fewer), so an absent
    key and a key written as ``null`` both exist in journals. ``from_json`` keeps the
    object's keys in order and ``to_json`` writes back exactly those; a part built
    here writes every field (those in ``OMIT_NONE`` only when set). A key with no field
    goes to ``extra``. A field defaults to what its readers took a missing key for
    (``.get``: None; the paths every reader needs: empty); defaults are never written.
    """

    extra: JsonObject = field(default_factory=dict, repr=False)
    #: the keys of the object this part was read from, in order (None: built here)
    row_keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {}
    PART_MAPS: ClassVar[Mapping[str, type[JsonPart]]] = {}

    def __post_init__(self) -> None:
        read_parts(self)

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "row_keys")]

    def to_json(self) -> JsonObject:
        names = self._names()
        if self.row_keys is None:
            order = [n for n in names if not (n in self.OMIT_NONE and getattr(self, n) is None)]
        else:
            order = list(self.row_keys)
            # set after the part was read (the sync's dead-man job): appended, as before
            order += [n for n in self.OMIT_NONE if n not in order and getattr(self, n) is not None]
        out: JsonObject = {}
        for name in order:
            if name in names:
                out[name] = plain(getattr(self, name))
            elif name in self.extra:
                out[name] = self.extra[name]
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    def to_dict(self) -> JsonObject:
        return self.to_json()

    @classmethod
    def from_json(cls, data: JsonObject | Self) -> Self:
        """A part from its JSON object (a part already typed is returned as is)."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        names = set(cls._names())
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra, row_keys=tuple(data))

    @classmethod
    def from_dict(cls, data: JsonObject | Self) -> Self:
        return cls.from_json(data)

    @classmethod
    def with_keys(cls, **values: Any) -> Self:
        """A part that writes exactly these keys, in this order (as a dict literal did)."""
        return cls.from_json(values)

    def but(self, **changes: Any) -> Self:
        """This part with some keys set: a key it had keeps its place, a new one comes
        last (what ``dict(part, key=value)`` did to the JSON object)."""
        return type(self).from_json({**self.to_json(), **changes})

    @classmethod
    def empty(cls) -> Self:
        """A part read from ``{}``: every field its default, and nothing written back."""
        return cls.from_json({})

    @classmethod
    def maybe(cls, data: JsonObject | Self | None) -> Self | None:
        """``from_json`` of an optional object (an agent's answer that may be None)."""
        return None if data is None else cls.from_json(data)


def json_of(part: JsonPart | None) -> JsonObject | None:
    """The JSON form of an optional part (None stays None)."""
    return None if part is None else part.to_json()
