"""Measured operator times (``soapbox.profile/1``): FlexFlow's "measure each distinct operator
once" (Jia et al. SysML'19 §5.1), the table :class:`engine.costs.model.CostModel` reads before
its roofline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["ProfileTable"]


@dataclass
class ProfileTable:
    """Measured operator times, ``soapbox.profile/1``.

    Entries are keyed by (kind, partition input/output/param shapes, precision, device type)
    and hold forward and backward seconds. A profile file is JSON::

        {"format": "soapbox.profile/1",
         "entries": [{"kind": "linear", "inputs": [[8, 1024]], "outputs": [[8, 4096]],
                      "params": [[4096, 1024], [4096]], "precision": "fp16",
                      "device_type": "A100-SXM4-80GB", "fwd_s": 1.2e-5, "bwd_s": 2.5e-5}]}
    """

    entries: dict[tuple, tuple[float, float]] = field(default_factory=dict)

    @staticmethod
    def key(kind: str, ins: Sequence[Sequence[int]], outs: Sequence[Sequence[int]],
            params: Sequence[Sequence[int]], precision: str, device_type: str) -> tuple:
        return (kind, tuple(map(tuple, ins)), tuple(map(tuple, outs)), tuple(map(tuple, params)),
                precision, device_type)

    def add(self, kind: str, ins, outs, params, precision: str, device_type: str, fwd_s: float,
            bwd_s: float) -> None:
        self.entries[self.key(kind, ins, outs, params, precision, device_type)] = (float(fwd_s), float(bwd_s))

    def get(self, key: tuple) -> tuple[float, float] | None:
        return self.entries.get(key)

    def __len__(self) -> int:
        return len(self.entries)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "soapbox.profile/1", "entries": [
            {"kind": k[0], "inputs": [list(s) for s in k[1]], "outputs": [list(s) for s in k[2]],
             "params": [list(s) for s in k[3]], "precision": k[4], "device_type": k[5], "fwd_s": v[0], "bwd_s": v[1]}
            for k, v in self.entries.items()]}

    @classmethod
    def from_checked(cls, data: Mapping[str, Any]) -> "ProfileTable":
        """The table of a schema-checked ``soapbox.profile/1`` mapping (load files with
        :func:`engine.formats.load_profile`, which checks them first)."""
        table = cls()
        for e in data["entries"]:
            table.add(e["kind"], e["inputs"], e["outputs"], e.get("params", []), e["precision"], e["device_type"],
                      e["fwd_s"], e["bwd_s"])
        return table
