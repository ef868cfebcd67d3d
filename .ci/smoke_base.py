"""Run in a venv holding only the base wheel: the producer imports, missing extras are named."""

import importlib.util

import echomq

assert importlib.util.find_spec("sqlalchemy") is None, "the base install pulled in sqlalchemy"
assert importlib.util.find_spec("psutil") is None, "the base install pulled in psutil"
assert echomq.Queue("smoke").name == "smoke"
for module, extra in (("echomq.supervisor", "supervisor"), ("echomq.floor", "floor")):
    try:
        importlib.import_module(module)
    except echomq.MissingExtra as exc:
        assert f"pip install 'echomq[{extra}]'" in str(exc), exc
    else:
        raise AssertionError(f"{module} imported without its extra")
print("smoke: base install imports; missing extras are named")
