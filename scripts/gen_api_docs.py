"""Generate docs/api.md (the public API) and docs/developer.md (the internals) of mindspore_ngd
from its docstrings and signatures, so that neither reference can drift.

    python scripts/gen_api_docs.py            # (re)write docs/api.md and docs/developer.md
    python scripts/gen_api_docs.py --check    # exit 1, with a diff, if either is out of date

What is documented, in this order:

* docs/api.md: every name in ``mindspore_ngd.__all__``, then every name in the ``__all__`` of the
  public sub-packages listed in :data:`MODULES` that define one (a sub-package without ``__all__`` is
  skipped), each in its ``__all__`` order, except the names of :data:`INTERNAL`;
* docs/developer.md: the names of :data:`INTERNAL` (exported for the tests, the benchmarks and the
  model zoo, not for users), in the same form;
* for each name: the signature from :func:`inspect.signature` and the docstring cleaned by
  :func:`inspect.getdoc`; for a class also its public methods and properties: those defined in the
  class itself, and those it inherits from a ``mindspore_ngd`` base class that is not documented
  itself (``NGDOptimizer`` shows ``summary()``, ``parallel_state()``, ... of its ``Inspection``
  mix-in). A method inherited from a documented class is listed by name with a link to it.
  MindSpore's own ``Cell`` / ``Optimizer`` / ``Callback`` methods, and the hooks that override them
  such as ``construct``, are left out;
* after the list of modules, the table of the arguments KFAC, SPNGD and THOR all take whose defaults
  differ: defaults from the signatures, reasons from ``mindspore_ngd.optim.argdocs.DEFAULT_DIFFERENCES``
  (generation fails when an argument whose defaults differ has no reason there);
* a name exported twice (``mindspore_ngd.RefreshMonitor`` is ``mindspore_ngd.train.RefreshMonitor``)
  is documented once and linked from the second place.

Nothing is written by hand: change a docstring or a signature, then run this script. The output
is deterministic (no memory addresses, annotations normalised across Python versions), so
``--check`` compares byte for byte. The repository root is put first on ``sys.path``, so the
package documented is this repository's ``mindspore_ngd`` whether or not it is installed.
Pure Python; it imports ``mindspore_ngd`` (and so MindSpore).
"""
import argparse
import difflib
import importlib
import inspect
import os
import re
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_PATH = os.path.join("docs", "api.md")
DEVELOPER_PATH = os.path.join("docs", "developer.md")

# the package first, then its public sub-packages (documented when they define __all__)
MODULES = ("mindspore_ngd", "mindspore_ngd.schedule", "mindspore_ngd.parallel", "mindspore_ngd.train")

# names exported by a public sub-package for the package's own use (tests, benchmarks, model zoo):
# documented in docs/developer.md, not in docs/api.md
INTERNAL = {
    "mindspore_ngd.parallel": ("OwnershipPlan", "PackLayout", "WorkItem", "lpt_assign", "pack_layout",
                               "plan_ownership", "tri_size"),
}

# methods of a documented class that users do not call themselves (besides the framework hooks
# that _own_members leaves out)
SKIPPED_METHODS = {"construct"}

WRAP_WIDTH = 88

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_OPTIONAL = re.compile(r"\bUnion\[([^\[\]]+), NoneType\]")


# ---------------------------------------------------------------------- rendering helpers
def _clean(text):
    """Strip memory addresses from a repr, so that the output does not change between runs."""
    return _ADDRESS.sub("", text)


def _format_default(value):
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.isclass(value):
        return value.__qualname__
    return _clean(repr(value))


def _format_annotation(annotation):
    text = inspect.formatannotation(annotation)
    text = text.replace("typing.", "")
    text = re.sub(r"\bmindspore_ngd(\.\w+)*\.(?=[A-Z])", "", text)   # mindspore_ngd.parallel.plan.WorkItem
    text = _OPTIONAL.sub(r"Optional[\1]", text)                      # Python 3.9 spells Optional as Union
    return _clean(text)


def _format_parameters(signature):
    parts, slash_needed, star_done = [], False, False
    for param in signature.parameters.values():
        kind = param.kind
        if kind is param.POSITIONAL_ONLY:
            slash_needed = True
        elif slash_needed:
            parts.append("/")
            slash_needed = False
        if kind is param.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        text = param.name
        if kind is param.VAR_POSITIONAL:
            text, star_done = "*" + text, True
        elif kind is param.VAR_KEYWORD:
            text = "**" + text
        if param.annotation is not param.empty:
            text += ": " + _format_annotation(param.annotation)
            if param.default is not param.empty:
                text += " = " + _format_default(param.default)
        elif param.default is not param.empty:
            text += "=" + _format_default(param.default)
        parts.append(text)
    if slash_needed:
        parts.append("/")
    return parts


