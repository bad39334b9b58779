"""docs/api.md (the public API) and docs/developer.md (the internals) are generated from the
docstrings and signatures (scripts/gen_api_docs.py): they must be up to date, so that neither
reference can drift from the code.

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


def test_api_docs_hold_the_public_surface_and_developer_docs_the_internals():
    """The inspection methods users are told to call are documented in api.md (under NGDOptimizer,
    linked from each optimizer); the planning internals only in developer.md."""
    root = _repo_root()
    with open(os.path.join(root, "docs", "api.md"), encoding="utf-8") as handle:
        api = handle.read()
    with open(os.path.join(root, "docs", "developer.md"), encoding="utf-8") as handle:
        developer = handle.read()
    for method in ("summary", "parallel_state", "demoted_layers", "state_counters", "factor_updates"):
        assert f"#### `mindspore_ngd.NGDOptimizer.{method}`" in api, method
        for cls in ("KFAC", "SPNGD", "THOR"):
            section = api.split(f"### `mindspore_ngd.{cls}`", 1)[1].split("\n### ", 1)[0]
            assert f"(#mindspore_ngdngdoptimizer{method})" in section, (cls, method)
    assert "Inspection." not in api
    for name in _generator(root).INTERNAL["mindspore_ngd.parallel"]:
        assert f"### `mindspore_ngd.parallel.{name}`" in developer, name
        assert f"### `mindspore_ngd.parallel.{name}`" not in api, name


def test_defaults_that_differ_are_tabled_with_a_reason(monkeypatch, tmp_path_factory):
    """Every argument shared by KFAC, SPNGD and THOR with differing defaults has a row (and a reason);
    generation refuses a difference without one."""
    import inspect

    import pytest

    import mindspore_ngd as ngd
    from mindspore_ngd.optim import argdocs

    signatures = [inspect.signature(cls.__init__).parameters for cls in (ngd.KFAC, ngd.SPNGD, ngd.THOR)]
    shared = [n for n in signatures[0] if n != "self" and all(n in s for s in signatures[1:])]
    differing = {n for n in shared if len({repr(s[n].default) for s in signatures}) > 1}
    assert differing == set(argdocs.DEFAULT_DIFFERENCES)
    with open(os.path.join(_repo_root(), "docs", "api.md"), encoding="utf-8") as handle:
        text = handle.read()
    for name in differing:
        assert f"| `{name}` |" in text, name
    generator = _generator(_repo_root())
    reasons = dict(argdocs.DEFAULT_DIFFERENCES)
    reasons.pop("split_dim")
    monkeypatch.setattr(argdocs, "DEFAULT_DIFFERENCES", reasons)
    with pytest.raises(ValueError, match=r"no reason for \['split_dim'\]"):
        generator.render()
    # and writing refuses before it opens a file: the pages already there are left whole
    root = tmp_path_factory.mktemp("docs_root")
    os.makedirs(root / "docs")
    for relative in ("api.md", "developer.md"):
        (root / "docs" / relative).write_text("kept\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no reason for"):
        generator.write(str(root))
    for relative in ("api.md", "developer.md"):
        assert (root / "docs" / relative).read_text(encoding="utf-8") == "kept\n"
