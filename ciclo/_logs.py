"""`Logs`: a pytree dict of collections (`losses`, `metrics`, ...) to dicts of entries.

Past 300 lines: the one class, its pytree registration (which reads its declared
modes) and the per-step paths written out inline on purpose (`add_metric`,
`add_loss`, `merge`'s fast path, `logs()` without `__init__`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from ciclo._entries import (
    Declared,
    Entries,
    flatten_dict,
    flatten_dict_fast,
    unflatten_dict,
)
from ciclo._locate import locate
from ciclo._short import short

__all__ = ["Logs", "logs"]

LOSSES = "losses"
METRICS = "metrics"
STATEFUL_METRICS = "stateful_metrics"
OUTPUTS = "outputs"
# The collections bars and writers show by default, by bare entry name; a name
# logged in several of them (`add_loss(..., add_metric=True)`) is shown once.
SHOWN_COLLECTIONS = (LOSSES, METRICS, STATEFUL_METRICS)
# A step's total sample weight, when its batch carries `sample_weight`: the
# weight of that step in a weighted mean (instead of its row count). Flax states'
# test steps log it; any step may.
WEIGHTS, SAMPLE_WEIGHT = "weights", "sample_weight"

# The aggregation modes a step can declare for an entry it logs (those of
# `ciclo.inner_loop` and `train_loop(epoch_logs=...)`).
MODES = ("last", "first", "mean", "weighted_mean", "sum", "min", "max", "std", "concat")


def _check_mode(mode: Any, collection: str, name: str, hint: str = "") -> None:
    if mode not in MODES:
        raise ValueError(
            f"Logs: `aggregation` of {collection}.{name} must be one of {list(MODES)} "
            f"(how train_loop(epoch_logs=...) aggregates the entry over an epoch), "
            f"got {short(mode)}.{hint}"
        )


def _checked_items(
    values: Mapping[str, Any] | None,
    kwargs: dict[str, Any],
    aggregation: str | None,
    collection: str,
    method: str,
) -> list[tuple[str, Any]]:
    """The entries a plural adder adds, after checking its `aggregation` (nothing
    is added when it is unknown)."""
    items = list({**(values or {}), **kwargs}.items())
    if aggregation is not None and aggregation not in MODES:
        names = ", ".join(name for name, _ in items)
        _check_mode(
            aggregation,
            collection,
            names if len(items) == 1 else f"{{{names}}}",
            f" `aggregation` is a reserved keyword of {method}: to log an entry "
            f"named 'aggregation', pass it in the dict form, "
            f"{method}({{'aggregation': value}}).",
        )
    return items


class Logs(dict):
    """What a step reports: a dict of collections to dicts of entries; a JAX pytree.

    Collections are any names; `losses`, `metrics`, `stateful_metrics` and
    `outputs` have helper methods. A `Logs` can be returned from `jax.jit`.

    Every `add_*` method takes an optional keyword-only `aggregation=` (one of
    `MODES`: `"mean"`, `"max"`, ...), declared for every entry it adds: the
    entry's default way of being aggregated wherever logs are (over an epoch by
    `train_loop(epoch_logs=...)`, by test and inner loops, across devices);
    `aggregations` reads them. The declarations are static data of the pytree
    (they survive `jax.jit`) and follow `merge`. In the plural adders
    (`add_metrics`, ...) `aggregation` is a reserved keyword: an entry named
    `"aggregation"` is passed in the dict form, `add_metrics({"aggregation": v})`.

    Example:
        >>> import ciclo
        >>> logs = ciclo.logs()
        >>> logs = logs.add_loss("loss", 0.5).add_metric("accuracy", 0.9)
        >>> logs.losses.loss, logs.entry_value("metrics.accuracy")
        (0.5, 0.9)
        >>> logs.add_metric("best", 0.9, aggregation="max").aggregations
        {('metrics', 'best'): 'max'}
        >>> ciclo.logs().add_metrics({"n": 3}, seen=4, aggregation="sum").aggregations
        {('metrics', 'n'): 'sum', ('metrics', 'seen'): 'sum'}
    """

    _aggregations: dict[tuple[str, str], str] | None = None  # declared modes

    def __init__(self, collections: Mapping[str, Mapping[str, Any]] | None = None):
        # dict.__new__ made the empty dict: no dict.__init__ call (the hot path)
        if collections:
            self.merge(collections)

    def __getattr__(self, name: str) -> Entries:
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "updates":
            raise AttributeError(
                "`Logs.updates` is write-only: `logs.updates = other`."
            )
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"Logs has no collection {name!r}; collections: {sorted(self)}."
            ) from None

    # -- adding -------------------------------------------------------------------
    def add_entry(
        self, collection: str, name: str, value: Any, *, aggregation: str | None = None
    ) -> Logs:
        """Sets `self[collection][name] = value`; returns this `Logs` (calls chain).
        `aggregation`: the entry's declared mode (see the class docstring)."""
        if aggregation is not None:  # checked first: nothing added if unknown
            self._declare(collection, name, aggregation)
        entries = self.get(collection)
        if entries is None:
            entries = self[collection] = Entries()
        entries[name] = value
        return self

    @property
    def aggregations(self) -> dict[tuple[str, str], str]:
        """The declared modes: `(collection, name) -> mode` (a copy)."""
        return dict(self._aggregations or {})

    def _declare(self, collection: str, name: str, mode: str) -> None:
        _check_mode(mode, collection, name)
        self._aggregations = {**(self._aggregations or {}), (collection, name): mode}

    def add_entries(
        self,
        collection: str,
        values: Mapping[str, Any] | None = None,
        /,
        *,
        aggregation: str | None = None,
        **kwargs: Any,
    ) -> Logs:
        """Adds several entries to `collection`, from a mapping and/or keywords.

        Args:
            collection: the collection the entries go to.
            values: entries `name -> value` (the form for an entry named
                `"aggregation"`, a reserved keyword here).
            aggregation: the declared mode of every entry added (see the class
                docstring); None declares nothing.
            **kwargs: more entries `name=value`.

        Returns:
            This `Logs` (calls chain).

        Raises:
            ValueError: if `aggregation` is not one of `MODES` (nothing is added).
        """
        return self._add_many(collection, values, kwargs, aggregation, "add_entries")

    def _add_many(
        self,
        collection: str,
        values: Mapping[str, Any] | None,
        kwargs: dict[str, Any],
        aggregation: str | None,
        method: str,
    ) -> Logs:
        items = _checked_items(values, kwargs, aggregation, collection, method)
        for name, value in items:
            self.add_entry(collection, name, value, aggregation=aggregation)
        return self

    def add_metric(
        self, name: str, value: Any, *, aggregation: str | None = None
    ) -> Logs:
        """Adds `value` to the `metrics` collection (`aggregation`: its declared
        mode)."""
        if aggregation is not None:  # checked first: nothing added if unknown
            self._declare(METRICS, name, aggregation)
        entries = self.get(METRICS)  # add_entry, inlined: called every step
        if entries is None:
            entries = self[METRICS] = Entries()
        entries[name] = value
        return self

    def add_metrics(
        self,
        values: Mapping[str, Any] | None = None,
        /,
        *,
        aggregation: str | None = None,
        **kwargs: Any,
    ) -> Logs:
        """Adds several entries to the `metrics` collection (as `add_entries`:
        `aggregation` declared for each; an entry named `"aggregation"` goes in
        the dict form)."""
        return self._add_many(METRICS, values, kwargs, aggregation, "add_metrics")

    def add_loss(
        self,
        name: str,
        value: Any,
        *,
        add_metric: bool = False,
        aggregation: str | None = None,
    ) -> Logs:
        """Adds `value` to `losses` (and to `metrics` too with `add_metric=True`;
        `aggregation`: its declared mode, in both)."""
        if aggregation is not None:  # checked first: nothing added if unknown
            self._declare(LOSSES, name, aggregation)
        entries = self.get(LOSSES)  # add_entry, inlined: called every step
        if entries is None:
            entries = self[LOSSES] = Entries()
        entries[name] = value
        if add_metric:
            return self.add_entry(METRICS, name, value, aggregation=aggregation)
        return self

    def add_losses(
        self,
        values: Mapping[str, Any] | None = None,
        /,
        *,
        add_metrics: bool = False,
        aggregation: str | None = None,
        **kwargs: Any,
    ) -> Logs:
        """Adds several entries to the `losses` collection (and to `metrics` too
        with `add_metrics=True`).

        Args:
            values: entries `name -> value` (the form for an entry named
                `"aggregation"` or `"add_metrics"`, reserved keywords here).
            add_metrics: also add each entry to `metrics`.
            aggregation: the declared mode of every entry added, in both
                collections (see the class docstring); None declares nothing.
            **kwargs: more entries `name=value`.

        Returns:
            This `Logs` (calls chain).

        Raises:
            ValueError: if `aggregation` is not one of `MODES` (nothing is added).
        """
        items = _checked_items(values, kwargs, aggregation, LOSSES, "add_losses")
        for name, value in items:
            self.add_loss(name, value, add_metric=add_metrics, aggregation=aggregation)
        return self

    def add_stateful_metric(
        self, name: str, value: Any, *, aggregation: str | None = None
    ) -> Logs:
        """Adds `value` to the `stateful_metrics` collection (`aggregation`: its
        declared mode)."""
        return self.add_entry(STATEFUL_METRICS, name, value, aggregation=aggregation)

    def add_stateful_metrics(
        self,
        values: Mapping[str, Any] | None = None,
        /,
        *,
        aggregation: str | None = None,
        **kwargs: Any,
    ) -> Logs:
        """Adds several entries to `stateful_metrics` (as `add_entries`:
        `aggregation` declared for each; an entry named `"aggregation"` goes in
        the dict form)."""
        return self._add_many(
            STATEFUL_METRICS, values, kwargs, aggregation, "add_stateful_metrics"
        )

    def add_output(
        self, name: str, value: Any, *, aggregation: str | None = None
    ) -> Logs:
        """Adds `value` to the `outputs` collection (`aggregation`: its declared
        mode, e.g. `"concat"`)."""
        return self.add_entry(OUTPUTS, name, value, aggregation=aggregation)

    def add_outputs(
        self,
        values: Mapping[str, Any] | None = None,
        /,
        *,
        aggregation: str | None = None,
        **kwargs: Any,
    ) -> Logs:
        """Adds several entries to the `outputs` collection (as `add_entries`:
        `aggregation` declared for each; an entry named `"aggregation"` goes in
        the dict form)."""
        return self._add_many(OUTPUTS, values, kwargs, aggregation, "add_outputs")

    # -- combining ----------------------------------------------------------------
    def merge(self, other: Mapping[str, Mapping[str, Any]] | None) -> Logs:
        """Merges `other` into this `Logs` in place (entries of `other` win); returns self.

        Raises:
            TypeError: if `other` is not a mapping of collections to mappings.
        """
        if other is None:
            return self
        declared = getattr(other, "_aggregations", None)
        if declared:
            self._aggregations = {**(self._aggregations or {}), **declared}
        if type(other) is Logs:  # the hot path: a Logs built with add_*
            for collection, entries in other.items():
                if type(entries) is not Entries:
                    break
                target = self.get(collection)
                if target is None:
                    self[collection] = Entries(entries)
                else:
                    target.update(entries)
            else:
                return self
        if not isinstance(other, Mapping):
            raise TypeError(
                f"Can only merge a Logs or a dict of collections, got "
                f"{type(other).__name__}."
            )
        for collection, entries in other.items():
            if not isinstance(entries, Mapping):
                raise TypeError(
                    f"Collection {collection!r} must map entry names to values, "
                    f"got {type(entries).__name__}: {short(entries, 80)}. Use "
                    f"logs.add_entry({collection!r}, name, value)."
                )
        for collection, entries in other.items():
            target = self.get(collection)
            if target is None:
                self[collection] = Entries(entries)
            else:
                target.update(entries)
        return self

    def _set_updates(self, other: Mapping[str, Mapping[str, Any]] | None) -> None:
        self.merge(other)

    updates = property(
        None, _set_updates, doc="Write-only: `logs.updates = other` merges `other`."
    )

    # -- reading ------------------------------------------------------------------
    def entries(self) -> Iterator[tuple[str, str, Any]]:
        """Iterates `(collection, name, value)` over every entry."""
        for collection, values in self.items():
            for name, value in values.items():
                yield collection, name, value

    def entry_value(self, name: str) -> Any:
        """The value of entry `name` (bare) or `"collection.name"`.

        Raises:
            KeyError: if no such entry exists (the message lists the entries).
            ValueError: if a bare name lives in several collections.
        """
        key = locate(self._pairs(), name, "these logs")
        if key is None:
            raise KeyError(
                f"No entry {name!r} in these logs; entries: {self._names()}."
            )
        return self[key[0]][key[1]]

    def _pairs(self) -> list[tuple[str, str]]:
        """Every `(collection, name)` pair, in insertion order."""
        return [(c, n) for c, values in self.items() for n in values]

    def _names(self) -> list[str]:
        return [f"{c}.{n}" for c, n, _ in self.entries()]