def _signature_block(name, obj, prefix="", method=False):
    """A fenced Python block with ``name(params)``, one parameter per line when it is long.

    ``method``: ``obj`` is a function defined in a class; its ``self`` / ``cls`` is not shown.
    """
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    if method:
        params = list(signature.parameters.values())
        if params and params[0].name in ("self", "cls"):
            signature = signature.replace(parameters=params[1:])
    parts = _format_parameters(signature)
    returns = ""
    if signature.return_annotation is not signature.empty and not inspect.isclass(obj):
        returns = " -> " + _format_annotation(signature.return_annotation)
    one_line = f"{prefix}{name}({', '.join(parts)}){returns}"
    if len(one_line) <= WRAP_WIDTH:
        body = one_line
    else:
        body = "\n".join([f"{prefix}{name}("] + [f"    {p}," for p in parts] + [f"){returns}"])
    return f"```python\n{body}\n```"


def _docstring_block(obj):
    doc = inspect.getdoc(obj)
    if not doc:
        return "*(no docstring)*"
    return "```text\n" + _clean(doc) + "\n```"


def _anchor(qualified):
    """The GitHub-style anchor of a heading that reads `` `qualified` ``."""
    return re.sub(r"[^a-z0-9_\- ]", "", qualified.lower()).replace(" ", "-")


def _is_package_class(cls):
    return inspect.isclass(cls) and (cls.__module__ or "").split(".")[0] == "mindspore_ngd"


def _member_kind(value):
    if isinstance(value, property):
        return "property"
    if isinstance(value, staticmethod):
        return "staticmethod"
    if isinstance(value, classmethod):
        return "classmethod"
    if inspect.isfunction(value):
        return "method"
    return None


def _framework_hook(cls, name):
    """True when ``name`` overrides a method of a MindSpore (or other non-package) base class, such
    as ``Cell.construct`` or ``Callback.on_train_epoch_end``: the framework calls it, users do not."""
    return any(name in vars(base) for base in cls.__mro__[1:]
               if base is not object and not _is_package_class(base))


def _own_members(cls):
    """Public methods and properties defined in ``cls`` itself, in definition order."""
    members = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in SKIPPED_METHODS or _framework_hook(cls, name):
            continue
        kind = _member_kind(value)
        if kind is not None:
            members.append((name, kind, value))
    return members


def _shown_members(cls, documented):
    """The members rendered under ``cls``: its own, then those of its ``mindspore_ngd`` base classes
    that are not documented themselves (mix-ins such as ``Inspection``), in MRO order. Members that
    come through a documented base class are rendered there (``KFAC`` links to ``NGDOptimizer``'s)."""
    through_documented = set()
    for base in cls.__mro__[1:]:
        if _is_package_class(base) and id(base) in documented:
            through_documented.update(base.__mro__)
    members, seen = [], set()
    for owner in cls.__mro__:
        if owner is not cls and (not _is_package_class(owner) or owner in through_documented):
            continue
        for name, kind, value in _own_members(owner):
            if name not in seen:
                seen.add(name)
                members.append((name, kind, value))
    return members


def _inherited_members(cls, documented):
    """``(documented base, name)`` of the public methods/properties ``cls`` inherits from a documented
    ``mindspore_ngd`` class (where they are rendered)."""
    seen = {name for name, _, _ in _shown_members(cls, documented)}
    inherited = []
    for base in cls.__mro__[1:]:
        if not _is_package_class(base) or id(base) not in documented:
            continue
        for name, _, _ in _shown_members(base, documented):
            if name not in seen:
                seen.add(name)
                inherited.append((base, name))
    return inherited


def _render_member(qualified_class, name, kind, value):
    lines = [f"#### `{qualified_class}.{name}`", ""]
    if kind != "method":
        lines += [f"*{kind}*", ""]
    target = value.fget if kind == "property" else getattr(value, "__func__", value)
    if kind != "property":
        signature = _signature_block(name, target, method=kind != "staticmethod")
        if signature:
            lines += [signature, ""]
    lines += [_docstring_block(target), ""]
    return lines


