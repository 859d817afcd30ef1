"""Byte sizes as users write them (``"2GB"``, ``"512MiB"``) and as messages print them."""

from __future__ import annotations

import re

from timerl.errors import MemoryBudgetError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip


def parse_bytes(value: str | int | float) -> int:
    """``"2GB"`` (10^9), ``"512MiB"`` / ``"512M"`` (2^20), ``"1.5GB"``, or a number of bytes."""
    if isinstance(value, bool):
        raise MemoryBudgetError(
            f"memory_budget={value!r}: give bytes (int) or a size such as '2GB' or '512MiB'"
        )
    if isinstance(value, (int, float)):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise MemoryBudgetError(
                f"memory_budget={value!r} is not a size: give bytes (int) or a number with a unit "
                f"({', '.join(u for u in ('KB', 'MB', 'GB', 'KiB', 'MiB', 'GiB'))}), e.g. '2GB'"
            )
        n = float(m.group(1)) * _UNITS[unit]
    if not n > 0:
        raise MemoryBudgetError(f"memory_budget={value!r} must be positive")
    return int(n)


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"
