"""A small unit-conversion library: what the example's MCP server (units_server.py) serves.

Exact arithmetic (fractions), so a result is the same text every time: the env's solver writes
its demonstrations from the same function the server runs.
"""

from __future__ import annotations

from fractions import Fraction

# unit -> (dimension, size in the dimension's base unit)
UNITS: dict[str, tuple[str, Fraction]] = {
    "second": ("time", Fraction(1)), "minute": ("time", Fraction(60)), "hour": ("time", Fraction(3600)),
    "day": ("time", Fraction(86400)), "week": ("time", Fraction(604800)),
    "millimeter": ("length", Fraction(1, 1000)), "centimeter": ("length", Fraction(1, 100)),
    "meter": ("length", Fraction(1)), "kilometer": ("length", Fraction(1000)),
    "inch": ("length", Fraction(254, 10000)), "foot": ("length", Fraction(3048, 10000)),
    "yard": ("length", Fraction(9144, 10000)), "mile": ("length", Fraction(1609344, 1000)),
    "gram": ("mass", Fraction(1)), "kilogram": ("mass", Fraction(1000)), "tonne": ("mass", Fraction(1000000)),
    "ounce": ("mass", Fraction(28349523125, 10**9)), "pound": ("mass", Fraction(45359237, 10**5)),
    "milliliter": ("volume", Fraction(1, 1000)), "liter": ("volume", Fraction(1)),
}
PLURALS = {"foot": "feet", "inch": "inches"}
ABBREVIATIONS = {"s": "second", "sec": "second", "min": "minute", "h": "hour", "hr": "hour", "d": "day",
                 "mm": "millimeter", "cm": "centimeter", "m": "meter", "km": "kilometer", "in": "inch",
                 "ft": "foot", "yd": "yard", "mi": "mile", "g": "gram", "kg": "kilogram", "t": "tonne",
                 "oz": "ounce", "lb": "pound", "ml": "milliliter", "l": "liter"}


def plural(unit: str) -> str:
    """`hour` -> `hours`, `foot` -> `feet`."""
    return PLURALS.get(unit, unit + "s")


_NAMES = {**ABBREVIATIONS, **{u: u for u in UNITS}, **{plural(u): u for u in UNITS},
          **{u.replace("meter", "metre"): u for u in UNITS if "meter" in u},
          **{plural(u).replace("meter", "metre"): u for u in UNITS if "meter" in u},
          **{"litre": "liter", "litres": "liter", "millilitre": "milliliter", "millilitres": "milliliter"}}


def unit_of(name: str) -> str:
    """The canonical unit a name means (`Hours`, `hr`, `h` -> `hour`); ValueError when unknown."""
    unit = _NAMES.get(name.strip().lower())
    if unit is None:
        raise ValueError(f"unknown unit {name!r}; known units: {', '.join(UNITS)}")
    return unit


def number_text(x: Fraction | int | float) -> str:
    """An exact integer as digits (`180`), anything else to 6 significant digits (`0.0833333`)."""
    x = Fraction(x)
    if x.denominator == 1:
        return str(x.numerator)
    return format(float(x), ".6g")


def convert_value(value: float, from_unit: str, to_unit: str) -> Fraction:
    """`value` in `from_unit`, expressed in `to_unit`, exactly."""
    a, b = unit_of(from_unit), unit_of(to_unit)
    if UNITS[a][0] != UNITS[b][0]:
        raise ValueError(f"cannot convert {plural(a)} ({UNITS[a][0]}) to {plural(b)} ({UNITS[b][0]})")
    return Fraction(value) * UNITS[a][1] / UNITS[b][1]


def convert_text(value: float, from_unit: str, to_unit: str) -> str:
    """The server's answer: `3 hours = 180 minutes`."""
    result = convert_value(value, from_unit, to_unit)
    return f"{number_text(value)} {plural(unit_of(from_unit))} = {number_text(result)} {plural(unit_of(to_unit))}"