def _render_object(module_name, name, obj, documented):
    """Lines for one public name. ``documented``: object id -> where it was documented first."""
    qualified = f"{module_name}.{name}"
    lines = [f"### `{qualified}`", ""]
    first = documented.get(id(obj))
    if first is not None and first != qualified:
        return lines + [f"The same object as [`{first}`](#{_anchor(first)}).", ""]
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
        defined = getattr(obj, "__module__", None)
        kind = "class" if inspect.isclass(obj) else "function"
        where = f", defined in `{defined}`" if defined and defined != module_name else ""
        lines += [f"*{kind}{where}*", ""]
        signature = _signature_block(name, obj, prefix="class " if inspect.isclass(obj) else "")
        if signature:
            lines += [signature, ""]
        lines += [_docstring_block(obj), ""]
        if inspect.isclass(obj):
            for member_name, member_kind, value in _shown_members(obj, documented):
                lines += _render_member(qualified, member_name, member_kind, value)
            inherited = _inherited_members(obj, documented)
            if inherited:
                links = []
                for base, member in inherited:
                    target = documented.get(id(base))
                    text = f"`{base.__name__}.{member}`"
                    links.append(f"[{text}](#{_anchor(f'{target}.{member}')})" if target else text)
                lines += ["Inherited: " + ", ".join(links) + ".", ""]
    else:
        lines += [f"*{type(obj).__name__}*", "", "```python", f"{name} = {_clean(repr(obj))}", "```", ""]
    return lines


# ---------------------------------------------------------------------- the document
def _modules(internal):
    """``(module name, module, names)`` of the public API (``internal=False``) or of the internals."""
    modules = []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        names = getattr(module, "__all__", None)
        if names is None:
            continue
        hidden = INTERNAL.get(module_name, ())
        chosen = [n for n in names if (n in hidden) == internal]
        if chosen:
            modules.append((module_name, module, chosen))
    return modules


_HEADER = [
    "<!-- Generated by scripts/gen_api_docs.py from the docstrings and signatures of mindspore_ngd.",
    "     Do not edit by hand: change the code, then run `python scripts/gen_api_docs.py`;",
    "     tests/test_api_docs.py fails when this file is out of date. -->",
    "",
]


def render(internal=False):
    """The text of docs/api.md (``internal=False``) or docs/developer.md (``internal=True``) for the
    mindspore_ngd that ``import mindspore_ngd`` finds."""
    modules = _modules(internal)
    # where each class or function is documented first: re-exports link there, and subclasses link
    # to the inherited methods
    documented = {}
    for module_name, module, names in modules:
        for name in names:
            obj = getattr(module, name, None)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and id(obj) not in documented:
                documented[id(obj)] = f"{module_name}.{name}"
    package = importlib.import_module("mindspore_ngd")
    version = getattr(package, "__version__", "")
    if internal:
        lines = ["# Developer reference", ""] + _HEADER + [
            f"Generated from `mindspore_ngd` {version}: the names the package exports for its own tests, "
            "benchmarks and model zoo. They are not part of the public API ([api.md](api.md)) and may "
            "change without notice. How they are used is in [distributed.md](distributed.md) and "
            "[algorithms.md](algorithms.md).",
            "",
        ]
    else:
        lines = ["# API reference", ""] + _HEADER + [
            f"Generated from `mindspore_ngd` {version}: every public name, with its signature and docstring; "
            "for the optimizers also the inspection methods (`summary()`, `parallel_state()`, "
            "`demoted_layers()`, ...) under [`NGDOptimizer`](#mindspore_ngdngdoptimizer). How the pieces fit "
            "together is in [algorithms.md](algorithms.md) and [distributed.md](distributed.md); the names "
            "the package exports for its own use are in [developer.md](developer.md).",
            "",
        ]
    for module_name, _, names in modules:
        links = ", ".join(f"[`{n}`](#{_anchor(f'{module_name}.{n}')})" for n in names)
        lines.append(f"- `{module_name}`: {links}")
    lines.append("")
    if not internal:
        lines += _default_differences()
    for module_name, module, names in modules:
        lines += [f"## `{module_name}`", ""]
        doc = inspect.getdoc(module)
        if doc and not internal:
            lines += ["```text", _clean(doc), "```", ""]
        for name in names:
            if not hasattr(module, name):
                lines += [f"### `{module_name}.{name}`", "", "*(listed in `__all__` but missing)*", ""]
                continue
            lines += _render_object(module_name, name, getattr(module, name), documented)
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def _default_differences():
    """The table of the arguments that KFAC, SPNGD and THOR all take with defaults that differ: the
    defaults read from the signatures, the reason from
    ``mindspore_ngd.optim.argdocs.DEFAULT_DIFFERENCES``. Raises ``ValueError`` when the two disagree
    (an argument whose defaults differ has no reason, or a reason names one whose defaults agree)."""
    package = importlib.import_module("mindspore_ngd")
    reasons = importlib.import_module("mindspore_ngd.optim.argdocs").DEFAULT_DIFFERENCES
    classes = (package.KFAC, package.SPNGD, package.THOR)
    signatures = [inspect.signature(cls.__init__).parameters for cls in classes]
    shared = [name for name in signatures[0] if name != "self" and all(name in s for s in signatures[1:])]

    def default(parameter):
        if parameter.default is inspect.Parameter.empty:
            return "required"
        if inspect.isfunction(parameter.default):
            return f"`{parameter.default.__name__}`"
        return f"`{_format_default(parameter.default)}`"

    rows = [(name, [default(s[name]) for s in signatures]) for name in shared]
    differing = [(name, values) for name, values in rows if len(set(values)) > 1]
    missing = [name for name, _ in differing if name not in reasons]
    stale = sorted(set(reasons) - {name for name, _ in differing})
    if missing or stale:
        raise ValueError(f"DEFAULT_DIFFERENCES in mindspore_ngd/optim/argdocs.py is out of date: no reason for "
                         f"{missing}; defaults no longer differ for {stale}")
    lines = ["## Defaults that differ between KFAC, SPNGD and THOR", "",
             "Every other argument the three optimizers share has the same default in each.", "",
             "| argument | `KFAC` | `SPNGD` | `THOR` | why |", "|---|---|---|---|---|"]
    for name, values in differing:
        lines.append(f"| `{name}` | " + " | ".join(values) + f" | {reasons[name]} |")
    return lines + [""]


