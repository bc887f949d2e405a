"""Packages of the attnlens wheel (metadata: pyproject.toml).

The repository keeps one top-level folder per floor (kernels/, hooked_models/, interp/,
dashboards/) beside the production line (attnlens/); installed, wheel or editable, they are the
subpackages `attnlens.kernels`, `attnlens.hooked_models`, `attnlens.interp` and
`attnlens.dashboards`, so nothing but `attnlens` lands at the top of site-packages. The bundled
models are not in this wheel: they are the `attnlens-zoo` distribution (scripts/build_zoo_wheel.py).
"""

from setuptools import find_packages, setup

FLOORS = ("kernels", "hooked_models", "interp", "dashboards")


def namespace_packages() -> tuple[list[str], dict[str, str]]:
    packages = find_packages(include=["attnlens", "attnlens.*"])
    package_dir = {"attnlens": "attnlens"}
    for floor in FLOORS:
        found = find_packages(include=[floor, f"{floor}.*"])
        packages += [f"attnlens.{p}" for p in found]
        package_dir[f"attnlens.{floor}"] = floor
    return sorted(packages), package_dir


packages, package_dir = namespace_packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "attnlens.lab": ["package_pins.json"],
        "attnlens.kernels": ["tuned_configs.json"],
        "attnlens.dashboards": ["assets/*.js", "assets/*.css"],
    },
    include_package_data=False,
)
