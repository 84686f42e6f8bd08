"""Put first on PYTHONPATH by `testbed launch --profile`: loads the recorder
(testbed/launch/profile_record.py) by its path, so that it works with any Python that
has torch (the toolkit need not be importable), then runs the sitecustomize this one
hides, if any."""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_recorder() -> None:
    path = os.path.join(os.path.dirname(_HERE), "profile_record.py")
    spec = importlib.util.spec_from_file_location("_testbed_profile_record", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install()


def _chain() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != __file__:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _load_recorder()
except Exception as exc:  # noqa: BLE001 - the program runs even if the recorder cannot
    sys.stderr.write(f"testbed profile: recorder not installed: {exc}\n")
_chain()
