"""What every fault kind is made of: the parsed :class:`Fault`, its :class:`FaultKind`
declaration, :class:`InjectError`, and the lookups of a fault's target on the simulated node.

Why it exists apart from ``inject.py``: the domain modules need these to declare their kinds,
and ``inject.py`` needs the domain modules to list them; the vocabulary sits below both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from gpu_monitor.sim.spec import GpuSpec, IbPortSpec, NodeSpec

_N = TypeVar("_N", int, float)


class InjectError(ValueError):
    """A malformed ``--inject`` spec; the message says what is wrong and what is accepted."""


@dataclass(frozen=True)
class Fault:
    kind: str
    target: str
    params: dict[str, str] = field(default_factory=dict)
    after_s: float = 0.0
    for_s: float | None = None
    text: str = ""

    def int(self, key: str, default: int | None = None) -> int:
        return self._number(key, default, lambda raw: int(raw, 0), "N", "an integer")

    def float(self, key: str, default: float | None = None) -> float:
        return self._number(key, default, float, "X", "a number")

    def _number(self, key: str, default: _N | None, convert: Callable[[str], _N],
                placeholder: str, what: str) -> _N:
        """The one reading of a numeric parameter: a missing one takes ``default`` or is refused
        (``missing key=N``), a malformed one is refused naming ``what`` it should be."""
        raw = self.params.get(key)
        if raw is None:
            if default is None:
                raise InjectError(f"{self.text}: missing {key}={placeholder}")
            return default
        try:
            return convert(raw)
        except ValueError:
            raise InjectError(f"{self.text}: {key}={raw!r} is not {what}") from None

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        raw = self.params.get(key, default)
        if raw is None:
            raise InjectError(f"{self.text}: missing {key}= (one of {', '.join(choices)})")
        if raw not in choices:
            raise InjectError(f"{self.text}: {key}={raw!r}: expected one of {', '.join(choices)}")
        return raw

    @property
    def gpu_index(self) -> int:
        return int(self.target.split(":")[1])

    @property
    def ib(self) -> tuple[str, int]:
        _, dev, port = self.target.split(":")
        return dev, int(port)


@dataclass(frozen=True)
class FaultKind:
    name: str
    target: str  # "gpu", "ib", "nvswitch", "node", "gpu or node"
    params: tuple[str, ...]
    summary: str
    apply: Callable[[NodeSpec, Fault], None]
    revert: Callable[[NodeSpec, Fault], None] | None = None
    timed: bool = False  # may use after=/for=
    example: str = ""


def fault_gpu(spec: NodeSpec, f: Fault) -> GpuSpec:
    try:
        return spec.gpu(f.gpu_index)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None


def fault_port(spec: NodeSpec, f: Fault) -> IbPortSpec:
    dev, port = f.ib
    try:
        return spec.ib_port(dev, port)
    except KeyError as exc:
        raise InjectError(f"{f.text}: {exc.args[0]}") from None
