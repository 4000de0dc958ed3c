"""Maps the top-level folders onto the one import package `tokentrace`.

`instrumentation/`, `collector/`, `analyzer/` and `web/` import as
`tokentrace.instrumentation` etc.  Sub-packages are discovered here so that
adding a folder with an `__init__.py` needs no packaging change.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = {
    "tokentrace": "tokentrace",
    "tokentrace.instrumentation": "instrumentation",
    "tokentrace.collector": "collector",
    "tokentrace.analyzer": "analyzer",
    "tokentrace.web": "web",
}


def _discover() -> tuple[list[str], dict[str, str]]:
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for package, folder in FOLDERS.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            name = ".".join([package, *rel.parts]) if rel.parts else package
            packages.append(name)
            package_dir[name] = str(Path(folder, *rel.parts))
    return packages, package_dir


packages, package_dir = _discover()
setup(packages=packages, package_dir=package_dir)