def same_entries(rows: list[Any]) -> list[tuple[str, str, list[Any]]] | None:
    """`(collection, name, values)` per entry when every logs of `rows` holds the
    same entries (values in `rows`' order), else None. Checked and gathered
    with C-level passes (no bytecode per logs): what the History's commits and
    the loop's accumulated logs take many logs at once with."""
    first = rows[0]
    if len(set(map(len, rows))) != 1:
        return None
    out = []
    try:
        for collection, entries in first.items():
            per_row = list(map(operator.itemgetter(collection), rows))
            if len(set(map(len, per_row))) != 1:
                return None
            for name in entries:
                out.append(
                    (collection, name, list(map(operator.itemgetter(name), per_row)))
                )
    except (KeyError, TypeError):  # a logs without one of them, or not a mapping
        return None
    return out


def logs(collections: Mapping[str, Mapping[str, Any]] | None = None) -> Logs:
    """Creates an empty `Logs` (or one holding a copy of `collections`).

    Example:
        >>> import ciclo
        >>> logs = ciclo.logs()
        >>> dict(logs.add_metrics(accuracy=0.9).metrics)
        {'accuracy': 0.9}
    """
    if collections is None:  # every step of most callbacks: no __init__ call
        return _new_logs(Logs)
    return Logs(collections)


_new_logs = Logs.__new__


def _flatten_logs(d: Logs):
    children, keys = flatten_dict(d)
    declared = d._aggregations
    return children, keys if not declared else Declared((keys, tuple(declared.items())))


def _flatten_logs_fast(d: Logs):
    children, keys = flatten_dict_fast(d)
    declared = d._aggregations
    return children, keys if not declared else Declared((keys, tuple(declared.items())))


jax.tree_util.register_pytree_with_keys(
    Logs, _flatten_logs, unflatten_dict(Logs), _flatten_logs_fast
)