def _ensure_importable(root):
    if root not in sys.path:
        sys.path.insert(0, root)


def _documents():
    """``(relative path, internal)`` of the generated files."""
    return ((API_PATH, False), (DEVELOPER_PATH, True))


def check(root=REPO_ROOT):
    """``(up_to_date, message)`` comparing ``root/docs/api.md`` and ``root/docs/developer.md`` with what
    :func:`render` produces."""
    _ensure_importable(root)
    for relative, internal in _documents():
        ok, message = _check_one(root, relative, render(internal))
        if not ok:
            return ok, message
    return True, f"{API_PATH} and {DEVELOPER_PATH} are up to date"


def _check_one(root, relative, expected):
    path = os.path.join(root, relative)
    try:
        with open(path, encoding="utf-8") as handle:
            current = handle.read()
    except FileNotFoundError:
        return False, f"{relative} does not exist; run: python scripts/gen_api_docs.py"
    if current == expected:
        return True, f"{relative} is up to date"
    diff = list(difflib.unified_diff(current.splitlines(), expected.splitlines(),
                                     f"{relative} (committed)", f"{relative} (generated)", lineterm="", n=2))
    shown = diff[:80] + ([f"... {len(diff) - 80} more diff lines"] if len(diff) > 80 else [])
    package = sys.modules.get("mindspore_ngd")
    source = os.path.dirname(os.path.dirname(os.path.abspath(package.__file__))) if package else "?"
    note = "" if os.path.abspath(source) == os.path.abspath(root) else \
        f"\nnote: the mindspore_ngd documented was imported from {source}, not from {root}"
    return False, (f"{relative} is out of date with the docstrings/signatures; regenerate it with:\n"
                   f"    python scripts/gen_api_docs.py\n" + "\n".join(shown) + note)


def write(root=REPO_ROOT):
    """Write ``root/docs/api.md`` and ``root/docs/developer.md``; returns their paths."""
    _ensure_importable(root)
    # every document is rendered before any file is opened for writing: a render that raises (e.g. an
    # out-of-date DEFAULT_DIFFERENCES) leaves the committed files as they were, not truncated
    texts = [(relative, render(internal)) for relative, internal in _documents()]
    paths = []
    for relative, text in texts:
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(description="Generate docs/api.md and docs/developer.md from mindspore_ngd's "
                                                 "docstrings.")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 with a diff if a file differs from the generated text")
    args = parser.parse_args(argv)
    if args.check:
        ok, message = check()
        print(message, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 1
    print("wrote " + ", ".join(os.path.relpath(path) for path in write()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
