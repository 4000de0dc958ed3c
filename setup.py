"""Maps the top-level folders onto the one import package `tokentrace`.

`app/` is the package itself (`tokentrace`: the command line and the composition
root); `instrumentation/`, `collector/`, `analyzer/`, `web/`, `store/` and
`examples/` import as `tokentrace.instrumentation` etc.  No folder is named
`tokentrace`, so a clone's root never shadows the installed package.
Sub-packages are discovered here so that adding a folder with an `__init__.py`
needs no packaging change.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
FOLDERS = {
    "tokentrace": "app",
    "tokentrace.instrumentation": "instrumentation",
    "tokentrace.collector": "collector",
    "tokentrace.analyzer": "analyzer",
    "tokentrace.web": "web",
    "tokentrace.store": "store",
    # the demo's tiny LLM server, load generator and scenarios travel with the
    # package, so `pip install tokentrace && tokentrace demo` works from a wheel
    "tokentrace.examples": "examples",
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
