"""pyproject.toml's floors and constraints/floors.txt cannot drift apart.

Each runtime dependency's ``>=`` is a promise that deploy/local/test.sh checks
by installing exactly that floor (constraints/floors.txt) and running the
real-worker tests on it: a floor raised or lowered in one file and not in the
other would test a promise nobody makes.
"""

from __future__ import annotations

import tomllib
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support import ROOT

# Pinned in floors.txt without being declared: the oldest kombu the celery floor
# accepts (celery 5.5.0 wants kombu>=5.5.2,<5.6).
TRANSITIVE = {"kombu"}


def _project() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project: dict[str, Any] = tomllib.load(f)["project"]
    return project


def _floors(requirements: list[str]) -> dict[str, Version]:
    """Each requirement's name and its ``>=`` floor (one, and nothing else)."""
    floors: dict[str, Version] = {}
    for line in requirements:
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == ">=", \
            f"{line!r}: one '>=' floor and nothing else (constraints/floors.txt pins it)"
        floors[canonicalize_name(req.name)] = Version(specs[0].version)
    return floors


def _declared() -> dict[str, Version]:
    project = _project()
    return _floors([*project["dependencies"], *project["optional-dependencies"]["providers"]])


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in (ROOT / "constraints" / "floors.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert not req.extras and len(specs) == 1 and specs[0].operator == "==", \
            f"floors.txt: {line!r} is not a plain name==version pin"
        name = canonicalize_name(req.name)
        assert name not in pins, f"floors.txt pins {name} twice"
        pins[name] = Version(specs[0].version)
    return pins


def test_every_declared_floor_is_pinned_in_floors_txt() -> None:
    pins = _pins()
    wrong = {name: (str(floor), str(pins[name]) if name in pins else None)
             for name, floor in _declared().items() if pins.get(name) != floor}
    assert not wrong, f"declared floor vs floors.txt pin: {wrong}"


def test_floors_txt_pins_nothing_else_but_the_known_transitive_ones() -> None:
    extra = set(_pins()) - set(_declared()) - TRANSITIVE
    assert not extra, f"floors.txt pins undeclared packages: {sorted(extra)}"


def test_the_dev_extras_provider_sdks_have_the_providers_floors() -> None:
    project = _project()
    providers = _floors(project["optional-dependencies"]["providers"])
    dev: dict[str, str] = {canonicalize_name(Requirement(r).name): r
           for r in project["optional-dependencies"]["dev"]}
    assert _floors([dev[name] for name in providers]) == providers
