"""`locate`: the one rule by which a key names an entry, `"collection.name"` or a
bare `name` (logs, history, monitors)."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["locate"]


def locate(
    keys: Iterable[tuple[str, str]], key: str, where: str
) -> tuple[str, str] | None:
    """The `(collection, name)` among `keys` that `key` names, or None if absent.

    The one lookup rule of ciclo (logs, history, monitors): `key` is
    `"collection.name"` or a bare `name`; a bare name found in several collections
    is an error naming them all.

    Raises:
        ValueError: for a bare name that lives in several collections.

    Example:
        >>> from ciclo._locate import locate
        >>> locate([("losses", "l"), ("metrics", "acc")], "acc", "logs")
        ('metrics', 'acc')
    """
    collection, sep, name = key.partition(".")
    if sep:
        return (collection, name) if (collection, name) in set(keys) else None
    found = [(c, n) for c, n in keys if n == key]
    if len(found) > 1:
        options = ", ".join(f"'{c}.{n}'" for c, n in found)
        raise ValueError(
            f"Entry {key!r} is ambiguous in {where}: it is in collections "
            f"{[c for c, _ in found]}. Use one of {options}."
        )
    return found[0] if found else None
