"""docs/api.md is generated from the docstrings and signatures (scripts/gen_api_docs.py): it must be
up to date, so that the API reference cannot drift from the code.

If this fails after a change to a public signature or docstring, regenerate the file:

    python scripts/gen_api_docs.py
"""
import importlib.util
import os


def _repo_root():
    """The nearest directory above this file that holds scripts/gen_api_docs.py (so the test works
    from any working directory and from any sub-folder of tests/)."""
    here = os.path.dirname(os.path.abspath(__file__))
    while True:
        if os.path.isfile(os.path.join(here, "scripts", "gen_api_docs.py")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            raise FileNotFoundError("scripts/gen_api_docs.py not found above " + os.path.abspath(__file__))
        here = parent


def _generator(root):
    path = os.path.join(root, "scripts", "gen_api_docs.py")
    spec = importlib.util.spec_from_file_location("_gen_api_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_docs_are_up_to_date():
    root = _repo_root()
    ok, message = _generator(root).check(root)
    assert ok, message


def test_api_docs_cover_the_public_names():
    import mindspore_ngd

    root = _repo_root()
    with open(os.path.join(root, "docs", "api.md"), encoding="utf-8") as handle:
        text = handle.read()
    for name in mindspore_ngd.__all__:
        assert f"### `mindspore_ngd.{name}`" in text, name
