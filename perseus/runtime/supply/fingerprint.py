"""A model's fingerprint: what the cache key holds so that a changed model misses the cache.

A profile measures one model; reused for another it plans wrong clocks. So the adapters describe
the model they see with these helpers, and the runtime hashes the description into its cache key
(``sources.cache_key``): the job-wide ingredients (layer specs, Megatron's arguments) go in
``PipelineJob.model_config`` as readable values, and each stage's parameters (names, shapes,
dtypes) as ``PipelineJob.stage_fingerprint``, which rank 0 gathers from every rank
(``sources.stage_models``), because a stage's parameters live on its own ranks only.

Everything here is duck-typed (never imports torch) and deterministic across processes: no
memory address, no ``id()``, no set order. A key that changed between two runs of the same model
would miss every time, which costs a profile; one that did not change for another model serves
the wrong plan, which costs training time. The second is worse, so unknown objects are described
by their ``repr`` (addresses removed), not ignored.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import json
import re
import weakref
from typing import Any, Iterable, Mapping

# The cache key's layout version: raised when what the key holds changes, so entries written
# under another layout are never mistaken for this one (they live in other hash directories).
KEY_VERSION = 3

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MAX_DEPTH = 8
_MEMO: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def value_digest(value: Any) -> str:
    """Short stable hash (16 hex digits of sha256) of ``describe_value(value)``."""
    text = json.dumps(describe_value(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parameter_signature(module: Any) -> list[list[Any]]:
    """``[name, shape, dtype]`` of each of a module's parameters, in its own order."""
    return [[str(name), [int(d) for d in p.shape], str(p.dtype)] for name, p in module.named_parameters()]


def module_digest(module: Any) -> str:
    """``value_digest`` of a module's parameter signature, memoized per module object: Megatron's
    adapter builds its job at every step, and parameter shapes do not change after construction."""
    try:
        return _MEMO[module]
    except (KeyError, TypeError):
        pass
    found = value_digest(parameter_signature(module))
    try:
        _MEMO[module] = found
    except TypeError:  # not weak-referenceable: computed each time
        pass
    return found


def stage_fingerprint(modules: Iterable[Any]) -> str:
    """The fingerprint of one rank's stage: every parameter's name, shape and dtype of ``modules``
    (its model chunks, in order). Goes in ``PipelineJob.stage_fingerprint``."""
    return value_digest([module_digest(m) for m in modules])


def is_module(value: Any) -> bool:
    """A module instance (torch ``nn.Module`` or anything with ``named_parameters()``), not its class."""
    return not isinstance(value, type) and callable(getattr(value, "named_parameters", None))


def describe_value(value: Any, depth: int = 0) -> Any:
    """A JSON-able description of ``value`` that is equal for equal models across processes.

    Modules: their class and parameter signature; tensors: shape and dtype; classes and functions:
    their qualified name; containers: their items; anything else: its repr without addresses."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if depth > _MAX_DEPTH:
        return _clean_repr(value)
    if is_module(value):
        return {"module": qualified_name(type(value)), "parameters": parameter_signature(value)}
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type):
        return {"tensor": [int(d) for d in value.shape], "dtype": str(value.dtype)}
    if isinstance(value, Mapping):
        return {str(k): describe_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [describe_value(v, depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((describe_value(v, depth + 1) for v in value), key=lambda d: json.dumps(d, sort_keys=True))
    if isinstance(value, functools.partial):
        return {"partial": describe_value(value.func, depth + 1), "args": describe_value(value.args, depth + 1),
                "kwargs": describe_value(value.keywords, depth + 1)}
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return qualified_name(value)
    return _clean_repr(value)


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class or function (lambdas are ``module.<lambda>``)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _clean_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not stop training
        text = type(value).__qualname__
    return _ADDRESS.sub("", text)
